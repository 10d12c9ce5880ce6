"""Full offload: every skeletal tensor of a layer goes to host after its forward (through the two
rounding buffers of `memo_sim.policy.rounding_buffers`) and comes back before its backward."""

from __future__ import annotations

from memo_sim.policy.base import Policy
from memo_sim.policy.registry import register
from memo_sim.policy.rounding_buffers import N_BUFFERS


@register
class FullOffload(Policy):
    name = "full_offload"
    offloads = True
    summary = "copy every skeletal tensor to host after the forward, prefetch before the backward"

    @property
    def offload_fraction_other(self) -> float:
        return 1.0

    def buffer_bytes(self, sk):
        return N_BUFFERS * sk["total"]

    def static_gpu(self, sk):
        return [("rounding_buffers", self.buffer_bytes(sk))]

    def shared_blocks(self, sk, steps, n_layers):
        return [(f"rounding_buffer{b}", sk["total"], steps.fwd(b), steps.end_of_backward)
                for b in range(N_BUFFERS)]

    def pipeline_rank_blocks(self, sk):
        # a pipeline rank's forward and prefetch buffers, shared by its micro-batches in flight (the rule runs over
        # the rank's units: `memo_sim.engine.schedules.microbatch`, `memo_exec.activations.pipeline_rounding`)
        return [(f"rounding_{kind}{b}", sk["total"]) for kind in ("forward", "prefetch") for b in range(N_BUFFERS)]
