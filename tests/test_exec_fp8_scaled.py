"""Row- and block-scaled FP8 GEMMs in the executor (`memo_exec.gemm_scaled`): ``fp8-rowwise`` (torchao's rowwise
recipe) and ``fp8-blockwise`` (TransformerEngine's Float8BlockScaling), which the simulator prices on the Hopper
profiles' measured curves (reports/gpu-h200-2026-12-04.md).

- each block's scale is its own amax over E4M3's largest value, rounded up to a power of two, and one outlier moves
  only its own block's scale (the point of block scaling): checked against a plain loop over the blocks;
- each of a linear's three GEMMs is the product of its operands cast along that GEMM's reduction (the weight by rows
  for the forward and along its output width for the data gradient; the output gradient and the input along the
  tokens for the weight gradient), E4M3 throughout: checked against the loop's casts in fp64;
- a weight's two copies are cast once and again only after the weights change;
- every activation policy gives store-all's gradients exactly (a rebuilt row casts as the forward cast it, without
  the forward's scales), and the model stays within FP8's noise of the unquantised one;
- the block-scaled format is refused in one line where a reduction is not whole 128-element tiles;
- on CUDA (GPU-marked), ``torch._scaled_mm`` with the scale layouts the executor passes gives the CPU path's product
  (the model on CUDA with every policy: `tests/test_exec_gpu.py`).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import memo_exec.gemm_formats as G
import memo_exec.gemm_scaled as S
from memo_exec.errors import ExecError
from memo_exec.runner import RunOptions, run_model
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy
from tests.exec_helpers import executor_grads, make_plan, max_rel_error, time_limit

torch.set_num_threads(1)

FORMATS = ("fp8-rowwise", "fp8-blockwise")
PLAIN = ModelConfig("fp8s-small", 4, 256, 8, 512, vocab=512, kv_heads=4, norm="rmsnorm", ffn_type="swiglu",
                    bias="none", tied_embeddings=False, dtype="fp32")
SEQ = 256
TOP = torch.finfo(torch.float8_e4m3fn).max


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(300):
        yield


def _loop_cast(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``t`` cast to E4M3 block by block and taken back to fp64: each block by its own power-of-two scale."""
    out = torch.empty_like(t, dtype=torch.float64)
    for i in range(0, t.shape[0], rows):
        for j in range(0, t.shape[1], cols):
            blk = t[i:i + rows, j:j + cols].double()
            amax = max(float(blk.abs().max()), 1e-12)
            scale = 2.0 ** math.ceil(math.log2(amax / TOP))
            out[i:i + rows, j:j + cols] = (blk / scale).float().to(torch.float8_e4m3fn).double() * scale
    return out


def _tiles(name: str, width: int) -> int:
    return width if name == "fp8-rowwise" else 128


def test_block_scales_are_their_own_blocks_powers_of_two():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(256, 384, generator=g)
    t[3, 200] = 1e4  # one outlier: its own 1 x 128 tile (row 3, columns 128-255) alone
    q, s = S.quantize_blocks(t, 1, 128)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (256, 3)
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)  # powers of two
    assert float(s[3, 1]) >= 1e4 / TOP and float(s[3, 0]) < 1.0 and float(s[4, 1]) < 1.0
    assert torch.equal(q.double() * S.expand_scales(s, (256, 384)).double(), _loop_cast(t, 1, 128))
    q, s = S.quantize_blocks(t, 128, 128)  # weights: 128 x 128 blocks
    assert s.shape == (2, 3) and torch.equal(q.double() * S.expand_scales(s, (256, 384)).double(),
                                             _loop_cast(t, 128, 128))


@pytest.mark.parametrize("name", FORMATS)
def test_each_gemm_casts_along_its_own_reduction(name, monkeypatch):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 384, generator=g, dtype=torch.float64)
    w = torch.randn(512, 384, generator=g, dtype=torch.float64)
    dy = torch.randn(256, 512, generator=g, dtype=torch.float64)
    casts = []
    real = S.quantize_blocks
    monkeypatch.setattr(S, "quantize_blocks", lambda t, r, c, dt=G.E4M3: casts.append((tuple(t.shape), r, c, dt))
                        or real(t, r, c, dt))
    gemm = G.layer_gemm(name)
    y, dx, gw = torch.empty(256, 512, dtype=torch.float64), torch.empty(256, 384, dtype=torch.float64), \
        torch.zeros(512, 384, dtype=torch.float64)
    gemm.forward(x, w, y)
    gemm.dgrad(dy, w, dx)
    gemm.wgrad(dy, x, gw)
    t = lambda n: _tiles(name, n)  # noqa: E731
    wb = (1, 384) if name == "fp8-rowwise" else (128, 128)
    want = [((256, 384), 1, t(384)), ((512, 384), *wb)]  # forward: the input by rows, the weight
    if name == "fp8-rowwise":
        want.append(((384, 512), 1, 512))  # the weight's transposed copy, along its output width
    want += [((256, 512), 1, t(512)), ((512, 256), 1, t(256)), ((384, 256), 1, t(256))]  # dy; dy^T, x^T by tokens
    assert [c[:3] for c in casts] == want and {c[3] for c in casts} == {G.E4M3}
    wf = _loop_cast(w, *wb)
    wt = _loop_cast(w.t().contiguous(), 1, 512).t() if name == "fp8-rowwise" else wf
    refs = (_loop_cast(x, 1, t(384)) @ wf.t(), _loop_cast(dy, 1, t(512)) @ wt,
            _loop_cast(dy.t().contiguous(), 1, t(256)) @ _loop_cast(x.t().contiguous(), 1, t(256)).t())
    for got, ref in zip((y, dx, gw), refs):
        assert float((got - ref).norm() / ref.norm()) < 1e-6  # the fp32 products of exact fp32 values
    assert float((y - x @ w.t()).norm() / (x @ w.t()).norm()) > 1e-3  # the casts are there


@pytest.mark.parametrize("name", FORMATS)
def test_a_weights_copies_are_cast_again_only_after_the_weights_change(name, monkeypatch):
    casts = []
    real = S.quantize_blocks
    monkeypatch.setattr(S, "quantize_blocks", lambda t, r, c, dt=G.E4M3: casts.append(tuple(t.shape)) or
                        real(t, r, c, dt))
    gemm = G.layer_gemm(name)
    w = torch.nn.Parameter(torch.randn(256, 128))
    x, out = torch.randn(16, 128), torch.empty(16, 256)
    for _ in range(3):
        gemm.forward(x, w, out)
    assert casts.count((256, 128)) == 1
    G.weights_changed()  # an optimizer step
    gemm.forward(x, w, out)
    assert casts.count((256, 128)) == 2


@pytest.fixture(scope="module")
def store_alls():
    return {n: executor_grads(make_plan(dataclasses.replace(PLAIN, gemm_format=n), SEQ, get_policy("store_all")))
            for n in FORMATS}


@pytest.mark.parametrize("policy,alpha", [("full_recompute", None), ("memo", 0.3), ("selective_recompute", None)])
@pytest.mark.parametrize("name", FORMATS)
def test_every_policy_gives_store_alls_gradients_exactly(name, policy, alpha, store_alls):
    loss0, grads0, _ = store_alls[name]
    m = dataclasses.replace(PLAIN, gemm_format=name)
    loss, grads, _ = executor_grads(make_plan(m, SEQ, get_policy(policy, alpha)))
    assert loss == loss0
    err, worst = max_rel_error(grads, grads0)
    assert err == 0.0, f"{name} {policy}: {worst} off by {err:.2e}"


@pytest.mark.parametrize("name", FORMATS)
def test_the_model_stays_within_fp8_noise_of_the_unquantised_one(name, store_alls):
    loss, grads, _ = store_alls[name]
    plain_loss, plain_grads, _ = executor_grads(make_plan(PLAIN, SEQ, get_policy("store_all")))
    assert loss != plain_loss and abs(loss - plain_loss) < 1e-2 * abs(plain_loss)
    err, worst = max_rel_error(grads, plain_grads)
    assert err < 0.25, f"{worst}: {err:.3f}"


def _block_tp_rank(rank: int, world: int) -> list[float]:
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor
    from memo_sim.layout.parallel import Layout

    lay = Layout(tp=2, sp=True)
    plan = make_plan(dataclasses.replace(TILED, gemm_format="fp8-blockwise"), SEQ, get_policy("memo", 0.5), chunk=128)
    plan.layout, plan.gpus = lay, lay.gpus
    ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp32", steps=2), build_context(lay, torch.device("cpu")),
                      DeviceSpec("cpu"))
    ex.allocate()
    try:
        return [ex.step(k).loss for k in range(2)]
    finally:
        ex.close()


# every TP shard whole 128-element tiles: the queries', the K/V and the FFN widths over TP 2
TILED = dataclasses.replace(PLAIN, kv_heads=8)


def test_block_scaling_under_tp_is_the_single_process_run():
    """Under TP 2 each rank casts its own weight shard and its own activations' tiles: where every shard is whole
    128-element tiles (the column-parallel weights' 128-row blocks, the row-parallel inputs' 1 x 128 tiles) the
    blocks are the single process's, so the first step's loss is the single process's (on this VM to the bit; the
    tensorwise format's per-shard scales moved it by 3e-4). The second follows it to FP8's noise: the first
    backward's TP reductions sum in another order (plain fp32 runs agree to 4e-8 there), and a last-bit difference
    flips an E4M3 rounding (6%) wherever it falls (2e-4 on this VM)."""
    from memo_exec.runner import Executor
    from tests.dist_harness import spawn

    m = dataclasses.replace(TILED, gemm_format="fp8-blockwise")
    ex = Executor(make_plan(m, SEQ, get_policy("memo", 0.5), chunk=128), RunOptions(device="cpu", dtype="fp32",
                                                                                     steps=2))
    try:
        single = [s["loss"] for s in ex.run().summaries]
    finally:
        ex.close()
    ranks = spawn(_block_tp_rank, 2, timeout=300)
    assert ranks[0] == ranks[1] and len(set(single)) == 2
    assert ranks[0][0] == pytest.approx(single[0], rel=1e-6)
    assert ranks[0][1] == pytest.approx(single[1], rel=1e-3)


def test_block_scaling_is_refused_where_a_reduction_is_not_whole_tiles():
    m = dataclasses.replace(PLAIN, gemm_format="fp8-blockwise", ffn=528)  # 16 x 33: not whole 128-element tiles
    with pytest.raises(ExecError, match="ffn / tp 528 not a multiple of 128") as e:
        run_model(make_plan(m, SEQ, get_policy("store_all")), RunOptions(device="cpu"))
    assert "\n" not in str(e.value)
    m = dataclasses.replace(PLAIN, gemm_format="fp8-rowwise", ffn=528)  # row-wise: CUDA's 16-multiples only
    assert run_model(make_plan(m, SEQ, get_policy("store_all")), RunOptions(device="cpu", steps=1)) is not None


cuda_fp8 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                              reason="row- and block-scaled FP8 GEMMs need a Hopper or newer GPU")


@pytest.mark.gpu
@cuda_fp8
@pytest.mark.parametrize("name", FORMATS)
def test_cuda_scaled_mm_takes_the_executors_scale_layouts(name):
    """torch._scaled_mm with the scales as the executor lays them out gives the CPU path's product of the same
    casts (bf16 output: to bf16's rounding), for each of the three GEMMs."""
    g = torch.Generator().manual_seed(2)
    x, w, dy = (torch.randn(*s, generator=g) for s in ((512, 384), (256, 384), (512, 256)))
    outs = {}
    for dev in ("cpu", "cuda"):
        gemm = G.layer_gemm(name)
        xd, wd, dyd = (t.to(dev, torch.bfloat16) for t in (x, w, dy))
        y, dx = torch.empty(512, 256, device=dev, dtype=torch.bfloat16), torch.empty(512, 384, device=dev,
                                                                                       dtype=torch.bfloat16)
        gw = torch.zeros(256, 384, device=dev, dtype=torch.float32)
        gemm.forward(xd, wd, y)
        gemm.dgrad(dyd, wd, dx)
        gemm.wgrad(dyd, xd, gw)
        outs[dev] = [t.float().cpu() for t in (y, dx, gw)]
    for c, d in zip(outs["cpu"], outs["cuda"]):
        assert float((c - d).norm() / c.norm()) < 1e-2
