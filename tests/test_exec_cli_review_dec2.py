"""A review of memo-exec's command line (Dec 2): --device spelled strictly in run / trace / calibrate / validate,
validate's --device checked before any plan is made, --alphas and --policies refused naming themselves, every
--device help listing what it takes, ``memo-exec --version``, and trace's / validate's output paths checked before
the work. CPU only, no plan runs (the work functions are replaced by ones that fail the test if reached)."""

from __future__ import annotations

from importlib.metadata import version

import pytest
import torch
from click.testing import CliRunner

import memo_exec.trace as trace_mod
import memo_exec.validate as validate_mod
from memo_exec.cli import cli
from memo_exec.device import DEVICE_FORMS, DeviceSpec, check_device_name, resolve_device
from memo_exec.errors import ExecError
from memo_sim.model.config import ModelConfig
from memo_sim.plan.schema import write_plan
from memo_sim.policy import get_policy
from tests.exec_helpers import make_plan, time_limit
from tests.cli_run import one_error_line

SMALL = ModelConfig("cli-test", 4, 64, 4, 256, vocab=128)
BAD_SPELLINGS = ["cuda:abc", "cudax", "cuda:-1", "cuda:", "cuda:01", "cuda:1.0", "CPU", "gpu", "cuda:N", ""]


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(60):
        yield


@pytest.fixture
def plan_file(tmp_path):
    return str(write_plan(make_plan(SMALL, 256, get_policy("memo", 0.3), chunk=100), tmp_path / "plan.json"))


@pytest.fixture
def fake_cuda(monkeypatch):
    """Two CUDA devices, as torch would see them on a GPU machine (nothing here touches them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a plan is made, run or traced."""
    def reached(*a, **kw):
        raise AssertionError("the work started before the refusal")

    for mod, name in ((validate_mod, "plan_set"), (validate_mod, "validate"), (trace_mod, "record_layer_trace")):
        monkeypatch.setattr(mod, name, reached)


def _validate(tmp_path, *args):
    return CliRunner().invoke(cli, ["validate", "--profile", "h100-sxm5-80gb", "--no-record",
                                    "--out", str(tmp_path / "v"), *args])


# -- 1. --device spelled strictly, refused without CUDA; an index past the visible devices where CUDA exists --------

@pytest.mark.parametrize("cuda", [False, True], ids=["no-cuda", "cuda"])
@pytest.mark.parametrize("name", BAD_SPELLINGS)
def test_check_device_name_refuses_a_misspelling_with_or_without_cuda(name, cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 if cuda else 0)
    for check in (lambda: check_device_name(name), lambda: resolve_device(name)):
        with pytest.raises(ExecError) as e:
            check()
        line = str(e.value)
        assert line.startswith("--device ") and "auto, cpu, cuda or cuda:N" in line and "\n" not in line


def test_resolve_device_on_a_two_gpu_machine(fake_cuda):
    assert resolve_device("cuda:1") == DeviceSpec("cuda", 1)
    assert resolve_device("cuda") == DeviceSpec("cuda", 0)
    assert resolve_device("auto") == DeviceSpec("cuda", 0) and resolve_device(None) == DeviceSpec("cuda", 0)
    assert resolve_device("cpu") == DeviceSpec("cpu")
    with pytest.raises(ExecError, match=r"--device cuda:2: only 2 CUDA device\(s\) visible \(cuda:0 to cuda:1\)"):
        resolve_device("cuda:2")
    for name in DEVICE_FORMS[:-1]:
        check_device_name(name)
    with pytest.raises(ExecError, match="meta"):  # a form the command does not take
        check_device_name("meta")
    check_device_name("meta", ("meta", "cpu"))


def test_no_cuda_still_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ExecError, match="--device cuda:1: no CUDA device is visible"):
        resolve_device("cuda:1")


@pytest.mark.parametrize("name", ["cuda:abc", "cudax", "cuda:-1", "cuda:7"])
def test_run_refuses_a_bad_device_in_one_line_on_a_cuda_machine(plan_file, tmp_path, fake_cuda, name):
    r = CliRunner().invoke(cli, ["run", plan_file, "--device", name, "--out", str(tmp_path / "o")])
    line = one_error_line(r)
    assert f"--device {name}" in line.replace("'", "")
    assert ("only 2 CUDA device(s)" in line) if name == "cuda:7" else ("auto, cpu, cuda or cuda:N" in line)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["cuda:abc", "cudax", "cuda:-1", "bogus"])
def test_trace_refuses_a_bad_device_listing_meta(plan_file, tmp_path, fake_cuda, no_work, name):
    r = CliRunner().invoke(cli, ["trace", plan_file, "--device", name, "--out", str(tmp_path / "t.json")])
    line = one_error_line(r)
    assert "--device" in line and "meta, auto, cpu, cuda or cuda:N" in line
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("name", ["cuda:abc", "cudax", "cuda:-1"])
def test_calibrate_refuses_a_bad_device_before_measuring(tmp_path, fake_cuda, monkeypatch, name):
    import memo_exec.calibrate.suite as suite

    monkeypatch.setattr(suite, "run_suite", lambda *a, **kw: pytest.fail("measured"))
    r = CliRunner().invoke(cli, ["calibrate", "--name", "x", "--device", name, "--out-dir", str(tmp_path / "p")])
    line = one_error_line(r)
    assert "--device" in line and "auto, cpu, cuda or cuda:N" in line


# -- 2. validate checks --device before any plan is made or run ---------------------------------------------------

@pytest.mark.parametrize("name", ["bogus", "cuda:abc", "cuda"])
def test_validate_refuses_a_bad_device_before_any_plan(tmp_path, no_work, monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = one_error_line(_validate(tmp_path, "--device", name))
    assert f"--device {name}" in line.replace("'", "")
    assert ("no CUDA device is visible" in line) if name == "cuda" else ("auto, cpu, cuda or cuda:N" in line)
    assert not (tmp_path / "v").exists()


# -- 3. --alphas and --policies name themselves -----------------------------------------------------------------------

@pytest.mark.parametrize("alphas", ["2", "-0.5", "0.5,nan", "0.25,1.5,sim", "inf"])
def test_validate_alphas_out_of_range_name_alphas(tmp_path, no_work, alphas):
    line = one_error_line(_validate(tmp_path, "--device", "cpu", "--alphas", alphas))
    assert "--alphas" in line and "[0, 1]" in line and "sim" in line
    assert "--alpha," not in line and "policy.alpha" not in line


def test_validate_unknown_policy_names_policies_and_lists_them(tmp_path, no_work):
    # the alphas 0, 1 and sim are taken: the refusal is the policy's
    line = one_error_line(_validate(tmp_path, "--device", "cpu", "--alphas", "0,1,sim", "--policies", "memo,bogus"))
    assert "--policies" in line and "'bogus'" in line
    assert "store_all, full_recompute, full_offload, memo" in line


def test_validate_device_auto_is_taken(tmp_path, no_work):
    line = one_error_line(_validate(tmp_path, "--device", "auto", "--alphas", "2"))
    assert "--alphas" in line  # past the device check


# -- 4. every --device help lists what the command takes -------------------------------------------------------------

@pytest.mark.parametrize("cmd,forms", [("run", "auto, cpu, cuda or cuda:N"), ("validate", "auto, cpu, cuda or cuda:N"),
                                       ("calibrate", "cpu, cuda or cuda:N"), ("trace", "meta")])
def test_device_help_lists_the_forms(cmd, forms):
    r = CliRunner().invoke(cli, [cmd, "-h"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert forms in text
    if cmd in ("trace", "calibrate"):
        assert "auto (cuda if available, else cpu)" in text
    if cmd == "trace":
        assert "meta (no memory" in text and "cuda or cuda:N" in text


def test_every_option_has_help():
    for name, cmd in cli.commands.items():
        for p in cmd.params:
            if p.param_type_name == "option":
                assert p.help, f"memo-exec {name} {p.opts[0]} has no help"


# -- 8. --version, as memo-sim's -------------------------------------------------------------------------------------

def test_version_as_memo_sim():
    from memo_sim.cli import cli as sim_cli

    r = CliRunner().invoke(cli, ["--version"], prog_name="memo-exec")
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"memo-exec, version {version('memo')}"
    s = CliRunner().invoke(sim_cli, ["--version"], prog_name="memo-sim")
    assert s.output.split()[-1] == r.output.split()[-1]


# -- 9. trace's --out and validate's --report checked before the work -------------------------------------------------

@pytest.mark.parametrize("where", ["proc", "under-a-file"])
def test_trace_checks_out_before_recording(plan_file, tmp_path, no_work, where):
    (tmp_path / "afile").write_text("x")
    out = "/proc/nope/x.json" if where == "proc" else str(tmp_path / "afile" / "x.json")
    line = one_error_line(CliRunner().invoke(cli, ["trace", plan_file, "--out", out]))
    assert line.startswith(f"error: --out {out}: cannot write there")


@pytest.mark.parametrize("where", ["proc", "under-a-file"])
def test_validate_checks_report_before_any_plan(tmp_path, no_work, where):
    (tmp_path / "afile").write_text("x")
    report = "/proc/nope/x.md" if where == "proc" else str(tmp_path / "afile" / "x.md")
    line = one_error_line(_validate(tmp_path, "--device", "cpu", "--report", report))
    assert line.startswith(f"error: --report {report}: cannot write there")
