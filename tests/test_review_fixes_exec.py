"""Review fixes of memo-exec: SPPO with TP refused by the what-if and up front, the plan's allocator settings
applied (or said to have no effect on CPU), validate's and trace's one-line messages naming what applies."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from memo_sim.layout.parallel import Layout

PROFILE = "h100-sxm5-80gb"

TOY = ["--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "512", "--dtype", "fp32", "--seq", "1K",
       "--profile", PROFILE]


def _cli(tool: str, *args: str) -> subprocess.CompletedProcess:
    exe = os.path.join(os.path.dirname(sys.executable), tool.replace("memo_", "memo-"))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)


def _in_process(tool: str, *args: str):
    """``tool`` (memo_sim or memo_exec) run in this process through click's runner, as its console script runs it
    (``cli.main(prog_name=...)``): for what-ifs that only write a plan, and refusals whose words are checked (not the
    count of stderr's lines, which a subprocess shows whole)."""
    from click.testing import CliRunner  # noqa: PLC0415

    if tool == "memo_sim":
        from memo_sim.cli import cli  # noqa: PLC0415
    else:
        from memo_exec.cli import cli  # noqa: PLC0415
    return CliRunner().invoke(cli, list(args), prog_name=tool.replace("memo_", "memo-"))


def _whatif(tmp_path, *args: str) -> dict:
    # --jobs 1: no worker processes forked from the test's process (the results are the serial run's either way)
    r = _in_process("memo_sim", "whatif", *TOY, *args, "--json", "--jobs", "1", "--out", str(tmp_path / "plan"))
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def sppo_tp_whatif(tmp_path_factory) -> tuple[dict, object]:
    """One what-if of SPPO with TP 2 over pp 2 (its JSON and its folder), read by the two tests below."""
    tmp = tmp_path_factory.mktemp("sppo_tp")
    doc = _whatif(tmp, "--gpus", "4", "--pp", "2", "--tp", "2", "--policy", "sppo", "--subseqs", "4")
    return doc, tmp


def test_whatif_says_executor_refuses_sppo_with_tp(sppo_tp_whatif):
    doc, _ = sppo_tp_whatif
    assert "tp = 2 under schedule sppo" in (doc["executor_refuses"] or "")


def test_exec_run_refuses_sppo_with_tp_before_nproc_advice(sppo_tp_whatif, tmp_path):
    _, plan_dir = sppo_tp_whatif
    r = _cli("memo_exec", "run", str(plan_dir / "plan" / "plan.json"), "--device", "cpu", "--out",
             str(tmp_path / "o"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "tp = 2 under schedule sppo" in lines[0] and "--nproc" not in lines[0]


def test_alloc_conf_goes_into_the_environment_on_cuda(monkeypatch):
    from memo_exec.alloc_settings import ENV, set_env  # noqa: PLC0415

    monkeypatch.delenv(ENV, raising=False)
    lay = Layout(expandable_segments=True, alloc_conf="max_split_size_mb:64,per_process_memory_fraction:0.5")
    set_env(lay, "cuda")
    assert os.environ[ENV] == "expandable_segments:True,max_split_size_mb:64"
    monkeypatch.delenv(ENV)
    set_env(lay, "cpu")  # no effect on a CPU: the environment is left alone
    assert ENV not in os.environ


def test_alloc_conf_refuses_a_different_environment(monkeypatch):
    from memo_exec.alloc_settings import ENV, set_env  # noqa: PLC0415
    from memo_exec.errors import ExecError  # noqa: PLC0415

    monkeypatch.setenv(ENV, "max_split_size_mb:128")
    with pytest.raises(ExecError, match="layout.alloc_conf"):
        set_env(Layout(expandable_segments=True), "cuda")


def test_alloc_conf_on_cpu_is_said_in_one_line(tmp_path):
    _whatif(tmp_path, "--gpus", "1", "--policy", "store_all", "--alloc-conf", "per_process_memory_fraction:0.5")
    out = tmp_path / "o"
    r = _cli("memo_exec", "run", str(tmp_path / "plan" / "plan.json"), "--device", "cpu", "--steps", "2",
             "--out", str(out))
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stdout.splitlines() if "per_process_memory_fraction:0.5" in ln]
    assert len(said) == 1 and "no effect on CPU" in said[0]
    assert "no effect on CPU" in (out / "report.md").read_text()


@pytest.mark.parametrize("args, want, not_want", [
    (("--pp", "5"), "give --layers a multiple of 5", "decoder-first"),
    (("--layers", "1", "--pp", "2"), "give --layers a multiple of 2", "decoder-first"),
    (("--ep", "2"), "--ep needs a MoE model", "give --dp"),
])
def test_validate_suggests_what_it_accepts(tmp_path, args, want, not_want):
    r = _in_process("memo_exec", "validate", "--profile", PROFILE, "--device", "cpu", *args, "--out",
                    str(tmp_path / "v"))
    assert r.exit_code == 2
    assert want in r.stderr and not_want not in r.stderr


def test_trace_names_only_the_reason_that_applies(tmp_path):
    _whatif(tmp_path, "--gpus", "2", "--pp", "2", "--policy", "store_all")
    r = _in_process("memo_exec", "trace", str(tmp_path / "plan" / "plan.json"), "--out", str(tmp_path / "t.json"))
    assert r.exit_code == 2
    assert "pp = 2 is not traced" in r.stderr and "tp_mode" not in r.stderr


def test_odd_tokens_under_tp_name_seq_tokens_and_a_fix():
    from memo_sim.model.config import ModelConfig  # noqa: PLC0415
    from memo_sim.plan.executor_scope import split_why_not  # noqa: PLC0415

    model = ModelConfig(name="t", layers=2, hidden=256, heads=8, ffn=1024, vocab=512)
    why = split_why_not(Layout(tp=2), model, 1, 1023)
    assert why.startswith("seq_tokens 1023") and "multiple of 2" in why


def test_tp_memo_report_says_the_memory_plan_is_followed(tmp_path):
    _whatif(tmp_path, "--gpus", "2", "--tp", "2", "--policy", "memo")
    out = tmp_path / "o"
    # the launcher in this process (its ranks are processes all the same): what it says of the memory plan is its own
    # stderr (`memo_exec.distributed.launch.say_memory_plan_not_followed`), the ranks' warnings pass through it
    r = _in_process("memo_exec", "run", str(tmp_path / "plan" / "plan.json"), "--device", "cpu", "--nproc", "2",
                    "--steps", "2", "--out", str(out))
    assert r.exit_code == 0, r.output
    # a tp-2 rank places its layer scratch at memo-sim's own level-1 offsets (h4: the executor's column-parallel
    # backward frees what the simulator frees before the reduce's output; before, the report said "memory plan:
    # none (no memory plan for a layer split by tp 2" and then, h3, "(the plan's level 1 does not fit ...")
    report = (out / "report.md").read_text()
    assert "- memory plan: arena " in report and "- memory plan: none" not in report, report
    assert "not followed" not in r.stderr, r.stderr


def test_memo_plan_without_memory_plan_warns_in_one_line(tmp_path):
    _whatif(tmp_path, "--gpus", "1", "--policy", "memo")
    doc = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert doc.pop("memory_plan", None) is not None
    plan = tmp_path / "nomp.json"
    plan.write_text(json.dumps(doc))
    r = _cli("memo_exec", "run", str(plan), "--device", "cpu", "--steps", "1", "--out", str(tmp_path / "o"))
    warned = [ln for ln in r.stderr.splitlines() if "memory_plan is missing" in ln]
    assert len(warned) == 1 and "--no-memory-plan" in warned[0]


def test_ring_cp_refuses_a_cuda_only_backend_on_cpu(tmp_path):
    _whatif(tmp_path, "--gpus", "2", "--cp", "2", "--policy", "store_all")
    r = _cli("memo_exec", "run", str(tmp_path / "plan" / "plan.json"), "--device", "cpu", "--nproc", "2",
             "--attention-backend", "sdpa_cudnn", "--steps", "1", "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "sdpa_cudnn needs a CUDA device" in lines[0], r.stderr


def test_plan_policy_messages_name_the_field_and_a_fix(tmp_path):
    """A MEMO plan with policy.alpha null, an SPPO policy with no bounds: one line naming the field and a fix."""
    import json as _json

    from click.testing import CliRunner as _Runner

    from memo_sim.cli import cli as _sim
    from memo_sim.layout.parallel import Layout as _Layout
    from memo_sim.model.config import get_model as _model
    from memo_sim.policy.sppo import Sppo as _Sppo

    out = _Runner().invoke(_sim, ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "512",
                                  "--seq", "1K", "--gpus", "1", "--policy", "memo", "--profile", "a800-80gb",
                                  "--jobs", "1", "--out", str(tmp_path / "w")])
    assert out.exit_code == 0, out.output
    plan = _json.loads((tmp_path / "w" / "plan.json").read_text())
    plan["policy"]["alpha"] = None
    (tmp_path / "bad.json").write_text(_json.dumps(plan))
    out = _Runner().invoke(_sim, ["check-plan", str(tmp_path / "bad.json")])
    assert out.exit_code == 2 and "policy.alpha" in out.output and "Traceback" not in out.output, out.output
    sppo = _Sppo(subseqs=2, bounds=())
    why = sppo.check(_model("gpt-7b"), _Layout(pp=2, tp=1), 1, 8192)
    assert "policy.bounds" in why and "memo-sim whatif --policy sppo" in why
