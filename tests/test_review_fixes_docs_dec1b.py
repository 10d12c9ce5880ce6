"""Fixes of a user review (2026-12-01, docs and what-if wording, second batch): SPPO's heuristic-vs-best share on
one tier, `memo-exec run` under torchrun staging its outputs, fp16 plans refused by memo-exec's contract and by
validate, validate's "not comparable" times, whatif's and export's help, --train-tokens on small jobs."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli as sim_cli

TOY = ["--layers", "2", "--hidden", "64", "--heads", "2", "--ffn", "256", "--vocab", "256", "--seq", "256",
       "--gpus", "1"]


# ------------------------------------------------------------------ 1. SPPO: heuristic vs best on one tier
def _sppo_cand(role: str, analytic_iter_s: float, sim_iter_s: float | None):
    """A what-if candidate as `summarize` reads it: throughput 1 / iteration time (tokens per GPU per second)."""
    sim = None if sim_iter_s is None else {"status": "OK", "iteration_s": sim_iter_s,
                                           "tgs_tokens_per_gpu_s": 1 / sim_iter_s}
    est = SimpleNamespace(tgs=1 / analytic_iter_s, iteration_s=analytic_iter_s)
    return SimpleNamespace(
        sppo={"roles": [role]}, status="OK", simulated=sim, estimate=est,
        tgs=sim["tgs_tokens_per_gpu_s"] if sim else est.tgs,  # `Candidate.tgs`: simulated where tier 2 ran
        layout=SimpleNamespace(label=lambda: "tp8+sp-pp4", tp=8, pp=4, dp=1),
        policy=SimpleNamespace(label=lambda: "sppo", subseqs=64, partition="len", multiplex=False),
        memory=SimpleNamespace(peak_gpu_bytes=1, host_bytes_per_node=1))


def _summary(heur, best) -> dict:
    from memo_sim.search.sppo.candidates import summarize

    search = SimpleNamespace(space_size=2, solved=2, heuristic_note="", best=None)
    return summarize(search, [heur, best])


def test_sppo_heuristic_share_compares_analytic_with_analytic_where_the_heuristic_was_not_simulated():
    """The review's numbers: the heuristic 177.72 s analytic only, the best 175.77 s analytic and 176.32 s simulated;
    the line said 99.2% (the best's simulated over the heuristic's analytic) "(analytic)": 98.9% on one tier."""
    sm = _summary(_sppo_cand("heuristic", 177.72, None), _sppo_cand("exhaustive best", 175.77, 176.32))
    assert sm["compared_on"] == "analytic"
    assert sm["heuristic_tgs_fraction_of_best"] == pytest.approx(175.77 / 177.72)
    both = _summary(_sppo_cand("heuristic", 177.72, 178.5), _sppo_cand("exhaustive best", 175.77, 176.32))
    assert both["compared_on"] == "simulated"
    assert both["heuristic_tgs_fraction_of_best"] == pytest.approx(176.32 / 178.5)


# ------------------------------------------------------------------ 2. memo-exec run under torchrun: staged --out
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def torchrun_env(monkeypatch):
    """This process as rank 0 of a torchrun world of one (torchrun's variables; no --nproc launcher)."""
    from memo_exec.distributed.launch import OUT_ENV

    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", str(_free_port()))):
        monkeypatch.setenv(k, v)
    monkeypatch.delenv(OUT_ENV, raising=False)


@pytest.fixture(scope="module")
def toy_plan(tmp_path_factory) -> Path:
    """A one-GPU store_all plan of a 2-layer toy (fp32: what a CPU run trains)."""
    out = tmp_path_factory.mktemp("toy") / "p"
    r = CliRunner().invoke(sim_cli, ["whatif", *TOY, "--policy", "store_all", "--dtype", "fp32", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


def test_torchrun_run_refuses_an_unwritable_out_before_any_work(tmp_path, toy_plan, torchrun_env, monkeypatch):
    """README: an --out that cannot be written is refused in one line, exit 2, before any work; under torchrun the
    run trained first and failed in torchrun's traceback (a review)."""
    import memo_exec.distributed.runner as dist_runner
    from memo_exec.cli import cli as exec_cli

    def no_training(*a, **k):
        raise AssertionError("the run started before --out was checked")

    monkeypatch.setattr(dist_runner, "DistExecutor", no_training)
    plan = toy_plan
    blocker = tmp_path / "afile"
    blocker.write_text("")
    r = CliRunner().invoke(exec_cli, ["run", str(plan), "--device", "cpu", "--steps", "1",
                                      "--out", str(blocker / "sub")])
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.output.strip().splitlines()[-1].startswith(f"error: --out {blocker / 'sub'}: cannot write there")


def test_torchrun_rank_stages_its_outputs_and_writes_the_manifest_last(tmp_path, toy_plan, torchrun_env,
                                                                        monkeypatch):
    """Rank 0 of a torchrun world writes into a hidden stage and moves it into --out with manifest.json (complete),
    no stage left behind, its lines naming --out (before: straight into --out, no manifest)."""
    from matplotlib.figure import Figure

    from memo_exec.distributed.launch import run_rank
    from memo_exec.runner import RunOptions

    def no_render(self, fname, *a, **k):  # the figures' files, not their pixels (rendering took most of the test)
        fname.write(b"png") if hasattr(fname, "write") else Path(fname).write_bytes(b"png")

    monkeypatch.setattr(Figure, "savefig", no_render)
    plan = toy_plan
    out = tmp_path / "run"
    said: list[str] = []
    run_rank(str(plan), RunOptions(device="cpu", steps=1), str(out), False, 60.0, False,
             lambda m=None, err=False, **k: said.append(m))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and "report.md" in [f["name"] for f in manifest["files"]]
    assert not [p for p in out.iterdir() if p.name.startswith(".")], list(out.iterdir())
    assert any(f"wrote {out / 'report.md'}" in (m or "") for m in said), said


def _rank0_word_rank(rank: int, world: int):
    from memo_exec.distributed.launch import rank0_word

    return rank0_word("--out x: cannot write there" if rank == 0 else None, world, rank, 30.0)


def test_every_rank_gets_rank_zeros_refusal():
    """Only rank 0 checks --out; every rank raises its line (exit 2 alike), none waits on a rank that left."""
    from tests.dist_harness import spawn

    assert spawn(_rank0_word_rank, 2) == ["--out x: cannot write there"] * 2


# ------------------------------------------------------------------ 3. fp16 plans
def test_whatif_says_memo_exec_refuses_an_fp16_plan():
    """memo-exec trains no fp16 (no loss scaling: `memo_exec.device.compute_dtype`); the what-if said nothing."""
    r = CliRunner().invoke(sim_cli, ["whatif", *TOY, "--no-plan", "--dtype", "fp16", "--simulate-top", "1"])
    assert r.exit_code == 0, r.output
    assert "memo-exec refuses this plan (plan model" in r.output and "dtype fp16" in r.output
    from memo_sim.model.config import get_model
    from memo_sim.plan.executor_scope import dtype_why_not

    assert dtype_why_not(get_model("gpt-7b")) is None


def test_validate_refuses_fp16_before_any_run(tmp_path):
    """`memo-exec validate --dtype fp16` ran every plan in fp32 on a CPU and reported "dtype fp16"."""
    from memo_exec.errors import ExecError
    from memo_exec.validate import TOY_MODEL, PlanSpec, validate
    from memo_sim.model.config import with_overrides
    from memo_sim.policy import get_policy
    from memo_sim.profile.loader import load_profile

    def no_run(*a, **k):
        raise AssertionError("a plan ran")

    model = with_overrides(TOY_MODEL, rename=False, dtype="fp16")
    with pytest.raises(ExecError, match=r"^--dtype fp16: memo-exec does not train fp16"):
        validate(model, load_profile("a800-80gb"), [PlanSpec(1024, get_policy("store_all"))], device="cpu", steps=1,
                 out_dir=tmp_path / "v", report_path=None, command="t", runner=no_run, record=False)


def test_validate_report_names_the_dtype_the_runs_trained_in():
    from memo_exec.validate import TOY_MODEL, ValidationRow, dtype_words
    from memo_sim.model.config import with_overrides

    bf16 = with_overrides(TOY_MODEL, rename=False, dtype="bf16")
    rows = [ValidationRow("1K store_all", "ran", {}, ran_dtype="fp32")]
    assert dtype_words(bf16, rows) == "dtype bf16 (the plans'; the runs trained in fp32)"
    assert dtype_words(with_overrides(TOY_MODEL, rename=False, dtype="fp32"), rows) == "dtype fp32"


# ------------------------------------------------------------------ 4. validate: a GPU profile's times on a CPU
def test_validate_says_not_comparable_where_the_run_does(tmp_path):
    """A GPU profile validated on a CPU: the run's --json says ``times_comparable: false`` (report.md "not
    comparable"); validate read "step-time |error| median 587004.7%"."""
    from memo_exec.validate import TOY_MODEL, PlanSpec, validate
    from memo_sim.model.config import with_overrides
    from memo_sim.policy import get_policy
    from memo_sim.profile.loader import load_profile

    def gpu_times_on_a_cpu(plan_file, run_dir, device, steps, timeout, threads=None):
        return "ran", {"times_comparable": False,
                       "totals": [{"quantity": "iteration time", "predicted": 1e-4, "measured": 0.5}],
                       "streams": [{"stream": "compute", "quantity": "busy", "predicted_s": 1e-4, "measured_s": 0.4}]}

    model = with_overrides(TOY_MODEL, rename=False, dtype="fp32")
    path, summary = validate(model, load_profile("a800-80gb"), [PlanSpec(1024, get_policy("store_all"))],
                             device="cpu", steps=1, out_dir=tmp_path / "v", report_path=None, command="t",
                             runner=gpu_times_on_a_cpu, record=False)
    from memo_exec.validate import summary_line

    line = summary_line(summary)
    assert "step times not comparable" in line and "%" not in line.split(";")[1], line
    text = Path(path).read_text()
    assert "not comparable" in text and "+499900.0%" not in text, text
    row = json.loads((tmp_path / "v" / "validation.json").read_text())["rows"][0]
    assert row["quantities"]["step_s"]["error_pct"] is None and row["quantities"]["step_s"]["not_comparable"]
    assert row["quantities"]["peak_memory_bytes"].get("not_comparable") is None  # bytes: not a speed


# ------------------------------------------------------------------ 5, 6. help
def test_whatif_help_says_one_ranked_table_holds_both_tiers():
    out = CliRunner().invoke(sim_cli, ["whatif", "-h"]).output
    assert "listed apart from analytic-only rows" not in out
    assert "One ranked table holds both tiers" in " ".join(out.split())


def test_progress_help_names_json_only_where_the_command_has_it():
    export = " ".join(CliRunner().invoke(sim_cli, ["export", "-h"]).output.split())
    assert "(default: on a terminal)." in export and "unless --json" not in export
    whatif = " ".join(CliRunner().invoke(sim_cli, ["whatif", "-h"]).output.split())
    assert "(default: on a terminal, unless --json or --format json, csv or md)." in whatif


# ------------------------------------------------------------------ 7. --train-tokens on a small job
def test_train_tokens_on_a_small_job_reads_minutes_and_one_gpu():
    """1B tokens at about 1.9M tokens/s on one GPU: about 520 s, 0.14 GPU-hours (it read "0.0 days, 0 GPU-hours")."""
    from memo_sim.cli.whatif import fmt_duration, fmt_gpu_hours

    assert fmt_duration(516.0) == "8.6 minutes" and fmt_gpu_hours(516.0 / 3600) == "0.143"
    assert fmt_duration(3 * 86400) == "3.0 days" and fmt_duration(7200) == "2 hours" and fmt_duration(5) == "5 s"
    assert fmt_gpu_hours(118_202.4) == "118,202"
    r = CliRunner().invoke(sim_cli, ["whatif", *TOY, "--no-plan", "--simulate-top", "1", "--train-tokens", "1B"])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if "training 1B tokens" in ln)
    assert "on 1 GPU:" in line and "0.0 days" not in line and " 0 GPU-hours" not in line, line


def test_validate_moe_alltoall_not_comparable_where_the_run_says_so():
    """The MoE all-to-all per layer is a time too: beside a GPU profile's prediction on a CPU, "not comparable" in its
    rows, its per-layer table and the summary's reason (not "no layer was timed by both")."""
    from memo_exec.validate import QUANTITIES, ValidationRow, alltoall_not_compared_why, alltoall_section, \
        quantities_from_run

    a2a = [{"layer": 1, "predicted_count": 4, "measured_count": 4, "predicted_s": 1e-4, "measured_s": 0.1,
            "ratio": 1000.0, "rel_error": 999.0}]
    doc = {"times_comparable": False, "moe_alltoall": a2a,
           "totals": [{"quantity": "iteration time", "predicted": 1e-3, "measured": 1.0}]}
    q = quantities_from_run(doc, {k: None for k, _, _ in QUANTITIES})
    assert q["alltoall_layer_s"]["not_comparable"] and q["alltoall_layer_s"]["error_pct"] is None
    row = ValidationRow("64 store_all", "ran", q, alltoall=a2a)
    assert alltoall_not_compared_why([row]).startswith("not comparable")
    table = "\n".join(alltoall_section([row]))
    assert "| 1000.00 | not comparable |" in table and "%" not in table.splitlines()[-1], table
