"""Qwen3's attention in the executor: a head size other than hidden / heads (``head_dim``) and QK norms
(an RMSNorm over each query and key head, `memo_exec.layer.head_rms_norm`).

Every activation policy's loss and gradients against the plain-autograd reference (its norms as
transformers' Qwen3Attention applies them) with norm weights drawn away from one; a plan placed on
the simulator's traces (which now name the normalised queries and keys) places them; on gloo, TP (with
and without sequence parallelism: each rank's QK-norm gradient sums its own heads only), ring CP,
Ulysses and METP's FFN ring (metp_ffn) match the single-process run (SPPO's pieces in one process:
tests/test_sppo_exec.py); full METP, whose head-group rings run heads of hidden / heads without norms,
refuses them in one line.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from memo_exec.errors import ExecError
from memo_exec.layer import LayerWeights
from memo_exec.runner import RunOptions
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy
from tests.exec_helpers import (bf16_within_autograd_noise, executor_grads, make_plan, max_rel_error,
                                reference_grads, time_limit)

torch.set_num_threads(1)

# Qwen3's shape in small: GQA, RMSNorm, SwiGLU, no biases, heads of 32 where hidden / heads is 16
QWEN = ModelConfig("qwen3-small", 4, 128, 8, 384, vocab=512, kv_heads=4, head_dim=32, qk_norm=True, norm="rmsnorm",
                   ffn_type="swiglu", bias="none", tied_embeddings=False, dtype="fp32")
SEQ = 256
TOL = 1e-10  # fp64


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(240):
        yield


def _norm_weights(ex) -> None:
    """Draw the QK norms' weights away from one (init fills them with ones, under which a forward that
    forgot them would pass)."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for lw in ex.gpt.layers:
            for w in (lw.lnq_w, lw.lnk_w):
                w.copy_(1 + 0.5 * torch.randn(w.shape, generator=g, dtype=torch.float64).to(w.dtype))


def test_layer_weights_have_the_models_parameter_count():
    lw = LayerWeights(QWEN, QWEN.layers, "meta", torch.float32)
    assert sum(p.numel() for p in lw.parameters()) == QWEN.layer_params()
    assert lw.wqkv.shape == (QWEN.q_dim + 2 * QWEN.kv_dim, QWEN.hidden) and QWEN.q_dim == 2 * QWEN.hidden
    assert lw.wo.shape == (QWEN.hidden, QWEN.q_dim) and lw.lnq_w.shape == lw.lnk_w.shape == (32,)


POLICIES = [("store_all", None), ("full_recompute", None), ("selective_recompute", None), ("full_offload", None),
            ("checkpoint_offload", None), ("memo", 0.0), ("memo", 0.3), ("memo", 1.0)]


@pytest.fixture(scope="module")
def reference():
    _, _, ex = executor_grads(make_plan(QWEN, SEQ, get_policy("store_all")), dtype="fp64", setup=_norm_weights)
    return reference_grads(ex)


@pytest.mark.parametrize("name,alpha", POLICIES, ids=[f"{n}{'' if a is None else a}" for n, a in POLICIES])
def test_every_policy_matches_the_autograd_reference(name, alpha, reference):
    ref_loss, ref_grads = reference
    loss, grads, _ = executor_grads(make_plan(QWEN, SEQ, get_policy(name, alpha)), dtype="fp64", setup=_norm_weights)
    assert abs(loss - ref_loss) <= TOL * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= TOL, f"{name}: gradient of {worst} off by {err:.2e}"
    assert float(grads["layers.0.lnq_w"].norm()) > 0 and float(grads["layers.0.lnk_w"].norm()) > 0


def test_bf16_run_is_within_autograd_noise(reference):
    """In bf16 (fp32 statistics and QK-norm temporaries) every gradient, the norms' included, is within the noise
    of bf16 autograd itself against fp32 math (`bf16_within_autograd_noise`)."""
    ref_loss, _ = reference
    loss, grads, ex = executor_grads(make_plan(QWEN, SEQ, get_policy("memo", 0.3)), dtype="bf16", setup=_norm_weights)
    assert abs(loss - ref_loss) <= 2e-2 * abs(ref_loss)
    assert bf16_within_autograd_noise(ex, grads) == []


def test_simulator_plan_places_the_normalised_queries_and_keys(reference):
    from tests.test_exec_memplan import sim_plan

    pol = get_policy("memo", 0.3)
    plan = make_plan(QWEN, SEQ, pol, memory_plan=sim_plan(pol, QWEN, SEQ))
    loss, grads, ex = executor_grads(plan, dtype="fp64", setup=_norm_weights)
    for ph in ("fwd", "bwd"):
        assert {"q_normed", "k_normed"} <= set(ex.arena_plan.offsets[ph]), ph
    assert not {f"{ph}:{n}" for ph in ("fwd", "bwd") for n in ("q_normed", "k_normed")} & ex.scratch.unplanned
    err, worst = max_rel_error(grads, reference[1])
    assert err <= TOL, f"{worst}: {err:.2e}"


# ------------------------------------------------------------------------------- gloo
def _rank_cases(rank: int, world: int, cases, refused) -> list:
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor

    def make(lay_kw, pol, model=QWEN):
        lay = Layout(**lay_kw)
        plan = make_plan(model, SEQ, get_policy(*pol), chunk=256)
        plan.layout, plan.gpus = lay, lay.gpus
        return DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=1),
                            build_context(lay, torch.device("cpu")), DeviceSpec("cpu"))

    out = []
    for lay_kw, pol in cases:
        ex = make(lay_kw, pol)
        ex.allocate()
        _norm_weights(ex)  # the same draw on every rank (the norms are whole on each)
        rec = ex.step(0, optimizer=False)
        grads = ex.full_gradients()
        ex.close()
        out.append((rec.loss, grads if rank == 0 else None))
    for lay_kw, pol, model in refused:
        try:
            make(lay_kw, pol, model).close()
            out.append(None)
        except ExecError as e:
            out.append(str(e))
    return out


TWO = [(dict(tp=2, sp=True), ("memo", 0.5)), (dict(tp=2, sp=False), ("store_all",)), (dict(cp=2), ("memo", 0.5)),
       (dict(ulysses=2), ("full_recompute",)), (dict(tp=2, sp=True, tp_mode="metp_ffn"), ("memo", 0.5))]
# full METP's head-group rings run heads of hidden / heads without norms (`FULL_METP_ARCHITECTURE`); a QKV bias, which
# full METP needs, so that only the attention is refused
FULL_METP = [(dict(tp=2, sp=True, tp_mode="metp"), ("store_all",), dataclasses.replace(QWEN, bias="qkv")),
             (dict(tp=2, sp=True, tp_mode="metp"), ("store_all",),
              dataclasses.replace(QWEN, bias="qkv", qk_norm=False))]


def test_two_ranks_tp_cp_ulysses_metp_ffn_match_single_process_and_full_metp_refuses():
    from tests.dist_harness import spawn

    results = spawn(_rank_cases, 2, TWO, FULL_METP, timeout=400)
    for r in results:
        got = r[len(TWO):]
        assert got[0] is not None and "qk_norm = True" in got[0] and "\n" not in got[0], got
        assert got[1] is not None and "head_dim = 32" in got[1] and "metp_ffn or megatron" in got[1], got
    for i, (lay, pol) in enumerate(TWO):
        ref_loss, ref_grads, _ = executor_grads(make_plan(QWEN, SEQ, get_policy(*pol), chunk=256), dtype="fp64",
                                                setup=_norm_weights)
        losses = [r[i][0] for r in results]
        assert abs(losses[0] - ref_loss) <= 1e-5 * abs(ref_loss), (lay, losses, ref_loss)
        err, name = max_rel_error(results[0][i][1], ref_grads)
        assert err <= 1e-5, (lay, name, err)
