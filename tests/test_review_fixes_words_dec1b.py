"""Review fixes to the answers' words (2026-12-01, second batch): the binding, best and on-the-edge lines hold the
deciding (higher, reserved) peak; explain's expandable-segments advice replayed, not assumed; an OOM-frag row's
frag/retries cell at its failure; the gap split keeps the user's --alloc-conf; a pipeline's stage lines name their
peak as the header does; maxseq says memo-exec refuses its plan; check-plan leads with the re-simulated peak where
the stored one is stale; an FP8 plan's MFU and GEMM format said the same way everywhere; explain and check-plan
refuse an FP8 plan on a GPU without FP8 by the plan's field."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.layout.parallel import Layout
from memo_sim.policy.registry import get_policy
from memo_sim.report.whatif_answer import allocator_cell, margin_line

GiB = 1 << 30
# two layers of GPT-7B at 512K on the memo-paper framework: the caching allocator replay reserves well above the
# allocated peak (the reviewers' 32-layer plan, cut to two layers)
RESERVED_ABOVE = ["--model", "gpt-7b", "--layers", "2", "--gpus", "8", "--seq", "512K", "--tp", "4", "--sp", "--cp",
                  "2", "--zero", "1", "--policy", "full_recompute", "--framework", "memo-paper", "--jobs", "1"]
TOY_FP8 = ["--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024", "--seq", "2K",
           "--gpus", "1", "--policy", "memo", "--alpha", "0.3", "--profile", "h100-sxm5-80gb", "--precision",
           "fp8-tensorwise", "--jobs", "1"]


def _run(args, code=0):
    r = CliRunner().invoke(cli, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


@pytest.fixture(scope="module")
def reserved_plan(tmp_path_factory):
    """The what-if's answer and plan.json where the replay's reserved peak is above the allocated one."""
    out = tmp_path_factory.mktemp("reserved")
    r = _run(["whatif", *RESERVED_ABOVE, "--out", out])
    return r.output, out / "plan.json"


@pytest.fixture(scope="module")
def fp8_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp8")
    _run(["whatif", *TOY_FP8, "--out", out])
    return out / "plan.json"


def _explain_json(plan) -> dict:
    return json.loads(_run(["explain", plan, "--json"]).output)


def test_binding_and_best_lines_hold_the_deciding_reserved_peak(reserved_plan):
    """Bug 1: "GPU memory 73% full" (the allocated peak) beside a reserved peak at 100% of the usable memory, which
    explain says decides: the what-if's best line and explain's binding line give the reserved one's share."""
    output, plan = reserved_plan
    d = _explain_json(plan)
    reserved, cap = d["allocator_memory_stats"]["reserved_bytes.all.peak"], d["gpu_capacity_bytes"]
    assert reserved > 1.05 * d["simulated_peak_gpu_bytes"]  # the case: the reserved peak decides
    share = f"GPU memory {100 * reserved / cap:.0f}% full (PyTorch's reserved peak"
    best = next(line for line in output.splitlines() if line.strip().startswith("GPU memory"))
    assert share in best, best
    binding = next(line for line in _run(["explain", plan]).output.splitlines() if line.startswith("binding:"))
    assert binding.startswith(f"binding: {share}"), binding


def _stub_candidate(peak: float, reserved: float, cap: float):
    """A simulated caching-allocator candidate with ``peak`` allocated and ``reserved`` by the replay."""
    return SimpleNamespace(simulated={"peak_gpu_bytes": peak, "allocator": {"static_memory_plan": False,
                                                                             "peak_reserved_bytes": reserved}},
                           policy=get_policy("full_recompute"), layout=Layout(tp=8),
                           memory=SimpleNamespace(gpu_capacity_bytes=cap, peak_gpu_bytes=peak))


def test_margin_line_holds_the_deciding_reserved_peak():
    """Bug 1: "on the edge: ... 96.0% ...; a peak 4.0% higher would not fit" where the reserved peak was 98.1%."""
    cap = 78 * GiB
    words = margin_line(SimpleNamespace(best=_stub_candidate(0.96 * cap, 0.981 * cap, cap), shown=[]))
    assert "reserved peak" in words and "is 98.1% of the usable memory" in words and "1.9% higher" in words, words
    # a reserved peak below the allocated one's edge leaves the line as it was
    assert "the predicted GPU peak is 96.0%" in margin_line(SimpleNamespace(best=_stub_candidate(0.96 * cap,
                                                                                                0.5 * cap, cap),
                                                                            shown=[]))
    # the reserved peak alone puts a plan on the edge
    assert "is 97.0% of" in margin_line(SimpleNamespace(best=_stub_candidate(0.7 * cap, 0.97 * cap, cap), shown=[]))


def test_explain_replays_expandable_segments_instead_of_promising_the_cache_back(reserved_plan):
    """Bug 2: explain said expandable segments "give most of the 16.18 GiB cached but free back", where the what-if
    with the flag kept 13.64 GiB cached (the framework's collectives call record_stream): it says what the replay
    with the flag gives, and why the record_stream blocks stay."""
    _output, plan = reserved_plan
    words = _explain_json(plan)["allocator_fragmentation"]
    assert "give most of the" not in words, words
    replayed = (r"with expandable segments .* the replay (reserves [\d.]+ [GM]iB at its peak, [\d.]+ [GMK]?i?B "
                r"cached but free when the allocation peaks, \d+ allocation retries|runs out of memory)")
    assert re.search(replayed, words), words
    assert "record_stream" in words, words


def test_oom_frag_row_shows_the_share_at_its_failure():
    """Bug 3: an OOM-frag row's cell read "0.0% / 10" (the share at an allocation peak before the failure) beside a
    failure of 77.95 GiB reserved, 27.35 GiB of it free in pieces: the share at the failure."""
    alloc = {"static_memory_plan": False, "fragmentation_at_peak": 0.0, "reorganizations": 10, "oom": True,
             "oom_reserved_bytes": 77.95 * GiB, "oom_cached_free_bytes": 27.35 * GiB}
    assert allocator_cell({"allocator": alloc}) == "35.1% at OOM / 10"
    # a summary without the failure's counts: no share rather than the peak's
    bare = {k: v for k, v in alloc.items() if not k.startswith("oom_")}
    assert allocator_cell({"allocator": bare}) == "- / 10"
    assert allocator_cell({"allocator": {**bare, "oom": False, "fragmentation_at_peak": 0.22}}) == "22.0% / 10"


def test_gap_split_keeps_the_users_alloc_conf():
    """Bug 4: the gap split's plan with the framework's mechanisms lost --alloc-conf expandable_segments:True
    ("expandable_segments True -> False")."""
    out = _run(["whatif", *RESERVED_ABOVE[:7], "704K", *RESERVED_ABOVE[8:], "--alloc-conf",
                "expandable_segments:True", "--no-plan"]).output
    line = next(line for line in out.splitlines() if "the gap split" in line)
    assert "expandable_segments True -> False" not in line, line
    assert "-expandable-" in line.split("mechanisms (", 1)[1].split(")", 1)[0], line


def test_pipeline_stage_lines_name_the_peak_as_the_header(tmp_path):
    """Bug 5: simulate of a pipeline printed "(simulated, allocated: no caching-allocator replay)" in its header and
    "(simulated, caching allocator)" for the same peak on its stage 0 line."""
    _run(["whatif", "--model", "gpt-7b", "--layers", "4", "--gpus", "4", "--seq", "8K", "--pp", "4", "--batch", "4",
          "--policy", "full_recompute", "--jobs", "1", "--out", tmp_path / "pipe"])
    out = _run(["simulate", tmp_path / "pipe" / "plan.json", "--out", tmp_path / "ps"]).output
    head = re.search(r"peak GPU [\d.]+ [GM]iB \(([^)]*)\)", out.splitlines()[1]).group(1)
    stages = [line for line in out.splitlines() if line.strip().startswith("stage ")]
    assert stages and head == "simulated, allocated: no caching-allocator replay", out
    for line in stages:
        assert re.search(r"peak GPU [\d.]+ [GM]iB \(" + re.escape(head) + r"\)", line), line


def test_maxseq_says_memo_exec_refuses_its_answer():
    """Bug 6: maxseq answered a full_recompute plan on a static memory plan (--allocator both) with no word that
    memo-exec refuses it, which the what-if says."""
    out = _run(["maxseq", *RESERVED_ABOVE[:6], "--policy", "full_recompute", "--framework", "memo-paper", "--step",
                "512K", "--allocator", "both", "--jobs", "1"]).output
    verdict, nxt = out.splitlines()[:2]
    assert "-memplan full_recompute" in verdict, out
    assert nxt.startswith("memo-exec refuses this plan (") and "simulator" in out, out


def test_check_plan_leads_with_the_re_simulation_of_a_stale_plan(fp8_plan, tmp_path):
    """Bug 7: after an edit, check-plan printed the stored "predicted peak GPU" on line 3 as if current and the
    re-simulated one only on line 4: the stale line leads, and the stored peak is named as stored and stale."""
    d = json.loads(fp8_plan.read_text())
    d["predicted"]["peak_gpu_bytes"] = d["predicted"]["peak_gpu_bytes"] / 2
    edited = tmp_path / "plan.json"
    edited.write_text(json.dumps(d))
    lines = _run(["check-plan", edited]).output.splitlines()
    assert "re-simulated now" in lines[1], lines[:4]
    stored = next(line for line in lines if "predicted peak GPU" in line)
    assert "stored predicted peak GPU" in stored and "stale: re-simulated now" in stored, stored


def test_fp8_mfu_and_format_said_the_same_way(fp8_plan, tmp_path):
    """Bug 8: check-plan, simulate and sweep-seq printed an FP8 plan's "MFU 77.6%" without "(of the bf16 peak)", and
    maxseq's header had no FP8: each says it as the what-if does."""
    check = _run(["check-plan", fp8_plan]).output.splitlines()[0]
    # and against the fp8 peak beside it (a review, 2026-12-02: every command that says an FP8 MFU)
    both = r"MFU [\d.]+% \(of the bf16 peak; [\d.]+% of the fp8 peak\)"
    assert "fp8-tensorwise GEMMs" in check and re.search(both, check), check
    sim = _run(["simulate", fp8_plan, "--out", tmp_path / "s"]).output.splitlines()[1]
    assert re.search(both, sim), sim
    sweep = _run(["sweep-seq", fp8_plan, "--out", tmp_path / "w", "--seqs", "2K", "--policy", "memo",
                  "--jobs", "1"]).output.splitlines()[0]
    assert "fp8-tensorwise GEMMs" in sweep and "MFU of the bf16 peak" in sweep, sweep
    out = _run(["maxseq", "--model", "llama-3.1-8b", "--layers", "2", "--gpus", "8", "--profile", "h100-sxm5-80gb",
                "--precision", "fp8-tensorwise", "--framework", "megatron", "--tp", "8", "--cp", "1", "--dp", "1",
                "--pp", "1", "--policy", "full_recompute", "--step", "512K", "--jobs", "1"]).output
    assert any(line.startswith("llama-3.1-8b-custom, fp8-tensorwise GEMMs, 8 x") for line in out.splitlines()), out
    assert "MFU (sim, of the bf16 peak)" in out, out


@pytest.mark.parametrize("command", ["explain", "check-plan"])
def test_fp8_plan_on_a_gpu_without_fp8_is_refused_by_its_field(fp8_plan, tmp_path, command):
    """Bug 9: explain and check-plan of an FP8 plan whose profile is an A100 told the user to add an FP8 peak to the
    A100's profile or give --dtype/--precision, flags they do not take: the plan's field and a fix they can use, as
    simulate says it."""
    d = json.loads(fp8_plan.read_text())
    d["profile"] = "a100-sxm4-80gb"
    edited = tmp_path / "plan.json"
    edited.write_text(json.dumps(d))
    out = _run([command, edited], code=2).output
    assert f"{edited}: model.gemm_format fp8-tensorwise: profile a100-sxm4-80gb" in out, out
    assert "--precision" not in out and "--dtype" not in out and "add fp8" not in out, out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
