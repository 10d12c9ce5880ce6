"""Whether a plan can be run as written: the checks `memo-sim check-plan` adds to the schema's.

`memo_sim.plan.schema.Plan.from_dict` checks every field on its own (types, ranges, names) and
the fields against each other (degrees and GPUs, schedule and batch split). What needs the rest
of the simulator is checked here, before anything runs:

- the profile the plan names can be found and read (`memo-sim simulate` and the executor need it);
- a policy with its own plan fields (SPPO's subsequences) fits the layout and length;
- MEMO's static memory plan places exactly the transient tensors of this plan's layer: every
  tensor of the forward and backward level-1 traces (`memo_sim.memplan.trace_gen`) has an
  offset or a stated reason for none, no offset names a tensor the layer does not allocate, and
  the placement is valid (no two tensors that live at the same time overlap, all inside the
  phase's arena); a plan of another policy carries no memory plan;
- a MEMO plan's level 2 under a micro-batch pipeline places, for every pipeline rank, exactly the blocks of the
  micro-batches that rank holds in flight in its schedule's order (`memo_sim.memplan.stage_plan`),
  validly; a plan in one stage carries no per-rank plans.
"""

from __future__ import annotations

from memo_sim.errors import MemoError, PlanError
from memo_sim.layout.parallel import check_layout, seq_fix_names
from memo_sim.memplan.placement_check import validate_placement
from memo_sim.memplan.stage_plan import stage_model_trace
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace, model_trace, unplaced_in
from memo_sim.plan.schema import Plan
from memo_sim.profile.loader import load_profile
from memo_sim.request_trace import RequestTrace
from memo_sim.search.frameworks import FRAMEWORKS


def plan_problems(plan: Plan) -> list[str]:
    """One line per problem (``field: what; fix``); empty when the plan can run as written."""
    out = []
    try:
        load_profile(plan.profile)
    except MemoError as e:
        out.append(f"profile: {e}")
    return out + runnable_problems(plan)


def layout_problem(plan: Plan, profile) -> str | None:
    """The plan's layout against its model, length and ``profile``'s nodes, as the what-if checks a candidate
    (`memo_sim.layout.parallel.check_layout`): ``layout: why; fix``, or None (a review: a plan edited to 131,073
    tokens under CP 4 and SP was valid for check-plan and exported, where the what-if refuses that length), and an
    attention kernel the profile gives no curves for (`memo_sim.profile.attention_kernels`: FlashAttention's Triton
    kernel off the A100 profiles)."""
    # the node as memo-exec validate sizes it (its plans run every rank on one machine: a CPU profile's node is one
    # device), so a plan's TP is not held to the profile's node here; the what-if's search is. The MoE dispatcher's
    # kernels see the profile's own node (a review: a 16-GPU DeepEP plan on 8-GPU nodes, written by the what-if,
    # was refused by every command that read it, as if its node held 16)
    why = check_layout(plan.layout, plan.model, plan.gpus, max(profile.node_gpus, plan.gpus), plan.seq_tokens,
                       plan.micro_batch or plan.batch, node_gpus=profile.node_gpus)
    if why:
        return f"layout: {seq_fix_names(why, 'seq_tokens')}"
    for kernel in dict.fromkeys((plan.layout.attention, plan.layout.block_kernel)):  # one the profile cannot price
        try:
            profile.efficiency.priced_attention_kernel(kernel)
        except MemoError as e:
            return f"layout: attention {kernel}: profile {profile.name} has {e}"
    # the policy against the model and layout, as the what-if leaves a pair out (a review: a hand-made plan of
    # selective recompute on METP was refused by memo-exec only after its ranks had started)
    why = (plan.policy.experts_why_not(plan.model) or plan.policy.model_why_not(plan.model)
           or plan.policy.layout_why_not(plan.layout))
    return f"policy: {why}" if why else None


def refuse_layout_problem(plan_file, plan: Plan, profile) -> None:
    """Raise `PlanError` (one line, exit 2) where `layout_problem` finds one: every command that reads a plan
    (simulate, explain, the sweeps, export, check-plan) refuses the layouts the what-if refuses (a review: a plan
    edited to ZeRO 3 beside a pipeline, refused by check-plan, was simulated as its ZeRO-1 twin under a z3 label)."""
    why = layout_problem(plan, profile)
    if why:
        raise PlanError(f"{plan_file}: {why}")


def runnable_problems(plan: Plan, memory_plan: bool = True,
                      traces: dict[str, RequestTrace] | None = None, profile=None) -> list[str]:
    """`plan_problems` less the profile's loading (`memo-exec run --profile` may name another file): the layout
    against the model, length and the plan's own profile's nodes, where that profile loads (`layout_problem`: a
    review found memo-exec running a METP plan without SP, which check-plan refuses, into a shape error, and a
    materialised-attention METP plan as ring attention), the plan's GEMM
    format against ``profile`` (the one the run predicts with; None: the plan's own, where it loads:
    `gemm_format_problem`), the policy's own plan fields and, with ``memory_plan``, MEMO's static memory plan. The
    executor refuses a plan with the lines `memo-sim check-plan` refuses it with (``traces``: see
    `memory_plan_problems`)."""
    out = []
    try:
        own = load_profile(plan.profile)
    except MemoError:
        own = None  # `plan_problems` names it; memo-exec run predicts with its --profile
    why = layout_problem(plan, own) if own is not None else None
    if why:
        out.append(why)
    if plan.framework not in FRAMEWORKS:  # (a review: "jax" was read, and only sweep-seq refused it, later)
        out.append(f"framework: {plan.framework!r} is not a framework memo knows; write one of {', '.join(FRAMEWORKS)}")
    elif plan.framework != "any" and plan.policy.name not in FRAMEWORKS[plan.framework].policies:
        # a review: a plan edited to megatron beside MEMO's policy was valid for check-plan, where the what-if searches
        # a framework's own policies only (memo's own, any, runs every policy its executor has)
        offered = FRAMEWORKS[plan.framework].policies
        out.append(f"framework: {plan.framework} does not offer the policy {plan.policy.name} (it offers "
                   f"{', '.join(offered)}); write a framework that offers it (`memo-sim frameworks`) or one of these "
                   f"policies")
    why = gemm_format_problem(plan, profile)
    if why:
        out.append(why)
    check = getattr(plan.policy, "check", None)  # SPPO: the subsequence plan must fit the layout and length
    why = check(plan.model, plan.layout, plan.batch, plan.seq_tokens) if check else None
    if why:
        out.append(f"policy: {why}")
    if memory_plan and not out:  # a memory plan is placed for the layout and policy above: checked where they hold
        out += memory_plan_problems(plan, traces)
    return out


def gemm_format_problem(plan: Plan, profile=None, profile_flag: bool = False) -> str | None:
    """The plan's GEMM format against ``profile``'s GPU (None: the plan's own profile; one that does not load is
    `plan_problems`' to say), or None: `memo_sim.cost.gemm_format.check_gemm_format` (no peak for the format, a
    compute capability outside it, TransformerEngine's own refusals where the plan's framework runs it), in the words
    memo-sim simulate, explain and check-plan refuse a plan file's format with (`memo_sim.cli.common.
    refuse_plan_gemm_format`; the plan's model.gemm_format named, not a flag; ``profile_flag``: the command takes
    --profile, which the fix then names). Part of the contract the executor shares (a review: memo-exec run trained an
    FP8 plan whose profile, an A100, check-plan refused)."""
    from memo_sim.cost.gemm_format import check_gemm_format, for_profile  # noqa: PLC0415

    if not plan.model.gemm.quantised:
        return None
    if profile is None:
        try:
            profile = load_profile(plan.profile)
        except MemoError:
            return None
    fmt = plan.model.gemm_format
    try:
        check_gemm_format(plan.model, profile)
        for_profile(plan.model, profile)  # its framework's FP8 library on this GPU (TransformerEngine's refusals)
    except MemoError as e:
        if "compute_capability" in str(e) or "--precision" not in str(e):  # the GPU's generation, not a missing peak
            return f"model.gemm_format {fmt}: {e}"
        peak = plan.model.gemm.peak
        other = "give --profile one" if profile_flag else "set the plan's \"profile\" to one"
        return (f"model.gemm_format {fmt}: profile {profile.name} ({profile.gpu.model}) has no {peak} peak; fix: "
                f"{other} that lists gpu.peak_flops.{peak}, or plan afresh for this GPU (memo-sim whatif --profile "
                f"{profile.name})")
    return None


EXECUTOR_TRACE_SOURCE = "memo-exec trace"  # how a memory plan placed from the executor's own trace begins its source


def traced_by_executor(plan: Plan) -> bool:
    """Whether the plan's memory plan was placed from the executor's recorded layer trace (`memo-exec
    trace --write-plan`): its tensors are the executor's, which only memo-exec can record."""
    return plan.memory_plan is not None and plan.memory_plan.source.startswith(EXECUTOR_TRACE_SOURCE)


def memory_plan_problems(plan: Plan, traces: dict[str, RequestTrace] | None = None) -> list[str]:
    """The memory plan checked against the layer's tensors per phase: ``traces`` (``{"fwd": ...,
    "bwd": ...}``, the executor passes its recorded layer for a plan placed from it) or, by
    default, the simulator's trace generator (`memo_sim.memplan.trace_gen`). A plan placed from the
    executor's trace is not checked without ``traces``: memo-exec run checks it."""
    mp = plan.memory_plan
    if mp is None:
        return []
    if not plan.policy.static_memory_plan:
        return [f"memory_plan: the {plan.policy.name} policy runs on PyTorch's caching allocator, not a static "
                f"plan; drop memory_plan or re-create the plan"]
    executor = traced_by_executor(plan)
    fix = ("re-trace the plan with memo-exec trace --write-plan for this device and attention backend" if executor
           else "re-create the plan with memo-sim whatif")
    if traces is None:
        if executor:
            return []
        traces = {"fwd": layer_forward_trace(plan.model, plan.layout, plan.micro_batch, plan.seq_tokens),
                  "bwd": layer_backward_trace(plan.model, plan.layout, plan.micro_batch, plan.seq_tokens, plan.policy)}
    out = []
    for ph in sorted(set(mp.phases) - set(traces)):
        out.append(f"memory_plan.phases.{ph}: not a phase of a layer (fwd, bwd)")
    for ph, trace in traces.items():
        where = f"memory_plan.phases.{ph}"
        p = mp.phases.get(ph)
        if p is None and not trace.buffers:
            continue
        if p is None:
            out.append(f"{where}: missing; {fix}")
            continue
        by_name = {b.name or b.id: b for b in trace.buffers}
        # what the layer does not place needs no offset: the plan's own list, or (a plan written before
        # plans carried it) the trace generator's
        unplaced = set(p.unplaced) | (set() if executor else set(unplaced_in(trace, ph)))
        missing = sorted(set(by_name) - set(p.offsets) - unplaced)
        unknown = sorted(set(p.offsets) - set(by_name))
        out += _name_problems(where, missing, "no offset for {n} tensor(s) of the layer", unknown,
                              "offsets for tensor(s) this layer does not allocate", fix)
        if missing or unknown or len(by_name) != len(trace.buffers):
            continue
        placed = {by_name[n].id: off for n, off in p.offsets.items()}
        sub = RequestTrace([b for b in trace.buffers if b.id in placed], name=trace.name)
        bad = validate_placement(sub, placed, p.peak_bytes)
        if bad:
            out.append(f"{where}: the placement is invalid ({bad[0]}); {fix}")
    if not out and not executor:
        out += _stage_problems(plan, fix) if plan.layout.pp > 1 else _model_problems(plan, fix)
    return out


def _model_problems(plan: Plan, fix: str) -> list[str]:
    """Level 2 of a run in one pass: the whole model's blocks (rebuilt from the model, the policy and the level-1
    peaks, as `memo_sim.memplan.planner.plan_memory` builds them) all placed, validly, in ``arena_bytes``, and
    each layer's block at its offset there (``layer_block_offsets``). An audit (2026-12-02): an arena edited to 1 KiB
    under offsets reaching 56 MB, or an offset edited to 1e15, was called valid and echoed as stored. A plan that
    carries no whole-model offsets (written before plans carried them) is not checked here."""
    mp = plan.memory_plan
    if not mp.model_offsets:
        return []
    fwd, bwd = (mp.phases[ph].peak_bytes if ph in mp.phases else 0 for ph in ("fwd", "bwd"))
    trace = model_trace(plan.model, plan.layout, plan.micro_batch, plan.seq_tokens, plan.policy, fwd, bwd,
                        plan.classifier_chunk_tokens)
    where = "memory_plan.model_offsets"
    ids = {b.id for b in trace.buffers}
    missing, unknown = sorted(ids - set(mp.model_offsets)), sorted(set(mp.model_offsets) - ids)
    out = _name_problems(where, missing, "no offset for {n} block(s) of the whole model", unknown,
                         "offsets for block(s) the whole model does not hold", fix)
    if out:
        return out
    bad = validate_placement(trace, mp.model_offsets, mp.arena_bytes)
    if bad:
        return [f"memory_plan: the whole model's placement in arena_bytes = {mp.arena_bytes:,} is invalid "
                f"({bad[0]}); {fix}"]
    moved = sorted(k for k, v in mp.layer_block_offsets.items() if mp.model_offsets.get(k) != v)
    if moved:
        return [f"memory_plan.layer_block_offsets: {', '.join(moved[:3])}{', ...' if len(moved) > 3 else ''} not "
                f"at the offset model_offsets places it at; {fix}"]
    return []


def _name_problems(where: str, missing: list[str], missing_text: str, unknown: list[str], unknown_text: str,
                   fix: str) -> list[str]:
    """The lines for names without an offset (``missing_text`` with ``{n}``) and offsets naming nothing
    the trace holds, the first three of each named."""
    def names(xs: list[str]) -> str:
        return ", ".join(xs[:3]) + (", ..." if len(xs) > 3 else "")

    out = [f"{where}: {missing_text.format(n=len(missing))} ({names(missing)}); {fix}"] if missing else []
    return out + ([f"{where}: {unknown_text} ({names(unknown)}); {fix}"] if unknown else [])


def _stage_problems(plan: Plan, fix: str) -> list[str]:
    """Level 2 per pipeline rank: present exactly for a micro-batch pipeline, each rank's blocks (rebuilt
    from the schedule's order and the level-1 peaks) all placed, validly, in the rank's arena."""
    from memo_sim.search.plan_build import stage_order_of  # noqa: PLC0415  (the engine's schedules)

    mp = plan.memory_plan
    order = stage_order_of(plan)
    if order is None:
        return [f"memory_plan.stages: per-rank plans in a plan without a micro-batch pipeline; {fix}"] if mp.stages \
            else []
    got = {st.stage: st for st in mp.stages}
    if sorted(got) != list(range(plan.layout.pp)) or len(mp.stages) != plan.layout.pp:
        return [f"memory_plan.stages: one plan per pipeline rank 0..{plan.layout.pp - 1} expected, found "
                f"{sorted(got) or 'none'}; {fix}"]
    fwd, bwd = (mp.phases[ph].peak_bytes if ph in mp.phases else 0 for ph in ("fwd", "bwd"))
    out = []
    for rank in range(plan.layout.pp):
        st, where = got[rank], f"memory_plan.stages[{rank}]"
        trace = stage_model_trace(plan.model, plan.layout, plan.micro_batch, plan.seq_tokens, plan.policy, fwd, bwd,
                                  list(order(rank)), rank, plan.classifier_chunk_tokens)
        ids = {b.id for b in trace.buffers}
        missing, unknown = sorted(ids - set(st.offsets)), sorted(set(st.offsets) - ids)
        out += _name_problems(f"{where}.offsets", missing, "no offset for {n} block(s) of the rank's micro-batches",
                              unknown, "offsets for block(s) this rank does not hold", fix)
        if missing or unknown:
            continue
        bad = validate_placement(trace, st.offsets, st.arena_bytes)
        if bad:
            out.append(f"{where}: the placement is invalid ({bad[0]}); {fix}")
    return out
