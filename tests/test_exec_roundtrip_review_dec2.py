"""A round-trip audit of memo-exec (Dec 2): a multi-rank run's memory check counts every rank on the host together
(checked in --nproc's launcher before torchrun starts, and again by the ranks), a rank that refuses leaves without
tearing the interpreter down under gloo's threads (no SIGABRT), a refusal leaves no hidden stage folder behind while a
crash keeps it and names it, and the times of a GPU profile's plan run on a CPU carry no relative error in the run's
JSON (rel_error null and a ``not_comparable`` flag, as report.md reads them).

The free memory is faked (`memo_exec.device.host_available_bytes` replaced in this process, in the spawned ranks, or
in torchrun's ranks through a ``sitecustomize`` on their PYTHONPATH): no test fills the machine's memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

import memo_exec.device as device_mod  # noqa: E402
import memo_exec.distributed.launch as launch_mod  # noqa: E402
import memo_exec.runner as runner_mod  # noqa: E402
from memo_exec.cli import cli  # noqa: E402
from memo_exec.errors import FitError  # noqa: E402
from memo_exec.memory_estimate import MemoryEstimate, check_fit  # noqa: E402
from memo_sim.plan.schema import read_plan, write_plan  # noqa: E402
from memo_sim.policy import get_policy  # noqa: E402
from tests.exec_helpers import make_plan, time_limit  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOY = ["--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "512", "--dtype", "fp32",
       "--seq", "512"]
MB = 10**6


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(240):
        yield


def _whatif(tmp_path_factory, name: str, *args: str) -> Path:
    from memo_sim.cli import cli as sim

    out = tmp_path_factory.mktemp(name)
    r = CliRunner().invoke(sim, ["whatif", *TOY, *args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


@pytest.fixture(scope="module")
def tp2_plan(tmp_path_factory):
    """The audit's plan: store all on tp 2 without SP (each rank's estimate 52.1 MB, its fp32 plan's peak)."""
    return _whatif(tmp_path_factory, "tp2", "--gpus", "2", "--tp", "2", "--no-sp", "--policy", "store_all")


@pytest.fixture(scope="module")
def pp2_plan(tmp_path_factory):
    """Two pipeline stages whose estimates differ (MEMO offloads on stage 0 more than on stage 1)."""
    return _whatif(tmp_path_factory, "pp2", "--gpus", "2", "--pp", "2", "--batch", "4", "--schedule", "1f1b",
                   "--policy", "memo", "--alpha", "0.5")


def _rank_peak(plan_file: Path) -> int:
    """One rank's device bytes as the plan predicts them (a store-all fp32 plan: the estimate within 1%)."""
    return int(read_plan(plan_file).predicted.peak_gpu_bytes)


def _fake_free(monkeypatch, free: int) -> None:
    monkeypatch.setattr(device_mod, "host_available_bytes", lambda: free)
    monkeypatch.setattr(runner_mod, "host_available_bytes", lambda: free)


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _estimate(total: int, host: int = 0) -> MemoryEstimate:
    terms = {"model_states": total // 2, "skeletal_resident": total // 4, "buffers": 0, "lse": 0, "norm_stats": 0,
             "transient_peak": total - total // 2 - total // 4, "layer_boundary": 0, "classifier_peak": 0,
             "optimizer_step_peak": 0, "peak_total": total}
    return MemoryEstimate(terms, host, {})


# ------------------------------------------------------------------ 1. the ranks on one host, checked together
def test_check_fit_counts_every_rank_on_the_host_together():
    """Two ranks of 50 MB on a CPU host with 80 MB free: each alone fits, together they do not; the line says so in
    words (2 ranks x 50 MB = 100 MB), and the one-process line is as it was."""
    est = _estimate(50 * MB)
    kw = dict(host_available=10**12, on_cuda=False, what="toy", where="this host")
    check_fit(est, device_free=80 * MB, **kw)  # one process: fits
    with pytest.raises(FitError) as e:
        check_fit(est, device_free=80 * MB, host_ranks=[(0, 50 * MB, 0), (1, 50 * MB, 0)], **kw)
    line = str(e.value)
    assert "needs about 2 ranks x 0.047 GiB = 0.094 GiB on this host" in line, line
    assert "which has 0.07 GiB free" in line, line
    check_fit(est, device_free=120 * MB, host_ranks=[(0, 50 * MB, 0), (1, 50 * MB, 0)], **kw)  # 100 MB of 120: fits
    # ranks of different sizes (pipeline stages): each named
    with pytest.raises(FitError, match=r"needs about 0\.09 GiB for its 2 ranks on this host \(0\.05 GiB \+ 0\.04 GiB"):
        check_fit(est, device_free=80 * MB, host_ranks=[(0, 50 * MB, 0), (1, 45 * MB, 0)], **kw)
    # on a CPU the host pool is the same memory: 2 x (30 + 20 MB)
    with pytest.raises(FitError, match=r"2 ranks x 0\.047 GiB = 0\.094 GiB"):
        check_fit(_estimate(30 * MB, 20 * MB), device_free=80 * MB,
                  host_ranks=[(0, 30 * MB, 20 * MB), (1, 30 * MB, 20 * MB)], **kw)


def test_check_fit_counts_the_pinned_pools_of_every_gpu_rank_on_the_host():
    """On CUDA each rank has its own device, but their pinned pools share the host."""
    est = _estimate(10 * MB, 50 * MB)
    kw = dict(device_free=10**12, on_cuda=True, what="toy", where="cuda:0")
    check_fit(est, host_available=80 * MB, **kw)
    with pytest.raises(FitError) as e:
        check_fit(est, host_available=80 * MB, host_ranks=[(0, 10 * MB, 50 * MB), (1, 10 * MB, 50 * MB)], **kw)
    assert "2 ranks x 0.047 GiB = 0.094 GiB of pinned host memory" in str(e.value), str(e.value)


def test_nproc_cpu_run_refuses_in_the_launcher_when_its_ranks_together_exceed_the_host(tmp_path, tp2_plan,
                                                                                          monkeypatch):
    """The audit's repro: 80 MB free, two ranks of 52.1 MB. The launcher refuses before torchrun starts (one line
    naming both ranks, exit 2, nothing left in --out's folder); with room for both it launches."""
    launched = []

    def launch(nproc, argv, out, progress, shown_out=None):
        launched.append(nproc)
        raise RuntimeError("launched")

    monkeypatch.setattr(launch_mod, "launch_nproc", launch)
    need = _rank_peak(tp2_plan)
    _fake_free(monkeypatch, int(1.5 * need))
    before = _left(tmp_path)
    r = CliRunner().invoke(cli, ["run", str(tp2_plan), "--nproc", "2", "--device", "cpu", "--steps", "1",
                                 "--out", str(tmp_path / "o")])
    assert not launched and r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: does not fit: "), r.output
    assert "2 ranks x 0.049 GiB = 0.098 GiB on this host" in lines[0] and "which has 0.07 GiB free" in lines[0], lines
    assert _left(tmp_path) == before  # no --out, no hidden stage
    _fake_free(monkeypatch, int(2.5 * need))
    r = CliRunner().invoke(cli, ["run", str(tp2_plan), "--nproc", "2", "--device", "cpu", "--steps", "1",
                                 "--out", str(tmp_path / "o")])
    assert launched == [2] and "launched" in str(r.exception), (r.output, r.exception)


def _ranks_fit(rank: int, world: int, plan_files: list[str], frees: list[int | None]) -> list[dict]:
    """Each plan's rank set up under a faked free memory (None: the machine's): its estimate, or its refusal."""
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor
    from memo_exec.runner import RunOptions

    out = []
    real = device_mod.host_available_bytes
    for plan_file, free in zip(plan_files, frees):
        fake = real if free is None else (lambda v=free: v)
        device_mod.host_available_bytes = runner_mod.host_available_bytes = fake
        plan = read_plan(plan_file)
        try:
            ex = DistExecutor(plan, RunOptions(device="cpu", steps=1), build_context(plan.layout, torch.device("cpu")),
                              DeviceSpec("cpu"))
        except FitError as e:
            out.append({"refused": str(e)})
            continue
        out.append({"total": ex.estimate.total, "host": ex.estimate.host})
        ex.close()
    return out


def test_the_ranks_check_their_host_together_and_the_launcher_sizes_them_as_they_do(tp2_plan, pp2_plan):
    """Started by torchrun alone (no launcher's check), the ranks gather their estimates and refuse together when the
    ranks on their host exceed its free memory, every rank with the same line; the launcher's estimates of the ranks
    (made from the layout, no process group) are the ranks' own, stage by stage."""
    from memo_exec.runner import RunOptions
    from tests.dist_harness import spawn

    need = _rank_peak(tp2_plan)
    files = [str(tp2_plan), str(pp2_plan), str(tp2_plan)]
    ranks = spawn(_ranks_fit, 2, files, [int(1.5 * need), None, int(2.5 * need)], timeout=180)
    refused = [r[0]["refused"] if "refused" in r[0] else None for r in ranks]
    assert refused[0] and refused[0] == refused[1], refused  # one line on both ranks
    assert "2 ranks x 0.049 GiB = 0.098 GiB on this host" in refused[0], refused[0]
    assert all("total" in r[2] for r in ranks)  # room for both: no refusal
    from memo_exec.distributed.runner import rank_estimates

    for k, plan_file in ((1, pp2_plan), (2, tp2_plan)):
        mine = rank_estimates(read_plan(plan_file), RunOptions(device="cpu", steps=1), 2)
        assert [(e.total, e.host) for e in mine] == [(r[k]["total"], r[k]["host"]) for r in ranks], plan_file
    stages = [r[1]["total"] + r[1]["host"] for r in ranks]
    assert stages[0] != stages[1]  # the stages differ: each is sized as its own


# ------------------------------------------------------------------ 2. a refusing torchrun rank leaves cleanly
class _Left(Exception):
    def __init__(self, code):
        super().__init__(code)
        self.code = code


def test_a_torchrun_rank_that_refuses_leaves_without_interpreter_shutdown(tmp_path, tp2_plan, monkeypatch):
    """A rank of several whose refusal comes after it joined the process group (the memory check) says its one line
    and then leaves by os._exit(2): no interpreter finalization, where gloo's threads aborted the process (SIGABRT,
    'terminate called without an active exception') in about 4 runs of 10; a collective failure leaves with 1 the
    same way."""
    def leave(code):
        raise _Left(code)

    monkeypatch.setattr(launch_mod, "in_torchrun", lambda: True)
    monkeypatch.setattr(os, "_exit", leave)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for exc, code in ((FitError("does not fit: the toy needs more"), 2),
                      (launch_mod.CommFailure("error: rank 1: a collective failed (x); stopping"), 1)):
        def run_rank(*a, exc=exc, **kw):
            raise exc

        monkeypatch.setattr(launch_mod, "run_rank", run_rank)
        r = CliRunner().invoke(cli, ["run", str(tp2_plan), "--device", "cpu", "--steps", "1",
                                     "--out", str(tmp_path / "o")])
        assert isinstance(r.exception, _Left) and r.exception.code == code, (r.exit_code, r.output, r.exception)
        assert r.output.strip().splitlines() == [str(exc) if code == 1 else f"error: {exc}"], r.output
    monkeypatch.setenv("WORLD_SIZE", "1")  # a world of one (no peer): the refusal exits as any command's does
    r = CliRunner().invoke(cli, ["run", str(tp2_plan), "--device", "cpu", "--steps", "1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.output, r.exception)


SITE = """import os
if os.environ.get("MEMO_TEST_RANK_FREE") and "RANK" in os.environ:  # torchrun's ranks only, not the launcher
    import memo_exec.device as _d
    _v = int(os.environ["MEMO_TEST_RANK_FREE"])
    _d.host_available_bytes = lambda: _v
"""


@pytest.mark.slow
def test_a_refusal_in_the_ranks_is_one_clean_line_every_time_and_leaves_nothing(tmp_path, tp2_plan):
    """The launcher's check passes (the machine's free memory) and the ranks see 1.5 ranks' worth: every run refuses
    with the ranks' one line, exit 2, no SIGABRT (a timing race: 5 runs; 2 of 6 died so before the fix), and
    leaves neither --out nor a hidden stage with launcher.log."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    runs = tmp_path / "runs"
    runs.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", MEMO_TEST_RANK_FREE=str(int(1.5 * _rank_peak(tp2_plan))))
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for k in range(5):
        r = subprocess.run([sys.executable, "-m", "memo_exec", "run", str(tp2_plan), "--nproc", "2", "--device", "cpu",
                            "--steps", "1", "--out", str(runs / f"o{k}")], capture_output=True, text=True,
                           timeout=180, env=env, cwd=tmp_path)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1, (k, r.returncode, r.stderr[-3000:])
        assert lines[0].startswith("error: does not fit: ") and "2 ranks x 0.049 GiB" in lines[0], lines
        assert _left(runs) == [], (k, _left(runs))


def test_a_rank_killed_by_a_signal_is_named_when_its_peer_left_first():
    """A peer that saw its collective fail now leaves at once (os._exit), so torchrun may observe it in the same poll
    as the rank that was killed and call it the root cause: the killed rank is named all the same (the launcher's
    line 'rank 1 died (SIGKILL)', not the survivor's collective failure); the ranks torchrun stopped (SIGTERM) are
    not what died."""
    log = ("Failures:\n[1]:\n  time      : 2026-12-02_14:37:54\n  host      : localhost\n"
           "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 23503)  (SIGKILL)\n"
           "Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-02_14:37:54\n  host      : localhost\n"
           "  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 23502) \n")
    assert launch_mod.killed_rank(log) == (1, -9)
    assert launch_mod.killed_rank(log.replace("-9 (pid: 23503)", "-15 (pid: 23503)")) is None  # stopped by torchrun


# ------------------------------------------------------------------ 3. a refusal leaves no stage; a crash keeps it
@pytest.mark.parametrize("rc,kept", [(2, False), (1, True)])
def test_the_launchers_stage_goes_with_a_refusal_and_stays_with_a_crash(tmp_path, tp2_plan, monkeypatch, rc, kept):
    monkeypatch.setattr(launch_mod, "launch_nproc", lambda *a, **kw: (rc, ""))
    _fake_free(monkeypatch, 10**13)
    runs = tmp_path / "runs"
    runs.mkdir()
    r = CliRunner().invoke(cli, ["run", str(tp2_plan), "--nproc", "2", "--device", "cpu", "--steps", "1",
                                 "--out", str(runs / "o")])
    assert r.exit_code == rc, (r.output, r.exception)
    left = _left(runs)
    assert (len(left) == 1 and left[0].startswith(".o.") and left[0].endswith(".partial")) if kept else left == [], left


def test_a_collective_failure_names_the_kept_folder(tmp_path, capsys):
    """A crash keeps the stage with launcher.log: every crash's line names it (a rank killed, no error line, and a
    collective failure, which named nothing)."""
    log = tmp_path / ".o.x.partial" / "launcher.log"
    log.parent.mkdir()
    log.write_text("torchrun's log\n")
    line = "error: rank 0: a collective failed (RuntimeError: peer gone); another rank exited; stopping"
    assert launch_mod._launch_status(1, 2, log, line, {line}) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(line) and str(log) in err and len(err.splitlines()) == 1, err
    refusal = "error: does not fit: toy"
    assert launch_mod._launch_status(1, 2, log, refusal, {refusal}) == 2
    assert capsys.readouterr().err.strip() == refusal  # a refusal: its line alone (the stage is removed)



def test_an_exit_2_after_the_run_began_keeps_and_names_the_stage(tmp_path, tp2_plan, monkeypatch, capsys):
    """A review (2026-12-02): out of memory mid-run (or a loss not finite) exits 2 as a refusal does, and the
    launcher deleted the stage and its launcher.log; the ranks now mark the stage once their checks passed
    (`launch.STARTED_MARK`), and only a refusal before it leaves nothing."""
    log = tmp_path / ".o.x.partial" / "launcher.log"
    log.parent.mkdir()
    log.write_text("torchrun's log\n")
    oom = "error: the device ran out of memory while running the plan (CUDA out of memory)"
    assert launch_mod._launch_status(1, 2, log, oom, {oom}, began=True) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(oom) and str(log) in err and len(err.splitlines()) == 1, err

    def began(nproc, argv, out_dir, progress, shown_out=None):
        (Path(out_dir) / launch_mod.STARTED_MARK).touch()
        return 2, ""

    monkeypatch.setattr(launch_mod, "launch_nproc", began)
    _fake_free(monkeypatch, 10**13)
    runs = tmp_path / "runs"
    runs.mkdir()
    r = CliRunner().invoke(cli, ["run", str(tp2_plan), "--nproc", "2", "--device", "cpu", "--steps", "1",
                                 "--out", str(runs / "o")])
    assert r.exit_code == 2, (r.output, r.exception)
    left = _left(runs)
    assert len(left) == 1 and left[0].startswith(".o.") and left[0].endswith(".partial"), left
    assert not (runs / left[0] / launch_mod.STARTED_MARK).exists()  # never one of the run's files


# ------------------------------------------------------------------ 4. times of another device: no rel_error in JSON
SMALL = ModelConfig("roundtrip-test", 4, 64, 4, 256, vocab=128, dtype="fp32")
PRED = {"status": "OK", "iteration_s": 0.05, "mfu": 0.4, "tgs_tokens_per_gpu_s": 5000.0, "peak_gpu_bytes": 2.0e8,
        "peak_host_bytes_per_node": 1.0e6, "exposed_copy_s": 0.0}
LT = {"forward": 0.004, "backward": 0.008, "recompute": 0.001, "offload": 0.002, "prefetch": 0.002}


def test_json_of_a_gpu_plan_run_on_a_cpu_has_no_time_errors(tmp_path):
    """An H100 plan on a CPU: --json and measured.json give every time row (totals, streams, layer ops) rel_error null
    and ``not_comparable`` saying why, as report.md reads them (the audit: iteration time rel_error 103.1, a +10,310%
    error); byte rows of the same (fp32) plan keep their errors; report.md's cells still read "not comparable"."""
    plan = write_plan(make_plan(SMALL, 256, get_policy("full_offload"), predicted=PRED, layer_timings=LT, chunk=100),
                      tmp_path / "plan.json")
    out = tmp_path / "o"
    r = CliRunner().invoke(cli, ["run", str(plan), "--device", "cpu", "--steps", "2", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    meta = json.loads((out / "measured.json").read_text())["meta"]
    assert doc["times_comparable"] is False
    for totals, streams, ops in ((doc["totals"], doc["streams"], doc["ops"]),
                                 (meta["comparison"], meta["streams"], meta["ops"])):
        it = next(t for t in totals if t["quantity"] == "iteration time")
        assert it["predicted"] and it["measured"] and it["rel_error"] is None, it
        assert it["not_comparable"].startswith("not comparable (") and "h100-sxm5-80gb" in it["not_comparable"], it
        times = [t for t in totals if t["unit"] in ("s", "tok/s", "") and t["predicted"] and t["measured"]]
        assert times and all(t["rel_error"] is None and t["not_comparable"] for t in times), times
        both = [s for s in streams + ops if s["predicted_s"] and s["measured_s"]]
        assert len(both) > 5 and all(s["rel_error"] is None and s["not_comparable"] == it["not_comparable"]
                                     for s in both), both
        byte_rows = [t for t in totals if t["unit"] == "bytes" and t["rel_error"] is not None]
        assert byte_rows and not any("not_comparable" in t for t in byte_rows), byte_rows
    md = (out / "report.md").read_text()
    it_row = next(ln for ln in md.splitlines() if ln.startswith("| iteration time |"))
    assert it_row.rstrip(" |").split("|")[-2].strip() == "not comparable", it_row
    fwd = next(ln for ln in md.splitlines() if ln.startswith("| 0 | forward |"))
    assert fwd.rstrip(" |").endswith("not comparable") and "%" not in fwd, fwd
    busy = next(ln for ln in md.splitlines() if ln.startswith("| compute | busy |"))
    assert busy.rstrip(" |").endswith("not comparable"), busy


def test_per_rank_rows_of_another_device_carry_no_iteration_error():
    from memo_exec.report import rank_rows

    payload = {"rank": 0, "coords": {"tp": 0}, "local_tokens": 256, "steady": {"iteration_s": 0.25},
               "summaries": [{"stream_busy_s": {"compute": 0.2}}], "events": [], "losses": [1.0]}
    row = rank_rows([payload], 0.0024, not_comparable="not comparable (x)")[0]
    assert row["iteration_rel_error"] is None and row["iteration_not_comparable"] == "not comparable (x)", row
    row = rank_rows([payload], 0.2)[0]
    assert row["iteration_rel_error"] == pytest.approx(0.25) and "iteration_not_comparable" not in row, row
