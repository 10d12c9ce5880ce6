"""What would make a configuration that does not fit fit: "why does X not fit" answered for X.

The what-if's binding words say why X does not fit (the term that fills memory, with the terms
beside it); `fit_fixes` says what would make it fit, by estimating (analytic tier, cheap) X with
one thing changed: another activation policy on X's layout, or X's sequence split twice as far
(ring context parallelism, over half the data-parallel replicas or twice the GPUs), or its
tensor parallelism doubled within a node. Only changes that fit are named, as the flags that ask
for them.
"""

from __future__ import annotations

from dataclasses import replace

from memo_sim.errors import MemoError
from memo_sim.layout.alloc_conf import EXPANDABLE_FLAG
from memo_sim.units import fmt_bytes

MAX_FIXES = 3


def _estimate(c, layout, policy: str, alpha):
    from memo_sim.policy import policy_class
    from memo_sim.search.whatif import make_candidate

    try:
        return make_candidate(c.model, layout, policy, c.batch, c.seq, c.profile,
                              alpha if policy_class(policy).takes_alpha else None, micro_batch=c.micro_batch)
    except MemoError:
        return None


def _layout_variants(c, gpus: int):
    """(flags, layout) of X's layout with its sequence or tensors split twice as far."""
    from memo_sim.layout.parallel import check_layout

    lay = c.layout
    out = []
    for field_, flag in (("cp", "--cp"), ("tp", "--tp")):
        v = replace(lay, **{field_: getattr(lay, field_) * 2})
        extra = ""
        if lay.dp % 2 == 0:
            v = replace(v, dp=lay.dp // 2)
        else:
            extra = f" --gpus {2 * gpus}"
        if check_layout(v, c.model, v.gpus, c.profile.node_gpus, c.seq, c.batch) is None:
            out.append((f"{flag} {getattr(v, field_)}{extra}", v))
    return out


def fit_fixes(c, gpus: int, alpha: float | None = None, policies: tuple[str, ...] | None = None,
              allows=None) -> list[str]:
    """Up to `MAX_FIXES` one-change variants of candidate ``c`` that fit (analytic tier), in words;
    ``policies``: the ones a --policy variant may name (the framework's; None: every one); ``allows``: whether
    the framework runs a layout (None: every one). A variant the what-if would refuse is never named (a review:
    --policy recompute_mlp was advised on a METP layout, --cp 2 under DeepSpeed, which has no ring CP)."""
    from memo_sim.layout.schedule import schedule_runs_policy
    from memo_sim.policy import policy_class, policy_names

    if c.status == "OK" or c.schedule != "single_stage":
        return []
    fixes = []
    for p in policy_names():
        if p == c.policy.name or schedule_runs_policy("sppo", p) or (policies is not None and p not in policies):
            continue
        cls = policy_class(p)
        if (cls.needs_experts and not c.model.moe) or cls.model_why_not(c.model) or cls.layout_why_not(c.layout):
            continue
        e = _estimate(c, c.layout, p, alpha)
        if e is not None and e.status == "OK":
            fixes.append((-e.tgs, f"--policy {p} ({e.layout.label()} {e.policy.label()}, {e.tgs:,.0f} tokens/GPU/s "
                                  "analytic)"))
    variants = _layout_variants(c, gpus)
    from memo_sim.policy.base import uses_memory_plan  # noqa: PLC0415

    if not c.layout.expandable_segments and not uses_memory_plan(c.policy, c.layout):  # PyTorch's one-flag fix
        variants.append((EXPANDABLE_FLAG, replace(c.layout, expandable_segments=True)))
    for flags, lay in variants:
        if allows is not None and not allows(lay):
            continue
        e = _estimate(c, lay, c.policy.name, alpha)
        if e is not None and e.status == "OK":
            fixes.append((-e.tgs, f"{flags} ({lay.label()} {e.policy.label()}, {e.tgs:,.0f} tokens/GPU/s analytic)"))
    return [words for _k, words in sorted(fixes)[:MAX_FIXES]]


EXPANDABLE_TRIES = 4  # faster layouts priced with expandable segments, at most, per fitting answer


def expandable_faster(shown, best) -> dict | None:
    """A fitting answer whose faster configurations ran out of memory on the caching allocator's fragmentation
    alone (an OOM with no byte over capacity, the ranking's 'OOM frag': a request found no cached block big enough
    though the peak fits): the fastest of them (analytic tier, up to `EXPANDABLE_TRIES` priced) that fits with
    PyTorch's expandable segments and beats the best's analytic throughput, or None (`fit_fixes` names the same flag
    when nothing fits)."""
    from memo_sim.policy.base import uses_memory_plan  # noqa: PLC0415

    if best is None or best.layout.expandable_segments:
        return None
    base = best.estimate.tgs
    tried = 0
    for c in shown:
        if (c is best or c.status != "OOM" or c.over_bytes > 0 or c.schedule != "single_stage"
                or c.layout.expandable_segments or uses_memory_plan(c.policy, c.layout) or c.estimate.tgs <= base):
            continue
        tried += 1
        lay = replace(c.layout, expandable_segments=True)
        e = _estimate(c, lay, c.policy.name, c.policy.alpha)
        if e is not None and e.status == "OK" and e.tgs > base:
            label = f"{c.layout.label()} {c.policy.label()}"
            words = (f"faster with {EXPANDABLE_FLAG}: {label} runs out of memory only on the caching allocator's "
                     f"fragmentation; with expandable segments it fits at {e.tgs:,.0f} tokens/GPU/s (analytic), "
                     f"{e.tgs / base:.2f}x the best's analytic {base:,.0f}")
            return {"flag": EXPANDABLE_FLAG, "label": f"{lay.label()} {e.policy.label()}", "tier": "analytic",
                    "tgs_tokens_per_gpu_s": float(e.tgs), "best_analytic_tgs_tokens_per_gpu_s": float(base),
                    "peak_gpu_bytes": float(e.peak_gpu_bytes), "words": words}
        if tried >= EXPANDABLE_TRIES:
            break
    return None


def eager_kernels_cost(best) -> dict | None:
    """What eager PyTorch's composite kernels cost the best plan (``Layout.kernel_fusion`` ``eager``: its RMSNorms and
    SwiGLU as separate tensor ops, `memo_sim.model.eager_kernels`): the same candidate with one fused kernel each
    (analytic tier, against the best's analytic throughput), or None where the best's kernels are not eager or
    nothing is gained."""
    if best is None or best.layout.kernel_fusion != "eager":
        return None
    from memo_sim.policy import policy_class  # noqa: PLC0415
    from memo_sim.search.whatif import make_candidate  # noqa: PLC0415

    base = best.estimate.tgs
    alpha = best.policy.alpha if policy_class(best.policy.name).takes_alpha else None
    try:  # the same schedule (a pipeline's own), layout and policy, its kernels fused
        e = make_candidate(best.model, replace(best.layout, kernel_fusion="fused"), best.policy.name, best.batch,
                           best.seq, best.profile, alpha, micro_batch=best.micro_batch, schedule=best.schedule)
    except MemoError:
        return None
    if e.status != "OK" or e.tgs <= base:
        return None
    peak, best_peak = e.memory.peak_gpu_bytes, best.memory.peak_gpu_bytes
    words = (f"eager kernels: the best plan's RMSNorms and SwiGLU run as eager PyTorch's separate tensor ops "
             f"(kernel_fusion eager); with one fused kernel each (a compiled block, or hand-fused kernels: "
             f"--kernel-fusion fused) it runs at {e.tgs:,.0f} tokens/GPU/s (analytic), {e.tgs / base:.2f}x the "
             f"best's analytic {base:,.0f}, its analytic peak {fmt_bytes(peak)} against {fmt_bytes(best_peak)} (what "
             f"the eager ops' autograd keeps for the backward)")
    return {"flag": "--kernel-fusion fused", "tier": "analytic", "tgs_tokens_per_gpu_s": float(e.tgs),
            "best_analytic_tgs_tokens_per_gpu_s": float(base), "peak_gpu_bytes": float(peak),
            "best_analytic_peak_gpu_bytes": float(best_peak), "words": words}
