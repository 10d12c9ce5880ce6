"""Ulysses over more ranks than K/V heads (`memo_sim.layout.kv_heads`): the executor repeats each K/V
head r = tp·u / n_kv times before the all-to-all and sums the repeats' gradients after it. On gloo
(CPU, fp64), loss and every parameter gradient against the single-process run of the same batch,
1e-5 relative, for GQA (2 K/V heads, 4 query heads) and MQA (1 K/V head) models."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memo_exec.device import DeviceSpec  # noqa: E402
from memo_exec.distributed.attention import repeat_kv_heads, sum_kv_repeats  # noqa: E402
from memo_exec.distributed.context import build_context  # noqa: E402
from memo_sim.plan.executor_scope import split_why_not  # noqa: E402
from memo_exec.distributed.runner import DistExecutor  # noqa: E402
from memo_exec.runner import RunOptions  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from tests.dist_cases import plan_for, reference  # noqa: E402
from tests.dist_harness import spawn  # noqa: E402
from tests.exec_helpers import max_rel_error, time_limit  # noqa: E402

TOL = 1e-5
SEQ = 64
SHAPE = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 96, "dtype": "fp32"}
GQA = ModelConfig("gqa-kv2", **SHAPE, kv_heads=2, ffn_type="swiglu", norm="rmsnorm", bias="none",
                  tied_embeddings=False)
MQA = ModelConfig("mqa-kv1", **SHAPE, kv_heads=1, bias="qkv")
MODELS = {"gqa": GQA, "mqa": MQA}
# (model, layout, policy): r = 2 (ulysses 4 over 2 K/V heads; TP 2 leaving one K/V head per TP rank under
# ulysses 2), r = 4 (MQA, ulysses 4) and r = 2 with ring CP carrying the repeated heads (MQA, ulysses 2 x cp 2)
# and XTuner 2024's rule (``ulysses_kv: query_heads``): MQA at ulysses 2 x cp 2, the K/V head repeated to the
# 4 query heads (r = 4, where the minimal rule repeats it twice), the ring carrying the repeats
CASES = [("gqa", {"ulysses": 4}, "store_all"), ("gqa", {"tp": 2, "ulysses": 2}, "full_recompute"),
         ("mqa", {"ulysses": 4}, "memo"), ("mqa", {"ulysses": 2, "cp": 2}, "store_all"),
         ("mqa", {"ulysses": 2, "cp": 2, "ulysses_kv": "query_heads"}, "full_recompute")]


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(600):
        yield


def rank_kv_repeat_cases(rank: int, world: int, cases) -> list:
    out = []
    for arch, lay_kw, pol in cases:
        lay = Layout(**lay_kw)
        plan = plan_for(lay, SEQ, pol, model=MODELS[arch], chunk=48)
        ctx = build_context(lay, torch.device("cpu"))
        ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=1), ctx, DeviceSpec("cpu"))
        ex.allocate()
        rec = ex.step(0, optimizer=False)
        grads = ex.full_gradients()
        r = ex.backend.r
        ex.close()
        out.append((rec.loss, grads if rank == 0 else None, r))
    return out


def test_repeat_order_and_its_gradient():
    """Head i becomes heads i·r .. i·r + r - 1 (query head j meets K/V head j // (heads / n_kv) after
    the head scatter); the gradient sums each head's repeats."""
    t = torch.arange(2 * 3 * 2, dtype=torch.float64).view(2, 6)  # 2 tokens, 3 heads of 2
    rep = repeat_kv_heads(t, 3, 2)
    assert torch.equal(rep.view(2, 6, 2), t.view(2, 3, 2)[:, [0, 0, 1, 1, 2, 2]])
    g = torch.randn(2, 12, dtype=torch.float64)
    out = torch.empty(2, 6, dtype=torch.float64)
    sum_kv_repeats(g, out, 3, 2)
    x = t.clone().requires_grad_(True)
    repeat_kv_heads(x, 3, 2).backward(g)
    assert torch.allclose(out, x.grad)
    assert repeat_kv_heads(t, 3, 1) is t


def test_executor_refuses_kv_heads_neither_dividing_nor_multiple():
    m = ModelConfig("kv2-h6", 2, 96, 6, 128, vocab=96, kv_heads=2, dtype="fp32")
    why = split_why_not(Layout(ulysses=3), m, 1, 96)
    assert why is not None and "\n" not in why and "kv heads (2)" in why and "(3)" in why


def test_four_ranks_ulysses_over_repeated_kv_heads_match_single_process():
    results = spawn(rank_kv_repeat_cases, 4, CASES, timeout=600)
    for i, (arch, lay_kw, pol) in enumerate(CASES):
        lay = Layout(**lay_kw)
        m = MODELS[arch]
        assert results[0][i][2] == lay.kv_repeat(m.n_kv_heads, m.heads) > 1  # K/V heads really repeated
        ref_loss, ref_grads, _ = reference(SEQ, pol, 1, model=MODELS[arch])
        what = (arch, lay_kw, pol)
        assert all(abs(r[i][0] - ref_loss) <= TOL * abs(ref_loss) for r in results), (what, ref_loss)
        err, worst = max_rel_error(results[0][i][1], ref_grads)
        assert err <= TOL, (what, worst, err)
