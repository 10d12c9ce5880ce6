"""memo-sim explain: where a plan's iteration time goes, what fills its memory, and what binds."""

from __future__ import annotations

import json
from dataclasses import replace

import click

from memo_sim.cost import comm_sms
from memo_sim.errors import PlanError
from memo_sim.layout.alloc_conf import EXPANDABLE_FLAG
from memo_sim.layout.parallel import stage_first_rank, stage_shards
from memo_sim.policy.base import uses_memory_plan
from memo_sim.engine.simulate import simulate
from memo_sim.memplan.footprint import memory_breakdown
from memo_sim.plan.schema import read_plan
from memo_sim.cost.gemm_format import plan_for_profile
from memo_sim.model.config import modules_words
from memo_sim.profile.loader import load_profile
from memo_sim.report.explain import PHASE_WORDS, gpu_devices, peak_moments, time_breakdown
from memo_sim.report.formats import Answer, emit, format_options, resolve_format
from memo_sim.report.peaks import analytic_peak, result_peak
from memo_sim.report.whatif_answer import mfu_words
from memo_sim.search.candidate import deciding_peak_words
from memo_sim.search.estimate import memo_alpha
from memo_sim.search.plan_check import refuse_layout_problem, runnable_problems
from memo_sim.units import fmt_bytes, fmt_count, fmt_time

_ALPHA_WORDS = {"overlap": "the offload of one layer's bytes must hide under that layer's forward",
                "host_memory": "the offloaded bytes of every offloaded layer must fit the node's pinned host memory",
                "none": "every token fits both limits"}


def refuse_runnable_problems(plan_file, plan, profile) -> None:
    """Raise `PlanError` (one line, exit 2) where check-plan's `runnable_problems` finds one in the plan's own fields
    (its framework among memo's, its policy's subsequence plan against the layout; the static memory plan left to
    check-plan, which re-solves it): explain and export refuse what check-plan refuses, in its words (a review: a
    plan naming framework 'megatron@2099' or 'bogus' was explained and exported, and check-plan refused it)."""
    problems = runnable_problems(plan, memory_plan=False, profile=profile)
    if problems:
        more = (f" (and {len(problems) - 1} more: memo-sim check-plan {plan_file} lists them)" if len(problems) > 1
                else "")
        raise PlanError(f"{plan_file}: {problems[0]}{more}")


@click.command("explain")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@format_options
def explain(plan_file, out_format, as_json):
    """Explain PLAN_FILE: time breakdown, memory at the peak, host memory, the binding limit."""
    as_json = resolve_format(out_format, as_json) == "json"
    plan = read_plan(plan_file)
    from memo_sim.cli.common import plan_profile, refuse_plan_gemm_format  # noqa: PLC0415

    profile = plan_profile(plan_file, plan, has_flag=False)

    refuse_plan_gemm_format(plan_file, plan, profile, profile_flag=False)  # as simulate and check-plan refuse it
    refuse_layout_problem(plan_file, plan, profile)  # as check-plan and export refuse it
    refuse_runnable_problems(plan_file, plan, profile)  # its framework and policy fields, as check-plan refuses them
    plan_for_profile(plan, profile)  # its FP8 library's copies on this GPU, as simulate prices them
    res = simulate_plan(plan, profile)
    devices = gpu_devices(res)
    times = [time_breakdown(res, d) for d in devices]
    mem = plan_breakdown(plan, profile)
    peaks = peak_moments(res)
    binding = binding_words(plan, profile, res)
    split = None
    if plan.model.moe:  # a MoE layer's time and the GPU's memory by part (`memo_sim.report.moe_split`)
        from memo_sim.report.moe_split import moe_split, moe_split_rows

        split = moe_split(plan.model, plan.layout, plan.micro_batch or plan.batch, plan.seq_tokens, profile)
    mtp = mtp_share(plan, profile)
    if as_json:
        click.echo(json.dumps({
            "plan": str(plan_file), "status": res.status, "iteration_s": res.iteration_s, "mfu": res.mfu,
            **({"moe_split": {"layer_time_s": split.time_s, "memory_bytes": split.memory_bytes}} if split else {}),
            **({"mtp_s_per_micro_batch": mtp} if mtp else {}),
            "time_breakdown_s": [{"device": t.device, "iteration_s": t.iteration_s, "busy": t.busy_s,
                                  "waits": t.waits_s, "busy_by_phase": t.busy_by_phase_s,
                                  "waits_by_cause": t.waits_by_cause_s, "slowed_s": t.slowed_s} for t in times],
            **memory_json(plan, res, mem, peaks), "binding": binding,
            "failure": res.failure.message() if res.failure is not None else None}, indent=1))
        return
    a = Answer()
    # an FP8 plan's MFU counts its FLOPs against the model dtype's peak, said as the what-if says it (a review)
    it = (f"{fmt_time(res.iteration_s)}/iteration, {mfu_words(res.mfu, plan.model, profile)}" if res.ok
          else res.failure.message())
    a.verdict = (f"{plan.model.name}{plan.model.gemm_words}, {fmt_count(plan.seq_tokens)} tokens x {plan.batch}, {plan.layout.label()}, "
                 f"{plan.policy.label()} on {plan.gpus} x {profile.gpu.model}: {res.status}, {it}")
    a.line(f"binding: {binding}")
    a.line(f"profile {profile.name}: {profile.provenance_line()}")
    for t in times:
        rows = [[k, fmt_time(v), f"{100 * v / t.iteration_s:.1f}%"] for k, v in t.busy_s.items()]
        rows += [[k, fmt_time(v), f"{100 * v / t.iteration_s:.1f}%"]
                 for k, v in sorted(t.waits_s.items(), key=lambda kv: -kv[1])]
        rows.append(["iteration", fmt_time(t.iteration_s), "100.0%"])
        where = f"GPU {t.device}"
        if len(devices) > 1:  # a stage's GPU: the simulated device is its index; its replica's stage_stride ranks
            k, stride = devices.index(t.device), plan.layout.stage_stride
            first = stage_first_rank(plan.layout, k)
            where = (f"stage {k}'s GPU (the first replica's ranks {first}-{first + stride - 1}" if stride > 1
                     else f"stage {k}'s GPU (the first replica's rank {first}") + ")"
        a.table(["", "seconds", "share"], rows, title=f"\ntime on {where}'s compute stream (simulated):")
        if t.slowed_s > 1e-9 * t.iteration_s:
            a.line(f"of the busy time, {fmt_time(t.slowed_s)} ({100 * t.slowed_s / t.iteration_s:.1f}% of the iteration) "
                   f"is kernels slowed {slowed_words(profile)}")
    if mtp:
        n = plan.model.mtp_layers
        a.line(f"classifier: the {modules_words(n, 'multi-token-prediction')} included, "
               f"{fmt_time(mtp)} a micro-batch on the last stage (analytic, `memo_sim.cost.boundary.mtp_seconds`)")
    if split is not None:
        a.table(["", "forward", "backward", "share"], moe_split_rows(split),
                title=f"\none MoE layer{' of ' + split.layer_of if split.layer_of else ''} by part (analytic: each op "
                      f"alone on the GPU, the busiest expert rank):")
        a.table(["", "bytes"], [[k, fmt_bytes(v)] for k, v in split.memory_bytes.items()],
                title="\nGPU memory by MoE part (analytic" + (f"; the model states of {split.states_of}, a layer's "
                                                                      f"activations" if split.states_of else "") + "):")
    add_memory_part(a, plan, res, mem, peaks)
    emit(a, resolve_format(out_format, False))


def slowed_words(profile) -> str:
    """What slows a kernel beside other work on this profile, in words (`memo_sim.cost.comm_sms`)."""
    copies = "by host copies sharing the GPU's memory bandwidth"
    if not comm_sms.priced(profile):
        return copies + " (the profile gives no gpu.sm_count / comm_sms: SMs held by communication not priced)"
    return (f"beside communication kernels holding SMs (an NCCL kernel {float(profile.gpu.comm_sms):g} of the "
            f"{float(profile.gpu.sm_count):g}) or {copies}")


def mtp_share(plan, profile) -> float:
    """The multi-token-prediction modules' seconds a micro-batch in the last stage's classifier phase (0 without),
    on the layout the simulation prices the head on (a pipeline's last stage's shard, `stage_shards`: where its
    groups sit) and with the plan's recompute."""
    if not plan.model.mtp_layers:
        return 0.0
    from memo_sim.cost.boundary import boundary_times  # noqa: PLC0415

    lay = stage_shards(plan.layout, profile.node_gpus)[-1] if plan.layout.pp > 1 else plan.layout
    return boundary_times(plan.model, lay, plan.micro_batch or plan.batch, plan.seq_tokens, profile,
                          recompute_mtp=plan.policy.recomputes_mtp).mtp


def simulate_plan(plan, profile):
    """One recorded iteration of ``plan`` under its schedule (explain and check-plan read it), with
    a micro-batch pipeline's analytic stage peaks added."""
    res = simulate(plan.model, plan.layout, plan.batch, plan.seq_tokens, plan.policy, profile, record=True,
                   classifier_chunk_tokens=plan.classifier_chunk_tokens, schedule=plan.schedule,
                   micro_batch=plan.micro_batch)
    _add_stage_analytic_peaks(plan, profile, res)
    return res


def plan_breakdown(plan, profile):
    """The analytic tier's per-GPU memory terms of ``plan``: of one micro-batch in flight, as the schedules lay
    them out (gradient accumulation runs its micro-batches one after the other; a pipeline's stages hold theirs
    apart, `memo_sim.search.pipeline`)."""
    return memory_breakdown(plan.model, plan.layout, plan.micro_batch or plan.batch, plan.seq_tokens, plan.policy,
                            profile, classifier_chunk_tokens=plan.classifier_chunk_tokens)


def memory_terms(plan, mem) -> dict:
    """The per-GPU memory terms at the peak, in words."""
    placed = "static plan" if uses_memory_plan(plan.policy, plan.layout) else "caching allocator"
    return {MEMORY_TERM_WORDS.get(k, k).format(placed=placed): v for k, v in memory_terms_by_kind(mem).items()}


# explain's memory terms: stable keys (--json's ``memory_terms_by_kind_bytes``) and their words
MEMORY_TERM_WORDS = {"model_states": "model states", "kept_activations": "kept activations",
                     "buffers": "rounding / static buffers", "lse": "attention lse",
                     "recompute_buffer": "recompute buffer (in a backward)",
                     "layer_transients": "layer transients ({placed})", "boundary_activation": "boundary activation",
                     "classifier": "classifier (or the three above it)"}


def memory_terms_by_kind(mem) -> dict:
    """The per-GPU memory terms at the peak by stable key (`MEMORY_TERM_WORDS`)."""
    return {"model_states": mem.model_states_bytes, "kept_activations": mem.skeletal_resident_bytes,
            "buffers": mem.rounding_buffer_bytes - mem.backward_buffer_bytes, "lse": mem.lse_bytes,
            "recompute_buffer": mem.backward_buffer_bytes, "layer_transients": mem.transient_peak_bytes,
            "boundary_activation": mem.layer_boundary_bytes, "classifier": mem.classifier_peak_bytes}


def memory_json(plan, res, mem, peaks: dict) -> dict:
    """The memory part of explain's and check-plan's JSON: the per-GPU terms (per-stage peaks for a
    pipeline), both tiers' peaks, when each GPU peaks, and host memory per node."""
    stages = (res.pipeline or {}).get("stages")
    return {"memory_terms_bytes": None if stages else memory_terms(plan, mem),
            "memory_terms_by_kind_bytes": None if stages else memory_terms_by_kind(mem), "stages": stages,
            "analytic_peak_gpu_bytes": max((st["analytic_peak_gpu_bytes"] for st in stages or ()),
                                           default=mem.peak_gpu_bytes),
            "simulated_peak_gpu_bytes": res.peak_gpu_bytes if res.ok else None,  # a failed run's is what was in use
            "gpu_capacity_bytes": res.gpu_capacity_bytes,
            "peak": peaks, "host_bytes_per_node": res.peak_host_bytes_per_node,
            "host_capacity_bytes": res.host_capacity_bytes,
            "allocator_memory_stats": (res.allocator or {}).get("memory_stats"),
            "allocator_fragmentation": fragmentation_words(plan, res, mem)}


def memory_rows(plan, res, mem) -> list[list[str]]:
    """The rows of the per-GPU memory table: a term or peak, its size alone (a CSV writes the column as integer
    bytes, `memo_sim.report.formats.csv_numbers`; a review found "69.12 GiB (analytic, memory plan)" under a
    ``bytes`` header), and how the peaks were found in a column of their own."""
    rows = [[k, fmt_bytes(v), ""] for k, v in memory_terms(plan, mem).items()]
    analytic = analytic_peak(mem, plan.policy, plan.layout)
    rows.append(["peak (the terms above)", fmt_bytes(analytic.bytes), analytic.source])
    if res.status == "OK":
        sim = result_peak(res)
        rows.append(["peak (the simulated iteration)", fmt_bytes(sim.bytes), sim.source])
    else:  # no peak (what was in use when the run stopped is not one): none in the size column, the words beside
        rows.append(["peak (the simulated iteration)", "-",
                     f"none: {res.status}, {fmt_bytes(res.failure.in_use_bytes)} in use when it stopped"])
    rows.append(["usable GPU memory", fmt_bytes(res.gpu_capacity_bytes), ""])
    return rows


def add_memory_part(a: Answer, plan, res, mem, peaks: dict | None = None) -> None:
    """The memory breakdown at the peak (per stage for a pipeline), when each GPU peaks and what is
    live then (`peak_lines`), the caching allocator replay's counters and which of them PyTorch
    reports (`torch_words`, `fragmentation_words`), and pinned host memory per node: explain and
    check-plan print it."""
    if peaks is None:
        peaks = peak_moments(res)
    stages = (res.pipeline or {}).get("stages")
    if stages:  # a pipeline: each stage holds its own layers, micro-batches or subsequences
        rows = [[str(s["stage"]), fmt_bytes(s["analytic_peak_gpu_bytes"]), fmt_bytes(s["peak_gpu_bytes"])]
                for s in stages]
        # the simulated column as the result names its peak: a pipeline's allocations summed, no allocator replay
        # (a review: 'peak (simulated, caching allocator)' beside a binding line saying no replay ran)
        alloc = analytic_peak(mem, plan.policy, plan.layout).allocator
        a.table(["stage", f"peak (analytic, {alloc})", f"peak ({result_peak(res).source})"], rows,
                title=f"\nGPU memory per stage (usable {fmt_bytes(res.gpu_capacity_bytes)}):")
    else:
        a.table(["", "size", "how"], memory_rows(plan, res, mem), title="\nGPU memory per GPU:")
    for d, p in peaks.items():
        for line in peak_lines(d, p, None if stages else mem):
            a.line(line)
    ms = (res.allocator or {}).get("memory_stats")
    if ms:  # the caching allocator replayed over the iteration, in torch.cuda.memory_stats()'s words
        a.line("  caching allocator, simulated replay of one iteration (torch.cuda.memory_stats() keys): "
               + ", ".join(f"{k} {fmt_bytes(v) if k.endswith('.peak') else v}" for k, v in ms.items()))
        a.line("  " + torch_words(res, ms, None if stages else mem))
        al = res.allocator or {}
        if al.get("steady") is False and not al.get("oom"):
            by = ", ".join(map(str, al.get("reorganizations_by_iteration") or []))
            a.line(f"  the replay found no steady iteration: none of its {al.get('iterations')} iterations left the "
                   f"cache as it found it, so these counters are its last iteration's (allocation retries per "
                   f"iteration: {by})")
    words = fragmentation_words(plan, res, mem)
    if words:
        a.line("  " + words)
    a.line(f"\npinned host memory per node: {fmt_bytes(res.peak_host_bytes_per_node)} of "
           f"{fmt_bytes(res.host_capacity_bytes)}" + ("" if res.status == "OK" else " when the run stopped"))


def peak_lines(device: int, p: dict | None, mem) -> list[str]:
    """When ``device`` peaks (`memo_sim.report.explain.peak_moment`), in words: the op running, the
    tensors live then where known, and, given the analytic terms ``mem`` (None for a pipeline's
    stage), which side of their max(layer transients + boundary, classifier) that instant is on."""
    if p is None:
        return []
    phase = PHASE_WORDS.get(p["phase"], p["phase"])
    if p["op"] is None:
        at = "a gap between compute ops"
    elif p["layer"] is not None:
        on = f" on the {p['stream']} stream" if p.get("stream") not in ("compute", None) else ""
        at = f"layer {p['layer']}'s {phase} (op {p['op']}{on}{', as it starts' if p['starts'] else ''})"
    else:
        at = f"the {p['op']}" + (f" ({phase})" if phase not in (p["op"], None) else "")
    lines = [f"  GPU {device} peaks at {fmt_time(p['time_s'])} during {at}"]
    live = p.get("live_bytes")
    if live:
        lines.append("    live then: " + " + ".join(f"{k} {fmt_bytes(v)}" for k, v in live.items())
                     + f" = {fmt_bytes(sum(live.values()))}")
    if mem is None:
        return lines
    if live:
        side = ("classifier" if "classifier" in live else
                "layer" if any(k.endswith("transients + boundary activation") for k in live) else None)
    else:
        side = ("classifier" if p["phase"] == "classifier" else
                "layer" if p["layer"] is not None and p["phase"] in ("fwd", "bwd", "recompute") else None)
    layer_side = mem.layer_side_bytes()
    terms = "layer" if layer_side >= mem.classifier_peak_bytes else "classifier"
    sizes = {"layer": f"layer transients + boundary{' + recompute buffer' if mem.backward_buffer_bytes else ''} "
                      f"{fmt_bytes(layer_side)}",
             "classifier": f"classifier {fmt_bytes(mem.classifier_peak_bytes)}"}
    other = "classifier" if terms == "layer" else "layer"
    if side == terms:
        words = f"the {side} side of the terms' max above ({sizes[terms]} >= {sizes[other]}), as the terms have it"
    elif side is not None:
        words = (f"the {side} side, though the terms above put the {terms} side higher ({sizes[terms]} >= "
                 f"{sizes[other]}): the simulated peak adds what is live at one instant, the terms each at its largest")
    else:
        words = "neither side of the terms' max above: no layer's transients and no classifier are live then"
    gap = mem.peak_gpu_bytes - p["bytes"]
    if live and abs(gap) > 1e-9 * mem.peak_gpu_bytes:
        words += (f"; the terms add {fmt_bytes(abs(gap))} {'more' if gap > 0 else 'less'} than is live then "
                  "(each term at its largest, some not live at this instant)")
    lines.append("    " + words)
    return lines


def torch_words(res, ms: dict, mem=None) -> str:
    """Which of the peaks printed PyTorch would report, why they differ, and which decides fit (``ms``: the
    caching allocator replay's `memo_sim.memplan.replay_result.IterationReplay.memory_stats`; ``mem``: the
    analytic terms, whose recompute buffer explains a peak above the replay's reserved one)."""
    reserved, allocated = ms["reserved_bytes.all.peak"], ms["allocated_bytes.all.peak"]
    diff = reserved - res.peak_gpu_bytes
    cap = res.gpu_capacity_bytes
    return ("in PyTorch, after torch.cuda.reset_peak_memory_stats() at the iteration's start: "
            f"torch.cuda.max_memory_reserved() ~ {fmt_bytes(reserved)}"
            + (f" ({100 * reserved / cap:.0f}% of the usable {fmt_bytes(cap)})" if cap else "")
            + f" and torch.cuda.max_memory_allocated() ~ {fmt_bytes(allocated)} (the replay's reserved_bytes.all.peak "
            "and allocated_bytes.all.peak: each tensor of the iteration sent through the allocator, its cached "
            "segments reused and split). "
            f"The peak above ({result_peak(res).text()}) is the event simulator's own high-water mark, each term "
            "one block while its phase runs, the layer transients at the caching allocator's footprint of one "
            f"layer replayed alone: the reserved peak is {fmt_bytes(abs(diff))} {'above' if diff >= 0 else 'below'} "
            f"it. {_decides_words(diff, mem)}. Allocated counts live tensors only: the "
            f"{fmt_bytes(max(0, reserved - allocated))} more reserved are cached but free")


def _decides_words(diff: float, mem) -> str:
    """Which of the two peaks decides fit: a plan fits where both hold (the what-if, maxseq and simulate hold the
    peak above against the GPU, and the replay must find room for every request), so the higher. Where that is the
    peak above under a whole-layer recompute, why: the policy's executor keeps the re-run tensors in one buffer
    (memo_exec/activations/base.py RECOMPUTE_BUFFER_DIFFERS), which the terms count and the replay, freeing each
    after its last use as autograd does, does not. A review: this line called the lower reserved peak "the number
    to hold against the GPU" while the fit was decided on the peak above."""
    head = ("A plan fits where both hold (the peak above within the GPU, as the what-if, maxseq and simulate hold "
            "it, and the replay finding room for every request), so the higher of the two decides and is the number "
            "to hold against the GPU: ")
    if diff >= 0:
        return head + "here the reserved peak"
    why = ("here the peak above, each term at its largest" if mem is None or not mem.backward_buffer_bytes else
           f"here the peak above, which holds the policy's re-run tensors as one recompute buffer "
           f"({fmt_bytes(mem.backward_buffer_bytes)}) through a layer's backward, as its executor keeps them in one "
           f"work buffer (memo-exec, memo_exec/activations/base.py RECOMPUTE_BUFFER_DIFFERS), where the replay frees "
           f"each after the last backward op that reads it, as autograd does in the frameworks")
    return head + why


def fragmentation_words(plan, res, mem) -> str | None:
    """For a plan on the caching allocator: how much of its reserved memory is not allocated when
    the allocation peaks (the replay's), its retries and what they cost, what expandable segments would give
    back, and how much lower the peak would be under a static memory plan of the same transients (the terms'
    max with the planned transients in place of the caching allocator's, against the analytic peak and the
    reported, reserved one), in words."""
    al = res.allocator or {}
    if al.get("static_memory_plan", True) or al.get("fragmentation_at_peak") is None:
        return None
    frag = al["fragmentation_at_peak"]
    reserved = al.get("reserved_at_peak_allocated_bytes") or al.get("peak_reserved_bytes") or 0
    cached, planned = mem.transient_caching_allocator_bytes, mem.transient_planned_bytes
    save = mem.peak_gpu_bytes - mem.peak_with(planned)
    retries = al.get("reorganizations", 0)
    head = (f"fragmentation: {100 * frag:.1f}% of the {fmt_bytes(reserved)} reserved when the allocation peaks is "
            f"not allocated ({fmt_bytes(frag * reserved)} cached but free; peak reserved "
            f"{fmt_bytes(al.get('peak_reserved_bytes') or 0)}); {retries} allocation retries per iteration"
            + (f" costing {fmt_time(al.get('stall_s', 0.0))} (device synchronisation, cudaFree, cudaMalloc)"
               if retries else ""))
    plan_words = "a static memory plan of the same transients (memo-sim whatif --allocator plan)"
    free = frag * reserved
    if free > 0 and not plan.layout.expandable_segments:  # what PyTorch's own setting gives: replayed, not assumed
        head += expandable_words(plan)
    static = mem.peak_with(planned)
    below_reserved = (al.get("peak_reserved_bytes") or 0) - static
    if below_reserved > 0:  # against what PyTorch would report: the cache is what a static plan does not hold
        tail = (f"; {plan_words} would hold about {fmt_bytes(static)} (no cache, its layer transients "
                f"{fmt_bytes(planned)} against {fmt_bytes(cached)} on the caching allocator), "
                f"{fmt_bytes(below_reserved)} below the reserved peak"
                + (" and none of the retries" if retries else ""))
    elif save > 0:
        tail = (f"; {plan_words} would hold {fmt_bytes(save)} less at the peak above"
                + (" and none of the retries" if retries else "")
                + f" (no cache: its layer transients {fmt_bytes(planned)} against {fmt_bytes(cached)} on the caching "
                "allocator, its arena allocated the whole iteration at its largest layer's transients)")
    else:
        why = (f"the classifier's {fmt_bytes(mem.classifier_peak_bytes)} sets it" if mem.classifier_peak_bytes
               >= mem.layer_side_bytes(cached) else "its planned transients are no smaller")
        tail = (f"; {plan_words} would not lower the peak above ({why})"
                + (", only drop the retries" if retries else ""))
    return head + tail


def expandable_words(plan) -> str:
    """What expandable segments (``expandable_segments:True``) give ``plan``, from the caching allocator replay of the
    same iteration with them (`memo_sim.memplan.iteration_replay.engine_replay`, the replay the engine charges, on the
    plan's layout with the flag set): its reserved peak, what is cached but free when the allocation peaks, and its
    retries. Not assumed to give the cache back: where the framework's collectives call ``record_stream`` on their
    buffers (``layout.nccl_record_stream``: ProcessGroupNCCL's recordStream, `record_stream_lag`), a freed buffer comes
    back to the cache only at the next synchronisation, whatever the segments (a review: this line promised most of
    16.18 GiB back where the what-if with the flag gave 13.64 GiB still cached and 25 retries)."""
    from memo_sim.memplan.iteration_replay import engine_replay  # noqa: PLC0415

    profile = load_profile(plan.profile)
    lay = replace(plan.layout, expandable_segments=True)
    rep = engine_replay(plan.model, lay, plan.micro_batch or plan.batch, plan.seq_tokens, plan.policy, profile,
                        classifier_chunk_tokens=plan.classifier_chunk_tokens)
    if rep is None:
        return ""
    head = f"; with expandable segments ({EXPANDABLE_FLAG}, priced by the what-if) the replay "
    if rep.oom:
        words = head + f"runs out of memory ({rep.oom_request})"
    else:
        kept = rep.fragmentation_at_peak * rep.reserved_at_peak_allocated_bytes
        words = (head + f"reserves {fmt_bytes(rep.peak_reserved_bytes)} at its peak, {fmt_bytes(kept)} cached but "
                 f"free when the allocation peaks, {rep.reorganizations} allocation retries")
    if plan.layout.nccl_record_stream:
        words += (" (the framework's collectives call record_stream on their buffers, nccl_record_stream: a freed "
                  "buffer comes back to the cache only at the next synchronisation, whatever the segments)")
    return words


def _add_stage_analytic_peaks(plan, profile, res) -> None:
    """A micro-batch pipeline's stage rows carry their analytic peak too (the SPPO schedule's carry
    theirs already): `memo_sim.search.pipeline.pipeline_memory`, the what-if's own estimate."""
    from memo_sim.search.pipeline import pipeline_memory

    stages = (res.pipeline or {}).get("stages") or []
    if not stages or all("analytic_peak_gpu_bytes" in st for st in stages):
        return
    _mem, rows = pipeline_memory(plan.model, plan.layout, plan.batch, plan.micro_batch, plan.seq_tokens,
                                 plan.policy, profile, plan.schedule)
    for st, row in zip(stages, rows):
        st.setdefault("analytic_peak_gpu_bytes", row["peak_gpu_bytes"])


def binding_words(plan, profile, res) -> str:
    """The limit nearest to binding for a simulated plan, in words (explain and simulate print it)."""
    if not res.ok:
        return res.failure.message()
    host = res.peak_host_bytes_per_node / res.host_capacity_bytes if res.host_capacity_bytes else 0.0
    # the deciding peak: the replay's reserved one where it is the higher
    # (`memo_sim.search.candidate.deciding_gpu_peak`, as `_decides_words` says; a review: "73% full" beside a
    # reserved peak at 100% of the usable memory)
    words = (deciding_peak_words(result_peak(res).text(), res.peak_gpu_bytes, res.allocator, res.gpu_capacity_bytes)
             + f"); pinned host memory {100 * host:.0f}% full")
    if plan.policy.takes_alpha and plan.layout.pp == 1:
        solved = memo_alpha(plan.model, plan.layout, plan.micro_batch or plan.batch, plan.seq_tokens, profile)
        # a plan priced on another profile than the one it was made on (simulate --profile OTHER): its alpha is the
        # solver's there, not one set by hand (a review)
        other = plan.profile if plan.profile not in (profile.name, getattr(profile, "source", None)) else None
        if solved.feasible:
            why = _ALPHA_WORDS.get(solved.binding, solved.binding)
            same = abs(solved.alpha - plan.policy.alpha) < 1e-9
            theirs = (f"is the plan's (made for {other}; the solver gives {solved.alpha:.3f} on {profile.name}): "
                      if other else f"was set by hand (the solver gives {solved.alpha:.3f}): ")
            words += f"; alpha {plan.policy.alpha:.3f} " + ("is the solver's: " if same else theirs) + why
        elif plan.policy.alpha == solved.alpha_or_zero:  # the what-if's own alpha where the solver finds none
            words += (f"; alpha {plan.policy.alpha:.3f} is the what-if's where the solver finds none: "
                      + solved.note().removeprefix("alpha 0: "))
        else:
            whose = f"is the plan's (made for {other})" if other else "was set by hand"
            words += (f"; alpha {plan.policy.alpha:.3f} {whose}: the solver finds none "
                      f"({solved.reason()}), so copies stall the compute stream")
    return words


COMMANDS = (explain,)
