"""A review of memo-exec's input handling (Dec 2): bad input is one line naming the flag or plan field and the fix,
exit status 2, no traceback, refused before the expensive work starts (torchrun's ranks, the benchmarks, the
trace) and leaving nothing behind. CPU only: the work functions are replaced by ones that fail the test if reached,
so no test runs a plan."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import memo_exec.distributed.launch as launch_mod
import memo_exec.runner as runner_mod
import memo_exec.trace as trace_mod
from memo_exec.cli import cli
from memo_exec.data import TokenSource
from memo_exec.errors import ExecError
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.plan.schema import Plan, write_plan
from memo_sim.policy import get_policy
from tests.cli_run import one_error_line
from tests.exec_helpers import make_plan, time_limit

SMALL = ModelConfig("input-test", 4, 64, 4, 256, vocab=128)
SEQ = 256


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(60):
        yield


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a plan is run (one process or torchrun's ranks) or a layer traced."""
    def reached(*a, **kw):
        raise AssertionError("the work started before the refusal")

    for mod, name in ((launch_mod, "launch_nproc"), (runner_mod, "Executor"), (trace_mod, "record_layer_trace")):
        monkeypatch.setattr(mod, name, reached)


def _one_device_plan(tmp_path, backend="math", name="plan.json"):
    return str(write_plan(make_plan(SMALL, SEQ, get_policy("store_all"), backend=backend, chunk=100),
                          tmp_path / name))


def _tp2_plan(tmp_path, backend="math"):
    plan = Plan(SMALL, 1, SEQ, 2, Layout(tp=2), get_policy("store_all"), "h100-sxm5-80gb", {"status": "OK"}, {},
                attention_backend=backend, classifier_chunk_tokens=100)
    return str(write_plan(plan, tmp_path / "tp2.json"))


def _left(folder):
    """Every name in ``folder`` (hidden ones too), sorted."""
    return sorted(p.name for p in folder.iterdir())


def _tokens(tmp_path, ids, name="tok.npy"):
    np.save(tmp_path / name, np.asarray(ids, dtype=np.int64))
    return str(tmp_path / name)


# -- 1. a bad --tokens file refused in the launching process, before --nproc's ranks start; nothing left behind ------

TOKEN_CASES = {
    "short": (list(range(10)), "10 tokens, need at least seq+1 = 257"),
    "past-vocab": ([5, 500] + [1] * SEQ, "token id 500 outside the model's vocabulary [0, 128)"),
    "negative": ([5, -3] + [1] * SEQ, "token id -3 outside the model's vocabulary [0, 128)"),
}


@pytest.mark.parametrize("case", sorted(TOKEN_CASES))
def test_nproc_run_refuses_bad_tokens_before_torchrun_leaving_nothing(tmp_path, no_work, case):
    ids, words = TOKEN_CASES[case]
    plan, tok = _tp2_plan(tmp_path), _tokens(tmp_path, ids)
    before = _left(tmp_path)
    r = CliRunner().invoke(cli, ["run", plan, "--device", "cpu", "--nproc", "2", "--steps", "1", "--tokens", tok,
                                 "--out", str(tmp_path / "r8")])
    line = one_error_line(r)
    assert line.startswith(f"error: --tokens {tok}: ") and words in line, line
    assert _left(tmp_path) == before  # no --out, no hidden .r8.*.partial stage


def test_nproc_run_refuses_an_unreadable_or_missing_token_file_before_torchrun(tmp_path, no_work):
    plan = _tp2_plan(tmp_path)
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"not numpy at all")
    before = _left(tmp_path)
    for tok, words in ((str(tmp_path / "none.npy"), "no such file"), (str(junk), "not a .npy array")):
        r = CliRunner().invoke(cli, ["run", plan, "--device", "cpu", "--nproc", "2", "--steps", "1", "--tokens", tok,
                                     "--out", str(tmp_path / "r8")])
        assert words in one_error_line(r)
        assert _left(tmp_path) == before


def test_one_process_run_refuses_bad_tokens_before_the_executor_with_the_same_words(tmp_path, no_work):
    ids, words = TOKEN_CASES["short"]
    plan, tok = _one_device_plan(tmp_path), _tokens(tmp_path, ids)
    before = _left(tmp_path)
    r = CliRunner().invoke(cli, ["run", plan, "--device", "cpu", "--steps", "1", "--tokens", tok,
                                 "--out", str(tmp_path / "r1")])
    assert line_has(one_error_line(r), f"--tokens {tok}: ", words)
    assert _left(tmp_path) == before


def line_has(line: str, *parts: str) -> bool:
    assert all(p in line for p in parts), line
    return True


def test_token_source_and_the_launcher_share_one_check(tmp_path):
    """TokenSource (every rank, every executor) and the launcher's check say the same line."""
    from memo_exec.data import check_tokens

    for ids, _words in TOKEN_CASES.values():
        tok = _tokens(tmp_path, ids)
        with pytest.raises(ExecError) as a:
            check_tokens(tok, SMALL.vocab, SEQ)
        with pytest.raises(ExecError) as b:
            TokenSource(SMALL.vocab, 1, SEQ, path=tok)
        assert str(a.value) == str(b.value) and "\n" not in str(a.value)
    good = _tokens(tmp_path, [i % SMALL.vocab for i in range(SEQ + 1)])
    assert check_tokens(good, SMALL.vocab, SEQ).size == SEQ + 1


# -- 5. a negative token id is the id reported, not the file's largest ------------------------------------------------

def test_negative_token_id_is_the_one_reported(tmp_path):
    tok = _tokens(tmp_path, [7, 3, -5, 2] + [1] * 20)
    with pytest.raises(ExecError) as e:
        TokenSource(100, 1, 8, path=tok)
    assert "token id -5 outside the model's vocabulary [0, 100)" in str(e.value)
    tok = _tokens(tmp_path, [7, 3, 150, 2] + [1] * 20, name="big.npy")
    with pytest.raises(ExecError, match=r"token id 150 outside the model's vocabulary \[0, 100\)"):
        TokenSource(100, 1, 8, path=tok)


# -- 2. calibrate refuses a CUDA-only attention backend on a CPU at once ----------------------------------------------

@pytest.mark.parametrize("backend", ["flash_attn", "sdpa_efficient", "sdpa_cudnn"])
def test_calibrate_refuses_a_cuda_only_backend_on_cpu_before_measuring(tmp_path, monkeypatch, backend):
    import memo_exec.calibrate.suite as suite

    monkeypatch.setattr(suite, "run_suite", lambda *a, **kw: pytest.fail("the benchmarks started"))
    r = CliRunner().invoke(cli, ["calibrate", "--name", "xfa", "--device", "cpu", "--quick",
                                 "--out-dir", str(tmp_path / "cal"), "--attention-backend", backend])
    line = one_error_line(r)
    assert f"--attention-backend {backend}" in line and "needs a CUDA device" in line, line
    assert "math" in line and "--device cuda" in line, line  # the fix
    assert not (tmp_path / "cal").exists()


# -- 3. trace's empty output paths ------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--out", "--write-plan", "--cuda-history"])
def test_trace_refuses_an_empty_output_path_naming_it(tmp_path, no_work, flag):
    plan = _one_device_plan(tmp_path)
    args = ["trace", plan, flag, ""] + ([] if flag == "--out" else ["--out", str(tmp_path / "t.json")])
    before = _left(tmp_path)
    line = one_error_line(CliRunner().invoke(cli, args))
    assert line.startswith(f"error: {flag} is empty") and "file path" in line, line
    assert _left(tmp_path) == before


# -- 6. trace's --target with a device other than meta ---------------------------------------------------------------

@pytest.mark.parametrize("device,target", [("cpu", "cuda"), ("cpu", "cpu"), ("auto", "cuda")])
def test_trace_refuses_target_without_meta(tmp_path, no_work, device, target):
    plan = _one_device_plan(tmp_path)
    r = CliRunner().invoke(cli, ["trace", plan, "--out", str(tmp_path / "tr9.json"), "--device", device,
                                 "--target", target])
    line = one_error_line(r)
    assert f"--target {target}" in line and "--device meta" in line and f"--device {device}" in line, line
    assert not (tmp_path / "tr9.json").exists()


def test_trace_target_with_meta_is_still_taken(tmp_path, monkeypatch):
    seen = {}

    def record(plan, device, dtype, backend, target):
        seen.update(device=device, target=target)
        raise ExecError("stop here")

    monkeypatch.setattr(trace_mod, "record_layer_trace", record)
    plan = _one_device_plan(tmp_path)
    r = CliRunner().invoke(cli, ["trace", plan, "--out", str(tmp_path / "t.json"), "--target", "cpu"])
    assert "stop here" in one_error_line(r) and seen == {"device": "meta", "target": "cpu"}


# -- 4. a plan's CUDA-only attention_backend on a CPU run names the plan, its field and the override ---------------

def test_run_names_the_plans_attention_backend_field_and_the_override(tmp_path, no_work):
    plan = _one_device_plan(tmp_path, backend="flash_attn")
    before = _left(tmp_path)
    r = CliRunner().invoke(cli, ["run", plan, "--device", "cpu", "--steps", "1", "--out", str(tmp_path / "r5")])
    line = one_error_line(r)
    assert f"error: {plan}: attention_backend flash_attn needs a CUDA device" in line, line
    assert "--attention-backend math" in line and "sdpa_flash" in line, line
    assert _left(tmp_path) == before


def test_nproc_run_names_the_plans_attention_backend_field_too(tmp_path, no_work):
    plan = _tp2_plan(tmp_path, backend="sdpa_cudnn")
    before = _left(tmp_path)
    r = CliRunner().invoke(cli, ["run", plan, "--device", "cpu", "--nproc", "2", "--steps", "1",
                                 "--out", str(tmp_path / "r5")])
    line = one_error_line(r)
    assert f"{plan}: attention_backend sdpa_cudnn needs a CUDA device" in line and "--attention-backend" in line
    assert _left(tmp_path) == before


def test_run_names_the_attention_backend_flag_when_it_was_the_flag(tmp_path, no_work):
    plan = _one_device_plan(tmp_path)
    r = CliRunner().invoke(cli, ["run", plan, "--device", "cpu", "--steps", "1",
                                 "--attention-backend", "sdpa_efficient", "--out", str(tmp_path / "r5")])
    line = one_error_line(r)
    assert line.startswith("error: --attention-backend sdpa_efficient needs a CUDA device"), line
    assert "math" in line and plan not in line
