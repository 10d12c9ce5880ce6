"""What every exporter shares: the plan's parts a framework cannot express, the nearest plan it
can run instead, and memo's predicted cost of running that one.

An exporter (one module per framework, registered by name in `memo_sim.export`) turns a plan
into the files that framework reads. Where the framework has no setting for a part of the plan
(MEMO's token-wise offload, the static memory plan, METP, SPPO, Ulysses or ring CP where it has
none, a ZeRO stage it does not offer, interleaving), the exporter records a `Gap`: what the plan
does, the nearest setting written instead, and how the plan changes (`PlanChange`). All changes
together give the nearest plan, which `price_nearest` simulates on the plan's profile, so the
user sees what memo predicts the framework's run costs beside what the plan promised.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

from memo_sim.policy.base import uses_memory_plan
from memo_sim.errors import MemoError
from memo_sim.layout.alloc_conf import merged_alloc_conf, parse_alloc_conf
from memo_sim.layout.moe_balance import parse_balance
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import FP8_MODEL_FIELDS, framework_field_moves, modules_words
from memo_sim.units import fmt_bytes
from memo_sim.model.precision import RECIPES, default_recipe
from memo_sim.units import fmt_time
from memo_sim.layout.schedule import default_schedule
from memo_sim.plan.schema import Plan
from memo_sim.policy import Policy, get_policy


# the model fields a framework sets beside its mechanisms (its FP8 library's, `memo_sim.frameworks.Framework.for_model`,
# `memo_sim.cost.gemm_format.for_profile`, and its offload's copies), named among the mechanisms where the export
# changes them and they move the plan (`framework_field_moves`)
_FRAMEWORK_FIELDS = FP8_MODEL_FIELDS + ("offload_copies_per_group",)
# a gradient reduction's element width in words (`PrecisionRecipe.grad_reduce_bytes`)
_REDUCE_WORDS = {4: "fp32", 2: "16 bits"}


@dataclass(frozen=True)
class PlanChange:
    """How the nearest plan differs: a policy by name, layout fields, a schedule."""

    policy: str | None = None
    layout: dict = field(default_factory=dict)
    schedule: str | None = None
    gemm_format: str | None = None  # the layer GEMMs' format the framework runs instead
    mtp_layers: int | None = None  # the multi-token-prediction modules it trains instead (`mtp_gap`)
    batch: int | None = None  # the sequences per replica it runs instead (the global batch kept over more replicas)


@dataclass(frozen=True)
class Gap:
    what: str  # the part of the plan the framework cannot express
    nearest: str  # the setting written instead
    change: PlanChange = PlanChange()
    # the edit without which the file written stops before it trains ("": it runs as written); said first, in the
    # file and on the terminal (a review: a DeepSpeed script that asserts at its first forward was one gap of a list)
    before_running: str = ""


@dataclass
class Export:
    """An exporter's answer: files by name, the gaps, the launch line, and the nearest plan's price."""

    framework: str
    source: str  # the framework version the option names were checked against
    files: dict[str, str]
    gaps: list[Gap]
    launch: str
    nearest: dict | None = None  # `price_nearest`'s answer (None when nothing changes)
    instead: dict | None = None  # `best_runnable`'s answer when the framework's own best plan was exported

    def comment_block(self, prefix: str = "# ") -> str:
        """The not-expressible block, as comment lines of the exported file."""
        lines = [f"Exported by memo-sim export for {self.framework} (option names as in {self.source})."]
        lines += [f"BEFORE RUNNING: {g.before_running}" for g in self.gaps if g.before_running]
        if self.instead is not None:
            lines += instead_lines(self.instead, self.framework)
        if not self.gaps:
            lines.append(f"Every part of the {'plan written' if self.instead is not None else 'plan'} is expressed "
                         "below" + (f"; {self.framework} runs it with its own mechanisms:" if self.nearest is not None
                                    else "."))
            if self.nearest is not None:  # (a review: a script the framework's mechanisms put out of memory said
                lines.append(price_line(self.nearest))  # nothing of it in the file, only on the terminal)
        else:
            lines.append("Not expressible in this framework (the nearest setting is written instead):")
            lines += [f"  - {g.what}: {g.nearest}" for g in self.gaps]
            if self.nearest is not None:
                lines.append(price_line(self.nearest))
        return "\n".join(prefix + ln if ln else prefix.rstrip() for ln in lines)


class NoNearest(MemoError):
    """An exporter's refusal: no nearest settings of the plan run in the framework (a gap it cannot write around);
    `memo_sim.export.export_plan` writes the framework's best plan instead, and refuses with it under --nearest."""


def instead_lines(i: dict, framework: str) -> list[str]:
    """Why another plan than the one asked for was exported, and what it gives up."""
    version = "" if i["framework"] == framework else f" ({i['framework']})"
    why = f" ({'; '.join(i['why'])})" if i.get("why") else ""
    plan = (f"memo's plan ({i['plan_label']}) is not expressible in {framework}{why}" if i.get("why") or
            not i.get("does_not_fit") else f"memo's plan ({i['plan_label']}) is expressible in {framework}, but "
            f"{i['does_not_fit']}")
    out = [f"{plan}; written instead: the best plan "
           f"memo predicts {framework}{version} runs, {i['label']}: {fmt_time(i['iteration_s'])}/iteration, "
           f"peak {fmt_bytes(i['peak_gpu_bytes'])} ({i['source']})."]
    if i.get("gemm_format_dropped"):
        why = ("the export writes its converters only on a model it ships" if i.get("gemm_format_written") is False
               else "it does not offer it")
        out.append(f"Its layer GEMMs run in {i.get('gemm_format_searched') or 'bf16'}: memo's plan's "
                   f"{i['gemm_format_dropped']} is not written for {framework} ({why}).")
    if i.get("balance_changed"):
        was, now = i["balance_changed"]
        out.append(f"Its experts' loads are {parse_balance(now).words}: {framework} has no setting for memo's "
                   f"plan's {parse_balance(was).words}.")
    if i.get("mtp_dropped"):
        modules = modules_words(i["mtp_dropped"], "multi-token-prediction")
        out.append(f"It trains the model without its {modules} ({framework} does not train them "
                   f"in memo's framework data): its time leaves their work out, memo's plan's does not.")
    if i.get("plan_iteration_s"):
        given_up = 1 - i["plan_iteration_s"] / i["iteration_s"]
        less = " on less work (its multi-token-prediction modules left out, above)" if i.get("mtp_dropped") else ""
        out.append((f"It gives up {100 * given_up:.1f}% of the throughput of" if given_up >= 0 else
                    f"It gives {100 * -given_up:.1f}% more throughput than")
                   + f" memo's plan ({fmt_time(i['plan_iteration_s'])}/iteration){less}; "
                   + ("memo's plan has no nearest settings there (`--nearest` refuses it)." if i.get("no_nearest") else
                      "`--nearest` writes memo's plan's nearest settings instead."))
    return out


def best_runnable(plan: Plan, framework: str, jobs: int = 1, progress=None,
                  keep_format: bool = True) -> tuple[Plan | None, dict | None]:
    """The best plan memo predicts the framework version runs for the plan's model, sequence, GPUs,
    profile, global batch and, for a mixture of experts, the routed tokens' balance (a property of the
    job's router: `memo_sim.layout.moe_balance`; where the framework has no setting for it, the nearest it runs,
    `framework_balance`, and the summary's ``balance_changed`` says so), the what-if constrained to the
    framework, and its summary; (None, None) when nothing the framework offers fits. A GEMM format the
    framework lacks is searched as the nearest one it offers that the GPU runs (`target_gemm_format`), one the exporter
    cannot write for the model (``keep_format`` False) as bf16 (the summary's ``gemm_format_dropped`` and
    ``gemm_format_searched`` say so)."""
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415
    from memo_sim.search.request import WhatifRequest, answer_whatif  # noqa: PLC0415

    model = plan.model
    written = target_gemm_format(plan, framework) if keep_format else "bf16"
    if written != model.gemm_format:
        model = dataclasses.replace(model, gemm_format=written)
    changed = framework_balance(plan, framework)
    balance = {"moe_balance": changed or plan.layout.moe_balance} if model.moe else {}
    ans = answer_whatif(WhatifRequest(model=model, seq=plan.seq_tokens, gpus=plan.gpus,
                                      profile=load_profile(plan.profile), global_batch=plan.batch * plan.layout.dp,
                                      framework=framework, jobs=jobs, **balance), progress=progress,
                       comparisons=False)  # its best alone: none of the answer's comparison searches
    best = ans.best
    if best is None:
        return None, None
    alt = best.to_plan()
    pred = alt.predicted
    label = f"{alt.layout.label()} {alt.policy.label()}" + (f" {alt.schedule}" if alt.layout.pp > 1 else "")
    return alt, {"framework": framework, "label": label, "iteration_s": pred.iteration_s,
                 "peak_gpu_bytes": pred.peak_gpu_bytes, "source": pred.source,
                 "plan_label": f"{plan.layout.label()} {plan.policy.label()}",
                 "plan_iteration_s": plan.predicted.iteration_s,
                 "gemm_format_dropped": plan.model.gemm_format if model.gemm_format != plan.model.gemm_format else None,
                 "gemm_format_written": keep_format,  # False: offered, but not written for this model
                 "gemm_format_searched": model.gemm_format,
                 "mtp_dropped": plan.model.mtp_layers - alt.model.mtp_layers or None,
                 "balance_changed": (plan.layout.moe_balance, changed) if changed else None}


def price_line(n: dict) -> str:
    if n.get("error"):
        return f"memo could not price the nearest plan: {n['error']}"
    planned = n.get("planned_iteration_s")
    own = (f"; with the framework's own mechanisms in place of the plan's ({', '.join(n['mechanisms'])})"
           if n.get("mechanisms") else "")
    if n["status"] != "OK":
        return (f"memo predicts the nearest plan ({n['label']}) does not fit: "
                + (n["failure"] if n.get("failure") else n["status"]) + own)
    text = f"memo predicts the nearest plan ({n['label']}): {fmt_time(n['iteration_s'])}/iteration"
    seqs, planned_seqs = n.get("sequences"), n.get("planned_sequences")
    if planned and seqs and planned_seqs and seqs != planned_seqs:  # a gap changed the sequences a step: compared
        # per sequence (a review: 4 sequences against the plan's 1 read +693.8%)
        per, planned_per = n["iteration_s"] / seqs, planned / planned_seqs
        text += (f" for {seqs} sequences a step against {fmt_time(planned)} for the plan's {planned_seqs} "
                 f"({fmt_time(per)} a sequence against {fmt_time(planned_per)}: {100 * (per / planned_per - 1):+.1f}%)")
    elif planned:
        text += f" against {fmt_time(planned)} for the plan ({100 * (n['iteration_s'] / planned - 1):+.1f}%)"
    return text + f", peak {fmt_bytes(n['peak_gpu_bytes'])} (simulated, profile {n.get('profile', '?')})" + own


def nearest_plan(plan: Plan, gaps: list[Gap]) -> tuple[Layout, Policy, str]:
    """The layout, policy and schedule the framework runs instead: every gap's change applied."""
    layout, policy, schedule = plan.layout, plan.policy, plan.schedule
    for g in gaps:
        c = g.change
        if c.layout:
            layout = dataclasses.replace(layout, **c.layout)
        if c.policy is not None:
            policy = get_policy(c.policy, None)
            if schedule == "sppo":
                schedule = default_schedule(layout.pp, c.policy, layout.vpp)
        if c.schedule is not None:
            schedule = c.schedule
    return layout, policy, schedule


def nearest_batch(plan: Plan, gaps: list[Gap]) -> int:
    """The sequences per replica the framework runs instead: the last gap's that changes them, else the plan's."""
    return next((g.change.batch for g in reversed(gaps) if g.change.batch is not None), plan.batch)


def framework_recipe(plan: Plan, framework: str) -> str | None:
    """The model-state recipe (`memo_sim.model.precision`) ``framework`` trains the plan's model with where it is not
    the plan's, else None: the recipe the plan's own framework data gave its dtype (DeepSpeed's ``zero``: 16-bit
    gradients, reduced in 16 bits) is that framework's, not the plan's, and ``framework`` runs its own (its data's
    for the dtype, else memo's default); a recipe the plan's framework data does not give (named with
    ``--precision``) is kept, as `Framework.for_model` keeps it."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    m = plan.model
    if plan.framework == framework:
        return None
    try:
        given = dict(get_framework(plan.framework).recipes).get(m.dtype)
    except MemoError:  # a plan of a framework version this memo does not have: its recipe kept
        return None
    if m.precision not in (None, given):
        return None
    theirs = dict(get_framework(framework).recipes).get(m.dtype) or default_recipe(m.dtype)
    return theirs if theirs != m.recipe.name else None


def nearest_model(plan: Plan, gaps: list[Gap], framework: str | None = None, profile=None):
    """The plan's model as the framework runs it: a GEMM format it lacks replaced (`gemm_format_gap`), the
    multi-token-prediction modules it does not train left out (`mtp_gap`); with ``framework`` also what its data says
    of how it trains the model, the one place the what-if takes it from (`memo_sim.frameworks.Framework.for_model`:
    its FP8 library's behaviour, ``fp8_saved_inputs``, ``fp8_sp_gathers``, ``fp8_weights_per_use``, the QK-norm
    outputs it keeps, chunked attention; a review: an export to Megatron-LM priced torchao's FP8 behaviour of the
    plan's framework), and with ``profile`` its FP8 library's copies on that GPU (``fp8_transposes``,
    `memo_sim.cost.gemm_format.for_profile`), as the what-if applies them. The model-state recipe stays the plan's
    here (`framework_recipe` names its change)."""
    over = {}
    for g in gaps:
        if g.change.gemm_format is not None:
            over.setdefault("gemm_format", g.change.gemm_format)
        if g.change.mtp_layers is not None:
            over.setdefault("mtp_layers", g.change.mtp_layers)
    model = dataclasses.replace(plan.model, **over) if over else plan.model
    if framework is not None:
        from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

        model = get_framework(framework).for_model(model)
    if profile is not None:
        from memo_sim.cost.gemm_format import for_profile  # noqa: PLC0415

        model = for_profile(model, profile)
    return model


def kept_launch(plan: Plan, gaps: list[Gap], framework: str, fields: tuple[str, ...]) -> dict:
    """The launch settings (``fields``: layout fields a launch line sets, `memo_sim.search.whatif.launch_overrides`'
    ``grad_overlap``, ...) the exporter writes from the plan's nearest layout, not from ``framework``'s data: those of a
    plan searched for the same framework (any version: its name before '@'), where the user may have pinned them
    (``whatif --framework megatron --no-grad-overlap``: a review found the script written with --overlap-grad-reduce
    and priced 10% faster than the plan, every part of it expressible); {} for a plan of another framework, which runs
    the target's own (`Framework.adapt`, named among the nearest plan's mechanisms)."""
    if plan.framework.split("@")[0] != framework.split("@")[0]:
        return {}
    layout = nearest_plan(plan, gaps)[0]
    return {f: getattr(layout, f) for f in fields}


def price_nearest(plan: Plan, gaps: list[Gap], framework: str, own: dict | None = None,
                  kept: dict | None = None) -> dict | None:
    """memo's prediction for the nearest plan on the plan's profile, run with ``framework``'s
    mechanisms (its attention kernel, loss: `Framework.adapt`, but the plan's allocator settings, which the export
    sets itself, `alloc_env`; its model-state recipe,
    `framework_recipe`), as that framework would run it (None when neither a gap nor the framework's mechanisms change
    the plan; ``error`` when it cannot be simulated). ``own``: layout fields the framework runs its own way for a part
    of the plan it expresses (torchtitan's FSDP2 for a ZeRO-3 plan), applied after the gaps and named among the
    mechanisms. ``kept``: the plan's launch settings the exporter writes as they are (`kept_launch`), kept over the
    framework's as the allocator settings are."""
    from memo_sim.engine.simulate import simulate  # noqa: PLC0415 - the simulator only when pricing
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    from memo_sim.frameworks import mechanism_changes  # noqa: PLC0415

    layout, policy, schedule = nearest_plan(plan, gaps)
    prof = load_profile(plan.profile)
    mine, layout = layout, get_framework(framework).adapt(layout, prof)
    # the allocator settings are the plan's: every export sets them on its run line (`alloc_env`), so the framework's
    # own script's (its data's, `Framework.adapt`) do not apply
    layout = dataclasses.replace(layout, expandable_segments=mine.expandable_segments, alloc_conf=mine.alloc_conf,
                                 **(kept or {}))
    own = {k: v for k, v in (own or {}).items() if getattr(layout, k) != v}
    named = [f"{k} {getattr(layout, k)} -> {v}" for k, v in own.items()]
    if own:  # and the framework's mechanisms that act on what they change (FSDP2's copies under its FSDP)
        layout = dataclasses.replace(get_framework(framework).adapt(dataclasses.replace(layout, **own), prof),
                                     expandable_segments=mine.expandable_segments, alloc_conf=mine.alloc_conf,
                                     **(kept or {}))
    mechanisms = mechanism_changes(mine, layout, prof) + named
    try:  # the framework's FP8 behaviour and the rest of its `Framework.for_model` (a review: left out here)
        model = nearest_model(plan, gaps, framework, prof)
    except MemoError as e:
        return {"label": f"{layout.label()} {policy.label()}", "error": str(e), "status": None,
                "mechanisms": mechanisms}
    offloads = bool(getattr(policy, "offload_modules", ()))
    fp8 = [f"{k} {getattr(plan.model, k)} -> {getattr(model, k)}" for k in _FRAMEWORK_FIELDS
           if framework_field_moves(model, k, offloads) and getattr(plan.model, k) != getattr(model, k)]
    mechanisms += fp8
    recipe = framework_recipe(plan, framework)
    if recipe is not None:  # (a review: a DeepSpeed plan exported to torchtitan priced with DeepSpeed's 16-bit
        # gradient reduce, where torchtitan's FSDP2 reduces in fp32)
        width = RECIPES[recipe].grad_reduce_bytes
        mechanisms.append(f"precision {plan.model.recipe.name} -> {recipe} (gradients reduced in "
                          f"{_REDUCE_WORDS.get(width, f'{width}-byte elements')})")
        model = dataclasses.replace(model, precision=recipe)
    if not mechanisms and not any(g.change != PlanChange() for g in gaps):  # (a review: a Megatron plan's cuDNN
        return None  # attention and vocab-parallel loss exported to torchtitan as "every part expressed")
    dropped = plan.model.mtp_layers - model.mtp_layers
    label = (f"{layout.label()} {policy.label()}" + (f" {schedule}" if layout.pp > 1 else "")
             + (f" {model.gemm_format} GEMMs" if model.gemm_format != plan.model.gemm_format else "")
             + (f", without its {modules_words(dropped, 'multi-token-prediction')}" if dropped else ""))
    try:
        res = simulate(model, layout, nearest_batch(plan, gaps), plan.seq_tokens, policy, load_profile(plan.profile),
                       keep_timeline=False, schedule=schedule, micro_batch=plan.micro_batch,
                       classifier_chunk_tokens=plan.classifier_chunk_tokens)
    except MemoError as e:
        return {"label": label, "error": str(e), "status": None, "mechanisms": mechanisms}
    return {"label": label, "status": res.status, "iteration_s": res.iteration_s, "mfu": res.mfu,
            "mechanisms": mechanisms,
            "peak_gpu_bytes": res.peak_gpu_bytes, "planned_iteration_s": plan.predicted.iteration_s,
            "sequences": nearest_batch(plan, gaps) * layout.dp, "planned_sequences": plan.batch * plan.layout.dp,
            "profile": load_profile(plan.profile).name,
            "failure": res.failure.message() if res.failure is not None else None}


# The gaps most frameworks share, written once.

def ulysses_gap(plan: Plan, instead: str = "cp", why: str = "") -> list[Gap]:
    """Ulysses written as ring context parallelism over its ranks (and the ring's); ``why``: the framework's reason,
    where it runs an all-to-all CP of its own that cannot take this one (Megatron-LM: the K/V heads)."""
    u = plan.layout.ulysses
    if u == 1:
        return []
    cp = plan.layout.cp
    beside = f" beside ring context parallelism over {cp}" if cp > 1 else ""
    because = f" ({why})" if why else ""
    return [Gap(f"DeepSpeed-Ulysses over {u} GPUs{beside}{because}", f"ring context parallelism over {cp * u} GPUs",
                PlanChange(layout={"ulysses": 1, instead: cp * u}))]


def metp_gap(plan: Plan) -> list[Gap]:
    if not plan.layout.metp:
        return []
    return [Gap(f"METP ({plan.layout.tp_mode}: weight blocks on a P2P ring)",
                f"Megatron tensor parallelism with sequence parallelism, degree {plan.layout.tp}",
                PlanChange(layout={"tp_mode": "megatron", "sp": True}))]


def async_tp_gap(plan: Plan, nearest: str) -> list[Gap]:
    """A plan whose TP collectives run decomposed beside their GEMMs (`memo_sim.tp.async_tp`), for
    a framework without PyTorch's async TP: ``nearest`` names what the framework runs instead."""
    if not plan.layout.flavour.async_collectives:
        return []
    return [Gap(f"async TP ({plan.layout.tp_mode}: TP collectives decomposed and overlapped with their GEMMs)",
                nearest, PlanChange(layout={"tp_mode": "megatron"}))]


def policy_gaps(plan: Plan, runs: dict[str, str], fallback: str = "full_recompute",
                notes: dict[str, str] | None = None) -> list[Gap]:
    """Gaps of the activation policy: ``runs`` maps the policies the framework expresses to the
    words of its setting; any other becomes ``fallback`` (``notes`` adds the framework's nearest
    mechanism in words, per policy); MEMO's static memory plan, which no framework takes, is
    listed on its own."""
    pol = plan.policy
    gaps = []
    if pol.name not in runs:
        what = {"memo": f"MEMO's token-wise offload (alpha = {pol.alpha or 0:.3g}) and recompute",
                "full_offload": "full offload of the skeletal activations to pinned host memory",
                "sppo": f"SPPO's subsequence pipeline ({getattr(pol, 'subseqs', '?')} subsequences, "
                        f"per-subsequence offload)"}.get(pol.name, f"the {pol.name} policy")
        note = (notes or {}).get(pol.name)
        gaps.append(Gap(what, runs[fallback] + (f" ({note})" if note else ""), PlanChange(policy=fallback)))
    if uses_memory_plan(pol, plan.layout):
        gaps.append(Gap("MEMO's bi-level static memory plan" if pol.static_memory_plan else "a static memory plan "
                        "of the transients", "PyTorch's caching allocator"))
    return gaps


def target_gemm_format(plan: Plan, framework: str) -> str:
    """The GEMM format the framework version runs the plan's layer GEMMs in: the plan's where it offers it, else the
    nearest quantised format it offers that the plan's GPU runs (`memo_sim.cost.gemm_format.nearest_format`: a
    Megatron fp8-tensorwise plan runs torchtitan's Float8 rowwise, not bf16), else bf16 (a profile that does not load:
    bf16)."""
    from memo_sim.cost.gemm_format import nearest_format  # noqa: PLC0415
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    offered = get_framework(framework).gemm_formats
    if plan.model.gemm_format in offered:
        return plan.model.gemm_format
    try:
        profile = load_profile(plan.profile)
    except MemoError:
        profile = None
    return nearest_format(plan.model, offered, profile)


def gemm_format_gap(plan: Plan, framework: str) -> list[Gap]:
    """The plan's GEMM format where the framework version (`memo_sim.frameworks` data) does not offer
    it: the nearest format it offers that the plan's GPU runs (`target_gemm_format`) instead, priced; the model
    dtype's where it offers none."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    fmt, fw = plan.model.gemm_format, get_framework(framework)
    if fmt in fw.gemm_formats:
        return []
    new = target_gemm_format(plan, framework)
    what = (f"{new} GEMMs, the nearest format {fw.name} offers that the GPU runs" if new != "bf16" else
            f"{plan.model.dtype} GEMMs")
    return [Gap(f"{fmt} GEMMs ({plan.model.gemm.summary})", f"{what} ({fw.name} offers "
                f"{', '.join(fw.gemm_formats)})", PlanChange(gemm_format=new))]


def rotary_gaps(m, why: str, partial: bool = True, learned: bool = False) -> list[Gap]:
    """A model's rotary details a framework's options do not express (``why`` says so): layers without rotary
    embedding (``nope_period``: Llama 4's NoPE layers), where ``partial`` a rotary embedding over part of each
    head (``rotary_fraction``: GLM-4.5's), and where ``learned`` learned positions (``positions``: GPT-2's table);
    the framework's script turns every head dimension on every layer."""
    parts = [(m.nope_period, f"no rotary embedding on one layer in every {m.nope_period} (NoPE)")]
    if partial:
        parts.insert(0, (m.rotary_fraction, f"a rotary embedding over {m.rotary_fraction:g} of each head"))
    if learned:
        parts.insert(0, (m.positions == "learned", "learned absolute positions (a position table, no rotary "
                                                    "embedding in the layers)"))
    return [Gap(what, f"rotary embeddings over every head dimension on every layer ({why}): set it in the model by "
                      f"hand") for on, what in parts if on]


def not_modelled_gap(plan: Plan) -> list[Gap]:
    """What the model describes that memo neither counts nor prices (`ModelConfig.not_modelled`: Llama 4's QK norm,
    a checkpoint's quantization): the script, written from what memo models, trains without it."""
    m = plan.model
    return [Gap(what, "not written (the times beside are without it): add it by hand to "
                "train the model as released") for what in m.not_modelled.split("; ") if what]  # one gap each


def mtp_gap(plan: Plan, framework: str, why: str) -> list[Gap]:
    """The model's multi-token-prediction modules where the framework version does not train them (``why``: what
    it lacks, in words): left out, and the nearest plan priced without them."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    n = plan.model.mtp_layers
    if not n or get_framework(framework).multi_token_prediction:
        return []
    where = " on the last stage" if plan.layout.pp > 1 else ""
    return [Gap(f"multi-token prediction ({modules_words(n)}{where})",
                f"not written ({why}): the script trains the model without it", PlanChange(mtp_layers=0))]


def optimizer_offload_gap(plan: Plan, framework: str, why: str = "") -> list[Gap]:
    """The optimizer on the host where the framework version does not offer it: on the GPU instead, ``why`` (the
    framework's nearest mechanism and how it differs) named beside it."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    lay = plan.layout  # over one ZeRO rank the stages are one setting (`Framework.offloads_optimizer`)
    if not lay.optimizer_offload or get_framework(framework).offloads_optimizer(lay.zero,
                                                                                 lay.dp * lay.cp * lay.ulysses):
        return []
    return [Gap("the optimizer's states and step on the host (optimizer offload)",
                "the optimizer on the GPU" + (f" ({why})" if why else ""),
                PlanChange(layout={"optimizer_offload": False}))]


def dp_flavour_gap(plan: Plan, framework: str) -> list[Gap]:
    """A data-parallel flavour the framework version does not run (FSDP2 as torchtitan runs it: HSDP, weights
    kept from the forward to the backward, FSDP beside pipeline stages): its own ZeRO instead, over the whole data
    group, ZeRO 1 at most beside pipeline stages."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    lay, fw = plan.layout, get_framework(framework)
    if lay.dp_mode in fw.dp_modes:
        return []
    change: dict = {"dp_mode": "zero", "fsdp_shard": 0, "reshard_after_forward": True}
    nearest = f"ZeRO {lay.zero} over the whole data group, the weights gathered again for the backward"
    if lay.pp > 1 and lay.zero > 1:
        change["zero"] = max(z for z in fw.zero if z <= 1)
        nearest = f"ZeRO {change['zero']} beside the pipeline stages"
    what = (f"data-parallel flavour {lay.dp_mode}" + (f", HSDP over shard groups of {lay.fsdp_shard}" if lay.fsdp_shard
                                                      else "")
            + ("" if lay.reshard_after_forward else ", the gathered weights kept from the forward to the backward")
            + (f" beside {lay.pp} pipeline stages" if lay.pp > 1 else ""))
    return [Gap(what, nearest, PlanChange(layout=change))]


# what runs instead of expert loads a framework has no setting for, nearest in price first
# (`memo_sim.layout.moe_balance`: random routing is priced at dropless's uniform loads)
_BALANCE_NEAREST = {"forced": ("random", "dropless"), "random": ("dropless",), "capacity": ("dropless",)}


def framework_balance(plan: Plan, framework: str) -> str | None:
    """The expert-load setting the framework version runs in place of the plan's (`memo_sim.frameworks`'
    ``balances``; the nearest in price, ``_BALANCE_NEAREST``), or None where it runs the plan's (or the model has
    no experts)."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    fw, bal = get_framework(framework), plan.layout.balance
    if not plan.model.moe or fw.experts is None or bal.kind in fw.experts.balances:
        return None
    return next(k for k in _BALANCE_NEAREST.get(bal.kind, ()) + ("dropless",) if k in fw.experts.balances)


def ep_overlap_gap(plan: Plan, framework: str) -> list[Gap]:
    """Megatron-Core's EP all-to-all overlap (`Layout.ep_overlap`) where the framework version has none: the
    all-to-alls exposed, each micro-batch's steps apart, priced so (a review found the nearest plan kept it)."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    experts = get_framework(framework).experts
    if not plan.layout.ep_overlap or (experts is not None and experts.ep_overlap):
        return []
    return [Gap("Megatron-Core's EP all-to-all overlap (--overlap-moe-expert-parallel-comm, merged forward and "
                "backward steps)", f"the all-to-alls exposed, each micro-batch's forward and backward apart ({framework} "
                f"has no such overlap in memo's framework data)", PlanChange(layout={"ep_overlap": False}))]


def balance_gap(plan: Plan, framework: str) -> list[Gap]:
    """Expert loads the framework version has no setting for: the nearest it runs instead, priced as that."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    instead, bal = framework_balance(plan, framework), plan.layout.balance
    if instead is None:
        return []
    fw = get_framework(framework)
    return [Gap(f"expert loads {bal.words}", f"{parse_balance(instead).words} ({fw.name} offers "
                                              f"{', '.join(fw.experts.balances)})",
                PlanChange(layout={"moe_balance": instead}))]


def rank_order_gap(plan: Plan, framework: str) -> list[Gap]:
    """A rank order the framework version does not number ranks in (`memo_sim.layout.rank_order`; it matters to a
    pipeline with data parallelism only): its own instead, priced as that."""
    from memo_sim.search.frameworks import get_framework  # noqa: PLC0415

    lay, fw = plan.layout, get_framework(framework)
    if lay.rank_order in fw.rank_orders or lay.pp == 1 or lay.dp == 1:
        return []
    return [Gap(f"ranks numbered {lay.rank_order} (innermost first)",
                f"{fw.rank_orders[0]}, as {fw.name} numbers them",
                PlanChange(layout={"rank_order": fw.rank_orders[0]}))]


def uneven_stages_gap(plan: Plan, framework: str) -> list[Gap]:
    """Uneven pipeline stages where the exporter does not write them (the plan is kept: the user sets
    the split as the framework spells it)."""
    lay = plan.layout
    if lay.pp < 2 or not lay.uneven:
        return []
    if lay.chunk_layers or lay.vpp > 1:  # every model chunk its own count (virtual stage c x pp + s): a rank's total
        # is not what the framework is told (a review: 6, 10, 10, 6 for chunks of 3, 5, 5, 3, 3, 5, 5, 3)
        counts = lay.chunk_layers or tuple(len(r) for r in lay.virtual_stage_ranges(plan.model.layers))
        return [Gap(f"uneven model chunks ({', '.join(map(str, counts))} layers, virtual stages in order)",
                    f"not written: set {framework}'s split to these counts")]
    counts = lay.stage_layer_counts(plan.model.layers)
    return [Gap(f"uneven pipeline stages ({', '.join(map(str, counts))} layers)",
                f"not written: set {framework}'s stage split to these counts")]


def zero_gap(plan: Plan, stages: tuple[int, ...], words: str) -> list[Gap]:
    z = plan.layout.zero
    if z in stages:
        return []
    nearest = max(s for s in stages if s <= z) if any(s <= z for s in stages) else min(stages)
    return [Gap(f"ZeRO stage {z}", f"{words} (ZeRO {nearest})", PlanChange(layout={"zero": nearest}))]


def interleave_gap(plan: Plan) -> list[Gap]:
    """Interleaved 1F1B where the framework runs 1F1B: one chunk a rank holding the layers of its chunks (an
    uneven split kept as each rank's total; the plan's chunk counts no longer fit pp x 1 chunks)."""
    if plan.schedule != "interleaved_1f1b":
        return []
    lay = plan.layout
    change: dict = {"vpp": 1}
    if lay.chunk_layers or lay.account_embedding_loss:
        change.update(chunk_layers=tuple(lay.stage_layer_counts(plan.model.layers)), account_embedding_loss=False,
                      first_stage_layers=0, last_stage_layers=0)
    return [Gap(f"interleaved 1F1B with {lay.vpp} virtual stages", "1F1B", PlanChange(layout=change, schedule="1f1b"))]


def shape_arguments(plan: Plan) -> list[tuple[str, str | None]]:
    """The model's shape and length as Megatron-LM's arguments (Megatron-DeepSpeed keeps them)."""
    m = plan.model
    return [("--num-layers", str(m.layers)), ("--hidden-size", str(m.hidden)), ("--ffn-hidden-size", str(m.ffn)),
            ("--num-attention-heads", str(m.heads)), ("--seq-length", str(plan.seq_tokens)),
            ("--max-position-embeddings", str(plan.seq_tokens))]


def gpus_per_host(plan: Plan) -> int:
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    return load_profile(plan.profile).host_gpus


# The caching allocator's environment variable. PyTorch's AllocatorConfig::instance (c10/core/AllocatorConfig.cpp,
# the releases with PYTORCH_ALLOC_CONF) reads PYTORCH_ALLOC_CONF and, where it is unset, PYTORCH_CUDA_ALLOC_CONF
# "for backwards compatibility" (warning once that it is deprecated); the releases before read
# PYTORCH_CUDA_ALLOC_CONF alone (c10/cuda/CUDAAllocatorConfig.cpp): the older name is the one every torch 2.x reads,
# the newer one where a framework's own launch script sets it (torchtitan's run_train.sh)
CUDA_ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def alloc_env(layout: Layout, variable: str = CUDA_ALLOC_ENV) -> str:
    """The caching allocator's settings memo priced for ``layout`` (its ``expandable_segments`` and the rest of its
    setting string, ``alloc_conf``: `memo_sim.layout.alloc_conf`) as the shell assignment ``VAR=value `` an exporter
    puts before its run line, the one place every exporter takes it from (a QA review: torchtitan's run line bypassed
    run_train.sh, whose PYTORCH_ALLOC_CONF="expandable_segments:True" memo prices, and set nothing); "" where the
    layout runs PyTorch's defaults (``expandable_segments:False`` is the default and is not written).
    ``per_process_memory_fraction`` is not a key of the variable (PyTorch's parser stops at start-up on
    "Unrecognized CachingAllocator option") and is left out here; `alloc_gap` names it."""
    conf = merged_alloc_conf(layout.expandable_segments, layout.alloc_conf)
    conf = dataclasses.replace(conf, expandable_segments=True if layout.expandable_segments else None,
                               per_process_memory_fraction=None)
    text = conf.text()
    return f"{variable}={shlex.quote(text)} " if text else ""


def alloc_gap(plan: Plan) -> list[Gap]:
    """A plan's ``per_process_memory_fraction`` (`memo_sim.layout.alloc_conf`): torch's
    ``torch.cuda.set_per_process_memory_fraction`` call, which no launcher option or allocator variable sets, so the
    framework runs on the whole GPU; the garbage collection that runs only under a fraction goes with it."""
    conf = parse_alloc_conf(plan.layout.alloc_conf)
    f = conf.per_process_memory_fraction
    if f is None:
        return []
    rest = dataclasses.replace(conf, per_process_memory_fraction=None, garbage_collection_threshold=0.0)
    gc = (f" and the caching allocator's garbage collection from {conf.garbage_collection_threshold!r} of it"
          if conf.garbage_collection_threshold else "")
    return [Gap(f"the process's GPU memory capped at {f!r} of the device (per_process_memory_fraction){gc}",
                f"not set, the whole GPU (add torch.cuda.set_per_process_memory_fraction({f!r}) to the training "
                f"script for the cap)", PlanChange(layout={"alloc_conf": rest.text(with_expandable=False)}))]


def torchrun_line(plan: Plan, script: str) -> str:
    """torchrun's process counts for the plan's GPUs on hosts of the profile's size (a GB200 NVL72's
    compute trays of 4 GPUs, not its 72-GPU NVLink domain), filled in order as the simulator places them: every
    host full but the last, which runs the rest (a review: a 6-GPU plan on hosts of 4 was launched as 2 x 4 = 8
    ranks, and Megatron-LM and torchtitan derive the data-parallel size from the world size: another job). torchrun
    takes a different --nproc-per-node on each host: its agent's ``_assign_worker_ranks``
    (torch/distributed/elastic/agent/server/api.py, torch 2.13.0) sums every host's local world size through the
    rendezvous store and gives each host the ranks after those of the hosts before it, under the static rendezvous
    too, unless TORCH_ELASTIC_WORKER_IDENTICAL is 1 (its fast path assumes equal hosts: the line sets it to 0)."""
    per = min(plan.gpus, gpus_per_host(plan))
    nodes = -(-plan.gpus // per)
    if nodes == 1:
        return f"torchrun --nnodes 1 --nproc-per-node {per} {script}"
    rank = f"${{NODE_RANK:?set NODE_RANK, 0..{nodes - 1}}}"
    last = plan.gpus - (nodes - 1) * per
    # the last host's count from its rank, the rank checked as it is read (bash expands the words in order)
    count = (str(per) if last == per else
             f"\"$(( {rank} < {nodes - 1} ? {per} : {last} ))\"")
    env = "" if last == per else "TORCH_ELASTIC_WORKER_IDENTICAL=0 "
    # several hosts: torchrun's static rendezvous, each host its rank and the first host's address from the
    # environment the job scheduler sets (the script refuses to start without them)
    return (f"{env}torchrun --nnodes {nodes} --nproc-per-node {count} --node-rank \"{rank}\" "
            f"--master-addr \"${{MASTER_ADDR:?set MASTER_ADDR, the first host}}\" "
            f"--master-port \"${{MASTER_PORT:-29500}}\" {script}")
