"""[modern-training] item 1: the GEMM formats (``--precision fp8-tensorwise|fp8-blockwise|mxfp8``) as
registered parts, priced as mechanisms: the layer GEMMs at the profile's FP8 peak, the casts'
bytes, the quantised weight copies in memory and their re-cast after the optimizer step; profiles
and framework versions without a format refuse it in one line; the executor refuses an FP8 plan."""

from __future__ import annotations

import dataclasses
import json

from dataclasses import replace

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost.boundary import boundary_times
from memo_sim.cost.gemm_format import check_gemm_format, weight_cache_bytes
from memo_sim.cost.kernel_time import memory_bound_op_time, memory_bound_time
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.cost.memory import model_state_parts
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import PRESETS
from memo_sim.model.gemm_formats import GEMM_FORMATS, gemm_format
from memo_sim.profile.loader import load_profile

H100 = load_profile("h100-sxm5-80gb")
A100 = load_profile("a100-sxm4-80gb")
B200 = load_profile("b200-180gb")
LLAMA = PRESETS["llama-3.1-8b"]


def fmt(model, name):
    return dataclasses.replace(model, gemm_format=name)


def test_registered_formats_and_refusal_of_an_unknown_one():
    assert GEMM_FORMATS == ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-blockwise", "mxfp8", "nvfp4")
    with pytest.raises(MemoError, match="GEMM format must be one of bf16, fp8-tensorwise"):
        gemm_format("fp9")
    with pytest.raises(MemoError, match="gemm_format"):
        fmt(LLAMA, "fp9")


def test_cast_and_copy_bytes_follow_each_formats_scales():
    n = 128 * 1024
    tw, bw, mx = gemm_format("fp8-tensorwise"), gemm_format("fp8-blockwise"), gemm_format("mxfp8")
    # tensorwise: amax read + cast read of bf16, two 1-byte copies with one fp32 scale each
    assert tw.cast_bytes(n, 2) == 2 * 2 * n + 2 * (n + 4)
    # blockwise: one read, fp32 scale per 128 activation elements / per 128x128 weight elements
    assert bw.cast_bytes(n, 2) == 2 * n + 2 * (n + n / 128 * 4)
    assert bw.quantised_bytes(n, weight=True) == 2 * (n + n / (128 * 128) * 4)
    # MXFP8: one E8M0 byte per 32 elements
    assert mx.quantised_bytes(n) == 2 * (n + n / 32)
    # rowwise: each of its two axis-wise casts reads the tensor once (the row's amax fused in), two 1-byte copies:
    # tensorwise's bytes (the per-row scales priced as one per tensor)
    assert gemm_format("fp8-rowwise").cast_bytes(n, 2) == tw.cast_bytes(n, 2)
    assert gemm_format("bf16").cast_bytes(n, 2) == 0


def _op(costs, name):
    return next(c for c in costs if c.name == name)


@pytest.mark.parametrize("name", ["fp8-tensorwise", "fp8-rowwise", "fp8-blockwise"])
def test_fp8_gemm_runs_at_the_fp8_peak_plus_its_cast(name):
    lay, seq = Layout(tp=1), 8192
    bf = _op(forward_costs(LLAMA, lay, 1, seq, H100), "fc1")
    m8 = fmt(LLAMA, name)
    f8 = _op(forward_costs(m8, lay, 1, seq, H100), "fc1")
    assert f8.flops == bf.flops  # the model FLOPs are the same
    cast = memory_bound_op_time(m8.gemm.cast_bytes(seq * LLAMA.hidden, 2), H100)
    gemm8 = f8.seconds - cast
    # the GEMM at twice the peak (H100: 1979 vs 989 TFLOP/s), on the format's own measured curve (the Hopper
    # profiles measure all three FP8 recipes since 2026-12-04)
    eff = H100.efficiency
    own = eff.gemm_curve(name)(bf.flops)
    assert eff.gemm_curve(name) is not eff.gemm
    ratio = 989 * eff.gemm(bf.flops) / (1979 * own)
    assert gemm8 == pytest.approx(bf.seconds * ratio, rel=1e-6)
    # backward: two kernels, and the output gradient's cast (m x n elements)
    b8 = _op(backward_costs(m8, lay, 1, seq, H100), "fc1")
    bb = _op(backward_costs(LLAMA, lay, 1, seq, H100), "fc1")
    cast_b = (memory_bound_op_time(m8.gemm.cast_bytes(seq * LLAMA.fc1_width, 2), H100)  # the output gradient
              + memory_bound_op_time(m8.gemm.cast_bytes(seq * LLAMA.hidden, 2), H100))  # the input, re-cast
    assert b8.seconds - cast_b == pytest.approx(bb.seconds * ratio, rel=1e-6)
    # what stays in bf16: the attention core
    assert _op(forward_costs(m8, lay, 1, seq, H100), "attention").seconds == \
        _op(forward_costs(LLAMA, lay, 1, seq, H100), "attention").seconds


def test_quantised_weight_copies_in_model_states_and_recast_in_the_optimizer_step():
    lay = Layout(tp=2, dp=4, zero=1)
    m8 = fmt(LLAMA, "fp8-tensorwise")
    parts, parts8 = model_state_parts(LLAMA, lay), model_state_parts(m8, lay)
    assert parts["quantised_weights"] == 0
    want = 2 * (LLAMA.layers * LLAMA.linear_params() / 2 + 4)  # two fp8 copies, one scale each
    assert parts8["quantised_weights"] == pytest.approx(want)
    assert {k: v for k, v in parts8.items() if k != "quantised_weights"} == \
        {k: v for k, v in parts.items() if k != "quantised_weights"}
    # ZeRO-3 gathers layer by layer: only the two gathered layers' copies exist
    z3 = Layout(dp=8, zero=3)
    assert model_state_parts(m8, z3)["quantised_weights"] == pytest.approx(weight_cache_bytes(m8, 2, z3))
    # the re-cast after the step reads the bf16 weights (twice: amax) and writes the copies
    extra = boundary_times(m8, lay, 1, 8192, H100).optimizer - boundary_times(LLAMA, lay, 1, 8192, H100).optimizer
    recast = 2 * 2 * LLAMA.layers * LLAMA.linear_params() / 2 + want
    assert extra == pytest.approx(memory_bound_time(recast, H100), rel=1e-6)


def test_profiles_without_the_tensor_cores_refuse():
    check_gemm_format(fmt(LLAMA, "fp8-tensorwise"), H100)
    check_gemm_format(fmt(LLAMA, "mxfp8"), B200)
    with pytest.raises(MemoError, match="profile a100-sxm4-80gb .* has no fp8 peak"):
        check_gemm_format(fmt(LLAMA, "fp8-tensorwise"), A100)
    with pytest.raises(MemoError, match="has no mxfp8 peak .*Blackwell"):
        check_gemm_format(fmt(LLAMA, "mxfp8"), H100)


def test_metp_with_fp8_is_rejected_as_a_layout():
    why = check_layout(Layout(tp=2, sp=True, tp_mode="metp_ffn", dp=4), fmt(LLAMA, "fp8-tensorwise"), 8, 8, 8192)
    assert why and "METP" in why


def _invoke(args):
    return CliRunner().invoke(cli, args)


@pytest.mark.parametrize("args,words", [
    (["--profile", "a100-sxm4-80gb", "--precision", "fp8-tensorwise"], "has no fp8 peak"),
    (["--profile", "h100-sxm5-80gb", "--precision", "fp9"], "neither a recipe"),
    (["--profile", "h100-sxm5-80gb", "--precision", "fp8-tensorwise,mxfp8"], "two GEMM formats"),
    (["--profile", "h100-sxm5-80gb", "--precision", "fp8-tensorwise", "--framework", "megatron@2023"],
     "megatron@2023 does not offer fp8-tensorwise"),
])
def test_bad_precision_is_one_line_exit_2(args, words):
    r = _invoke(["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--no-plan", *args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], r.output


def test_torchtitans_float8_rowwise_plans_a_mixture_of_experts_and_a_dense_model():
    """torchtitan's Float8 at b5bcd76c converts the linears (Float8LinearConverter) and a MoE's grouped experts
    (Float8GroupedExpertsConverter, deepseek_v3_671b_float8's): both kinds plan in fp8-rowwise (an earlier version of
    this session refused the MoE on a misreading of float8.py; a review found the grouped converter)."""
    base = ["whatif", "--gpus", "16", "--seq", "4K", "--no-plan", "--profile", "h100-sxm5-80gb", "--framework",
            "torchtitan", "--precision", "fp8-rowwise", "--jobs", "1", "--simulate-top", "1",
            "--pp", "1", "--policy", "store_all"]  # no pipeline, one policy: the format is planned, not the search
    for model in ("qwen3-30b-a3b", "llama-3.1-8b"):
        r = _invoke(base + ["--model", model, "--layers", "2"])
        assert r.exit_code == 0 and "fp8-rowwise GEMMs" in r.output, r.output


def test_whatif_ranks_fp8_plans_faster_than_bf16_on_h100():
    base = ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--profile", "h100-sxm5-80gb",
            "--framework", "megatron", "--tp", "2", "--dp", "4", "--zero", "1", "--policy", "store_all", "--no-plan",
            "--json"]
    out = {}
    for p in ("bf16", "fp8-tensorwise", "zero,fp8-blockwise"):
        r = _invoke([*base, "--precision", p])
        assert r.exit_code == 0, r.output
        obj = json.loads(r.stdout)
        out[p] = obj
    assert out["fp8-tensorwise"]["model"]["gemm_format"] == "fp8-tensorwise"
    assert out["zero,fp8-blockwise"]["model"]["precision"] == "zero"
    it = {p: o["candidates"][0]["simulated_iteration_s"] for p, o in out.items()}
    assert it["fp8-tensorwise"] < 0.9 * it["bf16"]
    # the model FLOPs are the format's own: MFU counts them against the bf16 peak, so it rises with the speed
    assert out["fp8-tensorwise"]["candidates"][0]["simulated_mfu"] > out["bf16"]["candidates"][0]["simulated_mfu"]
    # the copies cost memory
    assert out["fp8-tensorwise"]["candidates"][0]["model_states_bytes"] > out["bf16"]["candidates"][0]["model_states_bytes"]


def test_fp8_plan_round_trip_export_and_executor_refusal(tmp_path):
    r = _invoke(["whatif", "--model", "llama-3.1-8b", "--layers", "2", "--gpus", "1", "--seq", "4K", "--profile",
                 "h100-sxm5-80gb", "--precision", "fp8-tensorwise", "--policy", "store_all", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    from memo_sim.plan import read_plan

    plan = read_plan(tmp_path / "plan.json")
    assert plan.model.gemm_format == "fp8-tensorwise"
    r = _invoke(["export", str(tmp_path / "plan.json"), "--to", "megatron", "--out", str(tmp_path / "mg")])
    assert r.exit_code == 0, r.output
    script = (tmp_path / "mg" / "megatron.sh").read_text()
    assert "--fp8-format hybrid" in script and "--fp8-recipe tensorwise" in script
    r = _invoke(["export", str(tmp_path / "plan.json"), "--to", "deepspeed", "--out", str(tmp_path / "ds"),
                 "--nearest"])
    assert r.exit_code == 0 and "fp8-tensorwise GEMMs" in r.output and "bf16 GEMMs" in r.output, r.output
    pytest.importorskip("torch")
    from memo_exec.errors import ExecError
    from memo_exec.runner import RunOptions, run_model

    assert run_model(plan, RunOptions(device="cpu")).gemm_format == "fp8-tensorwise"  # the executor runs it
    blockwise = dataclasses.replace(plan, model=dataclasses.replace(plan.model, gemm_format="fp8-blockwise"))
    assert run_model(blockwise, RunOptions(device="cpu")).gemm_format == "fp8-blockwise"  # since 2026-12-04
    with pytest.raises(ExecError, match="gemm_format mxfp8: the executor runs bf16, fp8-tensorwise, fp8-rowwise, "
                                        "fp8-blockwise GEMMs only"):
        run_model(dataclasses.replace(plan, model=dataclasses.replace(plan.model, gemm_format="mxfp8")),
                  RunOptions(device="cpu"))


def test_transformer_engine_keeps_the_quantised_inputs_for_backward():
    """Megatron-LM (TransformerEngine) keeps the FP8 copies of the GEMM inputs only the weight gradient
    reads (the norms' outputs, the FFN activation) and does not re-cast them in backward; memo's executor keeps the
    high-precision ones, as torchao's later Float8Linear does (torchtitan@2024-12's torchao, eab345c, saved the FP8
    copies too: tests/test_review_fixes_fsdp_dec1b.py)."""
    from memo_sim.cost.activations import skeletal_bytes
    from memo_sim.model.layer_graph import layer_tensors
    from memo_sim.search.frameworks import get_framework

    m8 = fmt(LLAMA, "fp8-tensorwise")
    te, ao = get_framework("megatron").for_model(m8), get_framework("any").for_model(m8)
    assert te.fp8_saved_inputs and not ao.fp8_saved_inputs
    assert {n: t.dtype_bytes for n, t in layer_tensors(te).items() if n in ("ln1", "ln2", "act", "attn", "fc1")} == \
        {"ln1": 1, "ln2": 1, "act": 1, "attn": 2, "fc1": 2}
    lay, seq = Layout(tp=1), 8192
    saved = skeletal_bytes(ao, lay, 1, seq)["total"] - skeletal_bytes(te, lay, 1, seq)["total"]
    # one byte less per element of the three; Megatron's output projection keeps the original attention output
    # (set_save_original_input, 2026-12-03: tests/test_review_fixes_dec3.py), so no copy of it is added
    assert saved == pytest.approx(seq * (2 * LLAMA.hidden + LLAMA.ffn))
    assert "attn_fp8" not in layer_tensors(te) and "attn_fp8" not in layer_tensors(ao)
    # where the projection keeps its own quantised input (TransformerEngine's Linear, torchao's Float8Linear), that
    # copy is kept beside the kernel's bf16 output (`layer_graph.fp8_attention_copy`, a review)
    kept = get_framework("torchtitan@2024-12").for_model(m8)
    assert layer_tensors(kept)["attn_fp8"].dtype_bytes == 1
    # bf16 models are untouched by the precision (the framework's offload copies are its own mechanism)
    assert replace(get_framework("megatron").for_model(LLAMA), offload_copies_per_group=False) == LLAMA
    b_te = _op(backward_costs(te, lay, 1, seq, H100), "fc2").seconds
    b_ao = _op(backward_costs(ao, lay, 1, seq, H100), "fc2").seconds
    assert b_ao - b_te == pytest.approx(memory_bound_op_time(m8.gemm.cast_bytes(seq * LLAMA.ffn, 2), H100))


def test_torchaos_float8_tp_gathers_the_quantised_inputs_and_megatrons_does_not():
    """torchtitan@2024-12 (torchao's Float8ColwiseParallel / PrepareFloat8ModuleInput) all-gathers a
    column-parallel GEMM's input as its float8 copy in the forward, and (Float8RowwiseParallel's
    NoopFwToFloat8BwDynamic) a row-parallel GEMM's output gradient as its e5m2 copy in the backward; the other
    backward collectives (the reduce-scatters, the weight gradients' input re-gathers) and Megatron's
    (TransformerEngine's FP8 gathers are not modelled) stay in the model dtype."""
    from memo_sim.search.frameworks import get_framework

    m8 = fmt(LLAMA, "fp8-tensorwise")
    ao, te = get_framework("torchtitan@2024-12").for_model(m8), get_framework("megatron").for_model(m8)
    assert ao.fp8_sp_gathers and not te.fp8_sp_gathers
    assert not get_framework("torchtitan@2024-12").for_model(LLAMA).fp8_sp_gathers  # bf16 models untouched
    lay, seq = Layout(tp=8, sp=True), 8192
    for phase in (forward_costs, backward_costs):
        a = {c.name: c.nbytes for c in phase(ao, lay, 1, seq, H100) if c.stream == "comm"}
        t = {c.name: c.nbytes for c in phase(te, lay, 1, seq, H100) if c.stream == "comm"}
        assert a.keys() == t.keys()
        for name in a:
            fp8 = name.startswith("allgather") and (phase is forward_costs
                                                    or name in ("allgather_out_proj", "allgather_fc2"))
            assert a[name] == pytest.approx(t[name] / 2 if fp8 else t[name], rel=1e-6), name


def test_torchaos_float8_casts_the_weights_at_every_use_and_keeps_no_copy():
    """torchtitan's Float8Linear (torchao's matmul_with_hp_or_float8_args) saves the high-precision weight and casts
    it in each GEMM's forward, recompute and backward: no FP8 weight copy in the model states and no re-cast after
    the optimizer step, where TransformerEngine (megatron) keeps the copies (a review: a torchtitan FP8 plan of
    Llama-3.1-8B was charged 13 GiB of copies torchao does not keep and refused as OOM)."""
    from memo_sim.cost.gemm_format import weight_recast_bytes
    from memo_sim.model.layer_graph import forward_ops
    from memo_sim.search.frameworks import get_framework

    m8 = fmt(LLAMA, "fp8-rowwise")
    ao, cached = get_framework("torchtitan").for_model(m8), get_framework("any").for_model(m8)
    assert ao.fp8_weights_per_use and not cached.fp8_weights_per_use
    assert not get_framework("torchtitan").for_model(LLAMA).fp8_weights_per_use  # bf16 models untouched
    lay, seq = Layout(tp=2, sp=True), 8192
    assert model_state_parts(ao, lay)["quantised_weights"] == 0 == weight_recast_bytes(ao, LLAMA.layers, lay)
    assert model_state_parts(cached, lay)["quantised_weights"] == weight_cache_bytes(cached, LLAMA.layers, lay) > 0
    i, o = next(op.gemm for op in forward_ops(LLAMA) if op.name == "fc2")  # row-parallel: its input split by TP
    w = m8.gemm.cast_bytes(i / lay.tp * o, 2, weight=True)
    for phase in (forward_costs, backward_costs):  # one weight cast more in each, per GEMM
        a, c = _op(phase(ao, lay, 1, seq, H100), "fc2").seconds, _op(phase(cached, lay, 1, seq, H100), "fc2").seconds
        assert a - c == pytest.approx(memory_bound_op_time(w, H100), rel=1e-9), phase


def test_framework_files_carry_their_precision_and_layout_settings():
    from memo_sim.search.frameworks import FRAMEWORKS

    got = {n: (f.gemm_formats, f.fp8_saved_inputs, f.optimizer_offload, f.uneven_stages, dict(f.recipes))
           for n, f in FRAMEWORKS.items()}
    # TransformerEngine has no rowwise recipe (its current scaling is tensorwise)
    assert got["megatron"] == (tuple(f for f in GEMM_FORMATS if f != "fp8-rowwise"), True, True, True, {"fp16": "zero"})
    # at b5bcd76c torchtitan's Float8 recipes are rowwise only (fp8-rowwise, grouped experts too), and its
    # generated stage split takes lighter first / last stages (configs.py
    # pipeline_parallel_first/last_stage_less_layers)
    # and NVFP4 (torchtitan/components/quantization/nvfp4.py NVFP4LinearConverter, a review)
    assert got["torchtitan"] == (("bf16", "fp8-rowwise", "mxfp8", "nvfp4"), False, False, True, {})
    assert got["any"] == (GEMM_FORMATS, False, True, True, {})
    assert got["deepspeed"] == (("bf16",), False, True, False, {"fp16": "zero", "bf16": "zero"})
    assert got["megatron@2021"] == (("bf16",), False, False, False, {"fp16": "zero"})


def test_a_formats_own_gemm_curve_in_a_profile_names_a_registered_format():
    # efficiency.gemm_formats: measured curves keyed by GEMM format; a key no format has would never be read
    from memo_sim.profile.loader import list_profiles  # noqa: PLC0415

    seen = 0
    for name in list_profiles():
        for key, curve in load_profile(name).efficiency.gemm_formats:
            assert key in GEMM_FORMATS and key != "bf16", (name, key)
            assert 0 < curve(1e12) <= 1
            seen += 1
    assert seen >= 3  # the three Hopper profiles carry the measured fp8-tensorwise curve


def test_a_profile_naming_no_gemm_format_is_one_line(tmp_path):
    import yaml  # noqa: PLC0415

    raw = yaml.safe_load(open(H100.path))
    curves = raw["efficiency"]["gemm_formats"]
    curves["fp8_tensorwise"] = curves.pop("fp8-tensorwise")  # the underscore a user would type
    p = tmp_path / "typo.yaml"
    p.write_text(yaml.safe_dump({**raw, "name": "typo"}))
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--profile", str(p),
                                 "--no-plan"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "efficiency.gemm_formats.fp8_tensorwise" in lines[0] and "fp8-tensorwise" in lines[0]



@pytest.mark.parametrize("name", ["fp8-blockwise", "fp8-rowwise"])
@pytest.mark.parametrize("profile", ["h100-sxm5-80gb", "h200-141gb", "h100-sxm5-96gb-500w", "no-curve"])
def test_blockwise_gemms_are_no_faster_than_tensorwise_on_hopper(profile, name):
    """A user's review (2026-11-27): blockwise FP8 priced on the bf16 curve's fractions of the FP8 peak ran its
    GEMMs faster than the measured tensorwise curve on every Hopper profile; its kernels do tensorwise's MMAs
    and more, so they run no faster (the casts differ: blockwise's scales need no amax pass). Since 2026-12-04
    the Hopper profiles carry their own curves (measured against tensorwise in one run); a profile without them
    (``no-curve``: the H100's with the two curves dropped) still runs them no faster."""
    if profile == "no-curve":
        prof = load_profile("h100-sxm5-80gb")
        kept = tuple((n, c) for n, c in prof.efficiency.gemm_formats if n == "fp8-tensorwise")
        prof = dataclasses.replace(prof, efficiency=dataclasses.replace(prof.efficiency, gemm_formats=kept))
        assert prof.efficiency.gemm_curve(name) is prof.efficiency.gemm
    else:
        prof = load_profile(profile)
        assert prof.efficiency.gemm_curve(name) is not prof.efficiency.gemm
    for seq in (2048, 8192, 32768):
        tw = _op(forward_costs(fmt(LLAMA, "fp8-tensorwise"), Layout(tp=1), 1, seq, prof), "fc1")
        bw = _op(forward_costs(fmt(LLAMA, name), Layout(tp=1), 1, seq, prof), "fc1")
        cast = {n: memory_bound_op_time(fmt(LLAMA, n).gemm.cast_bytes(seq * LLAMA.hidden, 2), prof)
                for n in ("fp8-tensorwise", name)}
        assert bw.seconds - cast[name] >= (tw.seconds - cast["fp8-tensorwise"]) * (1 - 1e-9)


def test_the_executors_fp8_refusals_name_a_plan_it_runs():
    """A review: a megatron FP8 plan was told to plan with --framework torchtitan, which offers no format the executor
    runs, and a torchtitan fp8-rowwise plan to plan with fp8-tensorwise, which torchtitan refuses: every refusal
    names the ways to a plan it runs (fp8-tensorwise under --framework any, whose plans it accepts; torchtitan@2024-12's
    torchao keeps FP8 inputs since the FSDP review of 2026-12-01)."""
    from memo_sim.plan.executor_scope import gemm_why_not
    from memo_sim.search.frameworks import get_framework

    lay = Layout(tp=1)
    for fw, f, ok in (("megatron", "fp8-tensorwise", "fp8-tensorwise"), ("torchtitan", "fp8-rowwise", "fp8-rowwise"),
                      ("megatron", "fp8-blockwise", "fp8-blockwise"), ("megatron", "mxfp8", "fp8-tensorwise")):
        why = gemm_why_not(get_framework(fw).for_model(fmt(LLAMA, f)), lay, "single_stage")
        assert why and why.endswith(f"plan with --precision bf16, or {ok} under --framework any, to run it"), why
        # and that plan runs
        assert gemm_why_not(get_framework("any").for_model(fmt(LLAMA, ok)), lay, "single_stage") is None
    per_use = dataclasses.replace(fmt(LLAMA, "fp8-tensorwise"), fp8_weights_per_use=True)
    assert "fp8_weights_per_use" in gemm_why_not(per_use, lay, "single_stage")
    assert gemm_why_not(get_framework("any").for_model(fmt(LLAMA, "fp8-tensorwise")), lay, "single_stage") is None
    # torchtitan@2024-12's torchao (eab345c) keeps the FP8 copies of the GEMM inputs, which the executor does not
    why = gemm_why_not(get_framework("torchtitan@2024-12").for_model(fmt(LLAMA, "fp8-tensorwise")), lay,
                       "single_stage")
    assert why and "fp8_saved_inputs" in why


def test_a_routed_experts_grouped_gemm_pays_its_casts_once_over_its_tokens():
    """The dense GEMMs paid their FP8 casts, the experts' grouped GEMMs none; now each cast is one kernel over the
    rank's routed rows (the permuted buffer), not one per expert (a launch each: 32 local experts made DeepSeek-V3's
    FP8 layer slower than its casts' bytes say)."""
    from memo_sim.cost import moe
    from memo_sim.cost.gemm_format import cast_seconds, layer_gemm_time
    from memo_sim.model.layer_graph import forward_ops

    ds = fmt(PRESETS["deepseek-v3"], "fp8-tensorwise")
    lay = Layout(tp=2, sp=True, ep=8, dp=8)
    op = next(o for o in forward_ops(ds) if o.name == "expert_fc1")
    local, m, k, n = moe.expert_gemm_shape(op, ds, lay, 1, 4096)
    assert local == 32
    fwd = moe.expert_gemm_cost(op, ds, lay, 1, 4096, H100, "fwd").seconds
    assert fwd - local * layer_gemm_time(ds, H100, m, k, n) == pytest.approx(cast_seconds(ds, H100, local * m * k))
    bf16 = moe.expert_gemm_cost(op, PRESETS["deepseek-v3"], lay, 1, 4096, H100, "fwd").seconds
    assert bf16 == pytest.approx(local * layer_gemm_time(PRESETS["deepseek-v3"], H100, m, k, n))


# ---------------------------------------------------------------------------------------------------- NVFP4
def test_nvfp4_elements_are_half_a_byte_with_an_e4m3_scale_per_16():
    """NVFP4 (TransformerEngine's NVFP4BlockScaling): E2M1 elements (half a byte), an E4M3 scale (one byte) per 16
    elements, two copies (row-wise and the transposed column-wise one: TN only), at the profile's FP4 peak; its two
    copies (half a byte and a sixteenth of a scale byte an element) are smaller than MXFP8's."""
    n = 128 * 1024
    nv = gemm_format("nvfp4")
    assert nv.peak == "fp4" and nv.element_bytes == 0.5 and nv.scale_bytes == 1 and nv.scale_block == 16
    assert nv.quantised_bytes(n) == 2 * (n / 2 + n / 16) < gemm_format("mxfp8").quantised_bytes(n)


def test_nvfp4_gemms_run_at_the_fp4_peak_and_megatron_keeps_half_byte_inputs():
    """The layer GEMMs at the B200's dense FP4 rate (four times its bf16 one) plus their casts; Megatron's
    TransformerEngine keeps half-byte copies with their scales of the inputs a weight gradient reads; the H100 has
    no FP4 tensor cores."""
    from memo_sim.model.layer_graph import layer_tensors
    from memo_sim.search.frameworks import get_framework

    lay, seq = Layout(tp=1), 65536
    nv = fmt(LLAMA, "nvfp4")
    bf = _op(forward_costs(LLAMA, lay, 1, seq, B200), "fc1")
    f4 = _op(forward_costs(nv, lay, 1, seq, B200), "fc1")
    cast = memory_bound_op_time(nv.gemm.cast_bytes(seq * LLAMA.hidden, 2), B200)
    # the B200's dense FP4 rate (9,000 TFLOP/s) against its bf16 one (2,250), the same fractions of peak (no FP4
    # curve measured: the bf16 GEMM curve's, an assumption the profile's sensitivity line covers)
    assert B200.peak("fp4") == 4 * B200.peak("bf16")
    assert f4.seconds - cast == pytest.approx(bf.seconds / 4, rel=1e-6)
    mx = _op(forward_costs(fmt(LLAMA, "mxfp8"), lay, 1, seq, B200), "fc1")
    assert f4.seconds < mx.seconds
    # TransformerEngine keeps the quantised copy of a GEMM input for the weight gradient: half a byte an element and
    # an E4M3 scale per 16 (MXFP8: a byte and an E8M0 scale per 32)
    meg = get_framework("megatron").for_model(nv)
    assert meg.fp8_saved_inputs and layer_tensors(meg)["ln1"].dtype_bytes == 0.5 + 1 / 16
    assert layer_tensors(get_framework("megatron").for_model(fmt(LLAMA, "mxfp8")))["ln1"].dtype_bytes == 1 + 1 / 32
    with pytest.raises(MemoError, match="profile h100-sxm5-80gb .* has no fp4 peak .*FP4 tensor cores"):
        check_gemm_format(nv, H100)
    check_gemm_format(nv, B200)


@pytest.mark.parametrize("args,words", [
    (["--profile", "h100-sxm5-80gb"], "has no fp4 peak"),
    (["--profile", "b200-180gb", "--framework", "megatron@2023"], "megatron@2023 does not offer nvfp4"),
])
def test_nvfp4_where_it_does_not_run_is_one_line_exit_2(args, words):
    r = _invoke(["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--no-plan", "--precision",
                 "nvfp4", *args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], r.output


def test_nvfp4_plan_exports_megatrons_fp4_options_and_the_executor_refuses_it(tmp_path):
    from memo_sim.export import export_plan
    from memo_sim.plan.schema import read_plan
    from memo_sim.plan.executor_scope import gemm_why_not

    r = _invoke(["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--profile", "b200-180gb",
                 "--precision", "nvfp4", "--framework", "megatron", "--out", str(tmp_path),
                 "--pp", "1", "--policy", "store_all", "--simulate-top", "1"])  # the search's best plan, found alone
    assert r.exit_code == 0, r.output
    plan = read_plan(tmp_path / "plan.json")
    assert plan.model.gemm_format == "nvfp4"
    script = export_plan(plan, "megatron", price=False).files["megatron.sh"]
    assert "--fp4-format e2m1" in script and "--fp4-recipe nvfp4" in script and "--fp8-" not in script
    why = gemm_why_not(plan.model, plan.layout, plan.schedule)
    assert why.startswith("plan model llama-3.1-8b: gemm_format nvfp4: the executor runs bf16, fp8-tensorwise")


def test_nvfp4_rotated_columnwise_cast_reads_again_and_saved_copies_carry_their_scales():
    """A review of the first NVFP4 pricing: TransformerEngine writes an input's or an output gradient's Hadamard-
    rotated column-wise copy in a kernel of its own (three reads: the amaxes, the row-wise cast, the rotated
    column-wise cast), a weight's copies in one cast (two reads); the 2D weight scales are stored per 16 elements
    of each copy; the copy kept for the weight gradient carries its scales (every block-scaled format)."""
    n = 128 * 1024
    nv = gemm_format("nvfp4")
    assert nv.cast_bytes(n, 2) == 3 * 2 * n + 2 * (n / 2 + n / 16)
    assert nv.cast_bytes(n, 2, weight=True) == 2 * 2 * n + 2 * (n / 2 + n / 16)
    assert nv.quantised_bytes(n, weight=True) == nv.quantised_bytes(n) == 2 * (n / 2 + n / 16)
    assert gemm_format("fp8-tensorwise").cast_bytes(n, 2) == gemm_format("fp8-tensorwise").cast_bytes(n, 2, True)
    saved = {f: gemm_format(f).saved_element_bytes for f in GEMM_FORMATS}
    assert saved == {"bf16": 0.0, "fp8-tensorwise": 1.0, "fp8-rowwise": 1.0, "fp8-blockwise": 1 + 4 / 128,
                     "mxfp8": 1 + 1 / 32, "nvfp4": 0.5 + 1 / 16}


@pytest.mark.parametrize("name", ["fp8-tensorwise", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("tp", [1, 2])
def test_the_gradients_of_quantised_saved_inputs_are_in_the_model_dtype(name, tp):
    """A review: the backward trace sized d_ln1, d_ln2 and d_act as the quantised copies the layer keeps of ln1, ln2
    and act (TransformerEngine's), a half (FP8) or a quarter (NVFP4) of the bf16 gradients the kernels write; under
    TP with sequence parallelism d_ln1 and d_ln2 are the reduce-scatters of full-length partial sums, each the
    rank's shard in the model dtype (a second review: that path kept the quantised size)."""
    from memo_sim.memplan.trace_gen import layer_backward_trace
    from memo_sim.model.layer_graph import layer_tensors
    from memo_sim.search.frameworks import get_framework

    meg = get_framework("megatron").for_model(fmt(LLAMA, name))
    assert meg.fp8_saved_inputs
    tokens = 8192
    sizes = {b.name: b.size for b in layer_backward_trace(meg, Layout(tp=tp, sp=True), 1, tokens).buffers}
    for t, width in (("ln1", LLAMA.hidden / tp), ("ln2", LLAMA.hidden / tp), ("act", LLAMA.ffn / tp)):
        assert layer_tensors(meg)[t].dtype_bytes == meg.gemm.saved_element_bytes < 2
        assert sizes[f"d_{t}"] == pytest.approx(tokens * width * 2, rel=1e-3), (t, sizes[f"d_{t}"])
    if tp > 1:
        assert sizes["d_ln1_partial"] == sizes["d_ln2_partial"] == pytest.approx(tokens * LLAMA.hidden * 2, rel=1e-3)


@pytest.mark.parametrize("name", ["fp8-tensorwise", "nvfp4"])
def test_norm_and_activation_kernels_move_the_model_dtype_where_the_layer_keeps_quantised_inputs(name):
    """A second review: under Megatron's kept quantised inputs the norms and the activation were priced writing the
    kept copy's bytes, though they write the model dtype and the GEMM's cast reads it: their time is the bf16 run's
    (the casts are priced apart, `gemm_cast_seconds`)."""
    from memo_sim.search.frameworks import get_framework

    lay, seq, prof = Layout(tp=1), 8192, B200
    meg = get_framework("megatron").for_model(fmt(LLAMA, name))
    bf = get_framework("megatron").for_model(LLAMA)
    for phase_costs in (forward_costs, backward_costs):
        for op in ("ln1", "ln2", "act"):
            assert _op(phase_costs(meg, lay, 1, seq, prof), op).seconds == \
                pytest.approx(_op(phase_costs(bf, lay, 1, seq, prof), op).seconds, rel=1e-9), (phase_costs, op)
