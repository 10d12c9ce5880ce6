"""Review fixes of 2026-12-03: a plan's policy is checked against its model and layout by every command that reads the
plan, before anything runs (`memo_sim.search.plan_check.layout_problem`), as the what-if leaves such a pair out: a
hand-made plan of selective recompute on METP was refused by memo-exec only after its ranks had started."""

import json

from click.testing import CliRunner

from memo_exec.cli import cli as exec_cli
from memo_sim.cli import cli


def _metp_plan(tmp_path, policy: str):
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--layers", "4", "--gpus", "2", "--seq", "4K", "--tp",
                                 "2", "--tp-mode", "metp_ffn", "--policy", "full_recompute", "--out",
                                 str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "p" / "plan.json").read_text())
    d["policy"]["policy"] = policy
    f = tmp_path / f"{policy}.json"
    f.write_text(json.dumps(d))
    return f


def _one_line(r):
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.output
    return lines[0]


def test_selective_recompute_on_metp_is_refused_before_the_ranks_start(tmp_path):
    f = _metp_plan(tmp_path, "selective_recompute")
    line = _one_line(CliRunner().invoke(exec_cli, ["run", str(f), "--device", "cpu", "--nproc", "2"]))
    assert "policy: Megatron-LM's selective recompute" in line and "tp_mode megatron" in line and "launcher.log" not in line
    line = _one_line(CliRunner().invoke(cli, ["check-plan", str(f)]))
    assert "tp_mode metp_ffn does not have" in line
    line = _one_line(CliRunner().invoke(cli, ["simulate", str(f), "--out", str(tmp_path / "sim")]))
    assert "selective recompute" in line


def test_megatrons_module_offload_on_metp_is_refused_in_one_line(tmp_path):
    f = _metp_plan(tmp_path, "offload_attn")
    line = _one_line(CliRunner().invoke(exec_cli, ["run", str(f), "--device", "cpu", "--nproc", "2"]))
    assert "--offload-modules" in line and "tp_mode megatron" in line


def test_a_plan_without_its_schedule_runs_the_schedule_its_virtual_stages_name(tmp_path):
    """A plan of earlier releases has no ``schedule``: with virtual stages (vpp > 1) it is the interleaved 1F1B's
    (a review: such a plan, its schedule deleted, was refused as '1f1b' by every command)."""
    from memo_sim.layout.schedule import default_schedule
    from memo_sim.plan.schema import read_plan

    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--layers", "8", "--gpus", "2", "--seq", "4K", "--pp",
                                 "2", "--vpp", "2", "--schedule", "interleaved_1f1b", "--global-batch", "4",
                                 "--policy", "store_all", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert d.pop("schedule") == "interleaved_1f1b"
    f = tmp_path / "old.json"
    f.write_text(json.dumps(d))
    assert read_plan(f).schedule == "interleaved_1f1b"
    r = CliRunner().invoke(cli, ["check-plan", str(f)])
    assert r.exit_code == 0, r.output
    assert default_schedule(2, "memo") == "1f1b" and default_schedule(1, "memo", 1) == "single_stage"


def test_a_dense_plan_with_a_policy_for_experts_is_refused_by_every_command(tmp_path):
    """A plan edited to a policy that rebuilds or moves a mixture of experts' tensors on a dense model: one line,
    exit 2, from check-plan, simulate, export and memo-exec (a review: all but the what-if accepted it)."""
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--layers", "4", "--gpus", "1", "--seq", "4K",
                                 "--policy", "store_all", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "p" / "plan.json").read_text())
    for pol in ("offload_attn_experts", "recompute_moe"):
        d["policy"]["policy"] = pol
        f = tmp_path / f"{pol}.json"
        f.write_text(json.dumps(d))
        for args in (["check-plan", str(f)], ["simulate", str(f), "--out", str(tmp_path / f"s-{pol}")],
                     ["export", str(f), "--to", "megatron", "--no-price", "--out", str(tmp_path / f"e-{pol}")]):
            line = _one_line(CliRunner().invoke(cli, args))
            assert f"{pol} acts on a mixture of experts' tensors: model gpt-7b" in line, (args, line)
        line = _one_line(CliRunner().invoke(exec_cli, ["run", str(f), "--device", "cpu"]))
        assert "has no experts" in line


def test_megatrons_output_projection_keeps_the_original_attention_output_under_fp8():
    """Megatron-LM at d98e8a64 has the output projection save its original input for every FP8 recipe but delayed
    (set_save_original_input, attention.py): no quantised copy of the attention output is kept, and the weight
    gradient casts it again; torchao's Float8Linear (torchtitan@2024-12) keeps its copy (a review found the copy
    counted for Megatron)."""
    from dataclasses import replace

    from memo_sim.api import Layout, get_model, load_profile
    from memo_sim.cost.activations import layer_tensor_bytes
    from memo_sim.cost.layer_time import backward_costs
    from memo_sim.search.frameworks import get_framework

    m = replace(get_model("llama-3.1-8b"), gemm_format="fp8-tensorwise")
    meg, tt = (get_framework(f).for_model(m) for f in ("megatron", "torchtitan@2024-12"))
    lay = Layout(tp=8, sp=True)
    assert "attn_fp8" not in layer_tensor_bytes(meg, lay, 1, 8192)
    assert layer_tensor_bytes(tt, lay, 1, 8192)["attn_fp8"] > 0
    prof = load_profile("h100-sxm5-80gb")

    def proj(model):
        return next(c.seconds for c in backward_costs(model, lay, 1, 8192, prof) if c.name == "out_proj")

    assert proj(meg) > proj(replace(meg, fp8_attention_copy=True))  # the cast again for the weight gradient


def test_every_command_refuses_an_experts_policy_on_a_dense_plan_sweep_seq_and_trace_too(tmp_path):
    """sweep-seq --policy recompute_moe on a dense plan priced it, and memo-exec trace recorded it and wrote a plan
    every other command refuses (a review)."""
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--layers", "4", "--gpus", "1", "--seq", "4K",
                                 "--policy", "store_all", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    plan = tmp_path / "p" / "plan.json"
    line = _one_line(CliRunner().invoke(cli, ["sweep-seq", str(plan), "--out", str(tmp_path / "s"), "--seqs", "4K",
                                              "--policy", "recompute_moe", "--jobs", "1"]))
    assert "acts on a mixture of experts' tensors" in line and not (tmp_path / "s").exists()
    d = json.loads(plan.read_text())
    d["policy"]["policy"] = "recompute_moe"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    line = _one_line(CliRunner().invoke(exec_cli, ["trace", str(bad), "--device", "meta", "--out",
                                                   str(tmp_path / "t.json"), "--write-plan", str(tmp_path / "w.json")]))
    assert "has no experts" in line and not (tmp_path / "w.json").exists()


def test_a_candidate_with_virtual_stages_and_no_schedule_is_interleaved():
    """make_candidate without a schedule (sweep-seq's --tp-mode series, fit advice) took 1f1b for vpp > 1 (a
    review)."""
    from memo_sim.api import Layout, get_model, load_profile
    from memo_sim.search.whatif import make_candidate

    c = make_candidate(get_model("llama-3.1-8b"), Layout(tp=2, sp=True, pp=2, vpp=2), "store_all", 4, 8192,
                       load_profile("h100-sxm5-80gb"), None, micro_batch=1)
    assert c.schedule == "interleaved_1f1b"


def test_framework_fields_are_named_where_they_move_the_plan():
    """The export names fp8_attention_copy beside the other FP8 fields under a quantised format, and the what-if and
    the export name the offload's copies only for a policy that offloads module groups (a review)."""
    from dataclasses import replace

    from memo_sim.api import get_model, get_policy
    from memo_sim.model.config import framework_field_moves
    from memo_sim.search.request import _model_changes

    bf16 = get_model("llama-3.1-8b")
    fp8 = replace(bf16, gemm_format="fp8-tensorwise")
    assert framework_field_moves(fp8, "fp8_attention_copy", False) and not framework_field_moves(
        bf16, "fp8_attention_copy", False)
    theirs = replace(bf16, offload_copies_per_group=True)
    assert _model_changes(bf16, theirs, get_policy("store_all")) == []
    assert _model_changes(bf16, theirs, get_policy("offload_attn")) == ["offload_copies_per_group False -> True"]
