"""SPPO in the distributed executor (`memo_exec.distributed`): the ``sppo`` step schedule and the
``sppo`` activation policy, registered when `memo_exec.distributed.schedule` imports this module (``SCHEDULE_MODULES``).

- `SppoSchedule` (`memo_exec.distributed.schedule`, registered as ``sppo``: plans whose ``schedule`` is sppo): this rank is
  stage ``ctx.coord("pp")`` and holds that stage's layers (`memo_exec.sppo.stage.stage_layer_ids`); a
  step is `memo_exec.sppo.pipeline.StageRunner.step` over the plan's pieces (its bounds, alphas
  and multiplexing) with the ``pp`` process group for the transfers, the executor's weights
  (held layers, embedding, final norm), copy streams and recorder (so the per-rank trace holds
  every piece's forward and backward, the receive waits on a ``p2p`` stream, the offload and
  prefetch copies and the prefetch stalls), and the loss divided by the global token count.
  Gradients are accumulated into the executor's ``.grad`` views; the executor then reduces them
  over the data group and steps the optimizer.
- `SppoActivations` (registered under the simulator's policy name ``sppo``): the executor's
  activation-policy slot for SPPO plans. The stage keeps its activations itself (autograd saves
  them per piece, `memo_exec.sppo.offload` moves alpha_i of them to host, `memo_exec.sppo.kvcache`
  keeps K/V, the stage's last piece's aside, which is offloaded with that piece's activations), so this
  policy preallocates nothing, and it refuses to hand storage to the single-stage layer loop: an SPPO plan
  runs through `SppoSchedule` only.

Limits (refused in ``check`` with the fix): one rank per stage (tp = cp = ulysses = 1; the
simulator's TP+SP inside a stage needs the Megatron compute per piece), ZeRO 0 or 1.
"""

from __future__ import annotations

import torch

from memo_exec.activations.base import ActivationPolicy
from memo_exec.activations.registry import register
from memo_exec.distributed.schedule import Schedule, register_schedule
from memo_exec.errors import ExecError
from memo_exec.sppo.pipeline import StageRunner
from memo_exec.sppo.stage import stage_layer_ids
from memo_sim.plan.executor_scope import sppo_why_not


@register("sppo")
class SppoActivations(ActivationPolicy):
    """The activation-policy slot of an SPPO plan (module docs)."""

    pinned_bytes = 0  # the host pool after a step (set by the schedule: measured, not estimated)
    # the stage's pieces keep their activations through autograd (and K/V in `memo_exec.sppo.kvcache`): nothing
    # here sizes them before the step, so the report compares them as not estimated (they read -100% as 0 bytes)
    unsized_terms = ("skeletal_resident", "lse", "norm_stats")

    def device_bytes(self) -> dict[str, int]:
        return {"skeletal_resident": 0, "buffers": 0, "lse": 0, "norm_stats": 0}

    def allocate(self) -> None:
        return None

    def storage_for_forward(self, i: int):
        raise ExecError("policy sppo: an SPPO plan runs as a pipeline (layout.pp > 1, the sppo schedule); "
                        "plan it with --pp 2 or more")

    storage_for_backward = storage_for_forward  # type: ignore[assignment]

    def describe(self) -> dict:
        c = self.choice
        return {"policy": "sppo", "subseqs": c.subseqs, "partition": c.partition, "multiplex": c.multiplex,
                "bounds": list(c.bounds), "alphas": [float(a) for a in c.alphas],
                "activations": ("autograd per piece; alpha_i of each unit's token rows on host; K/V cached but "
                                "the stage's last piece's, which is offloaded with its other activations")}


@register_schedule("sppo")
class SppoSchedule(Schedule):
    """The SPPO pipeline of one rank (module docs)."""

    # the stage runs its layers per subsequence without the layer hooks: its gradients are reduced after the
    # backward and its ZeRO 1 weights gathered after the step (`memo_exec.distributed.zero.GradSync`)
    calls_layer_hooks = False

    def __init__(self, ex) -> None:
        super().__init__(ex)
        self.runner: StageRunner | None = None
        self.last = None  # the last step's `memo_exec.sppo.pipeline.StepResult`

    def check(self) -> str | None:
        ex, lay = self.ex, self.ex.layout
        pol = ex.plan.policy
        name = getattr(pol, "name", None)
        if name != "sppo":
            return f"the sppo schedule runs the sppo policy, not {name}"
        if ex.plan.micro_batches > 1:
            return (f"sppo splits each sequence into subsequences, not the batch into micro-batches: plan with "
                    f"micro_batch = batch ({ex.batch})")
        split = sppo_why_not(lay)  # the rule the what-if's executor_refuses names too
        if split:
            return split
        if lay.zero >= 2:
            return "sppo keeps a stage's weights and gradients whole: plan with ZeRO 0 or 1"
        why = pol.check(ex.model, lay, ex.batch, ex.seq)
        if why:
            return f"sppo: {why}"
        return None

    def layer_indices(self) -> list[int]:
        ex = self.ex
        return stage_layer_ids(ex.model.layers, ex.layout.pp, ex.ctx.coord("pp"))

    def _build(self) -> StageRunner:
        ex = self.ex
        pol = ex.plan.policy
        pp = ex.layout.pp
        pieces = pol.stage_pieces(ex.model, ex.layout, ex.batch)
        return StageRunner(ex.gpt, ex.ctx.coord("pp"), pieces, ex.batch, ex.seq, list(pol.alphas), list(range(pp)),
                           ex.device, group=ex.ctx.group("pp"), classifier_chunk=ex.plan.classifier_chunk_tokens,
                           streams=ex.engine, timer=ex.recorder, layer_weights=list(ex.gpt.layers),
                           norm_tokens=ex.global_tokens)

    def forward_backward(self, step: int) -> torch.Tensor:
        ex = self.ex
        if self.runner is None:
            self.runner = self._build()
        inputs, targets = ex.local_batch(step)  # one rank per stage: the replica's rows in order
        shape = (ex.batch, ex.seq)
        self.last = self.runner.step(inputs.reshape(shape), targets.reshape(shape))
        ex.policy.pinned_bytes = self.runner.offload.pool_bytes()
        return torch.tensor(self.last.loss or 0.0, dtype=torch.float64)

    def write_outputs(self, out_dir, plan_file) -> list:
        """After the run's merged ``measured.json`` is written (rank 0): the pipeline Gantt charts,
        measured and simulated, and the per-stage comparison (`memo_exec.sppo.report`). Called by
        the executor's output step where it offers this hook; else run
        ``python -m memo_exec.sppo.report OUT PLAN``."""
        from memo_exec.sppo.report import write_pipeline_outputs  # noqa: PLC0415

        if self.ex.ctx.rank != 0:
            return []
        return write_pipeline_outputs(out_dir, plan_file, self.ex.model.layers)
