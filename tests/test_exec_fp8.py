"""FP8 GEMMs in the executor (`memo_exec.gemm_formats`): the ``fp8-tensorwise`` format as torchao's Float8Linear
runs it (E4M3 activations and weights, E5M2 output gradients, one scale per tensor from its amax,
``torch._scaled_mm``), which the simulator prices for torchtitan's and memo's own FP8 plans.

- each of a linear's three GEMMs equals the cast-then-multiply math (`tests.exec_reference.Fp8Linear`), with the
  casts each GEMM must make (E4M3 forward operands, E5M2 gradients);
- a weight's FP8 copies are cast once and again only after the weight changes;
- every activation policy gives store-all's gradients exactly: MEMO's token-wise recompute casts the rebuilt rows
  with the forward's scales (their own amax would give other values: 8.5% off store-all before it did);
- the whole model is within FP8's own noise of the autograd reference with the same casts (FP8 amplifies the
  executor's fp32 accumulation inside ``_scaled_mm`` -- 1e-7 -- into flipped E5M2 elements, 25% each, so the
  two agree on the loss but only to FP8's noise on gradients);
- the weights' FP8 copies follow every optimizer step (one process, TP and DP on gloo: equal to casting every
  weight at every use; each TP rank casts its own weight shard with its own scale);
- each GEMM of every layer casts its operands (counted: E4M3 forward, E5M2 gradients);
- what it does not run is refused in one line.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import memo_exec.gemm_formats as G
from memo_exec.errors import ExecError
from memo_exec.runner import RunOptions, run_model
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy
from tests.exec_helpers import executor_grads, make_plan, max_rel_error, reference_grads, time_limit
from tests.exec_reference import Fp8Linear

torch.set_num_threads(1)

PLAIN = ModelConfig("fp8-small", 4, 256, 8, 512, vocab=512, kv_heads=4, norm="rmsnorm", ffn_type="swiglu",
                    bias="none", tied_embeddings=False, dtype="fp32")
FP8 = dataclasses.replace(PLAIN, gemm_format="fp8-tensorwise")
SEQ = 512


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(240):
        yield


def test_each_gemm_is_the_cast_math_with_the_casts_of_its_operands(monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(48, 32, generator=g, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(64, 48, generator=g, dtype=torch.float64)
    Fp8Linear.apply(x, w).backward(dy)
    casts = []
    real = G.quantize
    monkeypatch.setattr(G, "quantize",
                        lambda t, dt, scale=None: casts.append((tuple(t.shape), dt)) or real(t, dt, scale))
    gemm = G.Fp8TensorwiseGemm()
    wd = w.detach()  # one tensor, as a layer passes its parameter to each GEMM
    y = torch.empty(64, 48, dtype=torch.float64)
    gemm.forward(x.detach(), wd, y)
    assert casts == [((64, 32), G.E4M3), ((48, 32), G.E4M3)]  # the input, then the weight (kept)
    dx = torch.empty(64, 32, dtype=torch.float64)
    gemm.dgrad(dy, wd, dx)
    gw = torch.zeros(48, 32, dtype=torch.float64)
    gemm.wgrad(dy, x.detach(), gw)
    assert casts[2:] == [((64, 48), G.E5M2), ((48, 64), G.E5M2), ((32, 64), G.E4M3)]  # no weight cast again
    want = (Fp8Linear.apply(x.detach(), w.detach()), x.grad, w.grad)
    for got, ref in zip((y, dx, gw), want):
        assert float((got - ref).norm() / ref.norm()) < 1e-6  # _scaled_mm accumulates in fp32


def test_a_weights_copies_are_cast_again_only_after_it_changes(monkeypatch):
    casts = []
    real = G.quantize
    monkeypatch.setattr(G, "quantize", lambda t, dt, scale=None: casts.append(tuple(t.shape)) or real(t, dt, scale))
    gemm = G.Fp8TensorwiseGemm()
    w = torch.nn.Parameter(torch.randn(48, 32))
    x, out = torch.randn(8, 32), torch.empty(8, 48)
    for _ in range(3):
        gemm.forward(x, w, out)
    assert casts.count((48, 32)) == 1
    with torch.no_grad():
        w.add_(1.0)  # an optimizer step
    gemm.forward(x, w, out)
    assert casts.count((48, 32)) == 2
    gemm.forward(x, w[:16], torch.empty(8, 16))  # a row block (the fused QKV's q rows) has its own copies
    assert casts.count((16, 32)) == 1


POLICIES = [("store_all", None), ("full_recompute", None), ("selective_recompute", None), ("full_offload", None),
            ("checkpoint_offload", None), ("memo", 0.3), ("memo", 0.0)]


@pytest.fixture(scope="module")
def store_all():
    return executor_grads(make_plan(FP8, SEQ, get_policy("store_all")))


@pytest.mark.parametrize("name,alpha", POLICIES[1:], ids=[f"{n}{'' if a is None else a}" for n, a in POLICIES[1:]])
def test_every_policy_gives_store_alls_gradients_exactly(name, alpha, store_all):
    loss0, grads0, _ = store_all
    loss, grads, _ = executor_grads(make_plan(FP8, SEQ, get_policy(name, alpha)))
    assert loss == loss0
    err, worst = max_rel_error(grads, grads0)
    assert err == 0.0, f"{name}: {worst} off by {err:.2e}"


def test_the_model_is_within_fp8_noise_of_the_reference_with_the_same_casts(store_all):
    loss, grads, ex = store_all
    ref_loss, ref_grads = reference_grads(ex)  # RefGPT: every linear an Fp8Linear (the plan's format)
    plain_loss, _, _ = executor_grads(make_plan(PLAIN, SEQ, get_policy("store_all")))
    tol = 1e-4 * abs(ref_loss)  # "the same loss": the executor and the reference differ by FP8's flipped elements
    assert abs(loss - ref_loss) <= tol
    # the casts are there: FP8 moves the loss by more than the tolerance that calls two losses the same. It was
    # "more than 10 x the executor's gap to the reference", which the CPU sets: on the AMD EPYC VM of 2026-12-02 the
    # gap was 2.6e-4 and FP8's move 1.6e-3 (6x), on the earlier VM under a tenth of it (the same code: 256d0f6)
    assert abs(loss - plain_loss) > tol
    err, worst = max_rel_error(grads, ref_grads)
    assert err < 0.25, f"{worst}: {err:.3f}"


REFUSED = [
    ("mxfp8", dict(model=dataclasses.replace(PLAIN, gemm_format="mxfp8"))),
    ("ZeRO 3 / FSDP", dict(layout=Layout(dp=2, zero=3), gpus=2)),
    ("a rank's token rows 520 not a multiple of 16", dict(seq_tokens=520)),
    ("ffn / tp 520 not a multiple of 16", dict(model=dataclasses.replace(FP8, ffn=520))),
    ("fp8_saved_inputs", dict(model=dataclasses.replace(FP8, fp8_saved_inputs=True))),
    ("MoE experts", dict(model=dataclasses.replace(FP8, experts=4, top_k=2))),
    ("tp_mode metp_ffn", dict(layout=Layout(tp=2, sp=True, tp_mode="metp_ffn"), gpus=2)),
    ("SPPO's pieces", dict(layout=Layout(pp=2), gpus=2, schedule="sppo")),
]


@pytest.mark.parametrize("needle,change", REFUSED, ids=[r[0] for r in REFUSED])
def test_what_the_executor_does_not_run_in_fp8_is_refused_in_one_line(needle, change):
    plan = dataclasses.replace(make_plan(FP8, SEQ, get_policy("store_all")), **change)
    with pytest.raises(ExecError, match=needle) as e:
        run_model(plan, RunOptions(device="cpu"))
    assert "\n" not in str(e.value)


def _uncached(monkeypatch=None):
    """Every weight cast again at every use: what the cache must equal."""
    def fresh(self, w):
        q, s = G.quantize(w, G.E4M3)
        return q, q.t().contiguous(), s
    if monkeypatch is not None:
        monkeypatch.setattr(G.Fp8TensorwiseGemm, "_weight", fresh)
    else:
        G.Fp8TensorwiseGemm._weight = fresh


def _steps(ex, n: int) -> list[float]:
    ex.allocate()
    try:
        return [ex.step(k).loss for k in range(n)]
    finally:
        ex.close()


def _tp_rank(rank: int, world: int, layout: dict) -> list[list[float]]:
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor

    lay = Layout(**layout)
    plan = make_plan(FP8, SEQ, get_policy("memo", 0.5), chunk=256)
    plan.layout, plan.gpus = lay, lay.gpus

    def run():
        return _steps(DistExecutor(plan, RunOptions(device="cpu", dtype="fp32", steps=3),
                                   build_context(lay, torch.device("cpu")), DeviceSpec("cpu")), 3)
    cached = run()
    _uncached()  # a spawned rank: the patch dies with it
    return [cached, run()]


@pytest.mark.parametrize("layout", [dict(tp=2, sp=True), dict(dp=2, zero=1)], ids=["tp2-sp", "dp2-z1"])
def test_distributed_fp8_steps_cast_the_updated_weights(layout):
    """The distributed executor's parameters are views on flat buffers the optimizer and the all-gathers write, which
    no parameter's version counter sees: the FP8 copies are cast again after each optimizer step, so three steps
    equal a run that casts every weight at every use (the cache kept step 0's weights before: 1.2e-3 off at step 2).
    Under TP each rank casts its own weight shard with its own scale."""
    from tests.dist_harness import spawn

    results = spawn(_tp_rank, 2, layout, timeout=300)
    cached, fresh = results[0]
    assert cached == fresh and results[1][0] == cached, results
    assert len(set(cached)) == 3  # the weights moved


def test_single_process_fp8_steps_cast_the_updated_weights(monkeypatch):
    """The fused AdamW updates an fp32 weight through a detached alias without bumping its version: the cache now
    follows the optimizer's steps (three fp32 steps equal the uncached run's)."""
    from memo_exec.runner import Executor

    def run():
        ex = Executor(make_plan(FP8, SEQ, get_policy("memo", 0.3)), RunOptions(device="cpu", dtype="fp32", steps=3))
        try:
            return [s["loss"] for s in ex.run().summaries]
        finally:
            ex.close()
    cached = run()
    _uncached(monkeypatch)
    assert cached == run() and len(set(cached)) == 3


def test_each_gemm_of_every_layer_casts_its_operands(monkeypatch):
    """Per layer, forward: the four GEMM inputs cast to E4M3 once each (the fused QKV's one cast for its three);
    backward: every output gradient cast to E5M2 twice (data and weight gradients: fc2, fc1, out_proj and each of
    q, k, v) and each weight gradient's input to E4M3 again (four). A backward GEMM left in the model dtype, or a
    gradient cast to E4M3, changes the counts."""
    casts = []
    real = G.quantize

    def count(t, dt, scale=None):
        casts.append(dt)
        return real(t, dt, scale)
    monkeypatch.setattr(G, "quantize", count)
    executor_grads(make_plan(FP8, SEQ, get_policy("store_all")))
    weights = 6 * FP8.layers  # q, k, v, o, fc1, fc2: cast once (cached)
    assert casts.count(G.E5M2) == 12 * FP8.layers
    assert casts.count(G.E4M3) == 8 * FP8.layers + weights


def test_the_memory_estimate_counts_the_weights_fp8_copies_as_the_simulator_does():
    from memo_exec.runner import Executor
    from memo_sim.cost.gemm_format import weight_cache_bytes

    states = {}
    for m in (PLAIN, FP8):
        ex = Executor(make_plan(m, SEQ, get_policy("store_all")), RunOptions(device="cpu", steps=1))
        states[m.gemm_format] = ex.estimate.terms["model_states"]
        ex.close()
    assert states["fp8-tensorwise"] - states["bf16"] == weight_cache_bytes(FP8, FP8.layers, Layout())


def _estimated_states(rank: int, world: int, layout: dict) -> list[int]:
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor

    lay = Layout(**layout)
    out = []
    for m in (PLAIN, FP8):
        plan = make_plan(m, SEQ, get_policy("store_all"))
        plan.layout, plan.gpus = lay, lay.gpus
        ex = DistExecutor(plan, RunOptions(device="cpu", steps=1), build_context(lay, torch.device("cpu")),
                          DeviceSpec("cpu"))
        out.append(ex.estimate.terms["model_states"])
        ex.close()
    return out


def test_the_distributed_estimate_counts_each_ranks_fp8_copies_as_the_simulator_does():
    """The distributed executor's estimate (the device-fit check of every `--nproc` run) left the FP8 weight copies
    out: 10% of a small plan's model states under `--nproc 1` (a review). Each rank's copies of its TP shard, as the
    simulator prices them per GPU."""
    from memo_sim.cost.gemm_format import weight_cache_bytes
    from tests.dist_harness import spawn

    for layout in (dict(tp=2, sp=True), dict(dp=2, zero=1)):
        plain, fp8 = spawn(_estimated_states, 2, layout, timeout=300)[0]
        assert fp8 - plain == weight_cache_bytes(FP8, FP8.layers, Layout(**layout)), layout


def test_the_contract_names_the_formats_the_executor_runs():
    """memo-sim's what-if says when memo-exec refuses its answer from `memo_sim.plan.executor_scope` (no torch there):
    the formats it names are the executor's GEMM classes, and a refused plan's line is the one run_model raises."""
    from memo_sim.plan.executor_scope import EXEC_GEMM_FORMATS, plan_why_not

    assert tuple(G.GEMMS) == EXEC_GEMM_FORMATS
    plan = dataclasses.replace(make_plan(FP8, SEQ, get_policy("store_all")), seq_tokens=520)
    why = plan_why_not(plan.model, plan.layout, plan.policy, plan.schedule, plan.batch, plan.batch, plan.seq_tokens)
    with pytest.raises(ExecError) as e:
        run_model(plan, RunOptions(device="cpu"))
    assert why and str(e.value) == why
