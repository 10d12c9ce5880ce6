"""Outputs of ``memo-exec run``: measured.json (a Timeline), trace.json (Chrome trace) and
report.md with PNG figures, setting the measurement beside the prediction.

Predictions: the whole-iteration numbers are the plan's own (``plan.predicted``) when every
layer ran; with ``--layers N`` they come from re-simulating the plan for N layers, and with
``--profile`` from re-simulating it on that profile (the per-rank table too); where the stored
prediction is no longer what the plan simulates to (a hand-edited plan,
`memo_exec.compare.stale_prediction`), from the re-simulation, said in one ``warning:`` line. Per stream
(busy, exposed, overlapped time of compute, d2h, h2d) and per layer and op class (forward,
recompute, backward, offload, prefetch) the prediction is always that re-simulation
(`memo_exec.compare`), drawn over the measurement in ``gantt_overlay.png``. The executor's memory
estimate is set beside the simulator's memory breakdown term by term. Every row has
rel_error = (measured - predicted) / predicted.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from memo_exec.compare import (alltoall_rows, op_rows, rel_error, resimulate, ring_stall_seconds, sim_memory_breakdown,
                                stale_prediction, stream_rows, unpriced_ep_seconds)
from memo_exec.device import element_size, memo_dtype_name
from memo_exec.figures import layer_figure, overlay_gantt, rank_coords, rank_host_samples, ranks_to_draw
from memo_exec.measure import steady_steps, steady_value, timeline_from_step
from memo_exec.memory_estimate import ACTIVATION_TERMS, TRANSIENT_TERMS
from memo_exec.runner import RunResult
from memo_sim.model.flops import mfu
from memo_sim.fileio import atomic_write_text
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.report.chrome_trace import write_chrome_trace
from memo_sim.report.figures import gantt_figure, memory_figure
from memo_sim.timeline import TP_RING_STREAMS, Timeline

GiB = 2**30


def _peak_flops(profile: str, dtype: str) -> tuple[float | None, str]:
    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    try:
        return load_profile(profile).peak(dtype), f"profile {profile}"
    except MemoError as e:
        return None, f"no peak FLOP/s ({e})"


@dataclass
class Comparison:
    totals: list[dict]  # whole-iteration and per-layer quantities
    streams: list[dict]  # per stream: busy, exposed, overlapped
    ops: list[dict]  # per layer and op class
    memory: list[dict]  # executor estimate vs simulator breakdown, term by term
    source: str  # where the whole-iteration predictions come from
    simulation: str  # how the per-stream / per-op prediction was made (or why it is missing)
    predicted_timeline: Timeline | None = None
    alltoall: list[dict] = dataclasses.field(default_factory=list)  # MoE: per layer, the EP all-to-alls
    # whether the predicted times are predictions of this run's device (not a GPU profile's beside a CPU run):
    # where not, the times' rel_error compares different machines (report.md reads them "not comparable")
    times_comparable: bool = True
    # the plan's stored prediction differs from the re-simulation (`memo_exec.compare.stale_prediction`): why, and
    # the totals then compare with the re-simulation
    stale: str | None = None
    # MoE: the ep_comm collectives the simulator does not price (`memo_exec.compare.UNPRICED_EP_OPS`), measured
    # seconds a step (median over the steady steps), left out of the ep_comm rows; None where none ran
    ep_unpriced_s: float | None = None
    # one layer's predicted times the per-layer rows and layers.png show, and where they come from
    # (`predicted_layer_timings`): the re-simulation's wherever the iteration rows' are
    layer_timings: dict = dataclasses.field(default_factory=dict)
    layer_timings_from: str = "plan.layer_timings_s"
    # where the run did otherwise than the plan priced, one sentence each (`plan_notes`): report.md's bold lines and
    # the run's --json ``plan_notes``
    notes: list[str] = dataclasses.field(default_factory=list)

    def predicted_iteration(self) -> float | None:
        """The iteration time the totals compare with (the plan's, or the re-simulation's where
        ``--profile`` or a shorter run asked for one)."""
        return next((r["predicted"] for r in self.totals if r["quantity"] == "iteration time"), None)

    def to_dict(self) -> dict:
        return {"totals": self.totals, "streams": self.streams, "ops": self.ops, "memory": self.memory,
                "moe_alltoall": self.alltoall, "totals_predicted_from": self.source,
                "streams_ops_predicted_from": self.simulation, "times_comparable": self.times_comparable,
                "stale_prediction": self.stale, "ep_comm_unpriced_s": self.ep_unpriced_s, "plan_notes": self.notes}


def stale_line(stale: str) -> str:
    """The one line a run prints (stderr, report.md) for a stale stored prediction."""
    return (f"warning: {stale}; the totals and the layer rows compare with the re-simulation, not with the stored "
            f"prediction")


def whole_prediction(plan, n: int, sim, sim_note: str, other_profile: bool, stale: str | None = None
                     ) -> tuple[dict, str]:
    """(the whole-iteration prediction, where it comes from) for a run of ``n`` layers: the plan's own
    when every layer ran on the plan's profile and it is not ``stale`` (`memo_exec.compare.stale_prediction`),
    else the re-simulation ``sim`` (None: it failed, ``sim_note`` says why); ``other_profile``: `--profile`
    asked for a prediction on another profile."""
    if n == plan.model.layers and not other_profile and stale and sim is not None:
        return sim.to_dict(), f"{sim_note} (the plan's stored prediction is stale)"
    if n == plan.model.layers and not other_profile:
        return plan.predicted.to_dict(), "plan.predicted"
    if sim is not None and n == plan.model.layers:
        return sim.to_dict(), f"{sim_note} (--profile {plan.profile}, not the plan's own prediction)"
    if n == plan.model.layers:  # --profile asked for a prediction the simulator did not make
        return {}, f"not predicted with --profile {plan.profile}: {sim_note}"
    if sim is not None:
        return sim.to_dict(), f"{sim_note} (the plan is for {plan.model.layers} layers)"
    return {}, f"not comparable: the plan is for {plan.model.layers} layers, {n} ran, and {sim_note}"


def compare_run(res: RunResult) -> Comparison:
    plan, n = res.plan, res.meta["layers"]
    sim, sim_note = resimulate(plan, n)
    other_profile = getattr(res.options, "profile", None) is not None  # `--profile`: predicted again with it
    # the one re-simulation also tells whether the stored prediction is still the plan's (a hand-edited plan)
    stale = stale_prediction(plan, sim) if n == plan.model.layers and not other_profile else None
    pred, source = whole_prediction(plan, n, sim, sim_note, other_profile, stale)
    steady = steady_steps(res.steps)
    measured = [timeline_from_step(r, {}) for r in steady]
    # rank 0's measurements beside the simulator's first GPU (a pipeline's stage 0; the union of every stage's
    # compute would be the whole iteration)
    ptl = sim.timeline if sim is not None else None
    rank0 = ptl.of_device(0) if ptl is not None else None
    breakdown = sim_memory_breakdown(plan, n)
    lt, lt_name = predicted_layer_timings(plan, pred, stale, other_profile, sim_note, layers=n)
    # a pipeline's rank 0 (stage 0) beside its own stage's prediction, not the node's or the worst stage's
    # (a multi-rank run's: its rank 0 holds one stage)
    stage0 = pipeline_rank0_prediction(plan, sim, sim_note) if int(res.meta.get("world") or 1) > 1 else None
    totals = totals_rows(res, pred, source, lt, lt_name, rank0=stage0)
    if plan.layout.metp:
        totals += ring_rows(measured, sim, sim_note)
    unpriced = [unpriced_ep_seconds(t) for t in measured]
    streams, ops = stream_rows(measured, rank0), op_rows(measured, rank0, bool(plan.model.mtp_layers))
    alltoall = alltoall_rows(measured, rank0)
    why = times_not_comparable(res.meta, plan.profile)
    mark_times_not_comparable(why, [r for r in totals if r["unit"] in TIME_UNITS], streams, ops, alltoall)
    return Comparison(totals, streams, ops, res.estimate.compare(breakdown), source, sim_note, ptl, alltoall,
                      times_comparable=why is None, stale=stale,
                      ep_unpriced_s=steady_value(unpriced) if any(unpriced) else None,
                      layer_timings=lt, layer_timings_from=lt_name, notes=plan_notes(plan, res.meta))


def mark_times_not_comparable(why: str | None, *tables: list[dict]) -> None:
    """Where the predicted times are another kind of device's (``why``, `times_not_comparable`): every row of
    ``tables`` (times: the totals' time rows, the stream, layer-op and all-to-all rows) that has a relative error gets
    ``rel_error`` None and ``not_comparable`` ``why``, so that the run's JSON (--json, measured.json) reads them as
    report.md does (an all-to-all row keeps its measured / predicted ratio, which report.md does not print beside
    "not comparable": `alltoall_markdown`). A review: an A800 plan run on a CPU gave --json's iteration
    time rel_error 103.1, a +10,310% error, where report.md said "not comparable". ``why`` None: as they are."""
    if why is None:
        return
    for rows in tables:
        for r in rows:
            if r.get("rel_error") is not None:
                r["rel_error"], r["not_comparable"] = None, why


def predicted_layer_timings(plan, pred: dict, stale: str | None, other_profile: bool, sim_note: str,
                            layers: int | None = None) -> tuple[dict, str]:
    """(one layer's predicted times, where they come from) for the per-layer rows and ``layers.png``: from the
    same prediction as the iteration rows (``pred``, `whole_prediction`) wherever those come from the
    re-simulation -- a ``stale`` plan, ``--profile`` (``other_profile``: `memo_exec.runner` has set
    ``plan.profile`` to it, so the plan's stored ``layer_timings_s`` are another profile's and must not stand
    beside the re-simulation's iteration time), or ``--layers N`` (``layers``, the layers that ran, other than the
    plan's: the policy decides per layer count what a layer offloads and recomputes, so the plan's stored one-layer
    times are another model's; a review's 2-layer run of the README's 4-layer MEMO toy read offload 0.264 ms "from
    plan.layer_timings_s" beside a stream table and a per-layer table of a re-simulation that offloads nothing) --
    else the plan's stored ``layer_timings_s``."""
    if other_profile and not pred:  # the simulator did not predict on --profile: nothing of the plan's stands in
        return {}, f"not predicted with --profile {plan.profile}: {sim_note}"
    if other_profile:
        return dict(pred.get("layer_timings_s") or {}), \
            f"the re-simulation's layer timings (--profile {plan.profile})"
    if layers is not None and layers != plan.model.layers:
        if pred.get("layer_timings_s") is None:  # the re-simulation failed: the plan's are another model's
            return {}, f"not predicted for {layers} of the plan's {plan.model.layers} layers: {sim_note}"
        return dict(pred["layer_timings_s"]), f"the re-simulation's layer timings ({layers} layers)"
    if stale and pred.get("layer_timings_s") is not None:
        return dict(pred["layer_timings_s"]), "the re-simulation's layer timings"
    return dict(plan.layer_timings_s or {}), "plan.layer_timings_s"


def ring_rows(measured: list, sim, sim_note: str) -> list[dict]:
    """METP: the time the compute stream waited on the ring (``wait_tp_p2p`` / ``wait_tp_bcast``
    stalls, median over the steady steps) against the simulator's ``exposed_p2p_s`` for the same plan
    (its streams' waits on tp_p2p / tp_bcast beyond the compute they overlap)."""
    per = [ring_stall_seconds(t) for t in measured]
    rows = [("exposed METP ring time (compute waiting on tp_p2p + tp_bcast)",
             sim.exposed_p2p_s if sim is not None else None,
             steady_value([sum(d.values()) for d in per]) if per else None)]
    for s in TP_RING_STREAMS:
        rows.append((f"  of which waiting on {s}", None, steady_value([d[s] for d in per]) if per else None))
    src = sim_note if sim is not None else f"not predicted ({sim_note})"
    return [{"quantity": q, "unit": "s", "predicted": p, "measured": m, "rel_error": rel_error(m, p),
             "predicted_from": src if p is not None else "the simulator reports the sum only"} for q, p, m in rows]


def totals_rows(res: RunResult, pred: dict, source: str, layer_timings: dict | None = None,
                layer_timings_from: str | None = None, rank0: dict | None = None) -> list[dict]:
    """The whole-iteration and per-layer rows; ``layer_timings`` (``layer_timings_from`` names them,
    `predicted_layer_timings`): the re-simulation's, in place of the plan's stored ``layer_timings_s`` (a stale
    plan, `memo_exec.compare.stale_prediction`, or ``--profile``); ``rank0`` (`pipeline_rank0_prediction`): a
    pipeline's predictions of rank 0's stage for the exposed copy time and the pinned host rows, which the
    iteration's figures (the worst stage's, the node's) are not."""
    st = res.steady
    lt = layer_timings if layer_timings is not None else (res.plan.layer_timings_s or {})
    lt_name = layer_timings_from or ("the re-simulation's layer timings" if layer_timings is not None
                                     else "plan.layer_timings_s")
    tokens = res.meta["tokens"]
    it = st.get("iteration_s")
    cuda = res.meta["device_kind"] == "cuda"
    # a TP layer's analytic times hold its collectives; the per-op table's predictions are the compute stream's ops
    lt_src = lt_name + (" (with the layer's TP collectives, which the per-op table leaves out)"
                        if res.plan.layout.tp > 1 else "")
    meas_mfu = None
    if cuda and it:
        peak, _ = _peak_flops(res.plan.profile, res.plan.model.dtype)
        if peak:
            m = dataclasses.replace(res.plan.model, layers=res.meta["layers"])
            # the run's sequences (a multi-rank run's are the job's, batch x dp) over the GPUs that ran them
            meas_mfu = mfu(m, tokens / res.plan.seq_tokens, res.plan.seq_tokens, it, _replica_gpus(res), peak)
    rows = [
        ("iteration time", "s", pred.get("iteration_s"), it, source),
        ("MFU", "", pred.get("mfu"), meas_mfu, source),
        ("tokens per GPU per second", "tok/s", pred.get("tgs_tokens_per_gpu_s"),
         tokens / it / _replica_gpus(res) if it else None, source),
        ("layer forward", "s", lt.get("forward"), st.get("layer_forward_s"), lt_src),
        ("layer backward", "s", lt.get("backward"), st.get("layer_backward_s"), lt_src),
        ("layer recompute", "s", lt.get("recompute"), st.get("layer_recompute_s"), lt_src),
        ("layer offload (d2h)", "s", lt.get("offload"), st.get("layer_offload_s"), lt_name),
        ("layer prefetch (h2d)", "s", lt.get("prefetch"), st.get("layer_prefetch_s"), lt_name),
        _exposed_row(pred, st, source, rank0),
        *_peak_rows(res, pred, source, rank0, cuda),
        _pinned_row(res, pred, source, rank0=rank0),
    ]
    if not cuda:
        rows.append(("process RSS peak (CPU: model, activations and the host pool)", "bytes", None,
                     st.get("peak_allocated_bytes"), "not predicted"))
    # bytes in another element width than the plan's: their error would be the widths' ratio (`dtype_not_comparable`)
    why = dtype_not_comparable(getattr(res.plan.model, "dtype", None), res.meta.get("dtype"))
    out = []
    for q, u, p, m, s, *apart in rows:
        row = {"quantity": q, "unit": u, "predicted": p, "measured": m, "rel_error": rel_error(m, p),
               "predicted_from": s}
        if apart and apart[0]:  # no prediction of this rank's quantity (`pipeline_rank0_prediction`): said why
            row["rel_error"], row["not_comparable"] = None, apart[0]
        elif why and u == "bytes" and row["rel_error"] is not None:
            row["rel_error"], row["not_comparable"] = None, why
        out.append(row)
    return out


def dtype_not_comparable(plan_dtype: str | None, run_dtype: str | None) -> str | None:
    """``not comparable (ran fp32, plan bf16)`` where the run's element width differs from the plan's, else None.

    ``run_dtype``: the run's compute dtype as torch names it (``meta["dtype"]``, "float32"); ``plan_dtype``: the
    plan's model dtype, whose width (`memo_sim.model.layer_graph.DTYPE_BYTES`) the simulator counts every byte in.
    The executor's activations, host pool, buffers and model states take the run's width, so each byte count is the
    plan's times the widths' ratio: its relative error (or the bytes beside the simulated ones) would be that ratio,
    not an error of the prediction. report.md, pipeline.md and sppo_pipeline.md say it in these words (a review: a
    bf16 plan run in fp32 read "pinned host memory +100.0%" beside a term table that read the same bytes "not
    comparable"). Unknown names (a run record without a dtype): None."""
    plan_width = DTYPE_BYTES.get(plan_dtype or "")
    dt = getattr(torch, run_dtype or "", None)
    if plan_width is None or not isinstance(dt, torch.dtype) or element_size(dt) == plan_width:
        return None
    return f"{NOT_COMPARABLE} (ran {memo_dtype_name(run_dtype)}, plan {plan_dtype})"


def dtype_cell(cell: str, why: str | None, none: str = "—") -> str:
    """A simulated byte count's cell in pipeline.md or sppo_pipeline.md, with ``why`` (`dtype_not_comparable`) said
    beside it; an empty cell (``none``) as it is."""
    return cell if why is None or cell == none else f"{cell}, {why}"


def dtype_advice(run_dtype: str, plan_dtype: str | None = None) -> str:
    """How to compare bytes of another element width, a clause after "to compare them, ": plan in the run's dtype
    where memo-sim whatif plans it (its ``--dtype``: `memo_sim.model.layer_graph.DTYPE_BYTES`' names, bf16, fp16 and
    fp32), else (an fp64 run) through the widths' ratio, the what-if having no such dtype. ``run_dtype``: torch's
    name ("float32") or memo's; ``plan_dtype``: memo's name of the plan's, for the ratio."""
    name = memo_dtype_name(run_dtype)
    if name in DTYPE_BYTES:
        return f"plan in the run's dtype (the what-if's `--dtype {name}`)"
    dt = getattr(torch, _torch_dtype_name(run_dtype or ""), None)
    plan_width = DTYPE_BYTES.get(plan_dtype or "")
    ratio = (f", {element_size(dt)}/{plan_width}" if isinstance(dt, torch.dtype) and plan_width else "")
    return (f"divide the run's bytes by the widths' ratio{ratio}, or run in a dtype the what-if plans: memo-sim "
            f"whatif has no {name} (its --dtype plans {', '.join(DTYPE_BYTES)})")


def dtype_line(why: str) -> str:
    """The line under a table whose simulated bytes are in the plan's element width and measured ones in the run's
    (pipeline.md, sppo_pipeline.md; report.md's rows read the same words); ``why``: `dtype_not_comparable`'s words,
    ``... (ran X, plan Y)``, which name the run's and the plan's dtype (`dtype_advice`)."""
    ran = plan = None
    if "(ran " in why:
        ran, _, rest = why.split("(ran ", 1)[1].partition(", plan ")
        plan = rest.rstrip(")") or None
    advice = dtype_advice(ran, plan) if ran else "plan in the run's dtype (the what-if's `--dtype`)"
    return (f"**Bytes: {why}**: the run's offloaded bytes and peaks are in its element width, the simulated ones in "
            f"the plan's, so they differ by the widths' ratio, not by an error of the prediction; to compare them, "
            f"{advice}.")


def _torch_dtype_name(name: str) -> str:
    """torch's name of memo's dtype name ("fp64" -> "float64"; the name itself where it is torch's already)."""
    from memo_exec.device import DTYPES  # noqa: PLC0415

    dt = DTYPES.get(name)
    return str(dt).removeprefix("torch.") if dt is not None else name


def loss_kernel_note(plan) -> str | None:
    """Where the plan is priced with another loss kernel than memo-exec runs: memo-exec computes the loss in its
    chunked head (`memo_exec.model.ChunkedHead`, the simulator's ``chunked`` kernel) whatever the plan's
    ``cross_entropy`` (`memo_sim.cost.loss_kernels`); None where the plan's is that one."""
    ce = plan.layout.cross_entropy
    if ce == "chunked":
        return None
    from memo_sim.api import loss_kernel  # noqa: PLC0415

    mtp = (f", and the loss state of the {plan.model.mtp_layers} multi-token-prediction module(s) kept meanwhile"
           if plan.model.mtp_layers and loss_kernel(ce).kept_fp32 else "")
    return (f"loss kernel: the plan is priced with the {ce} loss (layout cross_entropy), memo-exec runs its chunked "
            f"head (the chunked kernel), so the classifier's time and memory peak{mtp} compare two kernels; plan "
            f"with the chunked kernel (memo-sim's default without --framework) to compare like with like")


def kernel_fusion_note(plan) -> str | None:
    """Where the plan is priced with eager PyTorch's composite norms and activations (``Layout.kernel_fusion``
    ``eager``: XTuner's Hugging Face layers, `memo_sim.model.eager_kernels`): memo-exec runs its own kernels
    (memo_exec/layer.py rms_norm and its SwiGLU), not those; None for any other plan (a compiled one is refused)."""
    if plan.layout.kernel_fusion != "eager":
        return None
    return ("memory-bound kernels: the plan is priced with eager PyTorch's RMSNorm and SwiGLU (layout kernel_fusion "
            "eager: a kernel per tensor op), memo-exec runs its own norm and activation kernels, so the norms' and "
            "activations' time compares two sets of kernels; plan without the framework's kernel_fusion (memo-sim's "
            "default without --framework) to compare like with like")


def rope_note(plan) -> str | None:
    """Where the plan prices a rotary embedding (``Layout.rope`` beside a model with rotary positions,
    `memo_sim.model.rope_kernels`): memo-exec's layers run no rotary op (they encode no positions); None otherwise."""
    if plan.layout.rope == "none" or plan.model.positions != "rotary":
        return None
    return (f"rotary embedding: the plan prices its framework's rotary kernels (layout rope {plan.layout.rope}), "
            f"memo-exec's layers run no rotary op (they encode no positions), so its layers' time lacks them; plan "
            f"without --framework (memo-sim's own data: rope none) to compare like with like")


def ulysses_kept_note(plan) -> str | None:
    """Where the plan's Ulysses backward sends the gradients alone (``Layout.ulysses_bwd_resend`` False: an autograd
    Ulysses, DeepSpeed's or TransformerEngine's): memo-exec's `UlyssesAttention` then keeps the forward's head-sharded
    q, k, v and output for the backward beside the sequence-sharded ones its policy stores, where the simulator prices
    what the framework keeps, the head-sharded tensors and the output projection's sequence-sharded input
    (`memo_sim.cost.activations.ulysses_kept_scale`): memo-exec holds the sequence-sharded q, k, v more
    (memo_exec/distributed/attention.py); None where the plan re-sends them or has no Ulysses."""
    lay = plan.layout
    if lay.ulysses == 1 or lay.ulysses_bwd_resend:
        return None
    return ("Ulysses backward: as the plan prices it, memo-exec sends the gradients alone and keeps the forward's "
            "head-sharded q, k, v and output for the backward, beside the sequence-sharded ones its policy stores "
            "(the simulator prices what the framework keeps: the head-sharded ones and the output projection's "
            "input), so the kept-activation row reads the sequence-sharded q, k, v above the prediction; plan "
            "without --framework (memo-exec re-sends them) to compare memory like with like")


def head_grads_note(plan) -> str | None:
    """Where the plan's framework reduce-scatters the output head's gradient before the embedding's is made
    (``Layout.head_grads_unit`` False under ZeRO 2 / 3, an untied head: `memo_sim.cost.memory`'s
    ``unsharded_grads``): memo-exec holds the embedding's, the head's and the final norm's gradients whole together
    until the step (its first gradient unit, memo_exec/distributed/zero.py); None where the plan prices that or the
    difference does not arise."""
    lay = plan.layout
    if lay.head_grads_unit or lay.zero < 2 or plan.model.tied_embeddings:
        return None
    return ("gradient unit of the embedding and head: the plan's framework reduce-scatters the output head's "
            "gradient before the embedding's is made; memo-exec holds both, with the final norm's, whole until the "
            "step (its first gradient unit), so the model-state row reads up to one vocabulary matrix's gradient "
            "above the prediction; plan without --framework to compare like with like")


def pipeline_rank0_prediction(plan, sim, sim_note: str = "the re-simulation") -> dict | None:
    """A pipeline's predictions of rank 0's stage (the simulator's device 0, whose measurements the totals show)
    for the two rows whose iteration figure is not that stage's: ``{"pinned": (bytes | None, words), "exposed":
    (seconds | None, words), "from": sim_note}``, a None value with ``words`` saying why it is not comparable; None
    where the plan is no pipeline or there is no re-simulation (the rows as they were).

    - pinned host memory: the simulator's figure is the fullest node's peak, every stage's blocks on it together
      (`memo_sim.engine.schedules.microbatch`: an offload holds its host block from the offload's start to its
      prefetch's end, a device's bytes times the GPUs it stands for). Rank 0's is that peak's share its device's
      blocks make: the blocks in flight swept over the predicted timeline's offload and prefetch spans (their copied
      bytes, which are the blocks' bytes over one ratio, as every unit's block is alike), device 0's peak over the
      node's. Not comparable where the node's host bytes are not the offloads' (the optimizer's states on the host).
    - exposed copy time: the simulator's is its most exposed GPU's (the largest wait on copies). Rank 0's stage's
      is 0 where it copies nothing, the iteration's where no other stage copies; else not comparable."""
    if getattr(plan.layout, "pp", 1) <= 1 or sim is None or getattr(sim, "timeline", None) is None:
        return None
    tl = sim.timeline
    stages = ((tl.meta or {}).get("pipeline") or {}).get("stages") or []
    dev = {int(r.get("device", r["stage"])): r for r in stages}
    node0 = (dev.get(0) or {}).get("node", 0)
    copies = [e for e in tl.events if e.stream in ("d2h", "h2d")]
    mine = [e for e in copies if e.device == 0]
    out: dict = {"from": sim_note}
    rows0 = [r for r in (getattr(sim, "pipeline", None) or {}).get("stages") or [] if r.get("stage") == 0]
    peak0 = rows0[0].get("peak_gpu_bytes") if rows0 else None  # stage 0: rank 0's
    if isinstance(peak0, (int, float)) and peak0 > 0:  # the device memory rows: rank 0's stage's, not the fullest's
        out["peak"] = (float(peak0), "its stage's simulated peak")
    if not mine:
        out["exposed"] = (0.0, "rank 0's stage copies nothing")
    elif all(e.device == 0 for e in copies):
        out["exposed"] = (float(sim.exposed_copy_s), "the only stage that copies")
    else:
        out["exposed"] = (None, "the prediction is the most exposed stage's, and other stages than rank 0's copy too")
    node_peak = float(sim.peak_host_bytes_per_node or 0.0)
    if getattr(plan.layout, "optimizer_offload", False):
        out["pinned"] = (None, "the prediction is the node's, every stage's optimizer states on the host with it, "
                               "and no stage's share of it")
        return out

    def held_peak(devices) -> float:
        steps = []
        for e in tl.events:
            if e.device not in devices:
                continue
            w = max(1, int((dev.get(e.device) or {}).get("gpus_on_node", 1))) if len(devices) > 1 else 1
            if e.stream == "d2h" and e.phase == "offload":
                steps.append((e.start, 1, e.nbytes * w))
            elif e.stream == "h2d" and e.phase == "prefetch":
                steps.append((e.end, 0, -e.nbytes * w))
        cur = peak = 0.0
        for _t, _o, d in sorted(steps):  # a free before an allocation at the same instant
            cur += d
            peak = max(peak, cur)
        return peak

    # the stages on rank 0's node (a timeline without them: every device that copies, as one node's)
    on_node = ({d for d, r in dev.items() if r.get("node", 0) == node0} if dev else {e.device for e in copies}) or {0}
    node_held = held_peak(on_node)
    if node_peak <= 0:
        out["pinned"] = (0.0, "the node's, which holds none")
    elif node_held <= 0:
        out["pinned"] = (None, "the prediction is the node's, and no stage's offloads make it")
    else:
        out["pinned"] = (node_peak * held_peak({0}) / node_held, "its stage's share of the node's peak")
    return out


def grad_sync_note(plan) -> str | None:
    """Where the plan prices a data-parallel collective overlapped that memo-exec runs exposed
    (memo_exec/distributed/zero.py, `GradSync`), one sentence, else None. A schedule that runs its layers with the
    layer hooks (`memo_exec.distributed.schedule.Schedule.calls_layer_hooks`: one stage, 1F1B, interleaved 1F1B)
    overlaps them as priced: each layer's reduction beside the next backward (``layout.grad_overlap``), ZeRO 1 / 2's
    updated weights gathered beside the next forward (``layout.param_gather`` ``overlap``), ZeRO 3's gathers a layer
    ahead. One that does not (SPPO's, ZeRO 0 or 1) reduces every gradient unit after the whole backward
    (`GradSync.end_backward`) and gathers ZeRO 1's weights after the optimizer step (`GradSync.step`). Only where
    the weights have replicas (``layout.state_shards``: dp x cp x ulysses > 1; one rank a group runs no
    collective)."""
    from memo_exec.distributed.schedule import SCHEDULES, registered  # noqa: PLC0415
    from memo_exec.errors import ExecError  # noqa: PLC0415

    lay = plan.layout
    if getattr(lay, "state_shards", 1) <= 1:
        return None
    registered()
    try:
        if SCHEDULES.get(getattr(plan, "schedule", "single_stage")).calls_layer_hooks:
            return None
    except ExecError:  # a schedule this executor does not run: refused before the run, nothing to note
        return None
    z = lay.zero
    parts = []
    if getattr(lay, "grad_overlap", False) and z <= 1:
        op = "all-reduce" if z == 0 else "reduce-scatter"
        parts.append(f"its gradient {op} overlapped with the backward (layout grad_overlap), memo-exec under the "
                     f"{plan.schedule} schedule {op}s every gradient unit after the whole backward")
    if z == 1 and getattr(lay, "param_gather", "") == "overlap":
        parts.append("its updated-weight all-gather overlapped with the next forward (layout param_gather overlap), "
                     "memo-exec all-gathers every unit's weights after the optimizer step, before the next forward")
    if not parts:
        return None
    return (f"data-parallel collectives: the plan prices {'; and '.join(parts)}, so the dp_comm stream's exposed "
            f"time and the iteration time read above the prediction by what the plan hides")


def reduce_bucket_note(plan) -> str | None:
    """Where the plan prices ZeRO 2 / 3's gradient buckets at a size its framework states (``layout.reduce_bucket``:
    XTuner's DeepSpeed reduce_bucket_size) and memo-exec reduces a layer's gradients at a time
    (memo_exec/distributed/zero.py, `GradSync`), one sentence, else None."""
    lay = plan.layout
    bucket = getattr(lay, "reduce_bucket", 0)
    if not bucket or lay.zero < 2 or getattr(lay, "state_shards", 1) <= 1:
        return None
    if bucket >= plan.model.layer_params() / lay.tp:  # no smaller than a layer on a GPU: priced as a layer's
        return None
    return (f"gradient buckets: the plan prices ZeRO {lay.zero}'s whole gradients in buckets of {bucket:,} elements "
            f"(layout reduce_bucket, its framework's stated size), memo-exec holds a layer's in each of its "
            f"workspaces, so the model_states row reads apart from the prediction by the difference")


def fsdp_copies_note(plan) -> str | None:
    """Where the plan prices FSDP2's copies on the compute stream (``layout.fsdp_copies``: each layer's gathered
    weights copied out of the all-gather's buffer, its gradients into the reduce-scatter's input) and memo-exec gathers
    into and reduces from the flat buffers its parameters and gradients are views of (memo_exec/distributed/zero.py),
    one sentence, else None."""
    lay = plan.layout
    if not getattr(lay, "fsdp_copies", False) or lay.zero < 3 or getattr(lay, "state_shards", 1) <= 1:
        return None
    return ("FSDP copies: the plan prices FSDP2's copies on the compute stream (layout fsdp_copies: each layer's "
            "gathered weights out of the all-gather's buffer, its gradients into the reduce-scatter's input), "
            "memo-exec gathers into and reduces from its parameters' own flat buffers, so its layers' forward and "
            "backward read below the prediction by them; plan without --framework to compare like with like")


def optimizer_impl_note(plan) -> str | None:
    """Where the plan prices the Adam step as torch.optim's foreach kernels (``layout.optimizer_impl`` foreach:
    torchtitan 9dec370's default) and memo-exec runs torch.optim's fused kernel (`memo_exec.optim`), one sentence,
    else None."""
    lay = plan.layout
    if getattr(lay, "optimizer_impl", "fused") != "foreach" or getattr(lay, "optimizer_offload", False):
        return None
    return ("optimizer step: the plan prices AdamW as torch.optim's foreach kernels (layout optimizer_impl foreach, "
            "a pass over the tensors per op of the update), memo-exec runs the fused kernel, so its step reads below "
            "the prediction; plan without --framework to compare like with like")


def host_pool_note(plan, meta: dict) -> str | None:
    """Where the plan prices PyTorch's caching host allocator (``layout.host_pool`` caching_host_allocator: each
    offloaded tensor pinned on its own, rounded up as the profile's ``host.pinned_rounding`` says, a power of two for
    PyTorch, `memo_sim.policy.host_layout`) and the run offloaded into memo-exec's one registered pool of exact sizes
    (`memo_exec.activations.host_pool`), one sentence, else None."""
    if getattr(plan.layout, "host_pool", "") != "caching_host_allocator" or not (meta.get("pinned_host_bytes") or 0):
        return None
    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    try:
        rounding = load_profile(plan.profile).host.pinned_rounding
    except MemoError:  # a profile written elsewhere: PyTorch's allocator rounds to a power of two
        rounding = "power_of_two"
    if rounding == "none":  # the profile rounds nothing: the two pools hold the same bytes
        return None
    words = {"power_of_two": "up to a power of two", "page": "up to whole pages"}.get(rounding, f"as {rounding}")
    return (f"host pool: the plan prices PyTorch's caching host allocator (layout host_pool caching_host_allocator: "
            f"each offloaded tensor pinned on its own and rounded {words}, the profile's host.pinned_rounding), "
            f"memo-exec holds them in its one registered pool at their exact sizes, so the pinned host memory row "
            f"reads below the prediction by that rounding; plan without --framework (the registered pool) to compare "
            f"like with like")


def plan_notes(plan, meta: dict) -> list[str]:
    """Where this run did otherwise than the plan priced, one sentence each (the bold lines of report.md and the
    run's --json ``plan_notes``): the attention kernel (`memo_exec.attention.priced_kernel_note`), the loss kernel,
    the eager kernels, the rotary embedding, the Ulysses backward, the embedding's and head's gradient unit, the
    data-parallel collectives' overlap, the gradient buckets, FSDP2's copies, the optimizer's kernels and the pinned host pool."""
    from memo_exec.attention import priced_kernel_note  # noqa: PLC0415

    kernel = priced_kernel_note(meta.get("attention_kernel_priced"), meta.get("attention_backend"),
                                meta.get("device_kind"))
    notes = [kernel.removeprefix("note: ") if kernel else None, loss_kernel_note(plan), kernel_fusion_note(plan),
             rope_note(plan), ulysses_kept_note(plan),
             head_grads_note(plan), grad_sync_note(plan), reduce_bucket_note(plan), fsdp_copies_note(plan),
             optimizer_impl_note(plan), host_pool_note(plan, meta)]
    return [n for n in notes if n]


def _estimate_total(res: RunResult):
    """The executor's whole-peak estimate, or None where it holds part of the terms only (a distributed rank's
    estimate without the plan's transient terms, or with activations autograd keeps, which are not sized before the
    step: `memo_exec.memory_estimate.MemoryEstimate.not_estimated`, `estimate_missing_why`): a partial sum against
    the predicted peak would read as an error."""
    if "peak_total" in getattr(res.estimate, "not_estimated", ()):
        return None
    return res.meta["memory_estimate_total_bytes"]


UNSIZED_TERMS = ACTIVATION_TERMS  # a policy's activations (`unsized_terms`)


def estimate_missing_why(res: RunResult) -> str | None:
    """Why the executor's total is not made (`_estimate_total` None), in words for the headline row, or None where it
    is: a policy's activations kept by autograd (`memo_exec.activations.base.ActivationPolicy.unsized_terms`, SPPO's),
    or a distributed rank's transient terms, which neither a meta-device dry run (no collectives) nor the plan made."""
    ne = getattr(res.estimate, "not_estimated", ())
    if "peak_total" not in ne:
        return None
    unsized = [k for k in UNSIZED_TERMS if k in ne]
    if unsized:
        return (f"the executor's total is not made: under the {res.plan.policy.name} policy autograd keeps the "
                f"activations ({', '.join(unsized)}), not sized before the step")
    return "the executor's total is not made: its transient terms are not estimated (see the memory terms)"


def _replica_gpus(res: RunResult) -> int:
    """What ``meta["tokens"]`` is spread over: a multi-rank run's tokens are the whole job's (batch x seq x
    dp, `memo_exec.distributed.runner.DistExecutor.describe`), so every rank; one process runs its replica's
    batch x seq alone."""
    world = int(res.meta.get("world") or 1)
    return world if world > 1 else 1


def ep_unpriced_note(seconds: float) -> str:
    """The line under a MoE run's stream rows: what its ep_comm rows leave out."""
    from memo_exec.compare import UNPRICED_EP_OPS  # noqa: PLC0415

    return (f"ep_comm's rows hold the dispatch and combine all-to-alls the simulator prices, as the per-layer "
            f"all-to-all table does; the executor's {', '.join(f'`{o}`' for o in UNPRICED_EP_OPS)} (the per-expert "
            f"counts, the copies' router weights and the deepep dispatcher's slots), which no simulator op prices, "
            f"took {_fmt(seconds, 's')} more a step (measured, not in these rows).")


def alltoall_markdown(rows: list[dict], simulation: str, world: int = 1, tpct=None) -> str:
    """The per-layer MoE all-to-all table of report.md (`memo_exec.compare.alltoall_rows`)."""
    from memo_exec.compare import alltoall_names  # noqa: PLC0415

    tpct = tpct or _pct
    who = "rank 0's" if world > 1 else "the run's"
    L = ["## MoE all-to-all per layer: measured vs predicted\n",
         f"The expert-parallel token dispatch and combine all-to-alls of each MoE layer (stream ep_comm: "
         f"{alltoall_names()}, forward, recompute and backward summed; n = how "
         f"many each side counted). Measured: {who} spans, median over the steady steps (on CPU the wall time "
         f"around each blocking collective, the wait for a later peer included); predicted: {simulation}.\n",
         "| layer | predicted | n | measured | n | measured / predicted | rel. error |",
         "|---:|---:|---:|---:|---:|---:|---:|"]
    from memo_sim.units import fmt_time  # noqa: PLC0415

    t = lambda v: "—" if v is None else fmt_time(v)  # noqa: E731 - microseconds where they are
    for r in rows:
        err = time_error_cell(r, tpct)
        # no ratio beside an error that is not comparable (another machine's times): it would be that error plus one
        ratio = "—" if r["ratio"] is None or err.startswith(NOT_COMPARABLE) else f"{r['ratio']:.2f}"
        L.append(f"| {r['layer']} | {t(r['predicted_s'])} | {r['predicted_count']} | "
                 f"{t(r['measured_s'])} | {r['measured_count']} | {ratio} | {err} |")
    return "\n".join(L)


def _exposed_row(pred: dict, st: dict, source: str, rank0: dict | None = None) -> tuple:
    """The exposed copy time, measured (rank 0's) against its prediction: the iteration's (the simulator's most
    exposed GPU), or on a pipeline rank 0's stage's where `pipeline_rank0_prediction` knows it, else said not
    comparable (a sixth element: why)."""
    what = "exposed copy time"
    got = (rank0 or {}).get("exposed")
    if got is None:
        return (what, "s", pred.get("exposed_copy_s"), st.get("exposed_copy_s"), source)
    value, words = got
    if value is None:
        return (f"{what} (rank 0's; {words})", "s", pred.get("exposed_copy_s"), st.get("exposed_copy_s"), source,
                f"{NOT_COMPARABLE} ({words})")
    return (f"{what} (rank 0's; predicted: {words})", "s", value, st.get("exposed_copy_s"),
            rank0.get("from", source))


def _peak_rows(res: RunResult, pred: dict, source: str, rank0: dict | None, cuda: bool) -> list[tuple]:
    """The device memory rows: measured peak and the executor's estimate against the prediction: the plan's (the
    fullest stage's for a pipeline) or, for a multi-rank pipeline, rank 0's own stage's (``rank0["peak"]``,
    `pipeline_rank0_prediction`), the stage the memory table below compares term by term (a review: the two tables
    read +58% and +7% for one estimate)."""
    pred_peak, src = pred.get("peak_gpu_bytes"), source
    got = (rank0 or {}).get("peak")
    if got is not None and int(res.meta.get("world") or 1) > 1:
        # the names kept (`memo_exec.validate` reads the rows by name); the source says whose
        pred_peak, src = got[0], f"rank 0's stage: {got[1]} ({rank0.get('from', source)})"
    why_est = estimate_missing_why(res)
    return [("peak device memory (allocated)", "bytes", pred_peak,
             res.steady.get("peak_allocated_bytes") if cuda else None, src),
            ("executor's memory estimate", "bytes", pred_peak, _estimate_total(res),
             src + (f"; {why_est}" if why_est else ""))]


def _pinned_row(res: RunResult, pred: dict, source: str, rank0: dict | None = None) -> tuple:
    """The pinned host pool, measured against its prediction. The simulator predicts a node's pool
    (every GPU of the node); one rank of a multi-rank run holds its own GPU's share of it, so that
    rank is compared with the node's prediction over the ranks on the node (the plan's GPUs per
    node, at most the world size): the same quantity on both sides where the ranks are alike. A pipeline's
    stages are not (one may offload where another does not): rank 0 is compared with its own stage's
    prediction (``rank0["pinned"]``, `pipeline_rank0_prediction`), or the row says it is not comparable (a sixth
    element: why)."""
    node = pred.get("peak_host_bytes_per_node")
    mine = res.meta.get("pinned_host_bytes")
    what = "pinned host memory"
    if res.plan.layout.optimizer_offload and mine is not None:  # the prediction holds the optimizer's states too
        mine += int(res.meta.get("host_optimizer_bytes") or 0)
        what = "host memory (pinned pool + the optimizer's states on the host)"
    world = int(res.meta.get("world") or 1)
    got = (rank0 or {}).get("pinned")
    if got is not None and world > 1:
        value, words = got
        if value is None:
            return (f"{what} (rank 0; {words})", "bytes", None, mine, source, f"{NOT_COMPARABLE} ({words})")
        return (f"{what} (rank 0; predicted: {words})", "bytes", value, mine, rank0.get("from", source))
    if world <= 1:
        return (what, "bytes", node, mine, source)
    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    try:
        per_node = min(world, load_profile(res.plan.profile).node_gpus)
    except MemoError:
        per_node = world
    share = None if node is None else node / per_node
    per = f"the node's over its {per_node} ranks" if per_node > 1 else "the node's, one rank a node in the profile"
    return (f"{what} (this rank; predicted: {per})", "bytes", share, mine, source)


def _fmt(v, unit: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if unit == "bytes":
        return f"{v / GiB:.3f} GiB"
    if unit == "s":
        return f"{v * 1e3:.3f} ms" if abs(v) < 1 else f"{v:.3f} s"
    if unit == "tok/s":
        return f"{v:,.0f}"
    if unit == "":
        return f"{v:.3f}"
    return f"{v}"


def _atomic_png(draw, path: Path) -> Path:
    """Let ``draw(tmp_path)`` write a PNG next to ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        draw(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# report.md's figures: (key, file, title), in the order its "Figures" section shows them
FIGURES = (("overlay", "gantt_overlay.png", "Predicted (light, upper) over measured (dark, lower) streams, last step"),
           ("timeline", "timeline.png", "Streams over the middle layers (last step)"),
           ("memory", "memory.png", "Memory over the step"), ("layers", "layers.png", "Per-layer times"))


def _run_meta(res: RunResult, cmp_: Comparison, plan_path) -> dict:
    """The meta of the run's measured timeline and report (rank 0's)."""
    meta = dict(res.meta)
    meta.update({"plan_file": str(plan_path) if plan_path else None, "steady_state": res.steady,
                 "steps": res.summaries, "comparison": cmp_.totals, "streams": cmp_.streams, "ops": cmp_.ops,
                 "memory_comparison": cmp_.memory, "prediction": {"totals": cmp_.source,
                                                                  "streams_and_ops": cmp_.simulation},
                 "predicted": res.plan.predicted.to_dict(), "layer_timings_s": res.plan.layer_timings_s,
                 "middle_layer": meta["layers"] // 2})
    return meta


def rank0_draws(res: RunResult, cmp_: Comparison, tl: Timeline, meta: dict) -> dict:
    """Each figure of `FIGURES` drawn from rank 0's run: a function of the PNG's path that writes it and
    returns the path, or why it is not drawn (the overlay without a predicted timeline)."""
    last = res.summaries[-1]
    draws = {"timeline": lambda p: _atomic_png(lambda q: gantt_figure(tl, q), p),
             "memory": lambda p: _atomic_png(lambda q: memory_figure(tl, q), p),
             "layers": lambda p: layer_figure(cmp_.layer_timings, [("", res.steady)], [("", last["per_layer"])],
                                              last["step"], p, predicted_from=cmp_.layer_timings_from)}
    draws["overlay"] = ((lambda p: overlay_gantt(cmp_.predicted_timeline, tl, p, f"{meta['model']} {meta['policy']}: "
                                                 "predicted vs measured (last step)"))
                        if cmp_.predicted_timeline is not None else cmp_.simulation)
    return draws


def write_outputs(res: RunResult, out_dir: str | Path, plan_path: str | Path | None = None, figures: bool = True
                  ) -> tuple[dict[str, Path], Comparison]:
    """measured.json, trace.json, the figures and report.md of rank 0's run. ``figures`` False: the figures
    are left to the caller, which draws them with every rank (`rank_figures`: a multi-rank run; rank 0's
    drawings would be drawn over), and report.md links them where they will be."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cmp_ = compare_run(res)
    meta = _run_meta(res, cmp_, plan_path)
    tl: Timeline = timeline_from_step(res.steps[-1], meta)
    paths = {"measured": tl.write_json(out / "measured.json"), "trace": write_chrome_trace(tl, out / "trace.json")}
    draws = rank0_draws(res, cmp_, tl, meta)
    figs: dict = {}
    for key, fname, _title in FIGURES:
        draw = draws[key]
        if isinstance(draw, str):
            figs[f"{key}_error"] = draw
        elif not figures:
            figs[key] = out / fname
        else:
            try:
                figs[key] = draw(out / fname)
            except Exception as e:  # noqa: BLE001 - a figure problem must not lose the measurements
                figs[f"{key}_error"] = f"{type(e).__name__}: {e}"
    paths.update({k: v for k, v in figs.items() if isinstance(v, Path)})
    paths["report"] = atomic_write_text(out / "report.md", render_markdown(res, cmp_, figs, meta))
    return paths, cmp_


def _pct(v) -> str:
    return "—" if v is None else f"{v * 100:+.1f}%"


NOT_COMPARABLE = "not comparable"


def _not_comparable(v) -> str:
    """A relative error that compares two different things (two machines, two element widths)."""
    return "—" if v is None else NOT_COMPARABLE


def time_error_cell(row: dict, tpct=None) -> str:
    """report.md's cell of a time row's relative error: "not comparable" where the row says so
    (`mark_times_not_comparable`), else ``tpct`` (default `_pct`) of its error."""
    return NOT_COMPARABLE if row.get("not_comparable") else (tpct or _pct)(row["rel_error"])
TIME_UNITS = ("s", "tok/s", "")  # quantities of speed: a prediction for the profile's device only


def profile_device_kind(profile: str) -> str | None:
    """The kind of device the plan's profile describes (`HardwareProfile.device_kind`), None when
    it cannot be read."""
    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    try:
        return load_profile(profile).device_kind
    except MemoError:
        return None


def times_comparable(meta: dict, profile: str) -> bool:
    """Whether the plan's predicted times are predictions of this run: not when its profile
    describes another kind of device (a GPU profile's plan run on a CPU)."""
    return times_not_comparable(meta, profile) is None


def times_not_comparable(meta: dict, profile: str) -> str | None:
    """Why the plan's predicted times are not predictions of this run, ``not comparable (the plan's profile P
    describes a cuda device, this ran on cpu)`` (the flag of the JSON rows whose relative error is then None,
    `mark_times_not_comparable`), or None where they are (`times_comparable`)."""
    kind = profile_device_kind(profile)
    ran = "cuda" if meta["device_kind"] == "cuda" else "cpu"
    if kind is None or kind == ran:
        return None
    return f"{NOT_COMPARABLE} (the plan's profile {profile} describes a {kind} device, this ran on {ran})"


def cpu_speed_lines(m: dict) -> list[str]:
    """A CPU run's torch threads against its profile's calibration, and the machine's speed during the run
    (the reference GEMM of `memo_exec.speed_probe`) against the calibration's: the two causes of CPU times far
    from the prediction that a report should name."""
    out = []
    th = m.get("cpu_threads") or {}
    if th:
        cal = th.get("calibrated")
        off = cal is not None and th["threads"] != cal
        out.append(f"- {'**' if off else ''}CPU threads: {th['threads']} (set by {th['set_by']}"
                   + (f"; the profile was calibrated with {cal}" if cal is not None else "") + ")"
                   + (": the profile's rates hold for its count; unset OMP_NUM_THREADS to use it**" if off else ""))
    probe = m.get("speed_probe") or {}
    from memo_exec.speed_probe import SPEED_DRIFT_LIMIT, drift  # noqa: PLC0415

    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    try:
        calibration = (load_profile(m["profile"]).provenance or {}).get("speed_probe") if m.get("profile") else None
    except MemoError:  # a profile written on another machine: the line says what is known
        calibration = None
    d = drift(probe, calibration) if probe and calibration else None
    if probe.get("median_gflops") is not None:
        ranks = probe.get("ranks_median_gflops") or {}
        who = (f" (rank {probe['rank']}'s, the slowest of {len(ranks)} ranks: "
               + ", ".join(f"{r}: {v}" for r, v in ranks.items()) + ")") if len(ranks) > 1 else ""
        line = f"the reference GEMM ran at {probe['median_gflops']} GFLOP/s during the run{who}"
        if d is not None:
            far = abs(d) > SPEED_DRIFT_LIMIT
            line += (f", {100 * d:+.0f}% from the calibration's {calibration.get('median_gflops')} GFLOP/s"
                     + (": the machine ran at another speed than the profile measured, so times are off by as "
                        "much" if far else ""))
            line = f"**{line}**" if far else line
        out.append(f"- machine speed: {line}")
    return out


def offload_line(pd: dict, pinned_bytes: int) -> str:
    """The memory section's line on a token-wise offloading policy (its ``describe()``): what goes to host, whole or
    by its first rows; a part with no tensor is left out."""
    moved = [f"{', '.join(pd['whole'])} whole"] if pd["whole"] else []
    if pd["split"]:
        moved.append(f"{', '.join(pd['split'])}: first {pd['offload_tokens']} of {pd['tokens']} tokens")
    # a pipeline rank's rule runs over its (layer, micro-batch) units (`memo_exec.pipeline.schedules.PolicySet`)
    what = (f"{pd['offloaded_units']} of the rank's {pd['units']} (layer, micro-batch) units" if "units" in pd
            else f"{pd['offloaded_layers']} layers")
    return (f"- offload: {what}; per layer {pd['layer_offload_bytes'] / GiB:.4f} GiB "
            f"({'; '.join(moved) or 'nothing'}); pinned pool {pinned_bytes / GiB:.4f} GiB")


def iteration_tokens_words(m: dict) -> str:
    """The tokens an iteration trains, for report.md's title: ``meta["tokens"]`` (`memo_exec.runner.Executor.describe`:
    batch x sequence, a multi-rank run's x dp, `memo_exec.distributed.runner`), with the sequences and their length
    where there are several (a review: a pp 2 run of batch 4 read "256 tokens", one sequence's, for 1,024)."""
    seq, tokens = m["seq_tokens"], m.get("tokens") or m["seq_tokens"]
    n = tokens // seq if seq else 1
    return f"{tokens:,} tokens an iteration" + (f" ({n:,} sequences of {seq:,})" if n > 1 else " (one sequence)")


def render_markdown(res: RunResult, cmp_: Comparison, figs: dict, meta: dict | None = None) -> str:
    m, p = (meta or res.meta), res.plan
    st = res.steady
    rows, source = cmp_.totals, cmp_.source
    same = times_comparable(m, p.profile)
    tpct = _pct if same else _not_comparable  # a speed's relative error
    L = []
    L.append(f"# memo-exec run: {m['model']} — {m['policy']} — {iteration_tokens_words(m)}\n")
    L.append(f"- device: {m['device']}, dtype {m['dtype']}, attention backend {m['attention_backend']} "
             f"(asked: {m['attention_backend_requested']})")
    if m.get("gemm_format", "bf16") != "bf16":  # the layer's linear GEMMs in another format (`memo_exec.gemm_formats`)
        from memo_exec.gemm_formats import GEMMS  # noqa: PLC0415

        L.append(f"- layer GEMMs: {m['gemm_format']} ({GEMMS[m['gemm_format']].words})")
    # where the run did otherwise than the plan priced (`plan_notes`): the attention kernel's first, as before
    from memo_exec.attention import priced_kernel_note  # noqa: PLC0415

    kernel = priced_kernel_note(m.get("attention_kernel_priced"), m.get("attention_backend"), m.get("device_kind"))
    kernel = kernel.removeprefix("note: ") if kernel else None
    notes = [n for n in (cmp_.notes or plan_notes(p, m)) if n != kernel]
    if kernel:  # another kernel than the plan was priced on: its times compare two kernels
        L.append(f"- **{kernel}**")
    L.append(f"- plan: {m.get('plan_file') or '(in memory)'}; profile {p.profile}; layout {m['layout']}; "
             f"batch {p.batch}; classifier chunk {m['classifier_chunk_tokens']} tokens; data {m['data']}")
    if m["layers"] != m["plan_layers"]:
        L.append(f"- **ran {m['layers']} of the plan's {m['plan_layers']} layers (`--layers {m['layers']}`)**: "
                 f"whole-iteration predictions from {source}; per-layer ones from {cmp_.layer_timings_from}.")
    else:
        L.append(f"- all {m['layers']} layers run")
    if cmp_.stale:
        L.append(f"- **{stale_line(cmp_.stale)}**")
    for note in notes:
        L.append(f"- **{note}**")
    from memo_exec.activations.registry import moe_block_note  # noqa: PLC0415

    note = moe_block_note(p.model, p.policy.name)
    if note:  # where the executor runs the MoE block otherwise than the simulator prices it (as validate says)
        L.append(f"- **MoE block under {note}**")
    if m.get("oversubscribed"):  # a multi-rank CPU run whose ranks and other processes wanted more cores than there are
        L.append(f"- **{m['oversubscribed']}**")
    # `memo_exec.measure.steady_state`: `steady_value` (the median) of each time, max() of each memory peak
    L.append(f"- steps: {len(res.summaries)}; steady state: the median of each time, the maximum of each memory "
             f"peak, over steps {st['steps_averaged']} "
             f"(step 0 includes warm-up when more than one step ran)")
    if m["device_kind"] != "cuda":
        L.append("- **CPU run**: times are host times of CPU kernels and thread copies, memory is the process RSS; "
                 "they test the executor, not the GPU predictions. MFU is not computed on a CPU.")
        L += cpu_speed_lines(m)
    if not same:
        L.append(f"- **the plan's profile ({p.profile}) describes a {profile_device_kind(p.profile)} device, this "
                 f"ran on {m['device_kind']}**: its predicted times are not predictions of this run, so their "
                 f"relative errors read \"{NOT_COMPARABLE}\" (they would be thousands of percent); to compare, "
                 f"run on the profile's device, or calibrate this machine (`memo-exec calibrate --device cpu "
                 f"--quick`) and run with `--profile` set to that profile.")
    L.append("")
    L.append("## Measured vs predicted\n")
    L.append("| quantity | predicted | measured | rel. error | predicted from |")
    L.append("|---|---:|---:|---:|---|")
    for r in rows:
        pct = tpct if r["unit"] in TIME_UNITS else _pct
        # bytes of another element width (`totals_rows`) say why in the cell; another device's times, said above the
        # table, read "not comparable" (`mark_times_not_comparable`)
        err = (NOT_COMPARABLE if r["unit"] in TIME_UNITS else r["not_comparable"]) if r.get("not_comparable") \
            else pct(r["rel_error"])
        L.append(f"| {r['quantity']} | {_fmt(r['predicted'], r['unit'])} | {_fmt(r['measured'], r['unit'])} | "
                 f"{err} | {r['predicted_from']} |")
    L.append("")
    L.append("Relative error = (measured − predicted) / predicted. Layer times are sums of the compute-stream ops "
             "of one layer (stalls excluded), averaged over layers; offload/prefetch are the copy-stream spans of "
             "one layer; exposed copy time is the time the compute stream waited on copy events in the whole "
             "iteration.")
    slow = slowest_rank_words(m.get("slowest_rank"))
    if slow:  # a multi-rank run: the rows are rank 0's (`compare_run`); a synchronous step is its slowest rank's
        L.append(f"The measured rows are rank 0's, as the simulator's first GPU is predicted; {slow}. A synchronous "
                 f"step lasts as long as its slowest rank; every rank's times are under \"Per rank\".")
    if m["device_kind"] == "cuda":
        L.append(f"Peak device memory is the caching allocator's peak allocated; its peak reserved was "
                 f"{_fmt(st['peak_reserved_bytes'], 'bytes')}. Pinned host memory is the page-locked offload pool.")
    else:
        L.append("On a CPU there is no device memory to measure: the process RSS holds the model, the activations "
                 "and the host pool of the offloaded activations together (the pool is part of the RSS, not "
                 "beside it); pinned host memory is the pool's size.")
    L.append("")
    L.append(f"## Streams: measured vs predicted\n\nPredicted: {cmp_.simulation}. Measured: median over the steady "
             f"steps. busy = time the stream runs ops (compute stalls excluded); overlapped = busy time during "
             f"which the other side also runs (copy and METP ring streams: compute; compute: either copy stream); "
             f"exposed = busy − overlapped.\n")
    L.append("| stream | quantity | predicted | measured | rel. error |")
    L.append("|---|---|---:|---:|---:|")
    for r in cmp_.streams:
        L.append(f"| {r['stream']} | {r['quantity']} | {_fmt(r['predicted_s'], 's')} | {_fmt(r['measured_s'], 's')} | "
                 f"{time_error_cell(r, tpct)} |")
    if cmp_.ep_unpriced_s is not None:
        L.append("")
        L.append(ep_unpriced_note(cmp_.ep_unpriced_s))
    L.append("")
    L.append("## Per layer and op class: measured vs predicted\n")
    L.append("| layer | op | predicted | measured | rel. error |")
    L.append("|---:|---|---:|---:|---:|")
    for r in cmp_.ops:
        layer = "head" if r["layer"] is None else r["layer"]
        L.append(f"| {layer} | {r['op']} | {_fmt(r['predicted_s'], 's')} | {_fmt(r['measured_s'], 's')} | "
                 f"{time_error_cell(r, tpct)} |")
    if cmp_.alltoall:
        L.append("")
        L.append(alltoall_markdown(cmp_.alltoall, cmp_.simulation, m.get("world", 1), tpct))
    elif p.model.moe and p.layout.ep > 1:  # an expert-parallel plan: say why there is no table, not nothing
        L.append("")
        L.append("## MoE all-to-all per layer: not compared (neither the run nor the prediction "
                 f"({cmp_.simulation}) has a dispatch or combine all-to-all)")
    L.append("")
    L.append("## Memory: the executor's estimate vs the simulator's breakdown\n")
    L.append("Term by term (bytes on the device; `memo_exec.memory_estimate` documents each term). "
             "A simulator value of 0 marks a term the simulator does not count.\n")
    L.append("| term | simulator | executor | rel. error |")
    L.append("|---|---:|---:|---:|")
    plan_width = DTYPE_BYTES.get(p.model.dtype)
    run_width = element_size(getattr(torch, m["dtype"]))
    widths_differ = dtype_not_comparable(p.model.dtype, m["dtype"]) is not None
    # another element width: every term's error would be the widths' ratio, not the estimate's
    mpct = _not_comparable if widths_differ else _pct
    for r in cmp_.memory:
        L.append(f"| {r['term']} | {_fmt(r['simulator_bytes'], 'bytes')} | {_fmt(r['executor_bytes'], 'bytes')} | "
                 f"{mpct(r['rel_error'])} |")
    if widths_differ:
        L.append("")
        L.append(f"The simulator counts the plan's {p.model.dtype} ({plan_width} bytes per element); this run computes "
                 f"in {m['dtype']} ({run_width} bytes), so activation and model-state terms differ by that ratio and "
                 f"their relative errors read \"{NOT_COMPARABLE}\" (to compare them, "
                 f"{dtype_advice(m['dtype'], p.model.dtype)}).")
    recipe = getattr(p.model, "recipe", None)  # the plan's model-state precision recipe
    ours = m["memory_estimate_bytes"]["model_states"] / max(1, m["params"])  # one process: its params are the model's
    if recipe is not None and m.get("world", 1) == 1 and abs(recipe.bytes_per_param - ours) > 1e-9:
        L.append("")
        L.append(f"The plan counts model states with the {recipe.name} recipe ({recipe.bytes_per_param} bytes per "
                 f"parameter); this executor's AdamW keeps {ours:g} bytes per parameter (gradients in the compute "
                 f"dtype, fp32 master weights and moments where the dtype is 16-bit).")
    if m.get("world", 1) > 1:
        L.append("")
        ne = getattr(res.estimate, "not_estimated", None)  # carried: the plan's transient terms stand in
        carried = ne is not None and not any(k in ne for k in TRANSIENT_TERMS)
        L.append(f"Distributed run: the executor's estimate is rank {m.get('rank', 0)}'s: its static memory (model "
                 "states after ZeRO, the policy's activation storage, lse and norm statistics) made here"
                 + ("; its transient, boundary and classifier terms the plan's own (the simulator's for one GPU of "
                    "the layout, in this run's dtype: a dry run of the layer on the meta device cannot run the "
                    "collectives), its optimizer-step term not estimated (—)." if carried else
                    "; its transient, boundary, classifier and optimizer-step terms are not estimated (they come "
                    "from a dry run of the layer on the meta device, which cannot run the collectives, and the plan "
                    "carries none), so they, the total and the row `executor's memory estimate` above read — (a sum "
                    "of the static terms against the predicted peak would read as an error)."))
        unsized = [r["term"] for r in cmp_.memory if r["executor_bytes"] is None and r["term"] in UNSIZED_TERMS]
        if unsized:  # the policy's activations are kept by autograd (`ActivationPolicy.unsized_terms`)
            L.append("")
            L.append(f"Under this plan's policy ({p.policy.name}) the activations ({', '.join(unsized)}) are kept by "
                     "autograd as the step runs, not sized before it, so they read — too, and so do the total "
                     "(peak_total) and the row `executor's memory estimate` above: a sum without them against the "
                     "predicted peak would read as an error.")
    if p.model.moe and p.policy.name in ("recompute_moe", "checkpoint_offload"):  # the rebuilt block's tensors
        rebuilt = "the rebuilt norm" if p.policy.name == "recompute_moe" else "the rebuilt layer's tensors"
        L.append("")
        L.append(f"Under {p.policy.name} the simulator's buffers term holds its recompute buffer: {rebuilt} and every "
                 "tensor the re-run MoE block keeps for its backward, one layer's at a time; this executor re-runs the "
                 "block under autograd, whose saved tensors are the backward's own allocations (not in its buffers "
                 "term, and not estimated beside the layer's transients), so the two buffers terms differ by them.")
    if p.model.qk_norm and p.model.qk_norm_kept:  # the framework's autograd keeps them; memo-exec normalises again
        L.append("")
        L.append("The plan keeps the QK norms' outputs beside the projections, as its framework's autograd does "
                 "(`model.qk_norm_kept`); this executor keeps the projections alone and normalises them again where "
                 "the attention kernel runs, so its skeletal term is smaller by the normalised queries and keys.")
    if p.model.offload_copies_per_group and getattr(p.policy, "offload_modules", ()):  # Megatron's copies per group
        L.append("")
        L.append("The plan prices its framework's fine-grained offload, which copies the attention output to the host "
                 "and back once for each offload group that saves it (`model.offload_copies_per_group`); this "
                 "executor moves it once, so its copies (and its pinned host memory) are smaller by one attention "
                 "output a layer.")
    if p.model.mixes_dense_layers:  # the README's named approximation of a mixed model, in the report it moves
        L.append("")
        n_dense = p.model.dense_layers
        L.append(f"The simulator prices {p.model.name}'s {n_dense} dense-FFN layer{'s' if n_dense > 1 else ''} "
                 f"({p.model.dense_where}) "
                 "as MoE layers in time and activations (one repeated layer; their parameters counted exactly); "
                 "this executor keeps each layer's own tensors (a dense layer's fc1 and act, a MoE layer's block), "
                 "so the activation terms differ by that much.")
    det = m.get("memory_estimate_detail_bytes") or {}
    if det:
        L.append("")
        L.append("transient_peak = arena + the larger of what lives outside it in forward and in backward: " +
                 ", ".join(f"{k} {_fmt(v, 'bytes')}" for k, v in det.items()))
    L.append("")
    L.append("## Steps\n")
    L.append("| step | loss | iteration | exposed copy | exposed offload | exposed prefetch | peak memory |")
    L.append("|---:|---:|---:|---:|---:|---:|---:|")
    for s in res.summaries:
        L.append(f"| {s['step']} | {s['loss']:.5f} | {_fmt(s['iteration_s'], 's')} | {_fmt(s['exposed_copy_s'], 's')} | "
                 f"{_fmt(s['exposed_offload_s'], 's')} | {_fmt(s['exposed_prefetch_s'], 's')} | "
                 f"{_fmt(s['peak_allocated_bytes'], 'bytes')} |")
    L.append("")
    last = res.summaries[-1]
    L.append("## Streams (last step)\n")
    L.append("The spans as recorded: each stream's summed span time in the last step alone (the per-rank table's "
             "too). The comparison above is the median of the steady steps and takes out of compute what it waited "
             "(stalls, and on a CPU the blocking collectives that lie inside the compute spans issuing them), so "
             "its compute busy time is smaller.\n")
    L.append("| stream | busy |")
    L.append("|---|---:|")
    busy = dict(last["stream_busy_s"])
    unpriced = unpriced_ep_seconds(Timeline(events=list(res.steps[-1].events))) if res.steps else 0.0
    if unpriced and "ep_comm" in busy:  # as the stream rows above: the priced all-to-alls, the others apart
        busy["ep_comm"] = max(0.0, busy["ep_comm"] - unpriced)
        busy["ep_comm, not priced (counts + router weights)"] = unpriced
    for k, v in sorted(busy.items()):
        L.append(f"| {k} | {_fmt(v, 's')} |")
    if last["non_layer_s"]:
        L.append("")
        L.append("Outside the layers (compute): " + ", ".join(f"{k} {_fmt(v, 's')}" for k, v in
                                                             sorted(last["non_layer_s"].items())))
    L.append("")
    L.append("## Memory\n")
    pd = m.get("policy_detail", {})
    if "offload_tokens" in pd:
        L.append(offload_line(pd, m.get("pinned_host_bytes", 0)))
    hp = m.get("host_pool") or {}
    if hp.get("warning"):
        L.append(f"- **host pool: {hp['method']}**: {hp['warning']}")
    mp = m.get("memory_plan")
    if mp:
        level2 = (f"; the plan's whole-model arena of {mp['plan_model_arena_bytes'] / GiB:.3f} GiB is not allocated: "
                  f"the rounding buffers, hidden states and classifier chunk it places are allocated on their own"
                  if mp.get("plan_model_arena_bytes") else "")
        L.append(f"- memory plan: arena {mp['arena_bytes'] / GiB:.4f} GiB, the largest phase peak "
                 f"({', '.join(f'{ph} {v / GiB:.4f} GiB' for ph, v in mp['phase_peak_bytes'].items())}; offsets "
                 f"x{mp['offset_scale']} for the executor's dtype){level2}; placed: " +
                 "; ".join(f"{ph}: {', '.join(n)}" for ph, n in mp["placed"].items()))
        if mp["plan_names_not_placed"]:
            L.append("- plan names this executor accepts but does not place: " +
                     "; ".join(f"{k} ({v})" for k, v in mp["plan_names_not_placed"].items()))
    else:
        why = m.get("memory_plan_not_used")  # the distributed rank's reason (`DistExecutor._arena_why_not`)
        L.append(f"- memory plan: none ({why + ': ' if why else ''}every scratch tensor from the caching allocator)")
    if m.get("allocator_settings"):  # the plan's (`memo_exec.alloc_settings`)
        note = m.get("allocator_settings_note")
        L.append(f"- **{note.removeprefix('note: ')}**" if note else
                 f"- allocator settings: {m['allocator_settings']} (the plan's layout.alloc_conf, applied on CUDA)")
    L.append("- through the caching allocator:")
    for line in m.get("caching_allocator", []):
        L.append(f"  - {line}")
    L.append("")
    L.append("## Figures\n")
    for key, _fname, title in FIGURES:
        if key in figs and isinstance(figs[key], Path):
            L.append(f"![{title}]({figs[key].name})\n")
        elif f"{key}_error" in figs:
            L.append(f"- {title}: not drawn ({figs[key + '_error']})")
    L.append("")
    L.append("Files: `measured.json` (memo-timeline, source=measured, last step), `trace.json` (open in "
             "https://ui.perfetto.dev).")
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------------------------------
# distributed runs: per-rank rows and the merged trace
# --------------------------------------------------------------------------------------------------
# Every rank records its own steps (`memo_exec.measure.Recorder`, Timeline events on device = its
# rank). At the end rank 0 gathers each rank's steady-state summary and last-step events
# (``gather_object``: `memo_exec.rank_payload`) and writes, beside the single-rank outputs of `write_outputs`
# (rank 0's report and comparisons): the figures drawn with every rank (`rank_figures`), ``measured.json`` and
# ``trace.json`` merged over the ranks (one
# Chrome-trace process per rank, its streams as threads; each rank's times from its own step
# start), and a "Per rank" section in ``report.md``: measured iteration, layer forward / backward
# and busy time per stream for every rank, against the simulator's representative GPU (the plan's
# prediction), with the spread over the ranks.

RANK_STREAMS = ("compute", "comm", "cp_comm", "ep_comm", "tp_p2p", "tp_bcast", "dp_comm", "d2h", "h2d")


def slowest_rank(payloads: list[dict]) -> dict | None:
    """The rank of a multi-rank run whose steady iteration took longest, beside rank 0's (the report's and the
    command line's headline, measured beside the simulator's first GPU: `compare_run`): ``{"rank", "iteration_s",
    "rank0_iteration_s", "ranks"}``, or None for one rank or where a rank measured no iteration. A synchronous step
    lasts as long as its slowest rank, so the headline says how far that one is (`slowest_rank_words`)."""
    its = {p["rank"]: (p.get("steady") or {}).get("iteration_s") for p in payloads}
    if len(its) < 2 or any(v is None for v in its.values()) or 0 not in its:
        return None
    r = max(its, key=lambda k: (its[k], -k))
    return {"rank": r, "iteration_s": its[r], "rank0_iteration_s": its[0], "ranks": len(its)}


def slowest_rank_words(slow: dict | None) -> str | None:
    """`slowest_rank` in words, or None where there is none: 'rank 0 is the slowest of 2 ranks' or 'the slowest
    of 2 ranks, rank 1, took 0.3476 s an iteration (+55.6% over rank 0's)'."""
    if not slow:
        return None
    n = slow["ranks"]
    if slow["rank"] == 0:
        return f"rank 0 is the slowest of {n} ranks"
    r0 = slow["rank0_iteration_s"]
    over = f" ({(slow['iteration_s'] / r0 - 1):+.1%} over rank 0's)" if r0 else ""
    return f"the slowest of {n} ranks, rank {slow['rank']}, took {slow['iteration_s']:.4f} s an iteration{over}"


def _busy(summaries: list[dict]) -> dict[str, float]:
    use = steady_steps(summaries)
    keys = {k for s in use for k in s["stream_busy_s"]}
    return {k: steady_value([s["stream_busy_s"].get(k, 0.0) for s in use]) for k in keys}


def rank_rows(payloads: list[dict], predicted_iteration: float | None, micro_batches: int = 1,
              not_comparable: str | None = None) -> list[dict]:
    """Every rank's row of the 'Per rank' table; ``micro_batches``: the plan's per iteration, so a rank's
    ``iteration_tokens`` (its ``local_tokens``, one micro-batch's rows, times them) count the iteration's tokens
    as the headline tokens/s does (a review read 512 'tokens' for pp 2 over 4 micro-batches of 512);
    ``not_comparable``: why the predicted iteration is another device's (`times_not_comparable`): each row's
    ``iteration_rel_error`` None and ``iteration_not_comparable`` that line, as the totals' rows."""
    rows = []
    for p in payloads:
        st = p["steady"]
        it = st.get("iteration_s")
        busy = _busy(p["summaries"])
        unpriced = p.get("ep_unpriced_s")
        if unpriced is not None and "ep_comm" in busy:  # as the stream rows: the priced all-to-alls only
            busy["ep_comm"] = max(0.0, busy["ep_comm"] - unpriced)
        rows.append({"rank": p["rank"], **p["coords"], "local_tokens": p["local_tokens"],
                     "micro_batches": micro_batches, "iteration_tokens": p["local_tokens"] * micro_batches,
                     "iteration_s": it,
                     "iteration_rel_error": rel_error(it, predicted_iteration),
                     "layer_forward_s": st.get("layer_forward_s"), "layer_backward_s": st.get("layer_backward_s"),
                     "layer_recompute_s": st.get("layer_recompute_s"),
                     "busy_s": busy, "ep_unpriced_s": unpriced, "peak_memory_bytes": st.get("peak_allocated_bytes"),
                     "ring_stall_s": _ring_stall(p["events"]), "last_loss": p["losses"][-1]})
        if not_comparable is not None and rows[-1]["iteration_rel_error"] is not None:
            rows[-1]["iteration_rel_error"], rows[-1]["iteration_not_comparable"] = None, not_comparable
    return rows


def _ring_stall(events) -> float | None:
    """The last step's wait on METP's ring (None when the rank ran no ring)."""
    if not any(e.stream in TP_RING_STREAMS for e in events):
        return None
    from memo_exec.metp.lane import exposed_ring_seconds  # noqa: PLC0415

    return sum(exposed_ring_seconds(events).values())


def spread(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    mean = statistics.fmean(vals)
    return (max(vals) - min(vals)) / mean if mean else None


def merged_timeline(payloads: list[dict], meta: dict) -> Timeline:
    events = [e for p in payloads for e in p["events"]]
    memory = [m for p in payloads for m in p["memory"] if m.kind == "gpu"]
    memory += [m for m in payloads[0]["memory"] if m.kind != "gpu"]
    events.sort(key=lambda e: (e.device, e.start, e.stream))
    return Timeline(events=events, memory=memory, meta={**meta, "source": "measured", "ranks": len(payloads)})


def _f(v, fmt="{:.4f}") -> str:
    return "—" if v is None else fmt.format(v)


def per_rank_markdown(rows: list[dict], predicted_iteration: float | None, memory_label: str,
                      comparable: bool = True) -> str:
    streams = [s for s in RANK_STREAMS if any(s in r["busy_s"] for r in rows)]
    ring = any(r.get("ring_stall_s") is not None for r in rows)
    unpriced = any(r.get("ep_unpriced_s") is not None for r in rows)
    # every rank's coordinates: dp, pp (a pipeline's stages are ranks of one replica), cp, ulysses, tp, and ep
    # where experts are split
    coords = ["dp", "pp", "cp", "ulysses", "tp"] + (["ep"] if any("ep" in r for r in rows) else [])
    L = ["", "## Per rank", "",
         f"The simulator predicts one representative GPU (iteration {_f(predicted_iteration)} s); every rank "
         "measured its own steps (steady state: the median of each time over the steps after the warm-up). Busy time per "
         "stream is the sum of that stream's spans (on CPU the collectives block the calling thread, so their "
         "spans also lie inside the compute spans that issue them).", "",
         "| rank | " + " | ".join("uly" if c == "ulysses" else c for c in coords)
         + " | tokens | iteration s | vs predicted | layer fwd s | layer bwd s | "
         + " | ".join(f"{s} busy s" for s in streams) + " | ep unpriced s" * unpriced + " | ring wait s" * ring
         + f" | {memory_label} peak GiB | last loss |",
         "|" + "---|" * (8 + len(coords) + len(streams) + unpriced + ring)]
    for r in rows:
        mem = None if r["peak_memory_bytes"] is None else r["peak_memory_bytes"] / 2**30
        L.append(f"| {r['rank']} | " + " | ".join(str(r.get(c, 0)) for c in coords) + f" | {_rank_tokens(r)} | "
                 f"{_f(r['iteration_s'])} | {_f(r['iteration_rel_error'], '{:+.1%}') if comparable else NOT_COMPARABLE} | "
                 f"{_f(r['layer_forward_s'])} | {_f(r['layer_backward_s'])} | "
                 + " | ".join(_f(r["busy_s"].get(s)) for s in streams)
                 + (f" | {_f(r.get('ep_unpriced_s'))}" if unpriced else "")
                 + (f" | {_f(r.get('ring_stall_s'))}" if ring else "")
                 + f" | {_f(mem, '{:.2f}')} | {_f(r['last_loss'], '{:.6f}')} |")
    sp = spread([r["iteration_s"] for r in rows])
    L += ["", tokens_note(rows)]
    if unpriced:
        L += ["", "ep_comm busy s: the dispatch and combine all-to-alls the simulator prices (as the stream rows); "
              "ep unpriced s: the per-expert counts' and router weights' all-to-alls, which it does not price."]
    if ring:
        L += ["", "ring wait s: the last step's time the compute stream waited on METP's ring (the "
              "`wait_tp_p2p` / `wait_tp_bcast` stalls), the measured exposed P2P time of that rank."]
    L += ["", f"Spread of the iteration time over the ranks (max - min) / mean: {_f(sp, '{:.1%}')}.", ""]
    return "\n".join(L)


def _rank_tokens(row: dict) -> int:
    """The tokens column of a rank: the iteration's (`rank_rows`), else one micro-batch's (a row without them)."""
    return row.get("iteration_tokens", row["local_tokens"])


def tokens_note(rows: list[dict]) -> str:
    """What the 'Per rank' table's tokens column counts (`rank_rows`)."""
    r = rows[0] if rows else {}
    if "iteration_tokens" not in r:
        return ("tokens: the token rows of one micro-batch on the rank (its share under sequence, context and "
                "Ulysses parallelism), not the iteration's.")
    return (f"tokens: the token rows the rank's layers ran in one iteration, as the headline tokens/s counts an "
            f"iteration: {r['micro_batches']} micro-batch(es) of {r['local_tokens']} rows on rank {r['rank']} (a "
            f"micro-batch's share under sequence, context and Ulysses parallelism; measured.json's per_rank rows keep "
            f"it as local_tokens).")


def write_rank_outputs(payloads: list[dict], res0, out_dir: str | Path, plan_file: str | Path,
                       paths: dict, comparison) -> list[dict]:
    """Rank 0: merged trace and measured timeline, per-rank rows appended to report.md."""
    out = Path(out_dir)
    pred = comparison.predicted_iteration()  # the totals' prediction (--profile re-predicts it)
    rows = rank_rows(payloads, pred, res0.plan.micro_batches, times_not_comparable(res0.meta, res0.plan.profile))
    meta = dict(res0.meta)
    meta.update({"plan_file": str(plan_file), "per_rank": rows, "iteration_spread": spread([r["iteration_s"]
                                                                                           for r in rows])})
    meta.update({"rank_labels": {str(r): c for r, c in rank_coords(rows).items() if c},
                 "middle_layer": meta["layers"] // 2})
    tl = merged_timeline(payloads, meta)
    paths["measured"] = tl.write_json(out / "measured.json")
    paths["trace"] = write_chrome_trace(tl, out / "trace.json")
    label = "GPU memory" if res0.meta.get("device_kind") == "cuda" else "CPU memory (process RSS)"
    report = Path(paths["report"])
    text = report.read_text() + per_rank_markdown(rows, pred, label, times_comparable(res0.meta, res0.plan.profile))
    if len(payloads) > 1:
        text += rank_figures(payloads, rows, tl, res0, comparison, out, plan_file)
        for key, fname, _title in FIGURES:  # one drawn neither way: its line says so, and no file is named
            if key in paths and not (out / fname).exists():
                del paths[key]
    paths["report"] = atomic_write_text(report, text)
    return rows


def rank_figures(payloads: list[dict], rows: list[dict], tl: Timeline, res0, comparison, out: Path,
                 plan_file=None) -> str:
    """Draw ``timeline.png``, ``memory.png``, ``gantt_overlay.png`` and ``layers.png`` with every rank
    (`memo_exec.figures.ranks_to_draw`), each labelled by its coordinates in the parallel groups, where
    `write_outputs` (``figures`` False) left them and report.md links them; rank 0's alone where one fails
    (`rank0_draws`); a line for the report saying which ranks they show."""
    drawn, note = ranks_to_draw(rows)
    ids = [r["rank"] for r in drawn]
    by_rank = {p["rank"]: p for p in payloads}
    coords = rank_coords(rows)
    name = {r: f"rank {r}" + (f" ({coords[r]})" if coords.get(r) else "") for r in ids}
    shown = Timeline(events=tl.events, memory=[m for m in tl.memory if m.kind == "gpu" and m.device in ids]
                     + rank_host_samples(payloads, ids), meta=tl.meta)  # every drawn rank's host memory too
    last = {r: by_rank[r]["summaries"][-1] for r in ids}
    draw = {
        "timeline": lambda p: gantt_figure(shown, p, devices=ids, note=note),
        "memory": lambda p: memory_figure(shown, p),
        "layers": lambda p: layer_figure(comparison.layer_timings,
                                         [(name[r], by_rank[r]["steady"]) for r in ids],
                                         [(name[r], last[r]["per_layer"]) for r in ids],
                                         last[ids[0]]["step"], p, note,
                                         predicted_from=comparison.layer_timings_from),
    }
    if comparison.predicted_timeline is not None:
        draw["overlay"] = lambda p: overlay_gantt(
            comparison.predicted_timeline, shown, p, f"{res0.meta['model']} {res0.meta['policy']}: predicted vs "
            f"measured (last step)", ranks=drawn, note=note)
    failed = []
    alone = None  # rank 0's drawings, made only where one with every rank fails
    for key, fname, _title in FIGURES:
        if key not in draw:
            continue
        try:
            _atomic_png(draw[key], out / fname)
        except Exception as e:  # noqa: BLE001 - rank 0's figure instead; the measurements are kept
            why = f"{type(e).__name__}: {e}"
            if alone is None:
                meta = _run_meta(res0, comparison, plan_file)
                alone = rank0_draws(res0, comparison, timeline_from_step(res0.steps[-1], meta), meta)
            try:
                alone[key](out / fname)
                failed.append(f"{fname} shows rank 0 only ({why})")
            except Exception as e0:  # noqa: BLE001
                failed.append(f"{fname}: not drawn ({why}; rank 0's alone: {type(e0).__name__}: {e0})")
    return "\n".join(["", f"The figures draw {note}, each labelled with its rank and coordinates."] + failed) + "\n"
