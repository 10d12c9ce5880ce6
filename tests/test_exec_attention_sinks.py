"""Attention sinks and sliding windows in the executor (GPT-OSS; `memo_exec.attention_sinks`,
`memo_exec.attention`): the kernels with the sinks around them against the Hugging Face formula written out in
autograd (the sink appended to each row's scores, softmax, its column dropped; keys beyond the window masked), a
layer pattern placed as GPT-OSS's ``layer_types``, single-process and gloo runs of a model with both (tp 2, dp 2,
pp 2 as one process), and the plans the executor refuses, in one line."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from memo_exec.arena import CachingScratch  # noqa: E402
from memo_exec.attention import AttnDims, MathAttention, SDPAFlash, select_backend  # noqa: E402
from memo_exec.attention_sinks import apply_sinks, sinks_grad  # noqa: E402
from memo_exec.errors import BackendError  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from tests.dist_harness import spawn  # noqa: E402

TOL = 1e-9  # fp64


def reference(q, k, v, sinks, dims: AttnDims):
    """Hugging Face's eager attention with sinks (GPT-OSS), a sliding window and chunks (Llama 4: each query sees the
    keys of its own chunk only), on [b, s, H, d] views."""
    b, s, H, d, g = dims.batch, dims.seq, dims.heads, dims.head_dim, dims.group
    qh = q.view(b, s, H, d).transpose(1, 2)
    kh = k.view(b, s, dims.kv_heads, d).transpose(1, 2).repeat_interleave(g, 1)
    vh = v.view(b, s, dims.kv_heads, d).transpose(1, 2).repeat_interleave(g, 1)
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(d)
    i, j = torch.arange(s, device=q.device).unsqueeze(1), torch.arange(s, device=q.device).unsqueeze(0)
    hidden = (j > i) | ((j <= i - dims.window) if dims.window else torch.zeros_like(j > i))
    if dims.chunk:
        hidden |= j // dims.chunk != i // dims.chunk
    scores = scores.masked_fill(hidden, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.view(1, H, 1, 1).expand(b, H, s, 1)], -1)
    p = torch.softmax(scores, -1)[..., :s]
    return (p @ vh).transpose(1, 2).reshape(b * s, H * d)


@pytest.mark.parametrize("backend", [MathAttention, SDPAFlash], ids=["math", "sdpa_flash"])
@pytest.mark.parametrize("window,sinks", [(0, True), (5, False), (5, True)], ids=["sinks", "window", "both"])
def test_the_kernels_with_sinks_and_windows_match_the_hugging_face_formula(backend, window, sinks):
    if window and not backend.windows:
        with pytest.raises(BackendError, match="runs no sliding windows .*; use --attention-backend math "
                                               r"\(on CUDA also flash_attn\)"):
            select_backend(backend.name, torch.device("cpu"), torch.float64, AttnDims(1, 16, 4, 2, 8, window=window))
        return
    dims = AttnDims(2, 16, 4, 2, 8, window=window)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(32, w, generator=g, dtype=torch.float64) for w in (32, 16, 16))
    s = torch.randn(4, generator=g, dtype=torch.float64) if sinks else None
    dout = torch.randn(32, 32, generator=g, dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)] + ([s.clone().requires_grad_(True)] if sinks else [])
    want = reference(*leaves[:3], leaves[3] if sinks else None, dims)
    grads = torch.autograd.grad(want, leaves, dout)
    kern, scr = backend(), CachingScratch(torch.device("cpu"))
    out = torch.empty(32, 32, dtype=torch.float64)
    aux = kern.forward(q, k, v, out, dims, scr)
    if sinks:
        apply_sinks(out, aux, s, dims)
    assert float((out - want.detach()).abs().max()) < TOL
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if sinks:
        ds = sinks_grad(dout, out, aux, s, dims)
        assert float((ds - grads[3]).abs().max()) < TOL, (ds, grads[3])
    kern.backward(dout, q, k, v, out, aux, dq, dk, dv, dims, scr)
    for got, ref in zip((dq, dk, dv), grads[:3]):
        assert float((got - ref).abs().max()) < TOL


def test_a_windowed_model_is_sized_and_traced_on_the_meta_device_for_each_kernel():
    """The layer is dry-run on the meta device before anything is allocated, with a stand-in of the chosen kernel
    (`memo_exec.attention.meta_stand_in`): flash-attn's runs windows (a sliding-window model whose run picks it
    once failed there, its stand-in being sdpa_flash), sdpa_flash's refuses them naming the kernels that run."""
    from memo_exec.trace import record_layer_trace
    from memo_sim.model.config import with_overrides

    windowed = with_overrides(SMALL, attention_sinks=False, sliding_layers=SMALL.layers, sliding_period=0)
    for model in (windowed, SMALL):
        plan = _plan(Layout(), "memo", 1, model)
        for name in ("math", "flash_attn", "sdpa_flash"):
            if (name == "sdpa_flash" or (name == "flash_attn" and model.attention_sinks)):
                with pytest.raises(BackendError, match="runs no"):
                    record_layer_trace(plan, "meta", "bf16", attention_backend=name)
            else:
                assert len(record_layer_trace(plan, "meta", "bf16", attention_backend=name)) > 0


def test_the_sliding_layers_are_gpt_oss_layer_types():
    """GPT-OSS's config.json: layer_types alternate sliding_attention (even layers) and full_attention; memo reads
    them as sliding_period 2 (`memo_sim.model.hf_config`), and every odd layer attends to the whole past."""
    from pathlib import Path

    from memo_sim.model.config import model_from_file

    m = model_from_file(Path(__file__).resolve().parent / "data" / "hf" / "gpt-oss-20b" / "config.json")
    assert m.sliding_period == 2 and m.attention_sinks
    assert [m.window_at(i) for i in range(4)] == [m.sliding_window, 0, m.sliding_window, 0]
    half = ModelConfig("x", 4, 64, 4, 128, sliding_window=8, sliding_layers=2)
    assert half.window_at(0) is None  # which two slide is not said: the executor refuses it (below)


SMALL = ModelConfig("sinks", 4, 64, 4, 128, vocab=128, dtype="fp32", attention_sinks=True, sliding_window=12,
                    sliding_layers=2, sliding_period=2, kv_heads=2)
SEQ = 32


def _plan(lay: Layout, pol: str, batch: int, model=SMALL, schedule: str = "", micro: int = 0):
    from tests.dist_cases import plan_for

    p = plan_for(lay, SEQ, pol, batch=batch, model=model, chunk=48)
    if schedule:
        p.schedule, p.micro_batch = schedule, micro
    return p


def _one_process(pol: str, batch: int, model=SMALL, steps: int = 0):
    from tests.exec_helpers import one_process_run

    return one_process_run(_plan(Layout(), pol, batch, model), steps)


def test_sinks_and_windows_change_the_loss_one_process():
    """The same weights with sinks and windows off give another loss (the test below can fail), and every sink
    has a gradient."""
    import dataclasses

    loss, grads, _ = _one_process("store_all", 2)
    plain = dataclasses.replace(SMALL, attention_sinks=False, sliding_window=0, sliding_layers=0, sliding_period=0)
    other, _, _ = _one_process("store_all", 2, plain)
    windowless = dataclasses.replace(SMALL, sliding_window=0, sliding_layers=0, sliding_period=0)
    third, _, _ = _one_process("store_all", 2, windowless)
    assert abs(loss - other) > 1e-6 and abs(loss - third) > 1e-9, (loss, other, third)
    for i in range(SMALL.layers):
        assert float(grads[f"layers.{i}.sinks"].abs().max()) > 0


def rank_cases(rank: int, world: int, cases) -> list:
    from tests.dist_cases import loss_and_grads

    return [loss_and_grads(_plan(Layout(**lay), pol, batch, schedule=sch, micro=micro), rank)
            for lay, pol, batch, sch, micro in cases]


CASES = [(dict(tp=2, sp=True, dp=2), "memo", 1, "", 0), (dict(tp=2, sp=False, dp=2), "full_recompute", 1, "", 0),
         (dict(pp=2, dp=2), "store_all", 2, "1f1b", 1), (dict(tp=2, sp=True, pp=2), "selective_recompute", 2,
                                                          "interleaved_1f1b", 1)]


def test_tp_dp_and_pipelines_with_sinks_and_windows_match_one_process():
    """Megatron TP (each rank its query heads' sinks), data parallelism and 1F1B / interleaved pipelines, store all,
    full and selective recompute and MEMO (its token-wise recompute keeps the rescaled attention output): loss and
    every gradient, the sinks' included, as one process."""
    from tests.exec_helpers import max_rel_error

    cases = [(lay | ({"vpp": 2} if sch == "interleaved_1f1b" else {}), pol, b, sch, mb)
             for lay, pol, b, sch, mb in CASES]
    results = spawn(rank_cases, 4, cases, timeout=300)
    for i, (lay, pol, batch, _, _) in enumerate(cases):
        loss, grads, _ = _one_process(pol, batch * (2 if lay.get("dp") else 1))
        got, got_grads = results[0][i]
        assert abs(got - loss) <= TOL * abs(loss), (lay, pol, got, loss)
        err, name = max_rel_error(got_grads, grads)
        assert err <= 1e-8, (lay, pol, name, err)
        assert any(k.endswith("sinks") for k in got_grads)


@pytest.mark.parametrize("lay,needle", [
    (Layout(cp=2), "with cp 2"), (Layout(ulysses=2), "with ulysses 2"),
    (Layout(tp=2, sp=True, tp_mode="metp_ffn"), "tp_mode metp_ffn"),
])
def test_layouts_that_split_the_sequence_or_ring_the_weights_are_refused_in_one_line(lay, needle):
    from memo_sim.plan.executor_scope import plan_why_not
    from memo_sim.policy.registry import get_policy

    why = plan_why_not(SMALL, lay, get_policy("store_all"), "single_stage", 1, 1, SEQ)
    assert why and needle in why and "attention_sinks and sliding_window" in why and "\n" not in why, why
    unplaced = ModelConfig("x", 4, 64, 4, 128, sliding_window=8, sliding_layers=2)
    why = plan_why_not(unplaced, Layout(), get_policy("store_all"), "single_stage", 1, 1, SEQ)
    assert why and "give sliding_period" in why, why


@pytest.mark.parametrize("window,chunk", [(0, 0), (48, 0), (0, 32)])
def test_the_reference_formula_runs_on_the_inputs_device(window, chunk):
    """The formula the CUDA test below holds the kernels to builds its masks where its inputs lie (its first GPU run
    failed on a CPU mask over CUDA scores: reports/gpu-h200-2026-11-30.md); the meta device catches a CPU tensor
    mixed in without a GPU."""
    dims = AttnDims(2, 128, 8, 2, 64, window=window, sinks=True, chunk=chunk)
    q, k, v = (torch.empty(256, w, device="meta") for w in (512, 128, 128))
    out = reference(q, k, v, torch.empty(8, device="meta"), dims)
    assert out.device.type == "meta" and tuple(out.shape) == (256, 512)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flash_attn"])
def test_the_cuda_kernels_with_sinks_and_windows_match_the_hugging_face_formula(name):
    """On a GPU each kernel's lse layout (the memory-efficient kernel's padded rows, cuDNN's trailing 1) under the
    sinks, and flash-attn's window, against the formula in fp32 on the same bf16 inputs (bf16 tolerance); a kernel
    without windows or sinks is refused by name."""
    dev = torch.device("cuda")
    for window, sinks in ((0, True), (48, False), (48, True)):
        dims = AttnDims(2, 128, 8, 2, 64, window=window, sinks=sinks)
        try:
            kern = select_backend(name, dev, torch.bfloat16, dims)
        except BackendError as e:
            assert "runs no" in str(e) or "cannot import" in str(e) or "does not run" in str(e), str(e)
            continue
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(256, w, generator=g).to(dev, torch.bfloat16) for w in (512, 128, 128))
        s = torch.randn(8, generator=g).to(dev, torch.bfloat16)
        dout = torch.randn(256, 512, generator=g).to(dev, torch.bfloat16)
        leaves = [t.float().clone().requires_grad_(True) for t in (q, k, v, s)]
        want = reference(*leaves[:3], leaves[3] if sinks else None, dims)
        grads = torch.autograd.grad(want, leaves[:3 + sinks], dout.float())
        scr = CachingScratch(dev)
        out = torch.empty_like(q)
        aux = kern.forward(q, k, v, out, dims, scr)
        if sinks:
            apply_sinks(out, aux, s, dims)
        assert float((out.float() - want.detach()).abs().max()) < 3e-2, (name, window, sinks)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if sinks:
            ds = sinks_grad(dout, out, aux, s, dims).float()
            assert float((ds - grads[3]).abs().max()) <= 3e-2 * float(grads[3].abs().max()) + 1e-2, (name, ds)
        kern.backward(dout, q, k, v, out, aux, dq, dk, dv, dims, scr)
        for got, ref in zip((dq, dk, dv), grads[:3]):
            assert float((got.float() - ref).abs().max()) <= 3e-2 * float(ref.abs().max()) + 1e-2, (name, window)
