"""memo-sim check-plan: a plan that cannot run as written is refused in one line (exit 2), with
the field; null predictions print as n/a (`memo_sim.search.plan_check`)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.memplan.trace_gen import layer_backward_trace
from memo_sim.plan.schema import read_plan

TOY = ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024", "--seq", "2K",
       "--gpus", "1", "--policy", "memo", "--alpha", "0.3", "--jobs", "1"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy")
    r = CliRunner().invoke(cli, TOY + ["--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


def _variant(toy, tmp_path, mutate):
    d = json.loads(toy.read_text())
    mutate(d)
    f = tmp_path / "variant.json"
    f.write_text(json.dumps(d))
    return CliRunner().invoke(cli, ["check-plan", str(f)])


def test_a_plan_the_whatif_wrote_is_valid(toy):
    r = CliRunner().invoke(cli, ["check-plan", str(toy)])
    assert r.exit_code == 0 and "valid" in r.output and "memory plan" in r.output


def _placed(d, ph):
    p = d["memory_plan"]["phases"][ph]
    return [n for n in p["offsets"] if n not in p["unplaced"]]


def _overlap(d):
    """Give a backward tensor the offset of another that is live at the same time."""
    plan = read_plan_from(d)
    trace = layer_backward_trace(plan.model, plan.layout, plan.micro_batch, plan.seq_tokens, plan.policy)
    placed = set(_placed(d, "bwd"))
    bufs = [b for b in trace.buffers if (b.name or b.id) in placed]
    a, b = next((x, y) for x in bufs for y in bufs if x is not y and x.lower < y.upper and y.lower < x.upper)
    offs = d["memory_plan"]["phases"]["bwd"]["offsets"]
    offs[b.name or b.id] = offs[a.name or a.id]


def read_plan_from(d):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as t:
        f = Path(t) / "p.json"
        f.write_text(json.dumps(d))
        return read_plan(f)


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.update(profile="abc"), "profile: profile 'abc' not found"),
    (lambda d: d["memory_plan"]["phases"]["bwd"]["offsets"].pop(_placed(d, "bwd")[0]), "no offset for 1 tensor"),
    (lambda d: d["memory_plan"]["phases"]["fwd"]["offsets"].update(bogus=0), "does not allocate (bogus)"),
    (lambda d: d["memory_plan"]["phases"].pop("fwd"), "memory_plan.phases.fwd: missing"),
    (_overlap, "memory_plan.phases.bwd: the placement is invalid"),
    (lambda d: d.update(policy={"policy": "full_recompute", "alpha": None}), "runs on PyTorch's caching allocator"),
    # the whole model's level 2 (an audit, 2026-12-02: these were called valid and echoed as stored)
    (lambda d: d["memory_plan"].update(arena_bytes=1024), "the whole model's placement in arena_bytes = 1,024 is "
                                                          "invalid"),
    (lambda d: d["memory_plan"]["model_offsets"].update({"layer0.fwd": 10**15}), "the whole model's placement"),
    (lambda d: d["memory_plan"]["model_offsets"].update(bogus=0), "model_offsets: offsets for block(s) the whole "
                                                                  "model does not hold (bogus)"),
    (lambda d: d["memory_plan"]["layer_block_offsets"].update({"layer0.fwd": 7}), "layer_block_offsets: layer0.fwd"),
])
def test_plans_that_cannot_run_are_refused(toy, tmp_path, mutate, needle):
    r = _variant(toy, tmp_path, mutate)
    assert r.exit_code == 2, r.output
    assert needle in r.output and r.output.count("\n") == 1


def test_null_predictions_print_as_na(toy, tmp_path):
    def null(d):
        d["predicted"].update(iteration_s=None, mfu=None)
    r = _variant(toy, tmp_path, null)
    # the verdict gives the re-simulation's step (the stored one may be null, or stale: an edited plan)
    assert r.exit_code == 0 and "simulated " in r.output.splitlines()[0] and "None" not in r.output, r.output


def test_a_plan_that_no_longer_fits_is_said_to_and_exits_3(tmp_path):
    """An edited plan (a longer sequence) read 'valid ... predicted OK' from its stored prediction, exit 0, while
    its own re-simulation ran out of memory (a user's review)."""
    out = tmp_path / "sa"
    w = CliRunner().invoke(cli, TOY[:-6] + ["--policy", "store_all", "--jobs", "1", "--out", str(out)])
    assert w.exit_code == 0, w.output
    r = _variant(out / "plan.json", tmp_path, lambda d: d.update(seq_tokens=d["seq_tokens"] * 2048))
    first = r.output.splitlines()[0]
    assert r.exit_code == 3 and "but does not fit: simulated OOM" in first, r.output
    assert "stored prediction OK, re-simulated now OOM" in r.output
    # the simulated peak of a run that stopped is none, not the bytes in use when it stopped printed as a peak
    # (a review: "peak (the simulated iteration) 0 B" for a plan whose model states alone did not fit)
    assert "peak (the simulated iteration)" in r.output and "none: OOM, " in r.output, r.output
    # what was in use when it stopped is the failure's, as the binding line says (a review: the highest level reached
    # before it was printed there)
    import re

    in_use = re.search(r"binding: OOM at [^:]+: .* needs [0-9.]+ [KMGT]?i?B with ([0-9.]+ [KMGT]?i?B) of", r.output)
    assert in_use and f"none: OOM, {in_use.group(1)} in use when it stopped" in r.output, r.output


def test_a_plan_whose_stored_peak_is_not_its_re_simulations_is_said_to_be_stale(toy, tmp_path):
    """A review (2026-11-30): a plan edited from EP 1 to EP 8 kept its step time within 1% of the stored one, and
    check-plan printed the stored peak (66.39 GiB) and, lines below, the re-simulated one (57.33 GiB) with no word of
    the difference: the stale rule compared step times only."""
    r = _variant(toy, tmp_path, lambda d: d["predicted"].update(peak_gpu_bytes=d["predicted"]["peak_gpu_bytes"] * 1.2))
    assert r.exit_code == 0 and "stored prediction peak GPU " in r.output and ", re-simulated now " in r.output, \
        r.output
    r = CliRunner().invoke(cli, ["check-plan", str(toy)])
    assert "stored prediction" not in r.output, r.output


def test_a_plan_edited_to_a_length_its_layout_cannot_split_is_refused_by_check_plan_and_export(tmp_path):
    """A review (2026-11-30): a CP 4 x TP 8 plan edited to 131,073 tokens was valid for check-plan (exit 0) and exported
    with --seq-length 131073 beside --context-parallel-size 4, where the what-if refuses that length. Both refuse it
    now with the what-if's reason, the fix in the plan's own field; maxseq's names its own --step."""
    w = CliRunner().invoke(cli, ["whatif", "--layers", "2", "--hidden", "256", "--heads", "8", "--ffn", "1024",
                                 "--vocab", "1024", "--seq", "2K", "--gpus", "2", "--cp", "2", "--policy",
                                 "full_recompute", "--jobs", "1", "--out", str(tmp_path / "p")])
    assert w.exit_code == 0, w.output
    d = json.loads((tmp_path / "p" / "plan.json").read_text())
    d["seq_tokens"] += 1
    f = tmp_path / "odd.json"
    f.write_text(json.dumps(d))
    for args in (["check-plan", str(f)], ["export", str(f), "--to", "megatron", "--out", str(tmp_path / "x")]):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2 and "layout: sequence length 2049 not divisible into 4 equal chunks" in r.output, \
            (args, r.output)
        assert "seq_tokens 2052 (or 2048) divides" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
    m = CliRunner().invoke(cli, ["maxseq", "--layers", "2", "--hidden", "256", "--heads", "8", "--ffn", "1024",
                                 "--vocab", "1024", "--gpus", "2", "--cp", "2", "--step", "1001", "--policy",
                                 "full_recompute"])
    assert m.exit_code == 2 and "; --step 1004 (or 1000) divides" in m.output, m.output


def test_simulating_an_fp8_plan_on_a_profile_without_fp8_names_the_plans_field(tmp_path):
    """A review (2026-11-30): `simulate PLAN --profile a100-sxm4-80gb` of an FP8 plan said 'fix: drop --precision
    fp8-tensorwise', a flag the command has not: the format is the plan's model.gemm_format."""
    w = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--layers", "2", "--gpus", "1", "--seq", "2K",
                                 "--profile", "h100-sxm5-80gb", "--precision", "fp8-tensorwise", "--jobs", "1",
                                 "--simulate-top", "1", "--out", str(tmp_path / "p")])
    assert w.exit_code == 0, w.output
    r = CliRunner().invoke(cli, ["simulate", str(tmp_path / "p" / "plan.json"), "--profile", "a100-sxm4-80gb",
                                 "--out", str(tmp_path / "s")])
    assert r.exit_code == 2 and "model.gemm_format fp8-tensorwise: profile a100-sxm4-80gb" in r.output, r.output
    assert "--precision" not in r.output and len(r.output.strip().splitlines()) == 1


def test_a_plan_of_more_devices_than_its_cpu_profiles_node_stays_valid(tmp_path):
    """A review (2026-11-30) of the layout check check-plan gained: memo-exec validate writes TP 2 plans on a CPU
    profile whose node is one device (every rank on this machine), and check-plan refused them ('tp=2 must divide the 1
    GPUs of a node'). The node is sized as validate sizes it; the what-if's search keeps its own rule."""
    w = CliRunner().invoke(cli, ["whatif", "--layers", "2", "--hidden", "256", "--heads", "8", "--ffn", "1024",
                                 "--vocab", "1024", "--seq", "2K", "--gpus", "2", "--tp", "2", "--policy",
                                 "full_recompute", "--dtype", "fp32", "--jobs", "1", "--out", str(tmp_path / "p")])
    assert w.exit_code == 0, w.output
    d = json.loads((tmp_path / "p" / "plan.json").read_text())
    d["profile"] = str(Path(__file__).parent / "data" / "profiles" / "cpu-quick-vm.yaml")
    f = tmp_path / "cpu.json"
    f.write_text(json.dumps(d))
    r = CliRunner().invoke(cli, ["check-plan", str(f)])
    assert r.exit_code == 0 and "layout:" not in r.output, r.output
