"""memo-sim profiles, models, frameworks, check-plan: what is there and whether a plan is valid."""

from __future__ import annotations

import click

from memo_sim.cost.gemm_format import check_profile_gemm_formats
from memo_sim.errors import MemoError
from memo_sim.model.config import PRESETS
from memo_sim.plan.schema import read_plan
from memo_sim.profile.loader import list_profiles, load_profile
from memo_sim.report.formats import (
    Answer,
    emit,
    fmt_params,
    format_options,
    plural,
    resolve_format,
)
from memo_sim.report.peaks import planned_peak
from memo_sim.units import fmt_bytes, fmt_count, fmt_time


@click.command()
@format_options
def profiles(out_format, as_json):
    """List the hardware profiles memo can find."""
    rows, data = [], []
    for name, path in sorted(list_profiles().items()):
        try:
            p = load_profile(name)  # by name, as --profile finds it: a file declaring another name is INVALID
            check_profile_gemm_formats(p)  # as the what-if checks it (the formats are registered downstream)
            fp8 = p.gpu.peak_flops.get("fp8")
            rows.append([name, p.gpu.model, fmt_bytes(p.gpu_memory), f"{p.peak() / 1e12:.0f}",
                         f"{float(fp8) / 1e12:.0f}" if fp8 is not None else "-", str(p.node_gpus),
                         fmt_bytes(float(p.host.memory_bytes)), _provenance_word(p), str(path)])
            data.append({"name": name, "gpu": p.gpu.model, "gpu_memory_bytes": p.gpu_memory,
                         "usable_gpu_memory_bytes": p.usable_gpu_memory, "bf16_flops": p.peak(),
                         "fp8_flops": float(fp8) if fp8 is not None else None, "gpus_per_node": p.node_gpus,
                         "host_memory_bytes_per_node": float(p.host.memory_bytes),
                         "provenance": _provenance_word(p), "file": str(path)})
        except MemoError as e:
            rows.append([name, f"INVALID: {e}", "", "", "", "", "", "", str(path)])
            data.append({"name": name, "invalid": str(e), "file": str(path)})
    answer = Answer()
    answer.table(["name", "gpu", "memory", "bf16 TFLOP/s", "fp8 TFLOP/s", "gpus/node", "host/node", "provenance",
                  "file"], rows)
    answer.line("provenance: calibrated (measured by memo-exec calibrate), datasheet or fitted (numbers from "
                "documents; kernel efficiency curves assumed or fitted): every answer on a profile prints its line.")
    emit(answer, resolve_format(out_format, as_json), data)


def _provenance_word(p) -> str:
    """One word for the profiles table: calibrated, or the method a datasheet profile states."""
    if p.calibrated:
        return "calibrated"
    return (p.provenance or {}).get("method") or "unknown"


@click.command()
@format_options
def models(out_format, as_json):
    """List the model presets (a Hugging Face config.json of a dense decoder or of a mixture of experts of the
    families the README lists works too: --model PATH)."""
    fmt = resolve_format(out_format, as_json)
    # parameters: 6.65B in the table; a CSV cell the exact count (a CSV reads "6.65B" as 6.65 bytes: a review)
    count = fmt_params if fmt != "csv" else str
    rows = [[m.name, str(m.layers), str(m.hidden), str(m.heads), str(m.n_kv_heads), str(m.ffn), m.ffn_type,
             m.norm, m.bias, "yes" if m.tied_embeddings else "no", str(m.vocab),
             f"{m.experts} top-{m.top_k}" if m.moe else "-", count(m.params()),
             count(m.active_params()) if m.moe else "-"]
            for m in PRESETS.values()]
    data = [{"name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.n_kv_heads,
             "ffn": m.ffn, "ffn_type": m.ffn_type, "norm": m.norm, "bias": m.bias,
             "tied_embeddings": m.tied_embeddings, "vocab": m.vocab, "experts": m.experts if m.moe else 0,
             "top_k": m.top_k if m.moe else None, "params": m.params(),
             "active_params": m.active_params() if m.moe else m.params()} for m in PRESETS.values()]
    answer = Answer()
    answer.table(["name", "layers", "hidden", "heads", "kv_heads", "ffn", "ffn_type", "norm", "bias", "tied",
                  "vocab", "experts", "params", "active"], rows)
    answer.line("tied: the classifier reuses the token embedding (counted once). experts: routed experts and how "
                "many each token reaches; active: the parameters a token passes through (transformers' count: the "
                "embedding included). llama-7b and llama-70b are the papers' shapes with GPT's norms, biases and tied "
                "embeddings; llama-2-7b and llama-2-70b are the released models.")
    emit(answer, fmt, data)


@click.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Every field of every framework file, with its sources.")
def frameworks(name, as_json):
    """List the framework versions `whatif --framework NAME` takes: policies, mechanisms, what memo does not
    model; `memo-sim frameworks NAME` shows one in full, with the layouts it offers and its sources."""
    import json

    from memo_sim.errors import MemoError
    from memo_sim.frameworks import load_frameworks

    fws = load_frameworks()
    if name is not None:
        if name not in fws:
            raise MemoError(f"framework {name!r} unknown; choose one of {', '.join(fws)}")
        fws = {name: fws[name]}
    if as_json:  # every field, from the validated file itself (`Framework.file_fields`)
        click.echo(json.dumps({n: f.file_fields() for n, f in fws.items()}, indent=1))
        return
    if name is not None:
        click.echo("\n".join(framework_lines(fws[name])))
        return
    click.echo("\n".join(line for f in fws.values() for line in _overview_lines(f, fws.get("any"))))
    click.echo("memo-sim frameworks NAME: one in full (its layouts, mechanisms, what memo does not model, sources); "
               "--json: every field")


def _overview_lines(f, base) -> list[str]:
    """A framework in the list, wrapped to 120 columns (a review: a one-row-per-framework table ran to thousands of
    columns): its summary, policies and precision, the mechanisms it runs unlike ``base`` (any's) and how many
    things memo does not model of it; `framework_lines` gives it in full."""
    import textwrap

    ref = dict(base.mechanisms) if base is not None and base is not f else {}
    unlike = [f"{k}={v}" for k, v in f.mechanisms if ref and ref.get(k) != v]
    gaps = len(f.not_modelled)
    body = [f"policies: {', '.join(f.policies)}",
            "precision: " + ", ".join(f"{d}: {r}" for d, r in f.recipes) + ("; " if f.recipes else "")
            + "GEMM formats " + ", ".join(f.gemm_formats)]
    if ref:
        body.append("mechanisms unlike any's: " + (", ".join(unlike) or "none"))
    body.append(f"not modelled: {plural(gaps, 'thing') if gaps else 'nothing named'}")
    wrap = lambda text: textwrap.wrap(text, 120, initial_indent="  ", subsequent_indent="    ")  # noqa: E731
    head = textwrap.wrap(f"{f.name}: {f.summary}", 120, subsequent_indent="    ")
    return [*head, *(w for b in body for w in wrap(b))]


def framework_lines(f) -> list[str]:
    """One framework version in full: what `memo-sim frameworks NAME` prints."""
    yes = lambda on: "yes" if on else "no"  # noqa: E731
    sp = lambda settings: ", ".join("on" if x else "off" for x in settings)  # noqa: E731
    e = f.experts
    experts = ("not offered" if e is None else
               f"EP {yes(e.expert_parallel)}, ETP {yes(e.expert_tensor_parallel)}, dispatchers "
               f"{', '.join(e.dispatchers)}, expert loads {', '.join(e.balances)}"
               + (", EP borrowing its ranks from TP x CP x the FSDP shard group only" if e.ep_within_shards else "")
               + (f", beside ZeRO {e.zero_words} only" if e.zero is not None else "")
               + (f", beside TP with SP {sp(e.sequence_parallel)} only"
                  if e.sequence_parallel is not None and f.tensor_parallel else ""))
    offload = ("no" if not f.optimizer_offload else "yes" if f.optimizer_offload_zero is None
               else f"beside ZeRO {', '.join(map(str, f.optimizer_offload_zero))}")
    tp = f"TP yes (SP {sp(f.sequence_parallel)}; {', '.join(f.tp_modes)})" if f.tensor_parallel else "TP no"
    out = [f"{f.name}: {f.summary}", f"  policies: {', '.join(f.policies)}",
           f"  layouts: {tp}, ring CP {yes(f.context_parallel)}, Ulysses {yes(f.ulysses)}, {_dp_words(f)}, "
           f"schedules {', '.join(f.schedules)}"
           + (f" ({', '.join(f.microbatches_at_least_stages)} with at least as many micro-batches as stages)"
              if f.microbatches_at_least_stages else "")
           + f", uneven stages {yes(f.uneven_stages)}"
           + (f" (the embedding and the loss a layer's slot each: {yes(f.embedding_loss_slots)})"
              if f.uneven_stages else "")
           + f", optimizer offload {offload}, rank orders {', '.join(f.rank_orders)}"
           + (" (another order with stages: expert groups of tp x cp ranks)" if f.mapping_equal_groups else "")
           + ("; its FSDP shards over the CP ranks (never replicated over them)" if f.shards_over_cp else "")
           + f"; experts: {experts}; multi-token prediction "
           + ("yes" if f.multi_token_prediction else "no (a model's MTP modules priced without, named)"),
           "  mechanisms: " + ", ".join(f"{k}={v}" for k, v in f.mechanisms),
           "  precision: " + ", ".join(f"{d}: {r}" for d, r in f.recipes) + ("; " if f.recipes else "")
           + "GEMM formats " + ", ".join(f.gemm_formats)
           + "".join(f", {k.replace('_', ' ')}" for k in ("fp8_saved_inputs", "fp8_sp_gathers", "fp8_weights_per_use",
                                                                "fp8_weights_saved")
                     if getattr(f, k)),
           f"  attention: chunked (Llama 4) {yes(f.chunked_attention)} (else run full causal), QK-norm outputs kept "
           f"for the backward {yes(f.qk_norm_outputs_kept)}"]
    out += ["  not modelled:"] + [f"  - {x}" for x in f.not_modelled or ("-",)]
    out += ["  sources:"] + [f"  - {x}" for x in f.sources] + [f"  file: {f.path}"]
    return out


def _dp_words(f) -> str:
    """Its data-parallel settings in words: ZeRO stages, or, where it runs FSDP2 alone (torchtitan), ZeRO 0 as the
    DDP it is and ZeRO 3 as FSDP2 (a review: "ZeRO 0, 3 (fsdp)")."""
    if f.dp_modes == ("fsdp",):
        zero0 = ("ZeRO 0 on one replica (no DDP)" if not f.ddp else
                 "ZeRO 0 as FSDP2 over a shard group of one" if f.mechanism("replicate_fsdp") else "DDP (ZeRO 0)")
        return ", ".join(zero0 if z == 0 else f"FSDP2 (ZeRO {z})" for z in f.zero)
    return f"ZeRO {', '.join(map(str, f.zero))} ({', '.join(f.dp_modes)})"


@click.command("check-plan")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@format_options
def check_plan(plan_file, out_format, as_json):
    """Validate a plan.json and summarise it: what binds and the memory at the peak (one simulated
    iteration, the words of memo-sim explain)."""
    from memo_sim.cli.explain import (
        add_memory_part,
        binding_words,
        memory_json,
        plan_breakdown,
        simulate_plan,
    )
    from memo_sim.cli.common import refuse_plan_gemm_format
    from memo_sim.cost.gemm_format import plan_for_profile
    from memo_sim.errors import PlanError
    from memo_sim.report.explain import peak_moments
    from memo_sim.search.plan_check import plan_problems

    plan = read_plan(plan_file)
    problems = plan_problems(plan)
    if problems:
        raise PlanError(f"{plan_file}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    profile = load_profile(plan.profile)
    refuse_plan_gemm_format(plan_file, plan, profile, profile_flag=False)  # the plan's format, as simulate says it
    plan_for_profile(plan, profile)  # its FP8 library's copies on this GPU, as simulate and explain price them
    res = simulate_plan(plan, profile)
    mem = plan_breakdown(plan, profile)
    binding = binding_words(plan, profile, res)
    fmt = resolve_format(out_format, as_json)
    stale = _stale_prediction(plan, res)
    from memo_sim.plan.executor_scope import memory_plan_missing, plan_why_not  # noqa: PLC0415 - memo-exec's rules

    refused = plan_why_not(plan.model, plan.layout, plan.policy, plan.schedule, plan.batch,
                           plan.micro_batch or plan.batch, plan.seq_tokens)
    missing = memory_plan_missing(plan)
    if fmt == "json":
        peaks = peak_moments(res)
        emit(Answer(), fmt, {"plan": str(plan_file), "valid": True, "fits": res.status == "OK",
                             "schedule": plan.schedule, "micro_batches": plan.micro_batches,
                             "predicted": plan.predicted.to_dict(), "simulated_status": res.status,
                             "simulated_iteration_s": res.iteration_s if res.status == "OK" else None,
                             "stale_prediction": stale, "binding": binding, "executor_refuses": refused,
                             "memory_plan_missing": missing,
                             **memory_json(plan, res, mem, peaks)})
    else:
        a = Answer(_summary_verdict(plan_file, plan, res, profile))
        if stale:  # before the stored numbers, so the re-simulation leads (a review: the stale peak on top)
            a.line(f"  {stale}")
        if missing:
            a.line(f"  warning: {missing}")
        for line in _summary_lines(plan, res):
            a.line(line)
        a.line(f"  binding: {binding}")
        if refused:  # as the what-if says it of its answer (`memo_sim.report.whatif_answer.executor_words`)
            a.line(f"  memo-exec refuses this plan ({refused})")
        add_memory_part(a, plan, res, mem)
        a.line("(memo-sim explain PLAN: the time breakdown as well)")
        emit(a, fmt)
    if res.status != "OK":  # as the what-if's nothing fits: the plan does not run as it stands
        from memo_sim.cli.whatif import NOTHING_FITS  # noqa: PLC0415

        click.get_current_context().exit(NOTHING_FITS)


def _stale_prediction(plan, res) -> str | None:
    """Why the plan's stored prediction is not what it predicts now (an edited plan, another profile or memo
    version), or None (`memo_sim.plan.stale`, memo-exec's rule too)."""
    from memo_sim.plan.stale import stale_plan  # noqa: PLC0415

    words = stale_plan(plan, res)  # every number a report compares, the plan's layer_timings_s too
    if words is None:
        return None
    return (f"{words}: the plan was edited, or predicted with another profile or memo version"
            + ("; the lines below are the re-simulation's" if plan.predicted.status != res.status else ""))


def _summary_verdict(plan_file, plan, res, profile=None) -> str:
    """The plan in one line, with what it does when simulated now (a valid plan file need not fit)."""
    head = (f"{plan_file}: valid {plan.model.name}{plan.model.gemm_words}, {fmt_count(plan.seq_tokens)} tokens, "
            f"{plural(plan.gpus, 'GPU')}, "
            f"{plan.layout.label()}, {plan.policy.label()}")
    if res.status != "OK":
        return f"{head}, but does not fit: simulated {res.status} (exit status 3)"
    from memo_sim.report.whatif_answer import mfu_words  # noqa: PLC0415 - the what-if's words for an FP8 MFU

    mfu = f", {mfu_words(res.mfu, plan.model, profile)}" if res.mfu is not None else ""
    return f"{head}, simulated {fmt_time(res.iteration_s)}/iter{mfu}"


def _summary_lines(plan, res=None) -> list[str]:
    """The schedule, the predicted peak, the memory plan and SPPO's split, one line each. The predicted peak is the
    plan file's stored one: where the re-simulation ``res`` gives another (more than `STALE_TOLERANCE` apart, the
    stale rule of `memo_sim.plan.stale`), it is named as stored and the re-simulated one beside it (a review: an
    edited plan's stored 33.42 GiB printed as "predicted peak GPU" above the re-simulated 48.37 GiB)."""
    from memo_sim.plan.stale import STALE_TOLERANCE  # noqa: PLC0415
    from memo_sim.report.peaks import result_peak  # noqa: PLC0415

    out = [f"  schedule {plan.schedule}: {plural(plan.micro_batches, 'micro-batch', 'micro-batches')} of "
           f"{plural(plan.micro_batch, 'sequence')}"
           + (f", {plan.layout.pp} stages x {plan.layout.vpp} chunks" if plan.schedule != "sppo" and
              plan.layout.pp > 1 else "")]
    if plan.framework != "any":
        out.append(f"  searched for the framework {plan.framework} (what it offers: `memo-sim frameworks`)")
    peak = planned_peak(plan)
    now = result_peak(res) if res is not None and res.ok else None
    if peak is not None and now is not None and peak.bytes > 0 and abs(now.bytes / peak.bytes - 1) > STALE_TOLERANCE:
        out.append(f"  stored predicted peak GPU {peak.text()}, stale: re-simulated now {now.text()}")
    elif peak is not None and res is not None and not res.ok:
        # the re-simulation failed (OOM): the stored peak is the plan file's, not this run's (a review found it
        # printed as the prediction under the line saying the re-simulation ran out of memory)
        out.append(f"  stored predicted peak GPU {peak.text()}, stale: the re-simulation now ends {res.status}")
    elif peak is not None:
        out.append(f"  predicted peak GPU {peak.text()}")
    if plan.memory_plan is not None:
        from memo_sim.search.plan_check import traced_by_executor

        how = ("placed from memo-exec's recorded layer, which memo-exec run checks it against"
               if traced_by_executor(plan) else "checked against this layer's forward and backward")
        out.append(f"  memory plan: transient arena {fmt_bytes(plan.memory_plan.transient_arena_bytes)}, "
                   f"{sum(len(ph.offsets) for ph in plan.memory_plan.phases.values())} tensors placed ({how}); "
                   "the layer transients below add the tensors a phase holds beside the arena, which the plan leaves "
                   "to the caching allocator (the backward's gradients, the attention workspace)")
        if plan.memory_plan.stages:
            out.append("  level 2 per pipeline rank (the micro-batches each holds in flight, checked against its "
                       "schedule's order): " + ", ".join(f"rank {st.stage} {fmt_bytes(st.arena_bytes)} "
                                                         f"({len(st.offsets)} blocks)" for st in plan.memory_plan.stages))
    if plan.schedule == "sppo":
        b, al = plan.policy.bounds, plan.policy.alphas
        out.append(f"  SPPO: PP={plan.layout.pp}, N={plan.policy.subseqs} ({plan.policy.partition} partition"
                   f"{', multiplexed' if plan.policy.multiplex else ''}); subsequence lengths "
                   f"{b[1] - b[0]}..{b[-1] - b[-2]} tokens; alpha_i {min(al):.3f}..{max(al):.3f}")
    return out


COMMANDS = (profiles, models, frameworks, check_plan)
