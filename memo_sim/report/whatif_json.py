"""A what-if's answer as JSON: what `memo-sim whatif --json` prints and `memo_sim.api.whatif_json` returns, one
builder for both (an audit, 2026-12-02: a program holding `memo_sim.api.whatif`'s answer could not get the
command's JSON); and the pieces the text answer shares with it (the METP rows, the fixes when nothing fits, the
training time of a token budget)."""

from __future__ import annotations

from memo_sim.layout.parallel import check_layout
from memo_sim.report.candidate_rows import candidates_json
from memo_sim.report.fit_advice import eager_kernels_cost, expandable_faster, fit_fixes
from memo_sim.report.whatif_answer import executor_refuses, runner_up, trained_model
from memo_sim.search.frameworks import get_framework
from memo_sim.search.whatif import fold_duplicates, megatron_twin

METP_COMPARED = 5  # METP candidates compared with their Megatron TP+SP twins


def whatif_json(ans, *, elapsed_s: float | None = None, plan_paths: dict | None = None,
                train_tokens: int | None = None, all_candidates: bool = False) -> dict:
    """The --json answer of the what-if ``ans`` (a `memo_sim.search.request.WhatifAnswer`): ``elapsed_s`` the seconds
    it took (None: not timed), ``plan_paths`` the plan files written by name (``plan.json``, ``plan-sppo.json``;
    None: none written), ``train_tokens`` a token budget to time (the command's --train-tokens), ``all_candidates``
    every candidate in full (--all-candidates)."""
    req, result, best, memo_best = ans.request, ans.result, ans.best, ans.memo_best
    paths = plan_paths or {}
    shown = fold_duplicates(result.candidates)
    plan_path, sppo_plan_path = paths.get("plan.json"), paths.get("plan-sppo.json")
    trained = best.model if best is not None else trained_model(req.model, req.framework)
    return {"model": dict(req.model.to_dict(), params=req.model.params(), active_params=req.model.active_params(),
                          mtp_layers=trained.mtp_layers, mtp_params=trained.mtp_params(), notes=trained.model_notes()),
            "seq_tokens": req.seq, "gpus": req.gpus, "partial_node": req.profile.partial_node_words(req.gpus),
            "batch": req.batch if req.batch or req.global_batch else 1, "global_batch": req.global_batch,
            "micro_batch": req.micro_batch, "profile": req.profile.name,
            "profile_provenance": {"calibrated": req.profile.calibrated, "line": req.profile.provenance_line(),
                                   "validation": req.profile.validation or None},
            "searched": result.searched,
            "elapsed_s": elapsed_s, "simulated_candidates": result.simulated,
            "tier2": result.tier2.to_dict() if result.tier2 is not None else None,
            "plan_file": str(plan_path) if plan_path else None,
            "framework": req.framework, "tp_mode": req.flavour,
            "sppo_plan_file": str(sppo_plan_path) if sppo_plan_path else None,
            "sppo": result.sppo_summary,
            "metp_vs_megatron": metp_vs_megatron(shown, req.alpha),
            "memo_best": memo_best.to_json() if memo_best is not None else None,
            # false: --no-compare, so memo_best, memo_best_on_framework, bf16_best and searched_split_best were not
            # searched (null for that reason, not for nothing fitting)
            "compared": ans.compared,
            # memo's best simulated with the framework's mechanisms (null: no --framework, or the same mechanisms)
            "memo_best_on_framework": ans.memo_on_framework,
            # why memo-exec refuses the best plan before it runs (null: it does not refuse it on the plan alone)
            "executor_refuses": executor_refuses(best) if best is not None else None,
            # an FP8 what-if: the same search without FP8 GEMMs (null: nothing fits it, or no FP8 asked: bf16_searched)
            "bf16_best": ans.bf16_best.to_json() if ans.bf16_best is not None else None,
            "bf16_searched": ans.bf16_searched,
            # a fixed pipeline split: the same search's best with the split searched (null: none fixed)
            "searched_split_best": ans.split_best.to_json() if ans.split_best is not None else None,
            "runner_up": runner_up(shown, best, result.tier2.mode if result.tier2 is not None else None),
            # a faster configuration that ran out of memory on fragmentation alone fits with expandable segments
            "faster_with_expandable_segments": expandable_faster(shown, best),
            # what eager PyTorch's composite norms and activations cost the best plan (null: its kernels are not eager)
            "eager_kernels": eager_kernels_cost(best),
            "train_tokens": train_tokens,
            **training_json(best, train_tokens),
            **candidates_json(shown, all_candidates),
            "not_fitting_fixes": answer_fixes(ans, shown),
            "folded_duplicates": len(result.candidates) - len(shown),
            "nothing_fits": best is None, "not_searched": ans.advice,
            "rejected_layouts": [{"layout": lay.label(), "reason": why} for lay, why in result.rejected_layouts]}


def answer_fixes(ans, shown: list) -> list[str]:
    """What would make the asked (closest) configuration fit, when nothing does (``shown``: the
    ranking with duplicates folded, `fold_duplicates`)."""
    fw = get_framework(ans.request.framework)  # a --policy or a layout the framework refuses fixes nothing
    return fit_fixes(shown[0], ans.request.gpus, ans.request.alpha, fw.policies, fw.allows) \
        if ans.best is None and shown else []


def metp_vs_megatron(candidates, alpha) -> list[dict]:
    """The best METP candidates (one per layout and policy) beside their Megatron TP+SP twins; ``candidates``: the
    ranking with its duplicates folded (`fold_duplicates`: a review found MEMO at alpha 1 and full offload on a
    memory plan as two rows here after the ranking listed them once)."""
    out = []
    for c in [c for c in candidates if c.layout.metp][:METP_COMPARED]:
        t = megatron_twin(c, alpha)
        m, tm = c.memory, t.memory
        why = check_layout(t.layout, c.model, t.layout.gpus, c.profile.node_gpus, c.seq, c.batch)
        out.append({"layout": c.layout.label(), "policy": c.policy.name, "policy_label": c.policy.label(),
                    "status": c.status, "peak_gpu_bytes": m.peak_gpu_bytes, "peak_source": "analytic",
                    "analytic_iteration_s": c.estimate.iteration_s,
                    "megatron_layout": t.layout.label(), "megatron_policy_label": t.policy.label(),
                    "megatron_status": "invalid" if why else t.status, "megatron_invalid_reason": why,
                    "megatron_peak_gpu_bytes": tm.peak_gpu_bytes,
                    "megatron_analytic_iteration_s": t.estimate.iteration_s,
                    "memory_saved_fraction": 1.0 - m.peak_gpu_bytes / tm.peak_gpu_bytes})
    return out


def training_json(best, tokens: int | None) -> dict:
    if tokens is None or best is None:
        return {"train_days": None, "train_gpu_hours": None}
    days, gpu_hours = training_time(best, tokens)
    return {"train_days": days, "train_gpu_hours": gpu_hours}


def training_time(c, tokens: int) -> tuple[float, float]:
    """(days, GPU-hours) to train ``tokens`` tokens at candidate ``c``'s throughput."""
    seconds = tokens / (c.tgs * c.layout.gpus)
    return seconds / 86400, seconds * c.layout.gpus / 3600
