"""Plans exported to the frameworks teams train with: one module per framework, registered by name.

Each module provides ``export(plan, price=True) -> Export`` (`memo_sim.export.base`): the files
the framework reads, the parts of the plan it cannot express with the nearest setting written
instead, and memo's predicted cost of that nearest plan.
"""

from __future__ import annotations

from types import ModuleType

from memo_sim.errors import MemoError
from memo_sim.export import deepspeed, megatron, torchtitan
from memo_sim.export.base import Export, Gap, NoNearest, PlanChange, best_runnable
from memo_sim.plan.schema import Plan

EXPORTERS: dict[str, ModuleType] = {"megatron": megatron, "torchtitan": torchtitan, "deepspeed": deepspeed}


def export_plan(plan: Plan, to: str, price: bool = True, nearest: bool = False, jobs: int = 1,
                progress=None, on_search=None) -> Export:
    """The plan as ``to``'s files. Where the framework cannot express the plan (a gap that changes
    it), the best plan memo predicts the framework's version runs is exported instead (`best_runnable`:
    the what-if constrained to it), with what it gives up against memo's plan; ``nearest`` writes
    memo's plan with its nearest settings instead (the gaps listed and priced). ``jobs`` and ``progress`` are the
    constrained what-if's (`memo_sim.search.request.answer_whatif`); ``on_search(framework)`` is called as that search
    starts (it takes minutes for a trillion-parameter model's pipelines)."""
    try:
        module = EXPORTERS[to]
    except KeyError:
        raise MemoError(f"--to {to!r}: no exporter; choose one of {', '.join(EXPORTERS)}") from None
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    load_profile(plan.profile)  # an unknown profile is the plan's error, not a framework's (a review: through the API
    # it came back as the framework's search finding no plan)
    try:
        ex, no_nearest = module.export(plan, price=price), None
    except NoNearest as e:  # no nearest settings of the plan run there (a gap the exporter cannot write around)
        if nearest:
            raise
        ex, no_nearest = None, e
    if ex is not None and (nearest or not (any(g.change != PlanChange() for g in ex.gaps)
                                           or _out_of_memory(ex.nearest))):
        return ex
    if on_search is not None:
        on_search(module.FRAMEWORK)
    try:
        # a GEMM format the exporter cannot write for this model (torchtitan's converters on a model it does not
        # ship) is searched without, so that the plan written is the one priced
        writes = getattr(module, "writes_gemm_format", None)
        alt, summary = best_runnable(plan, module.FRAMEWORK, jobs=jobs, progress=progress,
                                     keep_format=writes is None or writes(plan))
    except MemoError as e:  # the framework's search itself refused: the nearest settings, as with --nearest
        if ex is None:  # (the search's own words may blame a mechanism the plan's gap is not about: the exporter's)
            raise _none_either(no_nearest, module.FRAMEWORK) from None
        ex.gaps.append(Gap(f"a plan {module.FRAMEWORK} runs", f"the what-if constrained to --framework "
                           f"{module.FRAMEWORK} refused ({str(e).splitlines()[0]}): the nearest settings are written"))
        return ex
    if alt is None:  # nothing the framework offers fits: memo's plan's nearest settings, priced
        if ex is None:
            raise _none_either(no_nearest, module.FRAMEWORK)
        ex.gaps.append(Gap(f"a plan {module.FRAMEWORK} runs that fits", "none found by the what-if constrained to "
                           f"--framework {module.FRAMEWORK}: the nearest settings of memo's plan are written"))
        return ex
    if ex is None:  # the framework's best plan written where memo's has no nearest settings there (a review: export
        # promised it, and refused in one line while the constrained what-if found one)
        why = str(no_nearest).splitlines()[0].split(": ", 1)[-1]  # "--to NAME: " off, and the advice to export
        summary["why"] = [why.rsplit("; export ", 1)[0]]  # another plan, which this is
        summary["no_nearest"] = True
        return module.export(alt, price=price, instead=summary)
    summary["why"] = [g.what for g in ex.gaps if g.change != PlanChange()]  # what memo's plan has that it lacks
    if _out_of_memory(ex.nearest) and not summary["why"]:  # expressed, but out of memory as the framework runs it
        summary["does_not_fit"] = (f"with its own mechanisms ({', '.join(ex.nearest['mechanisms']) or 'none'}), "
                                   f"memo predicts it does not fit: {ex.nearest['failure'] or ex.nearest['status']}")
    return module.export(alt, price=price, instead=summary)


def _none_either(refusal: MemoError, framework: str) -> MemoError:
    """The exporter's refusal (no nearest settings of the plan run there) with the constrained what-if's answer put
    before its advice: it found no plan the framework runs either (refusing, or none fitting)."""
    head, sep, advice = str(refusal).partition("; export ")
    return MemoError(f"{head}; the what-if constrained to --framework {framework} finds no plan it runs either"
                     f"{sep}{advice}")


def _out_of_memory(priced: dict | None) -> bool:
    """Whether the plan as the framework runs it (`price_nearest`'s answer) was simulated and does not fit: its
    script would stop there, so the framework's best plan is written instead, as for a plan it cannot express."""
    return priced is not None and not priced.get("error") and priced.get("status") not in (None, "OK")


__all__ = ["EXPORTERS", "Export", "Gap", "NoNearest", "export_plan"]
