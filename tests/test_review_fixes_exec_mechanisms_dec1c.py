"""Review fixes (2026-12-01): the executor runs the framework mechanisms a plan prices.

- ring CP's dK/dV accumulators travel in the plan's dtype (``Layout.ring_dkv_fp32``: fp32, or the model's as
  TransformerEngine's p2p CP sends them), `memo_exec.distributed.attention.RingAttention`;
- Ulysses' backward keeps the forward's head-sharded q, k, v, out where the plan says so
  (``Layout.ulysses_bwd_resend`` False) and sends dout then dq, dk, dv alone: 4 all-to-alls, not 8;
- full recompute's buffers count a MoE layer's rebuilt block and hold no dense fc1 / act no MoE layer writes
  (`memo_exec.activations.full_recompute.FullRecompute`).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from tests.dist_harness import spawn  # noqa: E402
from tests.exec_reference import causal_gqa_attention  # noqa: E402

B, S, H, HK, D = 2, 32, 4, 2, 8


class _Spans:
    """A timer that records each span's (name, bytes) and runs its body."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def span(self, name, layer, phase, stream=None, nbytes=0):
        import contextlib

        self.seen.append((name, int(nbytes)))
        return contextlib.nullcontext()


def _full(dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, S, h, D, generator=g, dtype=torch.float64).to(dtype) for h in (H, HK, HK, H))


def _reference():
    """Causal GQA attention over the whole sequence by autograd (fp64): out, dq, dk, dv as [B, S, heads, D]."""
    return causal_gqa_attention(*_full(torch.float64))


def _err(results) -> float:
    want = _reference()
    worst = 0.0
    for pos, got in results:
        for g, w in zip(got, want):
            worst = max(worst, float((g.double() - w[:, pos]).norm() / w[:, pos].norm()))
    return worst


# ----------------------------------------------------------------------------------- ring CP dK/dV dtype
def _ring_rank(rank: int, world: int, cases):
    """Per case (dtype, dkv_fp32): this rank's positions, out, dq, dk, dv, the dK/dV shifts' bytes, and the elements
    of one dK or dV block."""
    from memo_exec.attention import AttnDims
    from memo_exec.distributed.attention import RingAttention
    from memo_exec.distributed.context import zigzag_positions

    pos = zigzag_positions(S, world, rank)
    s = pos.numel()
    res = []
    for dtype, dkv_fp32 in cases:
        q, k, v, do = (t[:, pos].reshape(B * s, -1).contiguous() for t in _full(dtype))
        dims = AttnDims(B, s, H, HK, D)
        ring = RingAttention(None, world, rank, dkv_fp32=dkv_fp32)
        ring.timer = _Spans()
        out = torch.empty_like(q)
        aux = ring.forward(q, k, v, out, dims, None)
        ring.timer.seen.clear()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ring.backward(do, q, k, v, out, aux, dq, dk, dv, dims, None)
        dkv = [n for name, n in ring.timer.seen if name == "cp_dkv_ring"]
        res.append((pos, [t.view(B, s, -1, D) for t in (out, dq, dk, dv)], dkv, B * s * HK * D))
    return res


def test_ring_dkv_travel_in_the_model_dtype_unless_the_plan_says_fp32():
    """bf16: the accumulators travel at 2 bytes an element (ring_dkv_fp32 False, TransformerEngine's) or 4 (True,
    the executor's old only way), both within bf16's error of the fp64 autograd reference; fp64 stays exact."""
    cases = [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float64, False)]
    res = spawn(_ring_rank, 2, cases, timeout=120)
    for i, (esize, tol) in enumerate(((2, 2e-2), (4, 2e-2), (8, 1e-12))):
        for _pos, _got, dkv, elems in (r[i] for r in res):
            assert dkv and all(n == 2 * elems * esize for n in dkv), (cases[i], dkv, elems)
        assert _err([(r[i][0], r[i][1]) for r in res]) < tol, cases[i]


# ----------------------------------------------------------------------------------- Ulysses backward
def _ulysses_rank(rank: int, world: int, cases):
    """Per case (resend): this rank's positions, out, dq, dk, dv, and the forward's and backward's all-to-alls."""
    from memo_exec.attention import AttnDims, SDPAFlash
    from memo_exec.distributed.attention import UlyssesAttention

    s = S // world
    pos = torch.arange(rank * s, (rank + 1) * s)
    res = []
    for resend in cases:
        q, k, v, do = (t[:, pos].reshape(B * s, -1).contiguous() for t in _full(torch.float64))
        dims = AttnDims(B, s, H, HK, D)
        uly = UlyssesAttention(SDPAFlash(), None, world, 1, resend=resend)
        uly.timer = _Spans()
        out = torch.empty_like(q)
        aux = uly.forward(q, k, v, out, dims, None)
        fwd = list(uly.timer.seen)
        uly.timer.seen.clear()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        uly.backward(do, q, k, v, out, aux, dq, dk, dv, dims, None)
        res.append((pos, [t.view(B, s, -1, D) for t in (out, dq, dk, dv)], fwd, list(uly.timer.seen)))
    return res


def test_ulysses_backward_sends_the_gradients_alone_unless_the_plan_resends():
    """ulysses_bwd_resend False (DeepSpeed's, Megatron's): the backward's all-to-alls are dout, dq, dk, dv (the
    forward's q, k, v, out kept); True (the ``any`` framework's): q, k, v, out again too. Both exact in fp64."""
    row = 8  # bytes of one fp64 element
    width = {"q": H * D, "kv": HK * D}
    T = B * S // 2
    cases = [False, True]
    res = spawn(_ulysses_rank, 2, cases, timeout=120)
    for i, sent in enumerate((["q", "q", "kv", "kv"], ["q", "kv", "kv", "q", "q", "q", "kv", "kv"])):
        assert _err([(r[i][0], r[i][1]) for r in res]) < 1e-12, cases[i]
        for _p, _g, fwd, bwd in (r[i] for r in res):
            assert len(fwd) == 4
            assert [n for _name, n in bwd] == [T * width[w] * row for w in sent], (cases[i], bwd)


def test_ulysses_estimate_counts_the_kept_head_sharded_tensors():
    """The distributed estimate's per-layer bytes of the kept copies: q, r (k + v), out of the inner shape, none
    where the plan re-sends them or there is no Ulysses."""
    from memo_exec.distributed.runner import DistExecutor
    from memo_sim.layout.parallel import Layout
    from memo_sim.model.config import ModelConfig

    m = ModelConfig("small", 2, 256, 8, 1024, vocab=512, dtype="fp32")

    def kept(**kw):
        ns = SimpleNamespace(layout=Layout(**kw), model=m, micro=1, seq=128, flavour=SimpleNamespace(size=1),
                             dtype=torch.float32)
        return DistExecutor._ulysses_kept_bytes(ns)

    assert kept(ulysses=2) == 128 * (m.q_dim + m.kv_dim + m.v_dim + m.attn_dim) // 2 * 4
    assert kept(ulysses=2, ulysses_bwd_resend=True) == 0
    assert kept() == 0


# ----------------------------------------------------------------------------------- full recompute, MoE
def test_full_recompute_buffers_count_the_rebuilt_moe_block():
    """A MoE model's work buffer: every skeletal tensor but x, fc1 and act (the block keeps its own), plus one MoE
    block's graph beyond its routing (its backward re-runs it under autograd); a dense model's unchanged."""
    from memo_exec.activations.registry import make_policy
    from memo_exec.layer import SKELETAL, storage_bytes
    from memo_sim.model.config import ModelConfig
    from memo_sim.policy.registry import get_policy

    moe = ModelConfig("m", 2, 256, 8, 768, vocab=512, dtype="fp32", experts=8, top_k=2, expert_ffn=96)
    dense = ModelConfig("d", 2, 256, 8, 768, vocab=512, dtype="fp32")
    for model in (moe, dense):
        pol = make_policy(get_policy("full_recompute"), model, 1, 256, model.layers, torch.float32,
                          torch.device("meta"), None, None, None)
        names = [n for n in SKELETAL if n != "x" and (not model.moe or n not in ("fc1", "act"))]
        want = storage_bytes(model, 256, torch.float32, tuple(names)) + pol.moe_graph_bytes()
        assert pol.device_bytes()["buffers"] == want, model.name
        assert (pol.moe_graph_bytes() > 0) == model.moe


# ----------------------------------------------------------------------------------- the runner reads the flags
def _runner_rank(rank: int, world: int, cases):
    """Per case (layout kwargs, dtype): the loss, rank 0's gradients and (count, bytes) of each comm span name."""
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor
    from memo_exec.runner import RunOptions
    from memo_sim.layout.parallel import Layout
    from tests.dist_cases import plan_for

    out = []
    for kw, dtype in cases:
        plan = plan_for(Layout(**kw), 64, "store_all", model=_TWO_LAYERS)
        ex = DistExecutor(plan, RunOptions(device="cpu", dtype=dtype, steps=1),
                          build_context(plan.layout, torch.device("cpu")), DeviceSpec("cpu"))
        ex.allocate()
        rec = ex.step(0, optimizer=False)
        grads = ex.full_gradients()
        ex.close()
        comm: dict[str, list[float]] = {}
        for e in rec.events:
            if e.op in ("ulysses_all_to_all", "cp_dkv_ring"):
                c = comm.setdefault(f"{e.op}:{e.phase}", [0, 0.0])
                c[0] += 1
                c[1] += e.nbytes
        out.append((rec.loss, grads if rank == 0 else None, comm))
    return out


def _two_layers():
    from memo_sim.model.config import ModelConfig

    return ModelConfig("small2", 2, 128, 4, 512, vocab=512, dtype="fp32")


_TWO_LAYERS = _two_layers()


def test_the_runner_runs_each_plans_ulysses_backward_and_ring_dtype():
    """Through `DistExecutor`: Ulysses with and without the re-sends matches the single-process run (fp64, 1e-5) and
    sends 4 + 4 or 4 + 8 all-to-alls a layer; a bf16 ring sends its dK/dV at half the fp32 plan's bytes."""
    from tests.dist_cases import reference
    from tests.exec_helpers import max_rel_error

    cases = [(dict(ulysses=2), "fp64"), (dict(ulysses=2, ulysses_bwd_resend=True), "fp64"),
             (dict(cp=2), "bf16"), (dict(cp=2, ring_dkv_fp32=True), "bf16")]
    res = spawn(_runner_rank, 2, cases, timeout=300)
    ref_loss, ref_grads, _ = reference(64, "store_all", 1, model=_TWO_LAYERS)
    for i, per_layer in ((0, 8), (1, 12)):
        loss, grads, comm = res[0][i]
        assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss), (cases[i], loss, ref_loss)
        assert max_rel_error(grads, ref_grads)[0] <= 1e-5, cases[i]
        assert sum(c for c, _b in comm.values()) == per_layer * _TWO_LAYERS.layers, (cases[i], comm)
    bf16 = sum(b for _c, b in res[0][2][2].values())
    fp32 = sum(b for _c, b in res[0][3][2].values())
    assert bf16 > 0 and fp32 == 2 * bf16, (res[0][2][2], res[0][3][2])


def test_the_report_says_where_memo_exec_keeps_ulysses_head_sharded_copies():
    """A plan whose Ulysses backward sends the gradients alone runs so, and memo-exec keeps the head-sharded tensors
    beside its policy's sequence-sharded ones: report.md says why the kept-activation row reads above the plan."""
    from types import SimpleNamespace as NS

    from memo_exec.report import ulysses_kept_note
    from memo_sim.layout.parallel import Layout

    assert "head-sharded" in ulysses_kept_note(NS(layout=Layout(ulysses=2)))
    assert ulysses_kept_note(NS(layout=Layout(ulysses=2, ulysses_bwd_resend=True))) is None
    assert ulysses_kept_note(NS(layout=Layout())) is None


def test_the_report_says_where_memo_exec_holds_the_head_and_embedding_gradients_together():
    """``head_grads_unit`` False (a framework's buckets reduce-scatter the head's gradient first) is not how memo-exec
    runs ZeRO 2 / 3 (its first gradient unit holds both): report.md says why the model-state row reads above."""
    from types import SimpleNamespace as NS

    from memo_exec.report import head_grads_note
    from memo_sim.layout.parallel import Layout

    untied, tied = NS(tied_embeddings=False), NS(tied_embeddings=True)
    assert "first gradient unit" in head_grads_note(NS(layout=Layout(dp=2, zero=3), model=untied))
    assert head_grads_note(NS(layout=Layout(dp=2, zero=3, head_grads_unit=True), model=untied)) is None
    assert head_grads_note(NS(layout=Layout(dp=2, zero=1), model=untied)) is None
    assert head_grads_note(NS(layout=Layout(dp=2, zero=3), model=tied)) is None
