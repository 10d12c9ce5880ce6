"""torch.compile as a framework mechanism (`memo_sim.model.kernel_fusion`, `Layout.kernel_fusion`): what a
compiled block fuses, what it saves in bytes, the framework version that runs it (the executor's refusal:
tests/test_exec_every_plan_kind.py), and torchtitan's tokens-per-GPU reading in the published runs."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from memo_sim.cost.activations import tensor_bytes
from memo_sim.cost.kernel_time import memory_bound_op_time, memory_bound_time
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS
from memo_sim.model.kernel_fusion import amax_fused_backward, amax_fused_forward, fused_inputs
from memo_sim.model.layer_graph import layer_tensors
from memo_sim.profile import load_profile
from memo_sim.search.frameworks import get_framework

LLAMA = PRESETS["llama-3.1-8b"]
PROF = load_profile("h100-sxm5-80gb")


def _costs(model, lay, fn=forward_costs, seq=8192):
    return {c.name: c for c in fn(model, lay, 1, seq, PROF)}


def test_vertical_fusions_follow_the_op_graph():
    assert fused_inputs(LLAMA) == {"ln2": ("h1",)}  # a dense layer: the residual add into the second norm
    moe = PRESETS["mixtral-8x7b"]  # a MoE layer also adds the unpermuted expert outputs in the same kernel
    assert fused_inputs(moe) == {"ln2": ("h1",), "add2": ("moe_out",)}


def test_compiled_ln2_reads_h1_once_less_and_pays_no_launch():
    fused, compiled = Layout(), Layout(kernel_fusion="compiled")
    a, b = _costs(LLAMA, fused)["ln2"], _costs(LLAMA, compiled)["ln2"]
    h1 = tensor_bytes(layer_tensors(LLAMA)["h1"], compiled, 1, 8192)
    assert a.nbytes - b.nbytes == pytest.approx(h1)
    assert a.seconds == pytest.approx(memory_bound_op_time(a.nbytes, PROF))
    assert b.seconds == pytest.approx(memory_bound_time(b.nbytes, PROF))
    # every other op is priced as before
    fa, fb = _costs(LLAMA, fused), _costs(LLAMA, compiled)
    assert {n: c.seconds for n, c in fa.items() if n != "ln2"} == {n: c.seconds for n, c in fb.items() if n != "ln2"}


def test_compiled_fp8_casts_read_once_where_a_memory_bound_kernel_wrote_the_tensor():
    fp8 = replace(LLAMA, gemm_format="fp8-tensorwise")
    assert amax_fused_forward(fp8, "compiled", "ln1") and amax_fused_forward(fp8, "compiled", "act")
    assert not amax_fused_forward(fp8, "compiled", "attn")  # the attention kernel is extern to Inductor
    assert not amax_fused_forward(fp8, "fused", "ln1")
    assert amax_fused_backward(fp8, "compiled", "proj")  # its gradient comes from the residual add's backward
    assert not amax_fused_backward(fp8, "compiled", "q", rope=False)  # from the attention kernel's backward
    assert amax_fused_backward(fp8, "compiled", "q")  # from the rotary op's backward, where the block runs one
    fused, compiled = Layout(), Layout(kernel_fusion="compiled")
    # forward: the inputs of qkv, fc1 and fc2 come from a norm or the activation, out_proj's from attention;
    # backward: the output gradients of out_proj, fc1 and fc2 from the add / activation backward, qkv's from attention's
    for fn, faster, same in ((forward_costs, ("qkv", "fc1", "fc2"), "out_proj"),
                             (backward_costs, ("out_proj", "fc1", "fc2"), "qkv")):
        a, b = _costs(fp8, fused, fn), _costs(fp8, compiled, fn)
        for gemm in faster:
            assert b[gemm].seconds < a[gemm].seconds, (fn.__name__, gemm)
        assert b[same].seconds == pytest.approx(a[same].seconds)
    # a format whose scales come from the cast kernel itself (no amax pass) gains nothing in its GEMMs
    blk = replace(LLAMA, gemm_format="fp8-blockwise")
    a, b = _costs(blk, fused), _costs(blk, compiled)
    assert b["qkv"].seconds == pytest.approx(a["qkv"].seconds)


def test_the_torchtitan_2024_12_version_compiles_and_the_plan_round_trips():
    fw = get_framework("torchtitan@2024-12")
    lay = fw.adapt(Layout(cp=2, dp=4, zero=3, dp_mode="fsdp"))
    assert lay.kernel_fusion == "compiled" and "compiled" in lay.label()
    assert get_framework("torchtitan").adapt(Layout()).kernel_fusion == "fused"
    assert Layout.from_dict(lay.to_dict()) == lay
    assert "kernel_fusion" not in Layout().to_dict()  # plans with fused kernels keep their shape
    from memo_sim.errors import MemoError
    with pytest.raises(MemoError, match="kernel_fusion"):
        Layout.from_dict({**Layout().to_dict(), "kernel_fusion": "inductor"})


def _published_runs():
    spec = importlib.util.spec_from_file_location(
        "published_runs", Path(__file__).resolve().parents[1] / "benchmarks" / "published_runs.py")
    pr = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("published_runs", pr)
    spec.loader.exec_module(pr)
    return sys.modules["published_runs"]


def test_torchtitan_tokens_per_gpu_divide_by_the_non_data_parallel_ranks():
    """torchtitan@9dec370 train.py: tps = local batch tokens / (step time x cp x tp x pp)."""
    pr = _published_runs()
    rows = {r.id: r for r in pr.RUNS}
    assert rows["torchtitan-t2-cp8"].published_s == pytest.approx(262144 / (548 * 8))
    assert rows["torchtitan-t2-cp1"].published_s == pytest.approx(32768 / 3890)
    assert rows["torchtitan-t4-2d"].published_s == pytest.approx(16 * 8192 / (829 * 8))
    t2 = rows["torchtitan-t2-cp2"]
    assert (t2.framework, t2.profile, t2.gemm_format, t2.dp_mode, t2.cp, t2.dp) == (
        "torchtitan@2024-12", "h100-sxm5-96gb-500w", "fp8-tensorwise", "fsdp", 2, 4)
    assert t2.layout().kernel_fusion == "compiled"
