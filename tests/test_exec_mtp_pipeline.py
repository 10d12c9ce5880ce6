"""Multi-token prediction on pipelines (`memo_exec.mtp` in `memo_exec.pipeline.schedules`), on CPU with gloo.

As Megatron-LM places them (and the simulator prices them, `memo_sim.cost.sppo.stage_params`): the modules live on
the last pipeline rank (the last virtual stage's), run after the main head for every micro-batch, that rank holds a
copy of the embedding (an untied one too: the modules embed the shifted tokens), and the embedding's two gradients
(rank 0's and rank pp-1's) are summed after the backward (finalize_model_grads' ``_allreduce_word_embedding_grads``).

- two gloo ranks, pp 2 with 4 micro-batches: 1F1B for a dense model with a tied embedding and 2 modules, an
  RMSNorm / SwiGLU / GQA one with an untied classifier and 1 module, a MoE one (the module's layer MoE);
  interleaved 1F1B (vpp 2) with a tied and an untied embedding, with 2 micro-batches (both in flight on the last
  chunk) and with a last chunk without a layer; store all, full recompute (the modules re-run) and MEMO: the loss
  and every parameter's gradient those of the single process (fp64, 1e-12 relative; the single process is
  `tests.test_exec_mtp`'s, checked against the autograd reference here and there), 5 training steps on its
  losses, the embedding's copies equal at the start and after the steps;
- four gloo ranks: pp2 x tp2 (sequence parallel), pp2 x dp2 (untied), pp2 x dp2 x ep2 (MoE, full recompute);
- the last rank's model states hold the modules (and the first's do not);
- `memo_sim.plan.executor_scope.plan_why_not` accepts these plans and refuses, in one line, the modules under a
  schedule the executor does not run them in (SPPO) and under a tensor-parallel flavour other than Megatron's.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from memo_exec.runner import RunOptions
from memo_sim.layout.parallel import Layout
from tests.dist_harness import spawn
from tests.exec_helpers import one_process_run, time_limit
from tests.test_exec_mtp import DENSE, DENSE_RMS, MOE, max_rel_error, plan_for, reference_grads, run_plan

BATCH, MICRO = 4, 1  # 4 micro-batches of one sequence (interleaved: a multiple of pp, more than pp)
TOL = 1e-12  # fp64

MODELS = {
    "dense-tied-d2": DENSE,  # 2 layers, LayerNorm, GELU, biases, tied classifier, 2 modules
    "rms-untied-d1": DENSE_RMS,  # RMSNorm, SwiGLU, GQA, untied classifier, 1 module
    "moe-tied-d1": MOE,  # layer 0 dense, layer 1 (and the module's) MoE
    "dense-tied-4l-d2": dataclasses.replace(DENSE, layers=4),
    "rms-untied-4l-d2": dataclasses.replace(DENSE_RMS, layers=4, mtp_layers=2),
}
ONE_F = {"pp": 2}
INTERLEAVED = {"pp": 2, "vpp": 2}


def pipe_plan(name: str, lay: dict, pol: str = "store_all", batch: int = BATCH):
    plan = plan_for(MODELS[name], pol, lay, batch=batch, micro=MICRO)
    plan.schedule = "interleaved_1f1b" if lay.get("vpp", 1) > 1 else "1f1b"
    return plan


def held_buffer_bytes(ex) -> int:
    """The activation buffers a rank allocated: the rank's shared blocks and each policy instance's own rounding,
    input and work blocks (by storage, each once)."""
    blocks = list(getattr(ex.schedule, "shared", None).blocks.values()) if hasattr(ex.schedule, "shared") else []
    for p in getattr(ex.policy, "policies", [ex.policy]):
        blocks += [b for b in (getattr(p, "blocks", None) or []) if p.name not in ("store_all",)]
        blocks += [getattr(p, "work_block", None), getattr(p, "mlp_block", None), getattr(p, "norm_block", None)]
    return sum({b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in blocks if b is not None}.values())


def run_case(name: str, lay: dict, pol: str = "store_all", steps: int = 0, batch: int = BATCH) -> dict:
    def after(ex, when):
        if when == "allocated":
            return {"wte0": ex.gpt.wte.detach().clone(), "buffers_estimated": ex.estimate.terms["buffers"],
                    "buffers_held": held_buffer_bytes(ex)}
        return {"wte": ex.gpt.wte.detach().clone(), "modules": len(ex.gpt.mtp),
                "module_params": sum(p.numel() for p in ex.gpt.mtp.parameters())}

    return run_plan(pipe_plan(name, lay, pol, batch), steps,
                    before=lambda ex: {"states": ex.estimate.terms["model_states"]}, after=after)


def rank_cases(rank: int, world: int, cases) -> list:
    return [run_case(**c) for c in cases]


CASES = [dict(name="dense-tied-d2", lay=ONE_F, steps=5),
         dict(name="rms-untied-d1", lay=ONE_F),
         dict(name="moe-tied-d1", lay=ONE_F),
         dict(name="dense-tied-d2", lay=ONE_F, pol="full_recompute"),
         dict(name="rms-untied-d1", lay=ONE_F, pol="memo"),
         dict(name="moe-tied-d1", lay=ONE_F, pol="full_recompute"),
         dict(name="dense-tied-4l-d2", lay=INTERLEAVED),
         dict(name="rms-untied-4l-d2", lay=INTERLEAVED, steps=5),
         dict(name="rms-untied-4l-d2", lay=INTERLEAVED, pol="full_recompute"),
         # m = pp: every forward first, so both micro-batches' modules are in flight on the last chunk at once
         dict(name="dense-tied-4l-d2", lay=INTERLEAVED, batch=2),
         dict(name="dense-tied-4l-d2", lay=INTERLEAVED, pol="full_recompute", batch=2),
         # the last chunk without a layer (Megatron-LM's --pipeline-model-parallel-layout): the modules re-run in a
         # recompute buffer of their own, on the classifier's rank
         dict(name="rms-untied-4l-d2", lay=dict(INTERLEAVED, chunk_layers=(1, 1, 2, 0)), pol="full_recompute"),
         # checkpoint offload on pipeline ranks (the rank's input and work buffers): a MoE layer among the rank's last
         # two units re-runs its block (it kept its graph over a work buffer later layers overwrite, and crashed), the
         # modules after a last chunk without layers, and a last rank of the modules and the loss alone
         dict(name="moe-tied-d1", lay=ONE_F, pol="checkpoint_offload"),
         dict(name="rms-untied-4l-d2", lay=dict(INTERLEAVED, chunk_layers=(1, 1, 2, 0)), pol="checkpoint_offload"),
         dict(name="rms-untied-d1", lay=dict(ONE_F, chunk_layers=(2, 0)), pol="checkpoint_offload"),
         dict(name="rms-untied-d1", lay=dict(ONE_F, chunk_layers=(2, 0)), pol="full_recompute")]

_REF: dict = {}


def reference(name: str, pol: str, steps: int, batch: int = BATCH):
    """The single process's loss, gradients and ``steps`` losses on the same global batch (one micro-batch)."""
    key = (name, pol, steps, batch)
    if key not in _REF:
        _REF[key] = one_process_run(plan_for(MODELS[name], pol, batch=batch), steps)
    return _REF[key]


@pytest.fixture(scope="module")
def results():
    return spawn(rank_cases, 2, CASES, timeout=240)


def test_pipelines_with_modules_match_the_single_process(results):
    worst = {}
    for i, case in enumerate(CASES):
        pol, steps = case.get("pol", "store_all"), case.get("steps", 0)
        what = f"{case['name']} {case['lay']} {pol} batch {case.get('batch', BATCH)}"
        with time_limit(60):
            loss, want, losses = reference(case["name"], pol, steps, case.get("batch", BATCH))
        got = [r[i] for r in results]
        assert all(abs(r["loss"] - loss) <= TOL * abs(loss) for r in got), (what, [r["loss"] for r in got], loss)
        assert any(n.startswith("mtp.") for n in want)
        err, name = max_rel_error(got[0]["grads"], want)
        worst[what] = (err, name)
        assert err <= TOL, (what, name, err)
        assert len(got[0]["losses"]) == steps
        for a, b in zip(got[0]["losses"], losses, strict=True):  # the training steps follow the single process's
            assert abs(a - b) <= 1e-10 * abs(b), (what, got[0]["losses"], losses)
        # the last rank's embedding copy starts as rank 0's and stays equal to it (summed gradients, same update)
        assert torch.equal(got[0]["wte0"], got[1]["wte0"]), what
        assert torch.equal(got[0]["wte"], got[1]["wte"]), what
        # the modules live on the last rank only
        assert got[0]["modules"] == 0 and got[1]["modules"] == MODELS[case["name"]].mtp_layers, what
    print("max relative gradient errors:", worst)


FOUR = [dict(name="dense-tied-d2", lay={"pp": 2, "tp": 2, "sp": True}),
        dict(name="rms-untied-d1", lay={"pp": 2, "dp": 2}, batch=2),
        dict(name="moe-tied-d1", lay={"pp": 2, "dp": 2, "ep": 2}, pol="full_recompute", batch=2)]


def test_four_ranks_pipelines_with_tp_dp_and_ep_match_the_single_process():
    results = spawn(rank_cases, 4, FOUR, timeout=240)
    for i, case in enumerate(FOUR):
        pol, dp = case.get("pol", "store_all"), case["lay"].get("dp", 1)
        with time_limit(60):
            loss, want, _ = reference(case["name"], pol, 0, case.get("batch", BATCH) * dp)
        got = [r[i] for r in results]
        assert all(abs(r["loss"] - loss) <= TOL * abs(loss) for r in got), (case, [r["loss"] for r in got], loss)
        err, name = max_rel_error(got[0]["grads"], want)
        assert err <= TOL, (case, name, err)
        assert sorted(r["modules"] for r in got) == [0, 0] + [MODELS[case["name"]].mtp_layers] * 2, case


def test_the_single_process_matches_the_autograd_reference_for_the_pipeline_models():
    """The single-process runs the pipelines are compared with, against the autograd reference
    (`tests.test_exec_mtp.reference_loss`) on the 4-sequence batch: the comparison above is a check of the math."""
    from tests.exec_helpers import executor_grads

    for name in ("rms-untied-4l-d2", "moe-tied-d1"):
        with time_limit(60):
            loss, grads, ex = executor_grads(plan_for(MODELS[name], batch=BATCH), dtype="fp64")
            want_loss, want = reference_grads(ex)
        assert abs(loss - want_loss) <= 1e-9 * abs(want_loss), (name, loss, want_loss)
        assert max_rel_error(grads, want)[0] <= 1e-9, name


def test_full_recompute_reruns_the_modules_on_the_last_rank(results):
    for i, case in enumerate(CASES):
        rec = [r[i]["recomputes"] for r in results]
        if case.get("pol") in ("full_recompute", "checkpoint_offload"):
            assert rec[0] == 0 and rec[1] > 0, (case, rec)
        else:
            assert rec == [0, 0], (case, rec)


def test_the_estimate_holds_the_activation_buffers_each_rank_allocates(results):
    """The memory estimate's buffers term covers the buffers each rank allocates (the rank's shared blocks and each
    instance's own), the modules' own recompute instances on a rank whose last chunk holds no layer included (an
    upper bound there: one per slot); a last rank of the modules and the loss alone, whose estimate said 0, holds
    exactly what it estimates."""
    for i, case in enumerate(CASES):
        for r in results:
            assert r[i]["buffers_estimated"] >= r[i]["buffers_held"], (case, r[i]["buffers_estimated"],
                                                                        r[i]["buffers_held"])
        if case["lay"].get("chunk_layers") == (2, 0) and case.get("pol") != "store_all":
            assert results[1][i]["buffers_estimated"] == results[1][i]["buffers_held"] > 0, case


def test_full_recompute_equals_store_all(results):
    """The modules checkpointed (full recompute) and kept (store all): the same loss and gradients."""
    pairs = [(0, 3), (2, 5), (7, 8), (9, 10)]  # (store all, full recompute) of one model, layout and batch
    for a, b in pairs:
        assert all(CASES[a].get(k) == CASES[b].get(k) for k in ("name", "lay", "batch"))
        ra, rb = results[0][a], results[0][b]
        assert abs(ra["loss"] - rb["loss"]) <= TOL * abs(ra["loss"])
        err, name = max_rel_error(rb["grads"], ra["grads"])
        assert err <= TOL, (CASES[b], name, err)


def test_the_last_ranks_model_states_hold_the_modules(results):
    """fp64: weights, gradients and AdamW's two moments of the modules' parameters on the last rank only (the
    embedding is on every rank, an even split gives both ranks the same layers)."""
    for i, case in enumerate(CASES):
        if case["name"] not in ("dense-tied-d2", "rms-untied-d1") or "chunk_layers" in case["lay"]:
            continue  # (an uneven split's ranks hold other layers)
        first, last = results[0][i], results[1][i]
        assert first["module_params"] == 0 and last["module_params"] == MODELS[case["name"]].mtp_params()
        assert last["states"] - first["states"] == last["module_params"] * 8 * 4, case


# ------------------------------------------------------------------------------- the plans memo-exec runs
def test_executor_scope_accepts_pipelines_with_modules_and_refuses_the_rest_in_one_line():
    from memo_sim.plan.executor_scope import plan_why_not
    from memo_sim.policy import get_policy

    store = get_policy("store_all")
    for name in ("dense-tied-d2", "rms-untied-d1", "moe-tied-d1"):
        assert plan_why_not(MODELS[name], Layout(pp=2), store, "1f1b", BATCH, MICRO, 32) is None, name
    assert plan_why_not(MODELS["dense-tied-4l-d2"], Layout(pp=2, vpp=2), store, "interleaved_1f1b", BATCH, MICRO,
                        32) is None
    assert plan_why_not(MODELS["dense-tied-d2"], Layout(pp=2, tp=2, dp=2), store, "1f1b", BATCH, MICRO, 32) is None
    sppo = plan_why_not(DENSE, Layout(pp=2), get_policy("sppo"), "sppo", BATCH, MICRO, 32)
    assert sppo.startswith("plan model mtp-dense: mtp_layers = 2 under schedule sppo") and "\n" not in sppo, sppo
    assert "--mtp-layers 0" in sppo, sppo
    metp = plan_why_not(DENSE, Layout(pp=2, tp=2, tp_mode="metp_ffn"), store, "1f1b", BATCH, MICRO, 32)
    assert metp.startswith("plan model mtp-dense: mtp_layers = 2 with tp_mode metp_ffn") and "\n" not in metp, metp


def test_memo_exec_accepts_a_pipeline_plan_with_modules():
    from memo_exec.runner import run_model

    assert run_model(pipe_plan("dense-tied-d2", ONE_F), RunOptions(device="cpu")).mtp_layers == 2


def test_two_micro_batches_in_flight_on_the_last_chunk_take_two_module_runs():
    """Interleaved with m = pp: the last rank's warm-up, (v - 1) x pp chunk forwards, runs its first chunk only
    (Megatron-LM since 4295be1a6c, torch's ScheduleInterleaved1F1B), so each micro-batch's last-chunk forward is
    followed by its backward: one module run in flight on the last chunk there; a rank with more micro-batches in
    flight on its last chunk keeps a `memo_exec.mtp.MTPRun` per activation slot (module docs). Before the warm-up
    rule changed, m = pp ran every forward first and both were in flight."""
    from memo_exec.pipeline.order import stage_order

    order = stage_order("interleaved_1f1b", 2, 2, 2, 1)
    fwd = [i for i, a in enumerate(order) if a.chunk == 1 and a.kind == "fwd"]
    bwd = [i for i, a in enumerate(order) if a.chunk == 1 and a.kind == "bwd"]
    assert len(fwd) == len(bwd) == 2 and fwd[0] < bwd[0] < fwd[1] < bwd[1]
