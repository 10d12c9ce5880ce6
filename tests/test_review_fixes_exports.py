"""A review of `memo-sim export`: DeepSpeed's flash attention and Ulysses degree, torchtitan's async TP, token
dispatcher and uneven model chunks, Megatron-LM's FP8 formats and the --nearest script's header. Each test failed
on the code before the fixes."""

import ast
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.errors import MemoError
from memo_sim.export import export_plan
from memo_sim.export.base import PlanChange, nearest_batch, nearest_plan
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import get_model
from memo_sim.plan.schema import Plan, write_plan
from memo_sim.policy import get_policy
from memo_sim.search.frameworks import get_framework
from tests.test_export import _names  # name -> kind of a checked-in option list

DATA = Path(__file__).parent / "data" / "export"
PROFILE = "h100-sxm5-80gb"




def _plan(layout: Layout, model="llama-3.1-8b", batch=1, seq=16384, policy=("full_recompute",), sched="",
          framework="megatron", profile=PROFILE) -> Plan:
    m = get_model(model) if isinstance(model, str) else model
    return Plan(model=m, batch=batch, seq_tokens=seq, gpus=layout.gpus, layout=layout, policy=get_policy(*policy),
                profile=profile, predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2}, micro_batch=1, schedule=sched, framework=framework)


def _launch_words(script: str) -> list[str]:
    return [w for ln in script.splitlines() if ln.startswith("    ") for w in ln.rstrip(" \\").split()]


# 1. DeepSpeed: flash attention


def test_deepspeed_export_turns_on_flash_attention_with_a_listed_flag():
    """Megatron-DeepSpeed's attention flags are off by default and its CoreAttention holds the s x s scores: the
    launch line turns on FlashAttention-2, the kernel memo's deepspeed data prices (no flash flag was written)."""
    plan = _plan(Layout(ulysses=8), model="gpt-7b", seq=65536, framework="deepspeed", profile="a800-80gb")
    words = _launch_words(export_plan(plan, "deepspeed", price=False).files["deepspeed.sh"])
    assert "--use-flash-attn-v2" in words
    assert _names("deepspeed_launcher_options.txt")["--use-flash-attn-v2"] == "flag"
    assert get_framework("deepspeed").mechanism("attention") == "flash"


def test_deepspeed_export_names_a_plans_other_attention_kernel():
    """A plan priced with cuDNN's attention (Megatron's on an H100 profile with its curves) is written with
    FlashAttention-2, and the file says so."""
    plan = _plan(Layout(ulysses=8, attention="cudnn"), seq=65536)
    assert plan.priced_attention_kernel() == "cudnn"
    ex = export_plan(plan, "deepspeed", price=False, nearest=True)
    gap = next(g for g in ex.gaps if "attention" in g.what)
    assert "cuDNN" in gap.what and "--use-flash-attn-v2" in gap.nearest and gap.change == PlanChange()
    flash = export_plan(_plan(Layout(ulysses=8), seq=65536), "deepspeed", price=False, nearest=True)
    assert not any("attention kernel" in g.what for g in flash.gaps)


# 2. DeepSpeed: Ulysses within the heads


def test_deepspeed_ulysses_beyond_the_heads_is_capped_the_rest_data_parallel():
    """TP 8 x CP 8 of a 32-head model is Ulysses over 64 GPUs, which Megatron-DeepSpeed refuses
    (num_attention_heads % sequence-parallel size): with 2 sequences a step, Ulysses 32 and 2 replicas."""
    plan = _plan(Layout(tp=8, sp=True, cp=8), batch=2, seq=524288)
    ex = export_plan(plan, "deepspeed", price=False, nearest=True)
    lay, _, _ = nearest_plan(plan, ex.gaps)
    assert (lay.tp, lay.cp, lay.ulysses, lay.dp) == (1, 1, 32, 2) and nearest_batch(plan, ex.gaps) == 1
    gap = next(g for g in ex.gaps if "cannot run" in g.what)
    assert "heads (32)" in gap.what and "dp 2" in gap.nearest
    one = replace(get_framework("deepspeed").adapt(lay), pp=1)
    assert check_layout(one, plan.model, 64, 64, plan.seq_tokens, 1) is None
    assert "--ds-sequence-parallel-size 32" in ex.files["deepspeed.sh"]
    assert '"train_batch_size": 2' in ex.files["ds_config.json"]


def test_deepspeed_ulysses_beyond_the_heads_without_sequences_to_split_is_refused_in_one_line(tmp_path):
    """With one sequence a step no DeepSpeed layout of the 64 GPUs runs the plan: refused in one line naming the heads
    (exit 2), with --nearest and without (the search's words blamed ring context parallelism)."""
    plan = _plan(Layout(tp=8, sp=True, cp=8), batch=1, seq=524288)
    with pytest.raises(MemoError, match=r"heads \(32\)"):
        export_plan(plan, "deepspeed", price=False, nearest=True)
    path = write_plan(plan, tmp_path / "plan.json")
    for extra in (["--nearest"], [], ["--no-progress"]):
        r = CliRunner().invoke(cli, ["export", str(path), "--to", "deepspeed", "--out", str(tmp_path / "x"),
                                     "--no-price", *extra])
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        # without --nearest the framework's best plan is searched first (2026-12-02), announced on its own line
        # unless --no-progress, and found to be none either
        assert len(lines) == (2 if not extra else 1) and "heads (32)" in lines[-1], r.output
        assert ("the what-if constrained to --framework deepspeed" in lines[-1]) == (extra != ["--nearest"])
        assert "ring context parallelism" not in r.output
    assert not (tmp_path / "x").exists()


# 3. torchtitan: async TP in the latest data


def test_latest_torchtitan_runs_async_tp_as_its_export_writes():
    """torchtitan at b5bcd76c has CompileConfig.enable_async_tensor_parallel, which its export writes: its data offers
    async TP too (the what-if refused it: 'torchtitan runs TP as megatron'); torchtitan@2024-12's is unchanged."""
    assert "async_tp" in get_framework("torchtitan").tp_modes
    assert get_framework("torchtitan@2024-12").tp_modes == ("megatron", "async_tp")
    lay = Layout(tp=2, sp=True, dp=4, zero=3, dp_mode="fsdp", tp_mode="async_tp")
    assert get_framework("torchtitan").allows(lay)
    ex = export_plan(_plan(lay, batch=2, framework="torchtitan"), "torchtitan", price=False)
    # async TP expressed; what is written otherwise is only that its blocks are compiled (the plan priced them
    # hand-fused: a review found the export turning compile on unsaid)
    assert ex.instead is None
    assert [g.what for g in ex.gaps if "async" in g.what] == [
        "async TP in blocks priced uncompiled (memo's hand-fused kernels, kernel_fusion fused)"]
    assert "config.compile.enable_async_tensor_parallel = True" in ex.files["memo_torchtitan.py"]


# 4. torchtitan: the token dispatcher


def test_torchtitan_nearest_lists_and_prices_an_allgather_dispatcher_as_all_to_all():
    model = replace(get_model("mixtral-8x7b"), layers=4)
    plan = _plan(Layout(tp=2, sp=True, ep=8, dp=8, zero=1, moe_dispatcher="allgather"), model=model, batch=1)
    ex = export_plan(plan, "torchtitan", price=False, nearest=True)
    gap = next(g for g in ex.gaps if "dispatcher" in g.what)
    assert gap.what == "the allgather token dispatcher" and "all-to-all" in gap.nearest
    assert gap.change == PlanChange(layout={"moe_dispatcher": "alltoall"})
    assert nearest_plan(plan, ex.gaps)[0].moe_dispatcher == "alltoall"


# 5. Megatron-LM: FP8 formats


@pytest.mark.parametrize("fmt, fp8_format", [("fp8-tensorwise", "hybrid"), ("fp8-blockwise", "e4m3"),
                                             ("mxfp8", "e4m3")])
def test_megatron_fp8_format_is_e4m3_for_the_block_scaled_recipes(fmt, fp8_format):
    """TransformerEngine's Float8BlockScaling and MXFP8BlockScaling are E4M3 everywhere, as memo prices them; hybrid
    (E5M2 gradients) is tensorwise current scaling's alone (hybrid was written for all three)."""
    model = replace(get_model("llama-3.1-8b"), gemm_format=fmt)
    plan = _plan(Layout(tp=2, sp=True, dp=4, zero=1), model=model, batch=2, policy=("store_all",),
                 profile="b200-180gb" if fmt == "mxfp8" else PROFILE)
    words = _launch_words(export_plan(plan, "megatron", price=False, nearest=True).files["megatron.sh"])
    assert words[words.index("--fp8-format") + 1] == fp8_format
    assert fp8_format in _names("megatron_options.txt")["--fp8-format"].split("|")


# 6. torchtitan: uneven model chunks


def test_torchtitan_writes_uneven_interleaved_chunks_as_module_fqns_per_model_part():
    """Chunks of 1, 6, 6, 3, 1, 6, 6, 3 layers (the review's: first stage 2, last 6, pp 4 x vpp 2) are torchtitan's
    module_fqns_per_model_part, its Decoder's module names, virtual stages in order (it was a gap, not written)."""
    lay = Layout(tp=2, sp=True, pp=4, vpp=2, dp=2, zero=3, dp_mode="fsdp", reshard_after_forward=False,
                 first_stage_layers=2, last_stage_layers=6)
    plan = _plan(lay, batch=16, sched="interleaved_1f1b", framework="torchtitan")
    ex = export_plan(plan, "torchtitan", price=False, nearest=True)
    assert not any("uneven" in g.what for g in ex.gaps)
    tree = ast.parse(ex.files["memo_torchtitan.py"])
    sets = {ast.unparse(n.targets[0]): n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)}
    parts = ast.literal_eval(sets["config.parallelism.module_fqns_per_model_part"])
    assert "config.parallelism.pipeline_parallel_layers_per_stage" not in sets
    ranges = lay.virtual_stage_ranges(32)
    assert [[f"layers.{i}" for i in r] for r in ranges] == [[n for n in p if n.startswith("layers.")] for p in parts]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    listed = [ln.split(" ") for ln in (DATA / "torchtitan_names.txt").read_text().splitlines() if ln.startswith("set ")]
    assert ["set", "parallelism.module_fqns_per_model_part", "fqns"] in listed


# 7. Megatron-LM: the --nearest script's header


def test_megatron_nearest_script_header_names_the_plan_and_the_layout_written():
    """--nearest writes Ulysses beside ring CP as Megatron's hierarchical CP and MEMO's policy as full recompute: the
    header named the plan's layout only, above a script of another."""
    plan = _plan(Layout(tp=2, sp=True, ulysses=2, dp=2, zero=2), batch=2, seq=8192, policy=("memo", 0.5))
    ex = export_plan(plan, "megatron", price=False, nearest=True)
    lay, pol, _ = nearest_plan(plan, ex.gaps)
    head = [ln for ln in ex.files["megatron.sh"].splitlines() if ln.startswith("# the plan:") or
            ln.startswith("# written")]
    assert len(head) == 2 and plan.layout.label() in head[0] and plan.policy.label() in head[0]
    assert lay.label() in head[1] and pol.label() in head[1] and "full_recompute" in head[1]
    assert lay.label() != plan.layout.label()
