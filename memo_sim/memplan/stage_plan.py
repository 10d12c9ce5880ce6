"""Level 2 of MEMO's memory plan for one pipeline stage: the micro-batches it holds in flight.

Level 1 (one layer's forward and backward transients, `memo_sim.memplan.planner.plan_memory`) does
not change under a micro-batch pipeline: a stage runs one layer phase at a time on its compute
stream, whichever micro-batch it belongs to, so every phase of every micro-batch reuses the same
arena at the same offsets. What a pipeline changes is level 2: a stage holds the blocks that cross
layers (lse, the policy's skeletal blocks and shared buffers such as MEMO's rounding buffers) of
every (model chunk, micro-batch) whose forward has run and whose backward has not, in the order
its schedule runs them (1F1B's warm-up forwards, the steady one-forward-one-backward, the drain).

`stage_model_trace` lays that order out as a step timeline and builds the request trace the same
way `memo_sim.memplan.trace_gen.model_trace` does for a whole model run in one pass:

* each layer forward and backward of a (chunk, micro-batch) is one step holding a pseudo block of
  its level-1 peak (``c{chunk}.mb{mb}.layer{i}.fwd`` / ``.bwd``, ``i`` the global layer);
* the chunk's input activation (the embedding's output on the first virtual stage, the activation
  received from the previous stage elsewhere) lives until its first layer's forward is done; its
  output (sent on to the next stage) for its last layer's forward step; the gradient received for
  its backward until its first backward layer is done, and the gradient of its input (sent back,
  or the embedding's gradient) for the step after its last one;
* on the last virtual stage, the classifier runs right after the chunk's last layer forward
  (``final_hidden``, one ``classifier_chunk``) and the gradient it leaves for the backward lives
  until that (chunk, micro-batch)'s first backward layer is done;
* lse (where the policy keeps it, `Policy.keeps_lse`) and `Policy.layer_blocks` live from a layer's
  forward to its backward; `Policy.shared_blocks`
  are taken per (chunk, micro-batch), with that chunk's layers numbered from 0 as the policy sees a
  chunk (the executor runs one policy instance per chunk size and activation slot), from the
  steps that (chunk, micro-batch) occupies (a recompute buffer: one backward's steps, so the
  micro-batches' copies can share offsets); a policy's `Policy.pipeline_rank_blocks` (MEMO's two
  forward and two prefetch buffers, which the executor's instances on a rank share) are taken once,
  through the whole step, in their place.

The order is passed in (the schedule's per-rank order, `memo_sim.engine.schedules.microbatch`):
the memory plan sits below the engine in the data flow and does not import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.cost.activations import skeletal_bytes
from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS, classifier_peak_bytes
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.trace_gen import _align
from memo_sim.model.config import ModelConfig
from memo_sim.policy.base import Policy
from memo_sim.request_trace import Buffer, RequestTrace


@dataclass(frozen=True)
class StageStep:
    """One entry of a rank's order: the forward (``"F"``) or backward (``"B"``) of micro-batch ``mb``
    through the rank's model chunk ``chunk`` (its virtual stage is ``chunk * pp + stage``)."""

    kind: str
    mb: int
    chunk: int = 0


class _ChunkSteps:
    """The `memo_sim.policy.base.ModelSteps` of one (chunk, micro-batch) on its stage's timeline: layer
    ``j`` is the chunk's j-th layer, as a policy instance that holds the chunk sees it."""

    def __init__(self, fwd: list[int], bwd: list[int]) -> None:
        self._fwd, self._bwd = fwd, bwd  # per local layer: the step of its forward / backward

    def fwd(self, layer: int) -> int:
        return self._fwd[min(layer, len(self._fwd) - 1)]  # a block a shorter chunk never reaches: from its last

    def bwd(self, layer: int) -> int:
        return self._bwd[min(layer, len(self._bwd) - 1)]

    @property
    def end_of_backward(self) -> int:
        return self._bwd[0] + 1  # the chunk's first layer is the last to run its backward


def stage_model_trace(model: ModelConfig, layout: Layout, micro_batch: int, seq: int, policy: Policy,
                      fwd_block: int, bwd_block: int, order: list[StageStep], stage: int,
                      classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> RequestTrace:
    """The level-2 request trace of pipeline rank ``stage`` running ``order`` (see the module doc).
    ``fwd_block`` / ``bwd_block``: the level-1 peaks of a layer's forward and backward."""
    pp, n = layout.pp, model.layers
    vranges = layout.virtual_stage_ranges(n)
    last_vs = len(vranges) - 1
    sk = skeletal_bytes(model, layout, micro_batch, seq)
    x = sk["input"]
    # the steps each (chunk, mb) takes: one per layer phase, plus the classifier's on the last virtual stage
    fwd_steps: dict[tuple[int, int], list[int]] = {}
    bwd_steps: dict[tuple[int, int], list[int]] = {}
    cls_step: dict[tuple[int, int], int] = {}
    t = 0
    for st in order:
        key, vs = (st.chunk, st.mb), st.chunk * pp + stage
        layers = list(vranges[vs])
        if st.kind == "F":
            fwd_steps[key] = list(range(t, t + len(layers)))
            t += len(layers)
            if vs == last_vs:
                cls_step[key] = t
                t += 1
        else:
            bwd_steps[key] = list(range(t + len(layers) - 1, t - 1, -1))  # last layer first
            t += len(layers)
    end = t + 1
    bufs: list[Buffer] = []

    def add(id_: str, size: float, lo: int, hi: int, kind: str, layer: int | None = None,
            phase: str | None = None) -> None:
        if size > 0 and hi > lo:
            bufs.append(Buffer(id_, _align(size), lo, hi, kind=kind, layer=layer, phase=phase, name=id_))

    holds = any(vranges[st.chunk * pp + stage] for st in order)  # a rank of the embedding or the loss alone: none
    rank_blocks = policy.pipeline_rank_blocks(sk) if holds else []
    for name, nbytes in rank_blocks:  # the rank's own, through its step (MEMO's forward and prefetch buffers)
        add(name, nbytes, 0, end, "skeletal")
    for key, fs in fwd_steps.items():
        c, mb = key
        bs = bwd_steps[key]
        vs = c * pp + stage
        layers = list(vranges[vs])
        tag = f"c{c}.mb{mb}"
        if layers:
            add(f"{tag}.input", x, fs[0], fs[0] + 1, "transient", phase="fwd")
            add(f"{tag}.input_grad", x, bs[0] + 1, min(bs[0] + 2, end), "transient", phase="bwd")
        if vs < last_vs and layers:
            add(f"{tag}.output", x, fs[-1], fs[-1] + 1, "transient", phase="fwd")
            add(f"{tag}.output_grad", x, bs[-1], bs[-1] + 1, "transient", phase="bwd")
        for j, i in enumerate(layers):
            add(f"{tag}.layer{i}.fwd", fwd_block, fs[j], fs[j] + 1, "pseudo", i, "fwd")
            add(f"{tag}.layer{i}.bwd", bwd_block, bs[j], bs[j] + 1, "pseudo", i, "bwd")
            for name, nbytes in policy.layer_kept_blocks(sk):  # the lse where kept (`keeps_lse`), ...
                add(f"{tag}.layer{i}.{name}", nbytes, fs[j], bs[j] + 1, "skeletal", i)
        if layers and not rank_blocks:
            for name, nbytes, lo, hi in policy.shared_blocks(sk, _ChunkSteps(fs, bs), len(layers)):
                add(f"{tag}.{name}", nbytes, lo, hi, "skeletal")
        if key in cls_step:
            c_at = cls_step[key]
            add(f"{tag}.final_hidden", x, c_at, c_at + 1, "transient")
            add(f"{tag}.classifier_chunk",
                classifier_peak_bytes(model, layout, micro_batch, seq, classifier_chunk_tokens,
                                      recompute_mtp=policy.recomputes_mtp) - 2 * x,
                c_at, c_at + 1, "transient")
            add(f"{tag}.final_hidden_grad", x, c_at, (bs[-1] + 1) if layers else c_at + 1, "transient")
    return RequestTrace(bufs, name=f"{model.name}-{layout.label()}-{seq}-{policy.name}-stage{stage}")
