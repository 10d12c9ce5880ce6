"""The analytic what-if: enumerate layouts x policies x alpha, estimate, rank, pick a plan.

Ranking: plans that fit (status OK) first, highest throughput first (tokens per GPU per second,
so a DP=2 plan that trains two sequences per iteration is judged by what it trains, not by its
longer iteration; MFU orders the same way for one model and length); then plans that do not fit,
least over capacity first (OOM by GPU bytes over, OOHM by host bytes over).

Tensor-parallel flavours (``tp_mode``): ``all`` (default) ranks METP layouts (``metp_ffn``:
METP FFN with Megatron TP+SP attention; ``metp``: METP FFN and two-level MHA) beside Megatron's
TP (with or without SP), ring CP and Ulysses, every activation policy on top of each (MEMO's alpha
solved for each layout); ``megatron``, ``metp_ffn`` or ``metp`` keep only that flavour.
`megatron_twin` prices a METP candidate's Megatron TP+SP counterpart (same degrees and policy)
so the answer can say what METP saves.

SPPO (the ``sppo`` policy, pipeline layouts with ``pp`` stages): `memo_sim.search.sppo` solves
its space of (SP, PP, N, partition, multiplexing) points, by the paper's heuristic and by an
exhaustive search; each pipeline layout's best point (and the heuristic's choice) joins the
ranking as a candidate beside the others, failures with their stage and unit. Tier 2 also
simulates the heuristic's choice and the best few SPPO points, so `WhatIfResult.sppo_summary`
can say how far the heuristic is from the best found.
"""

from __future__ import annotations

import gc
import math
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable

from memo_sim.cost.gemm_format import for_profile
from memo_sim.engine.core import gc_paused
from memo_sim.engine.simulate import Progress, simulate
from memo_sim.errors import MemoError, NothingFits
from memo_sim.heap_freeze import freeze_heap
from memo_sim.engine.schedules.microbatch import micro_batch_pipelines
from memo_sim.layout.alloc_conf import parse_alloc_conf
from memo_sim.layout.moe_balance import measured_why_not, parse_balance
from memo_sim.layout.parallel import (ExpertChoice, Layout, default_reason, enumerate_layouts, ep_overlap_why_not,
                                      offload_why_not)
from memo_sim.layout.pipeline_layout import OPTION as LAYOUT_OPTION
from memo_sim.layout.ring_merge import whole_sequence_only
from memo_sim.layout.schedule import SCHEDULE_NAMES, check_schedule, default_schedule, schedule_runs_policy
from memo_sim.tp import TP_MODES, tp_flavour
from memo_sim.memplan.footprint import memory_breakdown
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy, policy_class, policy_names, prices_model
from memo_sim.profile.attention_kernels import attention_kernel
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.candidate import Candidate, binding_words, host_memory_words  # noqa: F401  (re-exported)
from memo_sim.search.estimate import estimate_iteration, memo_alpha
from memo_sim.search.frameworks import FRAMEWORKS, get_framework
from memo_sim.search.pipeline import micro_batch_sizes, pipeline_candidate, pipeline_candidates
from memo_sim.forked import FORKS
from memo_sim.search.sppo_beside import SppoBeside
from memo_sim.search.prune import SIMULATE_ALL, SIMULATE_BOUND, PruneReport, parse_simulate_top, simulate_by_bound
from memo_sim.search.sppo import point_candidate, resolve_for_layout, sppo_candidates, summarize
from memo_sim.search.verdicts import (SPPO_VS_MEMO, VERDICT_ROUNDS, best_fit, likely_next_sides,
                                      verdict_sides_to_simulate)


@dataclass
class WhatIfResult:
    candidates: list[Candidate]
    rejected_layouts: list[tuple[Layout, str]] = field(default_factory=list)
    simulated: int = 0  # how many of the best were simulated (tier 2)
    sppo: object | None = None  # memo_sim.search.sppo.SppoSearch when SPPO was searched
    sppo_summary: dict | None = None  # heuristic vs exhaustive best (analytic and simulated)
    searched: dict = field(default_factory=dict)  # the schedules searched, and the pipelines' pp, vpp, micro-batch
    tier2: PruneReport | None = None  # how many tier 2 simulated, skipped by bound, and the proof margin

    @property
    def best(self) -> Candidate | None:
        ok = [c for c in self.candidates if c.status == "OK"]
        return ok[0] if ok else None


NO_VALID_LAYOUT = "no valid layout"  # how `candidates_for` says no layout matches the fixed degrees
# why the optimizer-on-host layouts were searched where the estimate had fitting candidates (`rank`)
OFFLOAD_AFTER_SIMULATION = ("nothing fits with the optimizer on the GPU in the event simulator (the estimate's "
                            "fitting candidates ran out of memory there)")

TP_MODE_CHOICES = TP_MODES + ("all",)


def tp_modes_of(tp_mode: str) -> tuple[str, ...]:
    """The flavours a ``--tp-mode`` value asks for (``all``: every one)."""
    choices = {"all": TP_MODES, **{m: (m,) for m in TP_MODES}}
    try:
        return choices[tp_mode]
    except (KeyError, TypeError):
        raise MemoError(f"--tp-mode {tp_mode!r} unknown; choose from {', '.join(TP_MODE_CHOICES)}") from None


ALLOCATORS = ("caching", "plan", "both")  # `candidates_for`'s allocator choice


def _fixed_degrees_why_not(model: ModelConfig, gpus: int, *, tp, cp, ulysses, dp, pp, vpp, ep, etp,
                           chunks: tuple[int, ...] | None = None) -> None:
    """A one-line refusal where a degree the user fixed cannot run whatever the rest of the search picks
    (the fix is that flag), before any layout is built. ``chunks``: each model chunk's layers as the user
    wrote them (the first may hold the embedding alone and the last the loss alone, so up to layers + 2
    stages)."""
    if ep is not None and etp is not None:
        ep_flag, ep_degree = f"--ep {ep} x --etp {etp} =", ep * etp
    else:
        ep_flag, ep_degree = ("--ep", ep) if ep is not None else ("--etp", etp)
    for flag, degree in (("--tp", tp), ("--cp", cp), ("--ulysses", ulysses), ("--dp", dp), ("--pp", pp),
                         (ep_flag, ep_degree)):
        if degree is not None and degree > gpus:
            raise MemoError(f"{flag} {degree} exceeds the {gpus} GPUs of --gpus; lower it or raise --gpus")
        if degree is not None and gpus % degree:  # every group tiles the GPUs (a stage's are a divisor of them)
            raise MemoError(f"{flag} {degree} does not divide the {gpus} GPUs of --gpus; pick a divisor of {gpus}")
    fixed = [(flag, d) for flag, d in (("--tp", tp), ("--cp", cp), ("--ulysses", ulysses), ("--dp", dp), ("--pp", pp))
             if d is not None and d > 1]
    if len(fixed) > 1 and gpus % math.prod(d for _, d in fixed):  # the groups nest: their product tiles the GPUs
        raise MemoError(f"{' x '.join(f'{flag} {d}' for flag, d in fixed)} = {math.prod(d for _, d in fixed)} GPUs, "
                        f"which does not divide the {gpus} GPUs of --gpus; lower one of them or raise --gpus")
    if pp is not None and not chunks and pp > model.layers:
        raise MemoError(f"--pp {pp} exceeds the model's {model.layers} layers (every stage runs at least one); "
                        f"lower it (the what-if's {LAYOUT_OPTION} can write more stages: a first of the "
                        f"embedding alone and a last of the loss alone)")
    if vpp is not None and vpp > 1 and pp == 1:
        raise MemoError(f"--vpp {vpp} interleaves model chunks over pipeline ranks: set --pp above 1 or drop --vpp")


def _allocator_variants(layouts: list[Layout], allocator: str) -> list[Layout]:
    """Each layout on the caching allocator, on a static memory plan, or both (in that order)."""
    planned = [replace(lay, memory_plan=True) for lay in layouts]
    return {"caching": layouts, "plan": planned, "both": [x for pair in zip(layouts, planned) for x in pair]}[allocator]


def _attention_why_not(attention: str, model: ModelConfig, profile: HardwareProfile) -> None:
    """One `MemoError` line where ``--attention`` cannot run the model on the profile: a kernel the profile gives no
    curves for, a head dim the kernel does not run (`memo_sim.profile.attention_kernels`)."""
    try:
        profile.efficiency.priced_attention_kernel(attention)
    except MemoError as e:
        raise MemoError(f"--attention {attention}: profile {profile.name} has {e}") from None
    why = attention_kernel(attention).why_not(model.qk_head_dim)
    if why:
        raise MemoError(f"--attention {attention}: model {model.name}: {why.replace('use attention', 'use --attention')}")


def launch_overrides(kernel_fusion: str | None = None, attention: str | None = None,
                     grad_overlap: bool | None = None) -> dict:
    """The layout settings a user's launch line sets over the framework's data (each None: the framework's): how the
    memory-bound kernels are built (``kernel_fusion``: fused, compiled or eager), the attention kernel
    (``attention``, `memo_sim.profile.attention_kernels`), the gradients reduced beside the backward or after it
    (``grad_overlap``: Megatron-LM's --overlap-grad-reduce, off by default in its arguments)."""
    return {k: v for k, v in (("kernel_fusion", kernel_fusion), ("attention", attention),
                              ("grad_overlap", grad_overlap)) if v is not None}


def _adapter(adapt: Callable[[Layout], Layout], alloc_conf: str | None,
             overrides: dict | None = None) -> Callable[[Layout], Layout]:
    """The framework's ``adapt`` with the user's allocator settings and launch settings (`launch_overrides`) on top
    (None: the framework's)."""
    if alloc_conf is None and not overrides:
        return adapt
    conf = parse_alloc_conf(alloc_conf) if alloc_conf is not None else None

    def adapted(lay: Layout) -> Layout:
        lay = adapt(lay)
        if overrides:
            lay = replace(lay, **overrides)
        if conf is None:
            return lay
        expandable = lay.expandable_segments if conf.expandable_segments is None else conf.expandable_segments
        return replace(lay, expandable_segments=expandable, alloc_conf=conf.text(with_expandable=False))

    return adapted


def _chunk_layout_vpp(chunks: tuple[int, ...], pp: int | None, vpp: int | None, uneven_flags: bool,
                      pipes: tuple[str, ...], allowed: tuple[str, ...]) -> int:
    """The virtual stages per rank a --pipeline-model-parallel-layout gives (its stages / pp), or a one-line
    refusal where the other pipeline options contradict it."""
    opt = "--pipeline-model-parallel-layout"
    if pp is None or pp < 2:
        raise MemoError(f"{opt} splits a pipeline: give --pp 2 or more (the pipeline ranks its stages spread over)")
    if uneven_flags:
        raise MemoError(f"{opt} gives every stage its layers: drop --decoder-first/last-pipeline-num-layers")
    if not pipes:
        raise MemoError(f"{opt} splits a micro-batch pipeline: search 1f1b or interleaved_1f1b")
    v = len(chunks) // pp
    if vpp is not None and vpp != v:
        raise MemoError(f"{opt} has {len(chunks)} stages over --pp {pp}: {v} per rank, not --vpp {vpp}; drop --vpp")
    if v > 1 and "interleaved_1f1b" not in allowed:
        raise MemoError(f"{opt}: {v} stages per rank run the interleaved_1f1b schedule, which is left out")
    return v


def _sppo_flags_why_not(dp_mode, rank_order, allocator, vpp, schedules, first, last, chunks, micro_batch, tp_mode,
                        tp, sp, pp, multiplex) -> None:
    """Refuse, in one line, a flag SPPO's search does not take where SPPO is the only policy asked for: it runs even
    stages of its own schedule with ZeRO 0 or 1 beside them, in memo's rank order, on the caching allocator, and
    splits a stage's tokens by Megatron TP with SP (a review: --dp-mode fsdp, --rank-order and --allocator plan were
    ignored, and --vpp 2, --schedule 1f1b or --tp-mode metp named unrelated reasons)."""
    flags = [(dp_mode not in (None, "zero"), f"--dp-mode {dp_mode}"), (rank_order is not None, "--rank-order"),
             (allocator != "caching", f"--allocator {allocator}"), (vpp is not None and vpp > 1, f"--vpp {vpp}"),
             (bool(schedules) and set(schedules) != {"sppo"}, "--schedule other than sppo"),
             (first is not None or last is not None, "--decoder-first/last-pipeline-num-layers"),
             (bool(chunks), "--pipeline-model-parallel-layout"), (micro_batch is not None, "--micro-batch"),
             (tp_mode not in ("all", "megatron"), f"--tp-mode {tp_mode}"), (tp is not None and tp > 1 and sp is False,
                                                                         "--no-sp"),
             (bool(multiplex) and pp == 1, "--multiplex with --pp 1 (multiplexing needs pp >= 2)")]
    said = [words for on, words in flags if on]
    if said:
        raise MemoError(f"--policy sppo does not take {', '.join(said)}: SPPO runs even stages of its own schedule, "
                        f"ZeRO 0 or 1 beside them, Megatron TP with SP inside, memo's rank order and the caching "
                        f"allocator; drop {'it' if len(said) == 1 else 'them'} or ask for another --policy")


def candidates_for(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *, batch: int | None = None,
                   tp: int | None = None, cp: int | None = None, ulysses: int | None = None, dp: int | None = None,
                   zero: int | None = None, sp: bool | None = None, policies: tuple[str, ...] | None = None,
                   alpha: float | None = None, framework: str = "any", tp_mode: str = "all",
                   metp_across_nodes: bool = False, pp: int | None = None, subseqs: int | None = None,
                   partition: str | None = None, multiplex: bool | None = None, vpp: int | None = None,
                   micro_batch: int | None = None, global_batch: int | None = None,
                   schedules: tuple[str, ...] | None = None, optimizer_offload: bool | None = None,
                   first_stage_layers: int | None = None, last_stage_layers: int | None = None,
                   chunk_layers: tuple[int, ...] | None = None, ep: int | None = None, etp: int | None = None, moe_dispatcher: str = "alltoall",
                   moe_balance: str = "dropless", dp_mode: str | None = None, alloc_conf: str | None = None,
                   allocator: str = "caching", rank_order: str | None = None, ep_overlap: bool = False,
                   kernel_fusion: str | None = None, attention: str | None = None,
                   grad_overlap: bool | None = None,
                   sppo_beside: Callable[..., SppoBeside] | None = None,
                   pipeline_floor: Callable[[list[Candidate]], float | None] | None = None,
                   on_stage: Callable[[str], None] | None = None, offload_beside: bool = False) -> WhatIfResult:
    """Every valid layout x policy x schedule x micro-batch size (MEMO at its solved alpha) for
    ``framework``, estimated and ranked (the strategies of `SEARCH_STRATEGIES`).

    ``batch``: sequences per data-parallel replica per iteration (default 1; a searched micro-batch
    pipeline's default is `memo_sim.search.pipeline.default_pipeline_batch`); ``global_batch``:
    sequences per iteration over every replica instead (each layout's batch is it / dp);
    ``micro_batch`` fixes the micro-batch size (default: `memo_sim.search.pipeline.micro_batch_sizes`).
    ``tp_mode``: the tensor-parallel flavours to include (``all``, or one of `TP_MODES`).
    ``pp``, ``vpp`` fix the pipeline (pp 1: none); ``subseqs``, ``partition``, ``multiplex`` fix
    parts of the SPPO search. ``schedules``: only these schedules (default: the framework's).
    Every schedule the framework runs is searched, micro-batch pipelines included, unless
    ``schedules`` or ``pp`` 1 leaves them out (`WhatIfResult.searched` says what was searched).
    ``pipeline_floor(candidates)``: the best throughput simulated among the candidates listed before the
    micro-batch pipelines are built (tier 2's bound search run early, `rank`); a pipeline family whose proved
    bound is below it is not built (`memo_sim.search.pipeline.pipeline_candidates`' ``floor``; how many:
    ``searched["pipeline"]["not_built"]``). Only where the pipelines are searched by default: a pipeline asked
    for (``pp``, ``vpp``, a pipeline schedule or the first / last stage's layers) has every family built.
    ``sppo_beside(search, shared)`` runs SPPO's search beside the rest (`memo_sim.search.sppo_beside.SppoBeside`;
    the same candidates in the same places); without it the search runs here first.
    ``optimizer_offload``: True searches only single-stage layouts with the optimizer on the host
    (`memo_sim.cost.optimizer_offload`), False none; None (default) adds them where nothing else fits
    and the framework offers it (``offload_beside``: whatever fits here, as `rank` asks where the event simulator
    found none of the estimate's fitting candidates fitting). ``first_stage_layers`` / ``last_stage_layers``: the first and last
    pipeline stages' layer counts (Megatron-LM's --decoder-first/last-pipeline-num-layers; default:
    an even split, or each of `memo_sim.layout.parallel.uneven_splits` where the layers do not divide).
    ``chunk_layers``: each model chunk's layers (`memo_sim.layout.pipeline_layout`, Megatron-LM's
    --pipeline-model-parallel-layout): ``pp`` fixed, len / pp chunks per rank.
    ``ep``, ``etp``: the expert degrees of a MoE model (None: searched), ``moe_dispatcher`` and
    ``moe_balance`` what every MoE candidate runs with (`memo_sim.layout.parallel.ExpertChoice`); ``ep_overlap``:
    every pipeline candidate that can run Megatron-Core's EP all-to-all overlap runs it, the others (1F1B without
    virtual stages, ZeRO 2 / 3, a policy it refuses beside it) without (`memo_sim.layout.parallel.with_ep_overlap`).
    ``dp_mode``: the data-parallel flavours to search (`memo_sim.dp`): one of the framework's, or ``all``
    of them; None: the framework's first (``any``: zero; torchtitan: fsdp). ``alloc_conf``: the
    caching allocator's settings as ``PYTORCH_CUDA_ALLOC_CONF`` writes them, over the framework's
    (`memo_sim.layout.alloc_conf`; None: the framework's). ``kernel_fusion``: how every candidate's memory-bound
    kernels are built (`memo_sim.model.kernel_fusion`: fused, compiled or eager; None: the framework's);
    ``attention``: the attention kernel every candidate runs (`memo_sim.profile.attention_kernels`; None: the
    framework's); ``grad_overlap``: the data-parallel gradients reduced beside the backward (True) or after it
    (False; None: the framework's), as a launch line sets them (`launch_overrides`).
    ``allocator``: who places the transients
    of the policies without MEMO's plan: ``caching`` (PyTorch's caching allocator, as the
    frameworks run), ``plan`` (a static memory plan, `Layout.memory_plan`) or ``both`` side by side
    (single-stage layouts; a pipeline takes the caching allocator under ``both``). ``rank_order``: the rank orders
    a pipeline with data parallelism is tried in (`memo_sim.layout.rank_order`): one the framework offers, or ``all``
    of them; None: the framework's first (pipeline stages outermost). ``on_stage(words)``: told as each stage of
    the pricing starts (the what-if's progress line, `memo_sim.cli.whatif.search_progress`)."""
    say = on_stage or (lambda _words: None)
    if allocator not in ALLOCATORS:
        raise MemoError(f"--allocator must be one of {', '.join(ALLOCATORS)}, got {allocator!r}")
    if gpus < 1:
        raise MemoError("--gpus must be at least 1")
    experts = ExpertChoice(ep, etp, moe_dispatcher, moe_balance, ep_overlap)
    if ep_overlap and not model.moe:
        raise MemoError(f"--ep-overlap overlaps the experts' all-to-alls: model {model.name} has none (dense); drop it")
    if ep_overlap:  # a degree, dispatcher, data-parallel mode, dtype or policy given that no candidate runs it beside
        # (a review: --vpp 1, --moe-dispatcher allgather, --dtype fp32 or --policy full_recompute dropped it unsaid)
        probe = Layout(ep=ep or 2, pp=pp or 2, vpp=vpp or 2, zero=1 if zero is None else zero, moe=True,
                       dp_mode=dp_mode if dp_mode in ("zero", "fsdp") else "zero", moe_dispatcher=moe_dispatcher,
                       ep_overlap=True)
        why = ep_overlap_why_not(probe, model)
        asked = [policy_class(p).layout_why_not(probe) for p in (policies or ()) if p != "sppo"]
        if why is None and asked and all(asked):  # every policy asked for refuses it (SPPO alone: its own search)
            why = asked[0]
        if why:  # each reason names --ep-overlap
            raise MemoError(why)
    if not model.moe and ((ep or 1) > 1 or (etp or 1) > 1):
        raise MemoError(f"--ep / --etp spread experts: model {model.name} has none (dense); drop them, or choose a "
                        f"model with experts (memo-sim models lists them)")
    _fixed_degrees_why_not(model, gpus, tp=tp, cp=cp, ulysses=ulysses, dp=dp, pp=pp, vpp=vpp, ep=ep, etp=etp,
                           chunks=chunk_layers)
    if not model.moe and (moe_dispatcher != "alltoall" or moe_balance != "dropless"):
        raise MemoError(f"--moe-dispatcher / --moe-balance route tokens to experts: model {model.name} has none "
                        f"(dense); drop them")
    if model.moe and (ep or 1) > 1 and model.experts % ep:
        raise MemoError(f"--ep {ep}: the {model.experts} experts do not split evenly; pick a divisor of {model.experts}")
    if attention is not None:
        _attention_why_not(attention, model, profile)
    modes = tp_modes_of(tp_mode)
    if kernel_fusion == "eager":  # async TP is a torch.compile pass (`memo_sim.tp.async_tp`)
        if tp_mode != "all" and tp_flavour(tp_mode).async_collectives:
            raise MemoError(f"--tp-mode {tp_mode}: a torch.compile pass, it needs compiled blocks; drop "
                            f"--kernel-fusion eager or choose another --tp-mode")
        modes = tuple(m for m in modes if not tp_flavour(m).async_collectives)
    fw = get_framework(framework)
    if grad_overlap is False and not fw.serial_grads:
        raise MemoError(f"--no-grad-overlap: {fw.name} reduces the data-parallel gradients beside the backward only "
                        f"(no setting of it defers them: its framework data's layouts.serial_grads); drop it or "
                        f"choose another --framework")
    if tp_mode != "all" and tp_mode not in fw.tp_modes:  # one line naming the versions that run it
        runs = [n for n, f in FRAMEWORKS.items() if tp_mode in f.tp_modes]
        family = [n for n in runs if n.split("@")[0] == fw.name.split("@")[0]]
        others = family or runs  # the framework's own versions first, else any framework that runs it
        verb = "runs" if len(others) == 1 else "run"
        raise MemoError(f"--tp-mode {tp_mode}: {fw.name} runs TP as {', '.join(fw.tp_modes)}"
                        + (f"; {' and '.join(others)} {verb} {tp_mode} (--framework {others[0]})" if others else
                           "; choose one of them or another --framework"))
    if whole_sequence_only(dict(fw.mechanisms).get("ring_merge", "none"), model, seq):
        # its CP gathers every K/V chunk for causal attention over the whole sequence (`check_layout`): CP 1 only
        if (cp or 1) > 1:
            raise MemoError(f"--cp {cp}: {fw.name}'s context parallelism (PyTorch's experimental CP) runs causal "
                            f"attention over the whole sequence, not {model.name}'s sliding-window or chunked layers "
                            f"at {seq} tokens; drop --cp or choose another --framework")
        cp = 1
    if model.sliding_layers and not fw.ring_cp_sliding_window:  # TransformerEngine's CP: a window under a2a only
        if (cp or 1) > 1:
            raise MemoError(f"--cp {cp}: {fw.name}'s TransformerEngine CP runs {model.name}'s sliding window under a2a "
                            f"or all_gather only, not its p2p ring; drop --cp (--ulysses runs a2a) or choose another "
                            f"--framework")
        cp = 1
    if model.moe and fw.experts is not None:  # what the framework's MoE training cannot run, named before the search
        ep_ok, etp_ok, dispatchers, balances = (fw.experts.expert_parallel, fw.experts.expert_tensor_parallel,
                                                fw.experts.dispatchers, fw.experts.balances)
        if zero is not None and fw.experts.zero is not None and zero not in fw.experts.zero:
            raise MemoError(f"--zero {zero}: {fw.name} runs MoE layers beside ZeRO stages {fw.experts.zero_words} in "
                            f"memo's framework data; choose one of them or another --framework")
        if (ep or 1) > 1 and not ep_ok:
            raise MemoError(f"--ep {ep}: {fw.name} runs no expert parallelism in memo's framework data; drop it or "
                            f"choose another --framework")
        if (etp or 1) > 1 and not etp_ok:
            raise MemoError(f"--etp {etp}: {fw.name} runs no expert tensor parallelism in memo's framework data; drop "
                            f"it or choose another --framework")
        if moe_dispatcher not in dispatchers:
            raise MemoError(f"--moe-dispatcher {moe_dispatcher}: {fw.name} runs {', '.join(dispatchers)}; choose one "
                            f"of them or another --framework")
        if ep_overlap and not fw.experts.ep_overlap:
            runs = [n for n, f in FRAMEWORKS.items() if f.experts is not None and f.experts.ep_overlap]
            raise MemoError(f"--ep-overlap: {fw.name} does not overlap the EP all-to-alls in memo's framework data"
                            + (f"; {' and '.join(runs)} does (--framework {runs[0]})" if runs else "")
                            + ", or drop --ep-overlap")
        if (kind := parse_balance(moe_balance).kind) not in balances:
            raise MemoError(f"--moe-balance {moe_balance}: {fw.name} runs expert loads {', '.join(balances)} in memo's "
                            f"framework data, not {kind}; choose one of them or another --framework")
    if model.moe:
        why = measured_why_not(parse_balance(moe_balance), model.experts, model.top_k)
        if why:
            raise MemoError(f"--moe-balance: {why}")
    adapt = _adapter(lambda lay: fw.adapt(lay, profile), alloc_conf,
                     launch_overrides(kernel_fusion, attention, grad_overlap))
    pipe_adapt = adapt if allocator != "plan" else (lambda lay: replace(adapt(lay), memory_plan=True))
    if dp_mode is not None and dp_mode != "all" and dp_mode not in fw.dp_modes:
        raise MemoError(f"--dp-mode {dp_mode}: {fw.name} runs {', '.join(fw.dp_modes)}; choose one of them or all")
    dp_modes = fw.dp_modes if dp_mode == "all" else (dp_mode,) if dp_mode else fw.dp_modes[:1]
    # --dp-mode fsdp: ZeRO 0 over replicas only where the framework runs it as FSDP2 over a shard group of one
    # (`memo_sim.layout.parallel._dp_variants`; a review: under any it answered a DDP plan)
    zero0_fsdp = dp_mode != "fsdp" or bool(fw.mechanism("replicate_fsdp"))
    if rank_order is not None and rank_order != "all" and rank_order not in fw.rank_orders:
        raise MemoError(f"--rank-order {rank_order}: {fw.name} numbers ranks {', '.join(fw.rank_orders)}; choose one "
                        f"of them or all")
    rank_orders = fw.rank_orders if rank_order == "all" else (rank_order,) if rank_order else fw.rank_orders[:1]
    if zero in (1, 2) and "zero" not in dp_modes:  # every other flavour shards all the states (ZeRO stage 3's)
        who = f"--dp-mode {dp_mode}" if dp_mode else f"{fw.name} (its data-parallel flavours: {', '.join(fw.dp_modes)})"
        raise MemoError(f"--zero {zero}: {who} shards weights, gradients and optimizer states together (ZeRO stage 3); "
                        f"use --zero 3 or 0" + (", or --dp-mode zero" if "zero" in fw.dp_modes else
                                                 ", or another --framework"))
    model = fw.for_model(model)  # the framework's model-state recipe; a GEMM format it lacks is refused
    model = for_profile(model, profile)  # and its FP8 library's copies on this GPU
    fw = fw.for_layouts_of(model)  # a mixture of experts' layouts: what its MoE layers run beside (ZeRO stages)
    if policies is not None:
        for p in policies:
            if p in policy_names() and (why := policy_class(p).experts_why_not(model)):
                raise MemoError(f"--policy {why}; fix: choose another --policy")
            if p in policy_names() and (why := policy_class(p).model_why_not(model)):
                raise MemoError(f"--policy {p}: {why}; fix: choose another --policy")
    if schedules and "sppo" in schedules and "sppo" in policy_names() and (why := policy_class("sppo").model_why_not(
            model)):  # the schedule runs that policy alone
        raise MemoError(f"--schedule sppo: {why}; fix: choose another --schedule")
    if schedules and policies is not None:  # a policy asked for that no schedule asked for runs (a review: --schedule
        # sppo --policy memo said 'no factorisation of the GPU count matches the fixed degrees', and with --pp 2 'no
        # pipeline schedule is searched (sppo)'); the rule is `memo_sim.layout.schedule.schedule_runs_policy`'s
        for p in policies:
            if p != "sppo" and p in policy_names() and not any(schedule_runs_policy(n, p) for n in schedules):
                other = f"or drop --policy {p}" if "sppo" in policies else "or ask for --policy sppo"
                raise MemoError(f"--policy {p} with --schedule {' '.join(schedules)}: the sppo schedule runs "
                                f"--policy sppo only; add --schedule single_stage, 1f1b or interleaved_1f1b for {p}, "
                                f"{other}")
    policies = fw.policies if policies is None else policies
    policies = tuple(p for p in policies if prices_model(p, model))
    _check_options(fw, policies, alpha, batch, micro_batch, global_batch, schedules)
    allowed = tuple(n for n in (schedules or fw.schedules) if n in fw.schedules)
    pipes = tuple(n for n in allowed if n in micro_batch_pipelines())
    sppo_pols = tuple(p for p in policies if schedule_runs_policy("sppo", p))
    plain = tuple(p for p in policies if p not in sppo_pols)
    sppo_fixed = subseqs is not None or partition is not None or multiplex is not None
    if sppo_fixed and not sppo_pols:
        raise MemoError("--subseqs, --partition and --multiplex plan SPPO pipelines: add --policy sppo")
    if tp_mode not in ("all", "megatron"):  # a fixed flavour's own degree and SP rules, named (a review: --tp 1
        # --tp-mode metp said 'no factorisation of the GPU count matches the fixed degrees')
        fl = tp_flavour(tp_mode)
        if tp is not None and tp < fl.min_tp:
            raise MemoError(f"--tp-mode {tp_mode} needs --tp {fl.min_tp} or more, got --tp {tp}")
        if fl.requires_sp and sp is False:
            raise MemoError(f"--tp-mode {tp_mode} shards every activation over the TP ranks as Megatron SP does: "
                            f"drop --no-sp")
    if sppo_pols and not plain:  # SPPO alone: a flag its search does not take is refused, not ignored (a review)
        _sppo_flags_why_not(dp_mode, rank_order, allocator, vpp, schedules, first_stage_layers, last_stage_layers,
                            chunk_layers, micro_batch, tp_mode, tp, sp, pp, multiplex)
    if vpp is not None and vpp > 1 and "interleaved_1f1b" not in allowed:
        raise MemoError(f"--vpp {vpp}: virtual stages run the interleaved_1f1b schedule, which "
                        f"{'--schedule' if schedules else fw.name} leaves out")
    if pp is not None and pp > 1 and not pipes and not ("sppo" in allowed and sppo_pols):
        runs = [n for n in fw.schedules if n in micro_batch_pipelines()]
        fix = (f"add --schedule {' or '.join(runs)}" if runs and schedules else
               "add --policy sppo" if "sppo" in fw.schedules and "sppo" in fw.policies else
               f"drop --pp ({fw.name} runs no pipeline in memo's framework data), or choose another --framework")
        raise MemoError(f"--pp {pp}: no pipeline schedule is searched ({', '.join(allowed)}); {fix}")
    uneven_flags = first_stage_layers is not None or last_stage_layers is not None
    if uneven_flags and (not pipes or pp == 1):
        raise MemoError("--decoder-first/last-pipeline-num-layers split a micro-batch pipeline: drop them, or search "
                        "1f1b or interleaved_1f1b with pp >= 2")
    chunk_layers = tuple(chunk_layers or ())
    if chunk_layers and not plain:
        raise MemoError("--pipeline-model-parallel-layout splits a micro-batch pipeline; SPPO splits its own stages: "
                        "drop it, or ask for another --policy")
    if chunk_layers:
        vpp = _chunk_layout_vpp(chunk_layers, pp, vpp, uneven_flags, pipes, allowed)
        uneven_flags = True
    if optimizer_offload and not fw.optimizer_offload:
        raise MemoError(f"--optimizer-offload: {fw.name} does not offer it; drop it or choose another --framework")
    if optimizer_offload and ((pp is not None and pp > 1) or (vpp is not None and vpp > 1)):
        raise MemoError("--optimizer-offload is priced for single-stage layouts only: drop --pp/--vpp or it")
    if global_batch is not None and dp is not None and global_batch % dp:
        raise MemoError(f"--global-batch {global_batch} does not split over --dp {dp}: every data-parallel replica "
                        f"trains as many sequences a step; give a multiple of {dp}, or leave --dp to the search")
    stage_valid: list[Layout] = []
    pipe_flags = ((pp is not None and pp > 1) or (vpp is not None and vpp > 1) or bool(set(pipes) & set(schedules or ()))
                  or uneven_flags)
    out: list[Candidate] = []
    rejected: list[tuple[Layout, str]] = []
    searched: dict = {"schedules": []}
    why_none = no_factorisation = "no factorisation of the GPU count matches the fixed degrees"
    # SPPO's search first (or beside the rest, ``sppo_beside``); its candidates are listed after the single
    # stage's all the same
    search, sppo_tried = None, (sppo_pols and "sppo" in allowed and (vpp is None or vpp == 1) and micro_batch is None
                                and not optimizer_offload and not uneven_flags and not model.moe)
    sppo_not_searched = None  # why SPPO, asked for, was not searched: what to say if nothing else was either
    sppo_batch = batch or 1  # SPPO's search holds one batch per replica over its layouts
    if sppo_pols and model.moe:
        searched["sppo"] = "not searched for mixture-of-experts models (SPPO's planner is built for dense layers)"
        sppo_not_searched = ("--policy sppo: SPPO is not searched for mixture-of-experts models (its planner is "
                             "built for dense layers); choose another --policy")
    elif sppo_tried and alloc_conf:  # its planner and engine run PyTorch's allocator defaults, the full GPU
        sppo_tried = False
        searched["sppo"] = ("not searched with --alloc-conf (SPPO's planner sizes its stages for PyTorch's allocator "
                            "defaults on the whole GPU)")
        sppo_not_searched = "--policy sppo with --alloc-conf: SPPO plans the allocator's defaults; drop --alloc-conf"
    elif sppo_tried and global_batch is not None:
        if dp is None:  # one batch per replica for every layout: the global batch fixes it only with dp fixed
            sppo_tried = False
            searched["sppo"] = ("not searched with --global-batch unless --dp is fixed (SPPO's search holds one "
                                "batch per replica over its layouts)")
            sppo_not_searched = f"--policy sppo with --global-batch {global_batch}: also fix --dp (its search holds " \
                                f"one batch per replica)"
        else:  # a --global-batch that does not split over --dp is refused above
            sppo_batch = global_batch // dp
    sppo_dp = dp
    if sppo_tried and "zero" not in dp_modes:  # FSDP alone asked for: SPPO's replicas run ZeRO 0/1 (a review: the
        # what-if wrote a ZeRO 1 SPPO plan under --dp-mode fsdp without a word)
        if dp is None or dp == 1:
            sppo_dp = 1
            searched["sppo"] = (f"searched without data parallelism only (--dp-mode {dp_mode}: SPPO's pipelines "
                                f"run ZeRO 0/1 over their replicas)")
        else:
            sppo_tried = False
            searched["sppo"] = f"not searched with --dp-mode {dp_mode} and --dp {dp} (SPPO's replicas run ZeRO 0/1)"
            sppo_not_searched = (f"--policy sppo with --dp-mode {dp_mode} and --dp {dp}: SPPO's replicas run ZeRO 0/1; "
                                 f"drop --dp-mode, or give --dp 1")
    beside = None
    if sppo_tried:
        def run_sppo(bounds=None) -> tuple:
            return sppo_candidates(model, seq, gpus, profile, batch=sppo_batch, tp=tp, cp=cp, ulysses=ulysses, dp=sppo_dp,
                                   zero=zero, sp=sp, tp_mode=tp_mode, pp=pp, subseqs=subseqs, partition=partition,
                                   multiplex=multiplex, bounds=bounds)

        if sppo_beside is not None:  # in a forked child while the rest is priced here
            beside = sppo_beside(run_sppo, (model, profile))
        else:
            say("SPPO's search of its (SP, PP, N) points (tier 1, analytic)")
            search, sppo_cands, sppo_rejected, sppo_why = run_sppo()
    if plain and "single_stage" in allowed and (pp is None or pp == 1) and (vpp is None or vpp == 1):
        say("pricing the single-stage layouts x policies (tier 1, analytic)")
        valid, rej = enumerate_layouts(model, gpus, profile.node_gpus, seq, tp=tp, cp=cp, ulysses=ulysses,
                                       dp=dp, zero=zero, sp=sp, tp_modes=modes,
                                       metp_across_nodes=metp_across_nodes, experts=experts, dp_modes=dp_modes,
                                       ulysses_kv=fw.mechanism("ulysses_kv"), replicate_fsdp=zero0_fsdp)
        rejected += rej + [(lay, fw.why_not(lay)) for lay in valid if not fw.allows(lay)]
        valid = [adapt(lay) for lay in valid if fw.allows(lay)]  # as the framework runs it
        if rejected:
            why_none = framework_why_none(rejected, fw)
        searched["schedules"].append("single_stage")
        stage_valid = valid
        if optimizer_offload:  # asked for: only the layouts with the optimizer on the host
            valid, why_off = _offloaded(valid, fw, rejected)
            why_none = why_off or why_none
            searched["optimizer_offload"] = "asked for"
        variants = _allocator_variants(valid, allocator)
        for i, lay in enumerate(variants, 1):  # the status line throttles these (`memo_sim.cli.whatif.SearchStatus`)
            say(f"pricing the single-stage layouts x policies (tier 1, analytic): layout {i} of {len(variants)}, "
                f"{len(out)} candidates priced")
            out += _single_stage(model, lay, plain, batch, global_batch, micro_batch, seq, profile, alpha, rejected,
                                 allocator)
        if rejected and why_none == no_factorisation:  # the layouts were valid: a policy's or the batch's refusal
            why_none = framework_why_none(rejected, fw)
    at_sppo = (len(out), len(rejected))  # where SPPO's candidates and rejections go
    # a layout the other policies' search refused says why nothing fits better than SPPO's own rules (a --cp
    # given for a ring-CP layout is not the mistake 'sppo splits by TP+SP only' would call it)
    said_before_sppo = why_none != no_factorisation
    pipes_said = False  # the pipelines' first rejection is why nothing fits (it comes after SPPO's)
    state_why = None
    if sppo_tried:
        searched["schedules"].append("sppo")
        if beside is None:
            out += sppo_cands
            rejected += sppo_rejected
            if sppo_why and not out and not said_before_sppo:
                why_none = sppo_why
    if plain and pipes and (pp is None or pp > 1) and not optimizer_offload:  # every schedule the framework runs
        say(f"{len(out)} candidates priced; pricing the micro-batch pipelines (tier 1, analytic)")
        pc, pr, what = pipeline_candidates(
            model, seq, gpus, profile, policies=plain, batch=batch, global_batch=global_batch,
            micro_batch=micro_batch, allows=fw.allows, why_not=fw.why_not, adapt=pipe_adapt, tp=tp, cp=cp, ulysses=ulysses, dp=dp, zero=zero, sp=sp,
            pp=pp, vpp=vpp, alpha=alpha, schedules=pipes, first=first_stage_layers, last=last_stage_layers,
            chunks=chunk_layers, experts=experts, tp_modes=modes, metp_across_nodes=metp_across_nodes, dp_modes=dp_modes,
            replicate_fsdp=zero0_fsdp,
            rank_orders=rank_orders, schedule_why_not=fw.schedule_why_not, on_stage=on_stage,
            floor=(lambda: pipeline_floor(out)) if pipeline_floor is not None and not pipe_flags else None)
        if uneven_flags and not pc and not what.get("not_built"):  # the split asked for splits nothing searched
            why = (what.get("state_why") or what.get("why_none") or (pr[0][1] if pr else
                   f"no layout of pp >= 2 over {gpus} GPU{'s' if gpus > 1 else ''}"))
            # a review: the flags were dropped without a word where no pipeline was valid (one GPU)
            raise MemoError(f"--decoder-first/last-pipeline-num-layers: no pipeline layout is valid with the degrees "
                            f"given ({why}): drop them, or give GPUs and degrees a pipeline of pp >= 2 can split")
        out += pc
        rejected += pr
        unbuilt = (what.get("not_built") or {}).get("schedules", ())  # searched, every family left out by the bound
        searched["schedules"] += [n for n in what["schedules"] if n in unbuilt or any(c.schedule == n for c in pc)]
        searched["pipeline"] = {"pp": what["pp"], "vpp": what["vpp"], "micro_batch": what["micro_batch"],
                                "why": "asked for" if pipe_flags else "searched by default",
                                "rank_orders": list(rank_orders)}
        if ep_overlap:  # how many run it (`with_ep_overlap`: the others cannot, and run without)
            searched["ep_overlap"] = (sum(c.layout.ep_overlap for c in pc), len(pc))
        if "not_built" in what:
            searched["pipeline"]["not_built"] = what["not_built"]
        state_why = what.get("state_why")  # every layout's model states alone overflow (`states_why_not`)
        said = state_why or what.get("why_none")
        # a layout reason of the single stage the degrees describe (no pipeline asked for) stays the answer: a review
        # found --ep 256 --moe-dispatcher deepep on 256 GPUs answered with the pipelines' 'must divide the 128 GPUs
        # of a pipeline stage' where DeepEP's rank cap refused the layout asked for
        keep_single = not pipe_flags and said_before_sppo and not state_why and "single_stage" in searched["schedules"]
        if (pr or said) and not out and not keep_single:
            why_none, pipes_said = said or framework_why_none(pr, fw), True
    if beside is not None:  # SPPO's rows where the search run here puts them (above)
        say(f"{len(out)} candidates priced; waiting for SPPO's search of its (SP, PP, N) points")
        search, sppo_cands, sppo_rejected, sppo_why = beside.result()
        out[at_sppo[0]:at_sppo[0]] = sppo_cands
        rejected[at_sppo[1]:at_sppo[1]] = sppo_rejected
        if not out and sppo_why and not pipes_said and not said_before_sppo:  # nothing at all: as above
            why_none = sppo_why
    if (optimizer_offload is None and stage_valid and fw.optimizer_offload
            and (offload_beside or not any(c.memory.status == "OK" for c in out))):  # the optimizer on the host
        off, _why = _offloaded(stage_valid, fw, rejected)
        for lay in _allocator_variants(off, allocator):
            out += _single_stage(model, lay, plain, batch, global_batch, micro_batch, seq, profile, alpha, rejected,
                                 allocator)
        searched["optimizer_offload"] = (OFFLOAD_AFTER_SIMULATION if offload_beside
                                         else "nothing fits with the optimizer on the GPU")
    if not out and not plain and sppo_not_searched and why_none == no_factorisation:
        why_none = sppo_not_searched  # nothing else was asked for: SPPO's refusal is the answer
    if not out and why_none == no_factorisation and vpp is not None and vpp > 1 and (pp is None or pp > 1):
        fixed = [f"--{k} {v}" for k, v in (("tp", tp), ("cp", cp), ("ulysses", ulysses), ("dp", dp)) if v]
        why_none += (f" (--vpp {vpp} needs a pipeline of at least 2 stages"
                     + (f" beside {' x '.join(fixed)}" if fixed else "")
                     + f" on {gpus} GPUs, and {model.layers} layers in pp x vpp chunks: give fewer GPUs to the fixed "
                     "degrees, or drop --vpp)")
    if not out:  # a valid request whose every layout's model states alone overflow: nothing fits (exit 3)
        error = NothingFits if state_why and why_none == state_why else MemoError
        why_none = (fw.fixed_why_not(tp=tp, cp=cp, ulysses=ulysses, zero=zero, sp=sp)
                    or default_reason(why_none, rejected, lambda r: framework_why_none(r, fw), cp=cp, ulysses=ulysses))
        raise error(f"{NO_VALID_LAYOUT} for {gpus} GPUs with the degrees given: {why_none}")
    out.sort(key=Candidate.sort_key)
    for c in out:  # the framework each plan names (`Candidate.to_plan`), for rank's and the what-if's callers alike
        c.framework = framework
    return WhatIfResult(out, rejected, sppo=search, searched=searched)


def framework_why_none(rejected: list[tuple[Layout, str]], fw) -> str:
    """Why nothing fits, from the rejected layouts: the first of memo's reasons about a layout the framework runs,
    else the framework's refusal of a layout memo builds (every layout memo could build is one the framework does
    not run), else the framework's reason for the first layout, else the first reason. The first reason alone
    named, under torchtitan with --ulysses 2, the METP flavour torchtitan does not offer."""
    own = f"{fw.name} does not offer"
    for lay, why in rejected:  # memo's reason about a layout the framework runs comes first (a review: DeepSpeed's
        if fw.allows(lay):  # Ulysses layouts of a MoE, refused by memo, were answered with its lack of ring CP)
            return why
    for _lay, why in rejected:
        if why.startswith(own):  # no layout the degrees allow is one the framework runs: the first refusal named
            return (f"{why}, nor any other layout with the degrees given; fix: give degrees it offers (`memo-sim "
                    f"frameworks {fw.name}` lists them) or choose another --framework")
    for lay, _why in rejected:
        if (fw_why := fw.why_not(lay)) is not None:
            return fw_why
    return rejected[0][1]


def _single_stage(model, lay: Layout, plain, batch, global_batch, micro_batch, seq, profile, alpha,
                  rejected: list[tuple[Layout, str]], allocator: str = "caching") -> list[Candidate]:
    """The single-stage candidates of one layout: every micro-batch size x policy. A policy with its
    own static plan (MEMO) is one candidate whatever the allocator asked for: on the caching
    layout, or under ``plan`` (no caching twin) on the layout without the ``memory_plan`` mark."""
    b = _replica_batch(batch, global_batch, lay, rejected)
    if b is None:
        return []
    out = []
    for mb in micro_batch_sizes(b, micro_batch):
        if b % mb:
            rejected.append((lay, f"--micro-batch {mb} does not divide the batch ({b} sequences per replica)"))
            continue
        for pol in plain:
            if why := policy_class(pol).layout_why_not(lay):
                rejected.append((lay, f"{pol}: {why}"))
                continue
            at = lay
            if lay.memory_plan and policy_class(pol).static_memory_plan:
                if allocator != "plan":
                    continue  # its caching-allocator twin is the same candidate
                at = replace(lay, memory_plan=False)  # MEMO's own plan places its transients
            out.append(make_candidate(model, at, pol, b, seq, profile, alpha, micro_batch=mb))
    return out


def _offloaded(valid: list[Layout], fw, rejected: list[tuple[Layout, str]]) -> tuple[list[Layout], str | None]:
    """The layouts of ``valid`` with the optimizer on the host where they can have it (ZeRO >= 1, or one
    state shard), and why none can."""
    out, why = [], None
    for lay in valid:
        off = replace(lay, optimizer_offload=True)
        bad = offload_why_not(off) or fw.why_not(off)
        if bad:
            rejected.append((off, bad))
            why = why or bad
        else:
            out.append(off)
    return out, (why if not out else None)


def _check_options(fw, policies: tuple[str, ...], alpha: float | None, batch: int | None, micro_batch: int | None,
                   global_batch: int | None, schedules: tuple[str, ...] | None) -> None:
    """The one-line refusals of a what-if's policies, alpha, batch split and schedules."""
    for p in policies:
        if p not in policy_names():
            raise MemoError(f"--policy {p!r} unknown; choose from {', '.join(policy_names())}")
        if p not in fw.policies:
            raise MemoError(f"--policy {p}: {fw.name} does not offer it (it offers {', '.join(fw.policies)})")
    if alpha is not None and not (0.0 <= alpha <= 1.0):
        raise MemoError(f"--alpha must lie in [0, 1], got {alpha}")
    if alpha is not None and not any(policy_class(p).takes_alpha for p in policies):
        raise MemoError(f"--alpha {alpha} sets MEMO's offloaded fraction, but the policies searched "
                        f"({', '.join(policies)}) take none: drop --alpha or add --policy memo")
    for flag, v in (("--batch", batch), ("--micro-batch", micro_batch), ("--global-batch", global_batch)):
        if v is not None and v < 1:
            raise MemoError(f"{flag} must be at least 1, got {v}")
    if batch is not None and global_batch is not None:
        raise MemoError("--batch (sequences per replica) and --global-batch (sequences over every replica) "
                        "say the same thing twice: give one")
    # a micro-batch that divides no replica's batch refuses every layout, each for its own last reason (a review:
    # --micro-batch 3 --batch 4 was answered with METP's QKV-bias rule): the batch split named first
    total = next(((flag, v) for flag, v in (("--batch", batch), ("--global-batch", global_batch)) if v is not None),
                 None)
    if micro_batch is not None and total and total[1] % micro_batch:
        fits = [d for d in range(1, total[1] + 1) if total[1] % d == 0]
        shown = ", ".join(map(str, fits[:8])) + (", ..." if len(fits) > 8 else "")
        raise MemoError(f"--micro-batch {micro_batch} does not divide {total[0]} {total[1]}"
                        + (" (nor, then, any replica's share of it)" if total[0] == "--global-batch" else "")
                        + f": give a --micro-batch that divides it ({shown})")
    if schedules:
        for n in schedules:
            if n not in SCHEDULE_NAMES:
                raise MemoError(f"--schedule {n!r} unknown; choose from {', '.join(SCHEDULE_NAMES)}")
            if n not in fw.schedules:
                raise MemoError(f"--schedule {n}: {fw.name} does not run it (it runs {', '.join(fw.schedules)})")


def _replica_batch(batch: int | None, global_batch: int | None, lay: Layout,
                   rejected: list[tuple[Layout, str]]) -> int | None:
    """Sequences per replica of ``lay``: ``batch``, or ``global_batch / dp`` (None, and the layout
    rejected, where dp does not divide it), or 1."""
    if global_batch is None:
        return batch or 1
    if global_batch % lay.dp:
        rejected.append((lay, f"--global-batch {global_batch} does not split over dp {lay.dp}"))
        return None
    return global_batch // lay.dp


def _single_stage_candidate(model: ModelConfig, lay: Layout, pol: str, batch: int, micro_batch: int, seq: int,
                            profile: HardwareProfile, alpha: float | None) -> Candidate:
    note, a = "", None
    if policy_class(pol).takes_alpha:
        if alpha is not None:
            a, note = alpha, "fixed by --alpha"
        else:
            res = memo_alpha(model, lay, micro_batch, seq, profile)
            a, note = res.alpha_or_zero, res.note()
    choice = get_policy(pol, a)
    est = partial(estimate_iteration, model, lay, batch, seq, choice, profile, micro_batch=micro_batch)  # on first read
    mem = memory_breakdown(model, lay, micro_batch, seq, choice, profile)
    return Candidate(model, lay, choice, batch, seq, profile, est, mem, note, micro_batch=micro_batch)


def _sppo_candidate(model: ModelConfig, lay: Layout, pol: str, batch: int, micro_batch: int, seq: int,
                    profile: HardwareProfile, alpha: float | None) -> Candidate:
    """SPPO's best point for this layout (the whole batch in one micro-batch)."""
    if micro_batch != batch:
        raise MemoError("the sppo schedule runs the whole batch at once (it splits the sequence instead): "
                        "drop --micro-batch")
    return point_candidate(model, resolve_for_layout(model, lay, batch, seq, profile), batch, seq, profile,
                           "fixed layout")


# the search strategy of each schedule for one fixed layout, by the schedule's name
SEARCH_STRATEGIES = {"single_stage": _single_stage_candidate, "sppo": _sppo_candidate}
for _name in micro_batch_pipelines():
    SEARCH_STRATEGIES[_name] = partial(lambda model, lay, pol, batch, micro_batch, seq, profile, alpha, _n:
                                       pipeline_candidate(model, lay, pol, batch, micro_batch, seq, profile, _n,
                                                          alpha), _n=_name)


def make_candidate(model: ModelConfig, lay: Layout, pol: str, batch: int, seq: int, profile: HardwareProfile,
                   alpha: float | None, *, micro_batch: int | None = None, schedule: str | None = None) -> Candidate:
    """One fixed layout's candidate for policy ``pol`` under ``schedule`` (default:
    `memo_sim.layout.schedule.default_schedule` for the layout and policy)."""
    name = schedule or default_schedule(lay.pp, pol, lay.vpp)
    mb = micro_batch or batch
    why = check_schedule(name, pp=lay.pp, vpp=lay.vpp, layers=model.layers, batch=batch, micro_batch=mb,
                         policy_name=pol, uneven=lay.uneven)
    if why:
        raise MemoError(f"{lay.label()} {pol}: {why}")
    return SEARCH_STRATEGIES[name](model, lay, pol, batch, mb, seq, profile, alpha)


def megatron_twin(c: Candidate, alpha: float | None = None) -> Candidate:
    """A METP candidate's Megatron TP+SP counterpart: the same degrees and policy (MEMO at its own
    solved alpha unless ``alpha`` fixes it), estimated (tier 1)."""
    twin = replace(c.layout, tp_mode="megatron")
    return make_candidate(c.model, twin, c.policy.name, c.batch, c.seq, c.profile, alpha, micro_batch=c.micro_batch,
                          schedule=c.schedule)


def _summary_args(c: Candidate, contention: bool, allocator_lag: int) -> tuple:
    """The arguments of `_simulate_summary` for ``c``."""
    return (c.model, c.layout, c.batch, c.seq, c.policy, c.profile, contention, allocator_lag, c.schedule,
            c.micro_batch)


def _simulate_summary(args: tuple) -> dict:
    """One candidate's tier-2 summary (module level: a process pool pickles it by name)."""
    model, layout, batch, seq, policy, profile, contention, allocator_lag, schedule, micro_batch = args
    r = simulate(model, layout, batch, seq, policy, profile, schedule=schedule, micro_batch=micro_batch,
                 contention=contention, keep_timeline=False, allocator_lag=allocator_lag)
    return r.to_dict()


def simulate_variant(c: Candidate, layout: Layout, allocator_lag: int = 0, model: ModelConfig | None = None) -> dict:
    """The tier-2 summary of candidate ``c`` on ``layout`` instead (e.g. the same plan with a framework's
    mechanisms), and ``model`` where given (as the framework trains it): the same batch, policy, schedule and
    profile, simulated as the ranking simulates."""
    return _simulate_summary(_summary_args(replace(c, layout=layout, model=model or c.model), True, allocator_lag))


_FORKED_WORK: list[tuple] = []  # the arguments of `_simulate_summary`, inherited by forked workers


def _simulate_chunk(items: list) -> list[dict]:
    """`_simulate_summary` of each item: its arguments, or (in a forked worker) the index of
    them in the memory the worker was forked with: nothing to pickle, and the candidates keep
    sharing one model, layout, policy and profile object wherever the parent's did, so that the
    memos keyed by them serve every candidate (unpickled copies are new keys to them)."""
    return [_simulate_summary(_FORKED_WORK[x] if isinstance(x, int) else x) for x in items]


# The cyclic garbage collector, at its default thresholds, spent about a fifth of tier 2's CPU
# walking the objects each simulation makes (op graphs, events, memos; refcounting frees them:
# `memo_sim.engine.core.Engine.run` leaves no cycle). Tier 2 collects less often: over every third
# plain candidate of benchmarks/sim_speed.py, 83 passes (1.1 s) instead of 8,227 (5.6 s) of 26.7 s
# of CPU, the same peak memory (2026-11-22, the shared 2-core machine, serial).
GC_THRESHOLDS = (20_000, 50, 1_000)


@contextmanager
def _fewer_collections():
    old = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _worker_init() -> None:
    """A pool worker: what it was forked with is never garbage there (`gc.freeze`), and it
    collects less often (`GC_THRESHOLDS`)."""
    freeze_heap()
    gc.set_threshold(*GC_THRESHOLDS)


def default_jobs() -> int:
    """All the cores this process may run on."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


PARALLEL_MIN = 4  # fewer candidates than this are simulated in this process (a pool costs more)
CHUNK = 32  # candidates per task of the pool


def _a_pipeline(c: Candidate) -> bool:
    """A pipeline (every schedule but the single stage): up to a few hundred times a single stage's simulation."""
    return c.schedule != "single_stage"


def _chunks(candidates: list[Candidate], jobs: int, among: list[int] | None = None) -> list[list[int]]:
    """The pool's tasks, in the order it hands them out: candidates that share per-GPU shapes
    go to one worker one after the other, so that its memoised costs and caching-allocator
    replays serve them all. Pipelines (every schedule but the single stage; SPPO up to a few hundred
    times a plain candidate) go first, one per task, so that no worker is left with a chunk of them at the end. The rest,
    sorted by shape, are cut into ``jobs`` runs of consecutive candidates, each in chunks of
    `CHUNK`, handed out in turn (a worker that takes the next chunk of its run, as it does when
    the workers keep pace, meets the shapes it has just simulated). ``among``: only these indices."""
    order = sorted(range(len(candidates)) if among is None else among, key=lambda i: _locality(candidates[i]))
    heavy = [[i] for i in order if _a_pipeline(candidates[i])]
    light = [i for i in order if not _a_pipeline(candidates[i])]
    step = max(1, -(-len(light) // jobs))
    runs = [[run[k:k + CHUNK] for k in range(0, len(run), CHUNK)]
            for run in (light[start:start + step] for start in range(0, len(light), step))]
    return heavy + [run[k] for k in range(max(map(len, runs), default=0)) for run in runs if k < len(run)]


class Tier2Pool:
    """One pool of forked workers for every batch of one query's tier 2 (`simulate_by_bound`
    simulates a few candidates at a time): forked once, at the first batch, with the arguments of
    every candidate the query may simulate (``candidates``) in its memory, so that a batch starts
    no process and each worker keeps its memos and caching-allocator replays from one batch to
    the next. Where the platform cannot fork, `usable` is False (each batch makes its own pool)."""

    def __init__(self, candidates: list[Candidate], jobs: int, contention: bool = True, allocator_lag: int = 0):
        import multiprocessing

        self.jobs = jobs
        self.usable = jobs > 1 and "fork" in multiprocessing.get_all_start_methods()
        self._index = {id(c): i for i, c in enumerate(candidates)}
        self._keep = list(candidates)  # their ids stay theirs while the pool lives
        self._work = [_summary_args(c, contention, allocator_lag) for c in candidates]
        self._args = (contention, allocator_lag)
        self._executor = None

    def serves(self, candidates: list[Candidate], contention: bool, allocator_lag: int) -> bool:
        return (self.usable and (contention, allocator_lag) == self._args
                and all(id(c) in self._index for c in candidates))

    def submit(self, chunk: list[Candidate]):
        """A future of `_simulate_chunk` of ``chunk`` (forking the workers on the first call)."""
        global _FORKED_WORK
        if self._executor is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            _FORKED_WORK = self._work  # the workers are forked at the first submit, with it
            self._executor = ProcessPoolExecutor(max_workers=self.jobs, initializer=_worker_init,
                                                 mp_context=multiprocessing.get_context("fork"))
        return self._executor.submit(_simulate_chunk, [self._index[id(c)] for c in chunk])

    def close(self) -> None:
        global _FORKED_WORK
        if self._executor is not None:
            self._executor.shutdown(cancel_futures=True)
            self._executor = None
            _FORKED_WORK = []


def simulate_candidates(candidates: list[Candidate], progress: Progress | None = None, *,
                        contention: bool = True, allocator_lag: int = 0, jobs: int = 1,
                        ahead: SppoBeside | None = None, pool: Tier2Pool | None = None) -> list[dict]:
    """Tier 2 of the what-if: simulate each candidate and store the summary in
    ``candidate.simulated`` (the keys `Candidate.to_plan` reads). Returns the summaries, in the
    candidates' order.

    ``jobs`` > 1 simulates in a pool of that many processes (`concurrent.futures`, forked where
    the platform can; ``pool``, a `Tier2Pool` that holds these candidates, instead of a new one);
    a simulation is deterministic, so the summaries are the serial run's (all
    but ``sim_wall_s``, the host seconds each took), in the same order. ``progress(done, total)``
    is called as they come in. ``ahead``: summaries started early (`memo_sim.search.sppo_beside`,
    simulated with the same settings), taken from there for the candidates it has."""
    global _FORKED_WORK
    if jobs < 1:
        raise MemoError(f"--jobs must be at least 1, got {jobs}")
    work = [_summary_args(c, contention, allocator_lag) for c in candidates]
    jobs = min(jobs, len(work))
    out: list[dict | None] = [None] * len(work)

    def take(indices, summaries, done: int) -> int:
        for i, summary in zip(indices, summaries):
            candidates[i].simulated = summary
            out[i] = summary
        if progress is not None:
            progress(done + len(indices), len(work))
        return done + len(indices)

    def early(i: int) -> dict | None:
        return ahead.take(candidates[i]) if ahead is not None and ahead.has(candidates[i]) else None

    # two pipelines or more go to the pool however few: each costs far more than the pool's start (SPPO's up to a few
    # seconds at 1M tokens; a verdict's round of two SPPO plans ran one after the other, 2026-12-02)
    heavy = sum(1 for c in candidates if _a_pipeline(c) and not (ahead is not None and ahead.has(c)))
    if jobs <= 1 or (len(work) < PARALLEL_MIN and heavy < 2):
        done = 0
        with _fewer_collections():
            for i, w in enumerate(work):
                done = take([i], [early(i) or _simulate_summary(w)], done)
        return out
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    shared = pool is not None and pool.serves(candidates, contention, allocator_lag)
    if shared:
        own = None
        submit = lambda chunk: pool.submit([candidates[i] for i in chunk])  # noqa: E731
    else:
        # fork: the workers start with this process's modules, caches and candidates
        fork = "fork" in multiprocessing.get_all_start_methods()
        own = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork") if fork else None,
                                  initializer=_worker_init)
        if fork:
            _FORKED_WORK = work
        submit = lambda chunk: own.submit(_simulate_chunk, chunk if fork else [work[i] for i in chunk])  # noqa: E731
    try:
        started = [i for i in range(len(work)) if ahead is not None and ahead.has(candidates[i])]
        early_ids = set(started)
        kept = [i for i in range(len(work)) if i not in early_ids] if started else None
        pending = {submit(chunk): chunk for chunk in _chunks(candidates, jobs, kept)}
        done = 0
        for i in started:  # taken while the pool simulates the others
            s = early(i)
            if s is None:
                pending[submit([i])] = [i]
            else:
                done = take([i], [s], done)
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                done = take(pending.pop(f), f.result(), done)
    finally:
        if own is not None:
            own.shutdown(cancel_futures=True)
            _FORKED_WORK = []
    return out


def _locality(c: Candidate) -> tuple:
    """What the per-GPU work of a candidate depends on most, for grouping similar ones."""
    lay = c.layout
    return (c.model.name, c.profile.name, c.seq, c.batch, c.micro_batch, lay.tp, lay.sp, lay.tp_mode, lay.cp,
            lay.ulysses, lay.pp, lay.vpp, c.schedule, c.policy.name, lay.zero, lay.dp, c.policy.label())


# ------------------------------------------------------------------------------------- presentation
def behaviour_key(c: Candidate, behaviours: dict | None = None) -> tuple:
    """What a candidate does, whatever its policy is called: its layout and which bytes go to
    host or are rebuilt (`Policy.behaviour`). Two candidates with one key are one plan twice
    (``memo`` at alpha = 1 moves what ``full_offload`` moves). ``behaviours``: a memo of
    `Policy.behaviour` by (policy, layers), kept by the caller over many candidates (a query's
    tens of thousands of candidates share a few dozen policies)."""
    if c.sppo is not None:
        what = c.policy.label()
    elif behaviours is None:
        what = c.policy.behaviour(c.model.layers)
    else:
        k = (c.policy, c.model.layers)
        what = behaviours.get(k)
        if what is None:
            what = behaviours[k] = c.policy.behaviour(c.model.layers)
    layout = c.layout
    if c.policy.static_memory_plan and not layout.memory_plan:  # MEMO's own plan is the layout asked to run on one
        layout = replace(layout, memory_plan=True)  # (an audit: memo at alpha 1 beside full_offload -memplan, twice)
    return (layout, c.schedule, c.batch, c.micro_batch, what)


def fold_duplicates(candidates: list[Candidate]) -> list[Candidate]:
    """The ranking with each behaviour (`behaviour_key`) once, at its best-ranked row; the rows
    folded into it are named in its ``folded`` list."""
    seen: dict[tuple, Candidate] = {}
    behaviours: dict = {}
    out = []
    for c in candidates:
        k = behaviour_key(c, behaviours)
        first = seen.get(k)
        if first is None:
            seen[k] = c
            c.folded = []
            out.append(c)
        else:
            first.folded.append(c.policy.label())
    return out


def _value_words(flag: str) -> Callable[[object], str]:
    return lambda v: f"{flag} {v}"


def _switch_words(on: str, off: str) -> Callable[[object], str]:
    return lambda v: on if v else off


# Every key `memo_sim.search.request.WhatifRequest.fixed` puts in ``fixed`` (request.py's FIXING), with the value that
# means "not pinned" and the command's words for a pinned value: `not_searched` reads this one table, so a pin that
# is the reason nothing fits is named (a review: --ep 1 --etp 1 left out of the advice while they kept Mixtral's
# experts whole on every GPU). Each row: the value the command has when the flag is not given, the flag's words for a
# value, and what dropping the flag does: ``search`` (the search tries every value), ``default`` (the command's one
# default value is priced instead: --moe-dispatcher, --moe-balance, --alloc-conf, --allocator) or ``sentence``
# (``tp_mode`` and ``metp_across_nodes``: a sentence of their own on the flavours and rings searched, no words here).
# A test iterates over request.py's FIXING (tests/test_review_fixes_moe_search.py).
PINNABLE: dict[str, tuple[object, Callable[[object], str] | None, str]] = {
    "batch": (None, _value_words("--batch"), "search"),
    "global_batch": (None, _value_words("--global-batch"), "search"),
    "micro_batch": (None, _value_words("--micro-batch"), "search"),
    "tp": (None, _value_words("--tp"), "search"),
    "cp": (None, _value_words("--cp"), "search"),
    "ulysses": (None, _value_words("--ulysses"), "search"),
    "dp": (None, _value_words("--dp"), "search"),
    "zero": (None, _value_words("--zero"), "search"),
    "sp": (None, _switch_words("--sp", "--no-sp"), "search"),
    "alpha": (None, _value_words("--alpha"), "search"),
    "pp": (None, _value_words("--pp"), "search"),
    "vpp": (None, _value_words("--vpp"), "search"),
    "schedules": (None, lambda v: " ".join(f"--schedule {s}" for s in v), "search"),
    "subseqs": (None, _value_words("--subseqs"), "search"),
    "partition": (None, _value_words("--partition"), "search"),
    "multiplex": (None, _switch_words("--multiplex", "--no-multiplex"), "search"),
    "optimizer_offload": (None, _switch_words("--optimizer-offload", "--no-optimizer-offload"), "search"),
    "first_stage_layers": (None, _value_words("--decoder-first-pipeline-num-layers"), "search"),
    "last_stage_layers": (None, _value_words("--decoder-last-pipeline-num-layers"), "search"),
    "chunk_layers": (None, lambda v: "--pipeline-model-parallel-layout", "search"),
    "ep": (None, _value_words("--ep"), "search"),
    "etp": (None, _value_words("--etp"), "search"),
    "dp_mode": (None, _value_words("--dp-mode"), "search"),
    "rank_order": (None, _value_words("--rank-order"), "search"),
    # one value is always priced: dropping the flag goes back to the command's default, it searches no others
    "moe_dispatcher": ("alltoall", _value_words("--moe-dispatcher"), "default"),
    "moe_balance": ("dropless", _value_words("--moe-balance"), "default"),
    "ep_overlap": (False, _switch_words("--ep-overlap", "--no-ep-overlap"), "default"),
    "alloc_conf": (None, _value_words("--alloc-conf"), "default"),
    "kernel_fusion": (None, _value_words("--kernel-fusion"), "default"),
    "attention": (None, _value_words("--attention"), "default"),
    "grad_overlap": (None, _switch_words("--grad-overlap", "--no-grad-overlap"), "default"),
    "allocator": ("caching", _value_words("--allocator"), "default"),
    "tp_mode": ("all", None, "sentence"),
    "metp_across_nodes": (False, None, "sentence"),
}
# the settings whose pinned value is a whole space searched: ``all`` is the unpinned search, not a pin
_SEARCH_ALL = {"dp_mode": "all", "rank_order": "all"}


def pinned_flags(fixed: dict) -> tuple[list[str], list[str]]:
    """The flags ``fixed`` pins, in the command's words (`PINNABLE`): those whose dropping widens the search, and
    those whose dropping goes back to the command's one default value. A key of ``fixed`` the table lacks is a
    `MemoError` (a new pin would otherwise go unnamed in the advice again)."""
    unknown = sorted(k for k in fixed if k not in PINNABLE)
    if unknown:
        raise MemoError(f"not_searched: no flag for the fixed option(s) {', '.join(unknown)}; add them to PINNABLE "
                        f"in memo_sim/search/whatif.py")
    searched, defaults = [], []
    for key, (default, words, kind) in PINNABLE.items():
        v = fixed.get(key, default)
        if words is None or v is None or v == default or _SEARCH_ALL.get(key) == v:
            continue
        (searched if kind == "search" else defaults).append(words(v))
    return searched, defaults


def not_searched(gpus: int, policies: tuple[str, ...] | None, framework: str, fixed: dict) -> list[str]:
    """What a what-if with these restrictions did not look at, as advice a user can act on: the policies and
    frameworks left out, and every flag ``fixed`` pins (`pinned_flags`, one table for every key of ``fixed``)."""
    fw = get_framework(framework)
    searched = tuple(policies) if policies else fw.policies
    out = []
    missing = [p for p in policy_names() if p not in searched]
    offered = [p for p in missing if p in fw.policies]
    if offered:  # what this framework runs but the request left out
        out.append(f"policies {', '.join(offered)} (drop --policy, or add --policy {offered[0]})")
    others = [p for p in missing if p not in fw.policies]
    if others:  # what only other frameworks run: a policy --policy cannot add here
        out.append(f"policies {', '.join(others)}, which {fw.name} does not offer (another --framework)")
    if framework != "any":
        out.append(f"layouts and policies outside what {framework} offers (--framework any)")
    pinned, settings = pinned_flags(fixed)
    if pinned:
        out.append(f"other values than {', '.join(pinned)} (drop them to search every layout)")
    if settings:
        out.append(f"other settings than {', '.join(settings)} (drop them for the command's defaults)")
    if fixed.get("tp_mode", "all") != "all":
        out.append(f"tensor-parallel flavours other than {fixed['tp_mode']} (--tp-mode all)")
    if not fixed.get("metp_across_nodes"):
        out.append("METP rings across nodes (--metp-across-nodes)")
    if fixed.get("tp") is None:  # the search keeps TP inside a node; a degree of whole nodes is priced where fixed
        out.append("Megatron TP over whole nodes (--tp, a multiple of a node's GPUs)")
    out.append(f"more than {gpus} GPU{'s' if gpus != 1 else ''} (--gpus) or a shorter sequence (memo-sim maxseq "
               f"finds the longest that fits)")
    return out


SPPO_SIMULATED = 2  # tier 2 also simulates the heuristic's SPPO choice and this many of the best SPPO points


def sppo_always(ranked: list[Candidate], n: int) -> list[Candidate]:
    """SPPO's candidates that tier 2 simulates whatever the bound says: the fitting heuristic
    choice and the ``n`` best fitting SPPO candidates of ``ranked`` (in rank order), each once."""
    ok = [c for c in ranked if c.memory.status == "OK" and c.sppo is not None]
    picked = [c for c in ok if "heuristic" in c.sppo.get("roles", ())] + ok[:n]
    return [c for i, c in enumerate(picked) if not any(c is x for x in picked[:i])]


def rank(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, *,
         simulate_top: int | str = SIMULATE_BOUND, progress: Progress | None = None, allocator_lag: int = 0,
         sppo_simulate: int = SPPO_SIMULATED, jobs: int = 1,
         while_waiting: Callable[[Candidate], object] | None = None, floor_tgs: float | None = None,
         **fixed) -> WhatIfResult:
    """Both tiers: every candidate estimated; of those that fit, tier 2 simulates (``simulate_top``)
    in order of a proved throughput bound until none left can beat the best simulated
    (``bound``, `memo_sim.search.prune`), every one (``all``), or the analytic best N; the
    simulated rank first by their simulated throughput (`WhatIfResult.tier2` says how many were
    simulated and skipped). The bound search skips SPPO's candidates by their proved bound
    (`memo_sim.search.bound.sppo_bound`) like the others (the SPPO vs MEMO verdict's SPPO side is
    simulated all the same, and in the bound search each verdict side's plans whose bound beats that
    side's best simulated plan, `memo_sim.search.verdicts`); with ``all`` or a count, tier 2 also
    simulates SPPO's heuristic choice and the best ``sppo_simulate`` SPPO points
    (`WhatIfResult.sppo_summary`). ``jobs``: processes for tier 2 (`simulate_candidates`).
    ``while_waiting(best)``: called once, on the best candidate simulated so far, where this process
    would otherwise wait for SPPO's simulation in the child (the what-if builds that plan's memory
    plan then, `memo_sim.search.plan_build.prebuild_plan`). ``fixed``: `candidates_for`'s keyword
    arguments. ``floor_tgs``: a throughput a plan this search builds was simulated at already (memo's own search
    beside a framework's, `memo_sim.search.request.answer_whatif`): the bound search before the pipelines counts it as
    its best, so neither single-stage plans nor pipeline families whose proved bounds lie below it are simulated or
    built; the caller checks the answer reaches it."""
    mode = parse_simulate_top(simulate_top)
    ahead: list[SppoBeside] = []  # summaries tier 2 takes instead of simulating

    def first_simulated(sppo_cands: list[Candidate]) -> list[Candidate]:
        """SPPO's candidates that tier 2 will simulate whatever else it does: the verdict's SPPO
        side; with ``all`` or a count, the extras below."""
        ranked = sorted(sppo_cands, key=Candidate.sort_key)
        if mode == SIMULATE_BOUND:  # the SPPO side of the SPPO vs MEMO verdict, where MEMO is searched too
            searched = fixed.get("policies") or get_framework(fixed.get("framework", "any")).policies
            memo_side = any(policy_class(p).takes_alpha for p in searched if p in policy_names())
            return [c for c in (best_fit(ranked, SPPO_VS_MEMO.a),) if c is not None] if memo_side else []
        return sppo_always(ranked, sppo_simulate) if sppo_simulate else []

    def beside(search, shared) -> SppoBeside:
        """SPPO's search in a forked child beside the rest of tier 1, then `first_simulated` there (with one
        job, or where the platform cannot fork, the search runs here and tier 2 simulates them)."""
        b = SppoBeside(search, first_simulated if mode else (lambda cands: []),
                       lambda c: _simulate_summary(_summary_args(c, True, allocator_lag)), shared)
        ahead.append(b)
        return b

    if jobs > 1 and FORKS:
        fixed = dict(fixed, sppo_beside=beside)
    try:
        result = _rank(model, seq, gpus, profile, mode, progress, allocator_lag, sppo_simulate, jobs, ahead, fixed,
                       while_waiting, floor_tgs)
        if (result.best is None and mode and fixed.get("optimizer_offload") is None
                and "optimizer_offload" not in result.searched and not fixed.get("offload_beside")):
            # the estimate fitted some candidates, the event simulator none (fragmentation, copy stalls): the
            # optimizer-on-host layouts, which `candidates_for` adds only where the estimate fits nothing, searched
            # as well (a review: exit 3 where --optimizer-offload fitted, 2026-12-03)
            again = _rank(model, seq, gpus, profile, mode, progress, allocator_lag, sppo_simulate, jobs, ahead,
                          dict(fixed, offload_beside=True), while_waiting, floor_tgs)
            if again.searched.get("optimizer_offload"):
                result = again
        return result
    finally:
        for a in ahead:
            a.close()


def _idle_on_best(head: list[Candidate], work: Callable[[Candidate], object]) -> None:
    """``work(best)`` on the best fitting candidate of ``head`` (the simulated ones), if any."""
    ok = [c for c in sorted(head, key=Candidate.sort_key) if c.status == "OK"]
    if ok:
        work(ok[0])


def _ranked(head: list[Candidate], candidates: list[Candidate]) -> list[Candidate]:
    """The ranking: ``head`` (the simulated) by `Candidate.sort_key`, then the rest of ``candidates`` in their order."""
    ids = {id(h) for h in head}
    return sorted(head, key=Candidate.sort_key) + [c for c in candidates if id(c) not in ids]


def _idle_for_child(head: list[Candidate], while_waiting: Callable[[Candidate], object] | None,
                    guess: Callable[[], object]) -> None:
    """What this process does while it would wait for the SPPO simulation the child makes: ``while_waiting`` on
    the best simulated plan (the plan file's memory plan; what it raises is dropped, as `SppoBeside.idle` says: the
    same work done later raises it where it matters), then ``guess`` (`_guess_sides`)."""
    if while_waiting is not None:
        try:
            _idle_on_best(head, while_waiting)
        except Exception:  # noqa: BLE001  (the docs above)
            pass
    guess()


def _guess_sides(candidates: list[Candidate], beside: SppoBeside, guessed: dict[int, dict], allocator_lag: int) -> None:
    """While this process would wait for the child's simulation of a verdict side (``beside``), simulate the plans
    the verdict is likely to name next (`memo_sim.search.verdicts.likely_next_sides`), one at a time while the
    child is not done, into ``guessed`` (id -> summary). The verdict then takes the ones it names instead of
    simulating them (the same summaries: a simulation is deterministic), after the one it waited for, where it
    used to simulate them one after the other (2026-12-02, GPT-13B / 64 A800s / 1M: the child's SPPO plan at
    N = 512, then N = 256 here, whose bound beat it); the others are dropped, so the answer is the one without
    guesses."""
    order = _ranked([c for c in candidates if c.simulated is not None], candidates)
    with _fewer_collections():
        for c in likely_next_sides(order, lambda c: beside.has(c) and c.simulated is None):
            if not beside.would_wait():
                break
            guessed[id(c)] = _simulate_summary(_summary_args(c, True, allocator_lag))


def _simulate_verdict_sides(candidates: list[Candidate], head: list[Candidate], run, bounded: bool = False) -> int:
    """Simulate (``run``) the verdict lines' sides that tier 2 left analytic
    (`memo_sim.search.verdicts`), adding them to ``head`` (the simulated candidates), until every
    verdict with two sides compares two simulated plans; how many were simulated. ``bounded`` (the
    proved-bound search): also each side's plans whose bound beats its simulated best (with
    ``--simulate-top N`` or ``all`` the user set what tier 2 simulates: the sides' first plans only)."""
    n = 0
    for _ in range(VERDICT_ROUNDS):
        need = verdict_sides_to_simulate(_ranked(head, candidates), bounded=bounded)
        if not need:
            break
        run(need)
        head.extend(need)
        n += len(need)
    return n


def _bound_words(what: str, simulated: int, gap: float | None) -> str:
    """The bound search's progress in words: how many simulated and the bound gap (`memo_sim.search.prune.bound_gap`:
    it ends where the next bound falls below the best simulated throughput)."""
    words = f"{what}: {simulated} simulated"
    if gap is not None:
        words += (f", the next bound {100 * gap:.1f}% above the best simulated" if gap >= 0 else
                  ", every bound left below the best simulated")
    return words


def _rank(model: ModelConfig, seq: int, gpus: int, profile: HardwareProfile, mode, progress, allocator_lag: int,
          sppo_simulate: int, jobs: int, ahead: list, fixed: dict, while_waiting=None,
          floor_tgs: float | None = None) -> WhatIfResult:
    """`rank` with SPPO's search beside the rest where ``fixed`` says so (``ahead``: what it simulates).
    The bound search starts before the micro-batch pipelines are priced: on the candidates listed by
    then, in this process (SPPO's search may hold the other core), so that a pipeline family whose
    proved bound is below its best is never built (`candidates_for`'s ``pipeline_floor``).

    Progress: where ``progress`` has a ``stage(words)`` method (`memo_sim.cli.whatif.search_progress`), each stage
    is named as it starts and the bound search's count and bound gap as it goes (a review: a bar counted out of
    every fitting candidate while the bound search simulated 31-47 of them, showed nothing for the 75-95% of the
    run spent pricing, and its ETA multiplied by plans it would skip); ``progress(done, total)`` itself is called
    only where the total is what tier 2 will simulate (``all`` or a count), never with the fitting count as a
    guess."""
    stage = getattr(progress, "stage", None) or (lambda _words: None)
    if mode == SIMULATE_BOUND:
        def floor(listed: list[Candidate]) -> float | None:
            # SPPO's candidates left out: with --jobs > 1 its search is still running in the child here, so the
            # floor would differ with the jobs (a review: --jobs 1 and 2 simulated different plans); the bound
            # search after the pipelines takes them in either way
            fit = [c for c in listed if c.memory.status == "OK" and c.sppo is None]
            what = f"bound search over the {len(fit)} fitting candidates priced before the pipelines"
            stage(f"{what}: proving each one's throughput bound, then simulating from the highest")
            # in this process, one at a time, where SPPO's search holds the other core in its child; with no child
            # (no SPPO searched: a framework without it, a mixture of experts) a pool of --jobs processes, the same
            # decisions (`simulate_by_bound`'s window: what a window simulates past the stop is dropped), so the same
            # floor (2026-12-05: DeepSeek-V3 on 256 B200s under torchtitan spent a third of its CPU here, one core
            # idle)
            pool = Tier2Pool(fit, jobs, allocator_lag=allocator_lag) if jobs > 1 and not ahead else None
            try:
                found = simulate_by_bound(fit, lambda cands: simulate_candidates(
                    cands, allocator_lag=allocator_lag, jobs=jobs if pool is not None else 1,
                    ahead=ahead[0] if ahead else None, pool=pool),
                    window=2 * jobs if pool is not None else None,
                    on_step=lambda k, gap: stage(_bound_words(what, k, gap)),
                    on_bound=lambda i, n: stage(f"{what}: proving throughput bounds, {i} of {n}"), floor=floor_tgs)
            finally:
                if pool is not None:
                    pool.close()
            # its own key (the words before ':'), so the status line's throttle of one stage cannot drop it: what
            # follows is the pipelines' pricing against this floor (`pipeline_candidates`' ``on_stage``)
            best = "none fits" if found.best_tgs is None else f"{found.best_tgs:,.0f} tokens/GPU/s" + (
                " (the floor given: a plan of this search simulated before it)" if found.best_tgs == floor_tgs else "")
            stage(f"best simulated before the pipelines: {best} ({found.simulated} of {len(fit)} simulated); next: "
                  f"bounding the micro-batch pipeline families against it")
            return found.best_tgs

        fixed = dict(fixed, pipeline_floor=floor)
    stage("pricing the candidates (tier 1, analytic)")
    with gc_paused():  # tens of thousands of long-lived candidates and memos, no garbage cycles
        result = candidates_for(model, seq, gpus, profile, **dict(fixed, on_stage=stage))
    if mode:
        fitting = [c for c in result.candidates if c.memory.status == "OK"]
        extra = []  # the bound search skips SPPO's candidates by their proved bound like any other
        if result.sppo is not None and sppo_simulate and mode != SIMULATE_BOUND:
            extra = sppo_always(fitting, sppo_simulate)

        pool = Tier2Pool(fitting, jobs, allocator_lag=allocator_lag) if mode == SIMULATE_BOUND else None

        # simulated so far over every batch; the stage's words, bound gap and total (None: unknown); its count is
        # ``offset`` (simulated before it) plus what it simulated since ``since`` (``done`` when it started)
        shown = {"done": 0, "words": "", "gap": None, "total": None, "offset": 0, "since": 0}

        def begin(words: str, offset: int = 0, total: int | None = None) -> None:
            shown.update(words=words, gap=None, total=total, offset=offset, since=shown["done"])
            stage(words)

        def counted(base: int):
            """The batch's progress as the whole tier's: its count on top of the batches before (a review: the bar
            restarted each batch and sat at 25%); out of what tier 2 will simulate where that is known
            (``shown["total"]``), else named with the bound gap (`_bound_words`)."""
            def told(done: int, _total: int) -> None:
                k = shown["offset"] + base + done - shown["since"]
                if shown["total"] is not None and progress is not None:
                    progress(k, shown["total"])
                else:
                    stage(_bound_words(shown["words"], k, shown["gap"]))
            return None if progress is None else told

        guessed: dict[int, dict] = {}  # summaries simulated while waiting for the child (`_guess_sides`)

        def run(cands: list[Candidate]) -> None:
            base = shown["done"]
            for c in cands:
                if id(c) in guessed:
                    c.simulated = guessed.pop(id(c))
            simulate_candidates([c for c in cands if c.simulated is None], progress=counted(base),
                                allocator_lag=allocator_lag, jobs=jobs, ahead=ahead[0] if ahead else None, pool=pool)
            shown["done"] = base + len(cands)

        if mode == SIMULATE_BOUND:
            def step(k: int, gap: float | None) -> None:
                shown["gap"] = gap
                stage(_bound_words(shown["words"], k, gap))

            try:
                # decisions PARALLEL_MIN at a time whatever --jobs (the serial run's), the pool fed 2 x jobs at once
                begin(f"bound search over {len(fitting)} fitting candidates",
                      sum(1 for c in fitting if c.simulated is not None))
                result.tier2 = simulate_by_bound(fitting, run, batch=PARALLEL_MIN, window=2 * jobs, always=extra,
                                                 on_step=step, on_bound=lambda i, n: stage(
                                                     f"{shown['words']}: proving throughput bounds, {i} of {n}"))
                result.tier2.add_not_built((result.searched.get("pipeline") or {}).get("not_built"))
                head = [c for c in result.candidates if c.simulated is not None]
                if ahead:
                    ahead[0].idle = partial(_idle_for_child, head, while_waiting, partial(
                        _guess_sides, result.candidates, ahead[0], guessed, allocator_lag))
                begin("simulating the verdict lines' sides")
                n = _simulate_verdict_sides(result.candidates, head, run, bounded=True)
                still = [c for c in fitting if c.simulated is None]
                plans = {behaviour_key(c) for c in fitting if c.simulated is not None}
                result.tier2.add_verdict_sides(n, still, [c for c in still if behaviour_key(c) not in plans])
            finally:
                pool.close()
        else:
            head = fitting if mode == SIMULATE_ALL else fitting[:mode]
            ids = {id(h) for h in head}
            head = head + [c for c in extra if id(c) not in ids]
            begin(f"simulating {len(head)} of the {len(fitting)} fitting candidates", total=len(head))
            run(head)
            result.tier2 = PruneReport("all" if mode == SIMULATE_ALL else "top", len(fitting), len(head), 0,
                                       top=0 if mode == SIMULATE_ALL else mode)
            begin("simulating the verdict lines' sides")
            result.tier2.add_verdict_sides(_simulate_verdict_sides(result.candidates, head, run))
            result.tier2.best_tgs = max((c.simulated["tgs_tokens_per_gpu_s"] for c in fitting if c.simulated
                                         and c.simulated["status"] == "OK"), default=None)
            result.tier2.set_unproved([c for c in fitting if c.simulated is None])  # a review: top N said nothing
        result.tier2.failed = sum(1 for c in fitting if c.simulated is not None and c.simulated["status"] != "OK")
        # the last line is the report's own tier-2 line (a review: the last progress line said 'the next bound 0.6%
        # above the best simulated', a bound the search went on to simulate, where the report said 'the closest
        # skipped bound is 0.4% below')
        stage("done: " + result.tier2.line().removeprefix("tier 2: "))
        result.candidates = _ranked(head, result.candidates)
        result.simulated = len(head)
    if result.sppo is not None:
        result.sppo_summary = summarize(result.sppo, result.candidates)
    return result
