"""A user review of FP8 across the simulator, the exports and the executor (2026-12-01, scripts in the review's
/tmp/rev2/fp8/): the casts' quantised copies left out of the layer transients; an export priced without the target
framework's FP8 behaviour; memo-exec run training an FP8 plan check-plan refuses; a model file's gemm_format refused as
"--precision"; MXFP8 accepted under TransformerEngine on compute capability 12.x; DeepSpeed's ZeRO-3 prefetch left at
its default where memo prices a whole next layer gathered ahead."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost.gemm_format import check_gemm_format, for_profile
from memo_sim.errors import MemoError
from memo_sim.export import export_plan
from memo_sim.export.base import nearest_model
from memo_sim.export.deepspeed import config as ds_config
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace, unplaced_in
from memo_sim.model.config import get_model
from memo_sim.model.layer_graph import forward_ops
from memo_sim.plan.schema import Plan, read_plan
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.plan_check import runnable_problems

H100 = "h100-sxm5-80gb"
K = 1024
GiB = 2 ** 30
TOY = ["--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024", "--seq", "2K",
       "--gpus", "1", "--policy", "memo", "--alpha", "0.3", "--profile", H100, "--precision", "fp8-tensorwise"]


def _names(trace) -> dict[str, int]:
    return {b.name: b.size for b in trace.buffers}


# 1. the casts' outputs are transient tensors of the layer's traces


def test_fp8_casts_are_layer_transients_at_the_formats_bytes():
    """llama-3.1-8b at 64K on one H100: fc1's output gradient cast writes two 1-byte copies (row-wise and transposed),
    65,536 x 28,672 x 2 B = 3.5 GiB, beside the bf16 gradient; the review found "layer transients 6.27 GiB" for both
    bf16 and fp8-tensorwise. Each GEMM's forward input cast and backward output-gradient and input casts are
    transients now, named as unplaced (the cast allocates them beside the arena)."""
    bf16 = replace(get_model("llama-3.1-8b"), layers=2)
    fp8 = replace(bf16, gemm_format="fp8-tensorwise")
    lay, seq = Layout(), 64 * K
    fwd, bwd = layer_forward_trace(fp8, lay, 1, seq), layer_backward_trace(fp8, lay, 1, seq)
    f, b = _names(fwd), _names(bwd)
    assert b["fc1_dout_fp8"] == 65536 * 28672 * 2 + 512  # the copies and their fp32 scales, aligned to 512 B
    assert b["fc1_input_fp8"] == 65536 * 4096 * 2 + 512  # ln2 cast again for the weight gradient (memo, torchao)
    assert f["fc1_input_fp8"] == 65536 * 4096 * 2 + 512 and f["fc2_input_fp8"] == 65536 * 14336 * 2 + 512
    gemms = {op.name for op in forward_ops(fp8) if op.kind == "gemm"}
    assert {n.rsplit("_", 2)[0] for n in f if n.endswith("_fp8")} == gemms
    assert set(f) - set(_names(layer_forward_trace(bf16, lay, 1, seq))) == {f"{g}_input_fp8" for g in gemms}
    assert all(n in unplaced_in(bwd, "bwd") for n in b if n.endswith("_fp8"))
    assert bwd.max_live_bytes() > layer_backward_trace(bf16, lay, 1, seq).max_live_bytes()


def test_a_framework_keeping_the_quantised_input_holds_only_the_other_copy():
    """TransformerEngine (fp8_saved_inputs) keeps the column-wise copy of ln1 / ln2 / act as a saved tensor and drops
    the row-wise one after the GEMM: the forward transient is one copy, the backward casts no input again; on a GPU
    whose FP8 GEMMs take any layout (one copy, `for_profile`) the forward holds no input copy beside the kept one."""
    m = replace(get_model("llama-3.1-8b"), layers=2, gemm_format="fp8-tensorwise", fp8_saved_inputs=True)
    lay, seq = Layout(), 8 * K
    f, b = _names(layer_forward_trace(m, lay, 1, seq)), _names(layer_backward_trace(m, lay, 1, seq))
    assert f["qkv_input_fp8"] == 8192 * 4096 + 512 and f["out_proj_input_fp8"] == 8192 * 4096 + 512
    assert "qkv_input_fp8" not in b and "fc2_input_fp8" not in b and "fc2_dout_fp8" in b
    one = for_profile(m, load_profile("b200-180gb"))
    assert not one.fp8_transposes and "qkv_input_fp8" not in _names(layer_forward_trace(one, lay, 1, seq))


@pytest.fixture(scope="module")
def toy_plan(tmp_path_factory) -> Path:
    """The review's FP8 toy MEMO plan on an H100, written by the what-if."""
    out = tmp_path_factory.mktemp("toy") / "t"
    r = CliRunner().invoke(cli, ["whatif", *TOY, "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


def test_an_fp8_memo_plan_with_its_casts_checks(toy_plan):
    """The memory plan of an FP8 MEMO plan names the casts as unplaced (the cast allocates them), so check-plan's
    contract passes it."""
    plan = read_plan(toy_plan)
    assert runnable_problems(plan) == []
    assert any(n.endswith("_fp8") for n in plan.memory_plan.phases["bwd"].unplaced)


# 2. an export prices the target framework's FP8 behaviour


def test_an_export_to_megatron_prices_transformer_engines_fp8_as_the_whatif_does(tmp_path):
    """An any-framework FP8 plan exported to Megatron-LM was priced with torchao's behaviour (no quantised inputs
    kept): 601.10 ms / 62.23 GiB against 585.99 ms / 57.73 GiB for `whatif --framework megatron` on that layout.
    The nearest model is `Framework.for_model`'s, and the export's price is the what-if's."""
    base = ["whatif", "--model", "llama-3.1-8b", "--layers", "2", "--gpus", "2", "--seq", "8K", "--profile", H100,
            "--precision", "fp8-tensorwise", "--tp", "1", "--ulysses", "1", "--cp", "1", "--pp", "1", "--zero", "3",
            "--policy", "store_all"]
    for fw in ("any", "megatron"):
        r = CliRunner().invoke(cli, base + ["--framework", fw, "--out", str(tmp_path / fw)])
        assert r.exit_code == 0, r.output
    plan, meg = read_plan(tmp_path / "any" / "plan.json"), read_plan(tmp_path / "megatron" / "plan.json")
    assert nearest_model(plan, [], "megatron", load_profile(H100)).fp8_saved_inputs is True
    ex = export_plan(plan, "megatron", nearest=True)
    assert "fp8_saved_inputs False -> True" in ex.nearest["mechanisms"]
    assert ex.nearest["iteration_s"] == pytest.approx(meg.predicted.iteration_s, rel=1e-9)
    assert ex.nearest["peak_gpu_bytes"] == pytest.approx(meg.predicted.peak_gpu_bytes, rel=1e-9)


# 3. the executor refuses what check-plan refuses: the GEMM format against the profile and the device


def _toy_plan_on(toy_plan, tmp_path, profile: str) -> Path:
    d = json.loads(toy_plan.read_text())
    d["profile"] = profile
    out = tmp_path / f"plan_{profile}.json"
    out.write_text(json.dumps(d))
    return out


def test_memo_exec_run_refuses_an_fp8_plan_check_plan_refuses_with_its_line(toy_plan, tmp_path):
    """The review's plan with "profile": "a100-sxm4-80gb": check-plan exited 2, memo-exec run trained it."""
    from memo_exec.cli import cli as exec_cli

    f = _toy_plan_on(toy_plan, tmp_path, "a100-sxm4-80gb")
    chk = CliRunner().invoke(cli, ["check-plan", str(f)])
    run = CliRunner().invoke(exec_cli, ["run", str(f), "--device", "cpu", "--steps", "1", "--out", str(tmp_path / "r")])
    assert chk.exit_code == 2 and run.exit_code == 2, (chk.output, run.output)
    line = f"{f}: model.gemm_format fp8-tensorwise: profile a100-sxm4-80gb (NVIDIA A100-SXM4-80GB) has no fp8 peak"
    assert line in chk.output and line in run.output, (chk.output, run.output)
    assert not (tmp_path / "r").exists()


def test_the_executor_refuses_an_fp8_plan_on_a_cuda_device_without_fp8(toy_plan, monkeypatch):
    """On CUDA the device's own compute capability decides (torch.cuda.get_device_capability): an A100 (8.0) has no
    FP8 tensor cores whatever the plan's profile says; an H100 (9.0) runs it."""
    import torch

    from memo_exec.errors import ExecError
    from memo_exec.plan_check import check_device_gemm_format

    plan = read_plan(toy_plan)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (8, 0))
    with pytest.raises(ExecError, match=r"p\.json: model.gemm_format fp8-tensorwise: this device, NVIDIA "
                                        r"A100-SXM4-80GB, has compute capability 8\.0; fp8-tensorwise GEMMs need 8\.9"):
        check_device_gemm_format(plan, "p.json", "cuda")
    check_device_gemm_format(plan, "p.json", "cpu")  # emulated on a CPU
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (9, 0))
    check_device_gemm_format(plan, "p.json", "cuda")


# 4. a model file's format is refused under its own name


TOY8 = """name: toy8
layers: 4
hidden: 512
heads: 8
kv_heads: 2
ffn: 1408
vocab: 32000
ffn_type: swiglu
norm: rmsnorm
bias: none
gemm_format: fp8-tensorwise
"""


def test_a_model_files_gemm_format_is_refused_as_the_files_field(tmp_path):
    """No --precision was given, yet the refusal said "--precision fp8-tensorwise: ... fix: drop --precision"."""
    f = tmp_path / "toy8.yaml"
    f.write_text(TOY8)
    base = ["whatif", "--model", str(f), "--gpus", "1", "--seq", "16K", "--profile", "a100-sxm4-80gb", "--no-plan"]
    for extra in ([], ["--layers", "2"]):
        r = CliRunner().invoke(cli, base + extra)
        assert r.exit_code == 2, r.output
        assert f"error: model file {f}: gemm_format fp8-tensorwise: profile a100-sxm4-80gb" in r.output, r.output
        assert "--precision fp8-tensorwise" not in r.output and "set gemm_format in the model file" in r.output
        assert "Traceback" not in r.output
    r = CliRunner().invoke(cli, base + ["--precision", "fp8-rowwise"])  # the flag's format: the flag named
    assert r.exit_code == 2 and "error: --precision fp8-rowwise: profile a100-sxm4-80gb" in r.output, r.output
    assert "gemm_format_from" not in json.dumps(get_model(str(f)).to_dict())  # never written into a plan


# 5. TransformerEngine's MXFP8 stops below compute capability 12.0


def _cc12(tmp_path) -> Path:
    src = Path(load_profile("b200-180gb").path).read_text()
    out = tmp_path / "rtx-bw.yaml"
    out.write_text(src.replace("name: b200-180gb", "name: rtx-bw").replace('compute_capability: {value: "10.0"',
                                                                           'compute_capability: {value: "12.0"'))
    assert load_profile(str(out)).gpu.compute_capability == (12, 0)
    return out


def test_mxfp8_under_transformer_engine_is_refused_on_compute_capability_12(tmp_path):
    """TransformerEngine's _compute_mxfp8_support: "MXFP8 (for all gemm layouts) is not supported on 12.0+
    architectures yet"; torchtitan's MX converter (torchao) checks has_cuda_capability(10, 0) alone."""
    prof = load_profile(str(_cc12(tmp_path)))
    m = replace(get_model("llama-3.1-8b"), layers=2, gemm_format="mxfp8")
    check_gemm_format(m, prof)  # no framework's library known: the format's lower bound alone
    for_profile(m, prof)  # torchao's (torchtitan): runs
    with pytest.raises(MemoError, match=r"states gpu.compute_capability 12\.0; TransformerEngine runs no mxfp8 GEMMs "
                                        r"on compute capability 12\.0 or higher"):
        for_profile(replace(m, fp8_saved_inputs=True), prof)
    check_gemm_format(replace(m, fp8_saved_inputs=True), load_profile("b200-180gb"))  # 10.0: runs
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--layers", "2", "--hidden", "512", "--heads",
                                 "8", "--ffn", "1024", "--gpus", "1", "--seq", "2K", "--profile",
                                 str(tmp_path / "rtx-bw.yaml"), "--precision", "mxfp8", "--framework", "megatron",
                                 "--no-plan"])
    assert r.exit_code == 2 and "TransformerEngine runs no mxfp8 GEMMs" in r.output, r.output


# 6. DeepSpeed's ZeRO-3 prefetch as memo prices it


def test_deepspeed_zero3_config_prefetches_a_whole_layer_and_holds_the_layers_memo_prices():
    """memo prices ZeRO 3 with the next layer gathered ahead whole (two layers' weights live); DeepSpeed's default
    stage3_prefetch_bucket_size is 5e7 elements, a quarter of a Llama-3.1-8B layer (218M)."""
    m = get_model("llama-3.1-8b")
    lay = Layout(dp=8, zero=3)
    plan = Plan(model=m, batch=1, seq_tokens=8192, gpus=8, layout=lay, policy=get_policy("store_all"),
                profile=H100, predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2}, micro_batch=1, framework="deepspeed")
    z = ds_config(plan, [])["zero_optimization"]
    assert z["stage"] == 3 and z["stage3_prefetch_bucket_size"] == m.layer_params() == 218112000
    assert z["stage3_max_live_parameters"] == 2 * m.layer_params()
    z2 = ds_config(replace(plan, layout=Layout(dp=8, zero=2)), [])["zero_optimization"]
    assert "stage3_prefetch_bucket_size" not in z2 and "stage3_max_live_parameters" not in z2
