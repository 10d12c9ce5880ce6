"""Eager PyTorch's composite kernels (`memo_sim.model.eager_kernels`, ``Layout.kernel_fusion`` ``eager``): the
counts memo holds are what the dispatcher runs (benchmarks/eager_kernels.py, counted again here), an eager layer
prices its RMSNorms and SwiGLU activations from them, and the frameworks that run HF layers eager say so."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from memo_sim.cost.activations import tensor_bytes
from memo_sim.cost.kernel_time import memory_bound_time
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS
from memo_sim.model.eager_kernels import EAGER_OPS
from memo_sim.model.layer_graph import layer_tensors
from memo_sim.profile import load_profile
from memo_sim.search.frameworks import get_framework

LLAMA = PRESETS["llama-3.1-8b"]
PROF = load_profile("h100-sxm5-80gb")
LATENCY = float(PROF.efficiency.kernel_latency)


def _costs(model, lay, fn=forward_costs, seq=8192):
    return {c.name: c for c in fn(model, lay, 1, seq, PROF)}


@pytest.mark.parametrize("name,dtype", [(n, d) for n in ("rmsnorm", "swiglu") for d in ("bf16", "fp32")])
def test_counts_are_what_the_dispatcher_runs(name, dtype):
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from eager_kernels import count_eager_kernels
    c = count_eager_kernels(name, dtype, 1024, 512)
    held = EAGER_OPS[(name, 2 if dtype == "bf16" else 4)]
    assert (c.fwd_kernels, c.bwd_kernels) == (held.fwd_kernels, held.bwd_kernels)
    # the weight, the rows' statistics and the weight gradient's partial sums: under 0.2 byte an element here
    assert c.fwd_bytes == pytest.approx(held.fwd_bytes, abs=0.2)
    assert c.bwd_bytes == pytest.approx(held.bwd_bytes, abs=0.2)
    assert c.saved_bytes == pytest.approx(held.saved_bytes, abs=0.02)


@pytest.mark.parametrize("name", ["layernorm", "gelu"])
def test_layernorm_and_gelu_are_one_kernel_each_way_eager_too(name):
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from eager_kernels import count_eager_kernels
    c = count_eager_kernels(name, "bf16", 1024, 512)
    assert (c.fwd_kernels, c.bwd_kernels) == (1, 1)
    assert c.saved_bytes < 0.02  # the rows' statistics at most: the fused kernel's memory


def test_eager_prices_the_rmsnorms_and_the_swiglu_from_the_counts():
    fused, eager = Layout(), Layout(kernel_fusion="eager")
    for fn, phase in ((forward_costs, "fwd"), (backward_costs, "bwd")):
        a, b = _costs(LLAMA, fused, fn), _costs(LLAMA, eager, fn)
        for op, tensor, key in (("ln1", "ln1", "rmsnorm"), ("ln2", "ln2", "rmsnorm"), ("act", "act", "swiglu")):
            per, kernels = EAGER_OPS[(key, 2)].phase(phase)
            elements = tensor_bytes(layer_tensors(LLAMA)[tensor], eager, 1, 8192) / 2
            assert b[op].nbytes == pytest.approx(per * elements)
            assert b[op].seconds == pytest.approx(memory_bound_time(per * elements, PROF) + kernels * LATENCY)
            # RMSNorm 36 / 4 bytes an element forward, 92 / 8 backward; SwiGLU 10 / 6 and 18 / 12
            assert b[op].seconds > 1.4 * a[op].seconds
        # every other op (the GEMMs, attention, the residual adds) priced as the fused layer's
        same = {n for n in a if n not in ("ln1", "ln2", "act")}
        assert {n: a[n].seconds for n in same} == {n: b[n].seconds for n in same}


def test_a_layernorm_gelu_model_is_priced_alike_eager_and_fused():
    gpt = PRESETS["gpt-7b"]
    assert gpt.norm == "layernorm" and gpt.ffn_type == "gelu"
    for fn in (forward_costs, backward_costs):
        a, b = _costs(gpt, Layout(), fn), _costs(gpt, Layout(kernel_fusion="eager"), fn)
        assert {n: c.seconds for n, c in a.items()} == {n: c.seconds for n, c in b.items()}


def test_moe_experts_activation_eager_too():
    moe = PRESETS["mixtral-8x7b"]
    a, b = _costs(moe, Layout()), _costs(moe, Layout(kernel_fusion="eager"))
    assert b["expert_act"].seconds > a["expert_act"].seconds


def test_fp32_rmsnorm_counts_no_casts():
    fp32 = replace(LLAMA, dtype="fp32")
    b = _costs(fp32, Layout(kernel_fusion="eager"))
    elements = tensor_bytes(layer_tensors(fp32)["ln1"], Layout(), 1, 8192) / 4
    assert b["ln1"].nbytes == pytest.approx(EAGER_OPS[("rmsnorm", 4)].fwd_bytes * elements)


def test_xtuner_runs_hf_layers_eager():
    assert get_framework("xtuner").adapt(Layout()).kernel_fusion == "eager"
    assert get_framework("torchtitan@2024-12").adapt(Layout()).kernel_fusion == "compiled"
    assert "eager" in Layout(kernel_fusion="eager").label()


def test_the_executor_runs_an_eager_plan_and_names_its_kernels():
    from types import SimpleNamespace

    from memo_exec.report import kernel_fusion_note
    eager = SimpleNamespace(layout=Layout(kernel_fusion="eager"))
    assert "eager PyTorch's RMSNorm and SwiGLU" in kernel_fusion_note(eager)
    assert kernel_fusion_note(SimpleNamespace(layout=Layout())) is None
    assert kernel_fusion_note(SimpleNamespace(layout=Layout(kernel_fusion="compiled"))) is None


def test_whatif_kernel_fusion_over_the_framework():
    from click.testing import CliRunner

    from memo_sim.cli import cli
    base = ["whatif", "--model", "llama-3.1-8b", "--layers", "4", "--gpus", "8", "--seq", "8K", "--profile",
            "h100-sxm5-80gb", "--framework", "torchtitan@2024-12", "--no-plan", "--json"]
    import json
    eager = CliRunner().invoke(cli, base + ["--kernel-fusion", "eager"])
    compiled = CliRunner().invoke(cli, base)
    assert eager.exit_code == 0 and compiled.exit_code == 0, (eager.output[-800:], compiled.output[-800:])
    e, c = json.loads(eager.output), json.loads(compiled.output)
    eb, cb = e["candidates"][0], c["candidates"][0]
    assert "eager" in eb["layout"] and "compiled" in cb["layout"]
    assert eb["layout"].replace("eager", "compiled") == cb["layout"]
    assert eb["simulated_iteration_s"] > cb["simulated_iteration_s"]
    # async TP is a torch.compile pass: not searched under eager kernels, refused in one line where asked for
    assert all("async" not in row["layout"] for row in e["candidates"])
    r = CliRunner().invoke(cli, base + ["--kernel-fusion", "eager", "--tp", "2", "--tp-mode", "async_tp"])
    assert r.exit_code == 2 and "needs compiled blocks" in r.output and "Traceback" not in r.output


def test_whatif_says_what_eager_kernels_cost_the_best_plan():
    import json

    from click.testing import CliRunner

    from memo_sim.cli import cli
    base = ["whatif", "--model", "llama-2-7b", "--layers", "4", "--gpus", "8", "--seq", "32K", "--profile",
            "a100-sxm4-80gb", "--no-plan"]
    eager = json.loads(CliRunner().invoke(cli, base + ["--framework", "xtuner", "--json"]).output)["eager_kernels"]
    assert eager["tgs_tokens_per_gpu_s"] > eager["best_analytic_tgs_tokens_per_gpu_s"]
    assert "--kernel-fusion fused" in eager["words"]
    text = CliRunner().invoke(cli, base + ["--framework", "xtuner"]).output
    assert "eager kernels: the best plan's RMSNorms and SwiGLU" in text
    assert json.loads(CliRunner().invoke(cli, base + ["--json"]).output)["eager_kernels"] is None


def test_eager_saved_tensors_kept_or_rebuilt_as_the_policy_runs_the_ops():
    from memo_sim.cost.activations import eager_saved_bytes, skeletal_bytes
    from memo_sim.policy import get_policy
    eager, seq = Layout(kernel_fusion="eager"), 8192
    tensors = layer_tensors(LLAMA)
    h_elems = tensor_bytes(tensors["ln1"], eager, 1, seq) / 2
    f_elems = tensor_bytes(tensors["act"], eager, 1, seq) / 2
    # two RMSNorms' fp32 input copies and normalised rows (6 bytes an element), the silu output (2)
    assert eager_saved_bytes(LLAMA, eager, 1, seq) == pytest.approx(2 * 6 * h_elems + 2 * f_elems)
    assert eager_saved_bytes(LLAMA, Layout(), 1, seq) == 0.0
    assert eager_saved_bytes(LLAMA, Layout(kernel_fusion="compiled"), 1, seq) == 0.0
    assert eager_saved_bytes(PRESETS["gpt-7b"], eager, 1, seq) == 0.0  # LayerNorm and GELU save what fused ones do
    sk = skeletal_bytes(LLAMA, eager, 1, seq)
    b = sk["eager_saved"]
    store, full, sac = get_policy("store_all"), get_policy("full_recompute"), get_policy("op_sac")
    assert ("eager_saved", b) in store.forward_kept(sk) and ("eager_saved", b) not in store.recompute_allocated(sk)
    # a recompute that re-runs the norms and the activation saves them again: one layer's, in its recompute buffer
    for pol in (full, sac):
        assert ("eager_saved", b) not in pol.forward_kept(sk)
        assert ("eager_saved", b) in pol.recompute_allocated(sk)
        assert pol.buffer_bytes(sk) == pytest.approx(sum(x for _n, x in pol.recompute_allocated(sk)))
    fused = skeletal_bytes(LLAMA, Layout(), 1, seq)
    assert all(n != "eager_saved" for n, _b in store.forward_kept(fused) + full.recompute_allocated(fused))
