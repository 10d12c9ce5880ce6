"""Checkpoint offload: full recompute with each layer's checkpointed input on the host.

Activation checkpointing keeps only a layer's input for its backward; DeepSpeed's
``activation_checkpointing.cpu_checkpointing`` (the 'AC + OC' of its Ulysses-Offload blog) moves
that input to host memory after the layer's forward and brings it back before the recompute. So
the GPU holds no per-layer activation at all, only:

- two input buffers the layers take in turn (`memo_sim.policy.rounding_buffers`: layer i's input
  is written into buffer i % 2 by layer i-1's last op, copied out beside layer i's forward, and
  prefetched back beside layer i+1's backward), the last `KEPT_LAYERS` layers' inputs staying in
  theirs;
- one recompute buffer: the layer's other skeletal tensors rebuilt from its input by re-running its
  whole forward (attention included) before its backward, as `full_recompute` does, and that layer's
  attention lse, which the recompute rebuilds (``keeps_lse`` False, inherited: no layer keeps its lse
  past its forward; memo_exec/activations/checkpoint_offload.py ``after_forward`` drops it, its
  ``device_bytes`` count one layer's).

Host memory holds one input per offloaded layer. The copies run on the offload and prefetch
streams beside the compute, waited for by the rule every offloading policy shares (MEMO's
rounding-buffer rule), as DeepSpeed's asynchronous offload engine for ``cpu_checkpointing`` runs
them (deepspeed/runtime/activation_checkpointing/checkpointing.py ``_ActivationOffloadEngine``);
the blocking ``.cpu()`` copies of its earlier releases are not modelled.
"""

from __future__ import annotations

from memo_sim.policy.full_recompute import FullRecompute
from memo_sim.policy.registry import register
from memo_sim.policy.rounding_buffers import N_BUFFERS


@register
class CheckpointOffload(FullRecompute):
    """`FullRecompute`'s recompute (every layer, attention included, into one buffer), its inputs on the host."""

    name = "checkpoint_offload"
    offloads = True
    offloaded_roles = ("input",)
    summary = "activation checkpointing with each layer's input on the host (DeepSpeed cpu_checkpointing)"

    def resident_bytes(self, sk, n_layers):
        return 0.0  # no layer's input stays on the device past its offload

    def forward_kept(self, sk):
        return self.kept_lse(sk) + self.kept_extras(sk)  # none: the input goes to the input buffers, the rest rebuilt

    def layer_blocks(self, sk):
        return []

    def buffer_bytes(self, sk):
        # the two input buffers and the one-layer recompute buffer (with its rebuilt lse: `recompute_allocated`)
        return N_BUFFERS * sk["input"] + self.backward_buffer_bytes(sk)

    def static_gpu(self, sk):
        return [("input_buffers", N_BUFFERS * sk["input"])]

    def pipeline_rank_blocks(self, sk):
        # a pipeline rank's two forward and two prefetch input buffers and its one recompute buffer, shared by its
        # micro-batches in flight (`memo_exec.activations.checkpoint_offload`)
        return ([(f"input_{kind}{b}", sk["input"]) for kind in ("forward", "prefetch") for b in range(N_BUFFERS)]
                + [("recompute_buffer", self.backward_buffer_bytes(sk))])

    def shared_blocks(self, sk, steps, n_layers):
        return ([(f"input_buffer{b}", sk["input"], steps.fwd(b), steps.end_of_backward) for b in range(N_BUFFERS)]
                + [("recompute_buffer", self.backward_buffer_bytes(sk), steps.bwd(n_layers - 1),
                    steps.end_of_backward)])
