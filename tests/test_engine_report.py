"""Chrome trace, figures, the simulator's click commands and the API the what-if calls."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from memo_sim.engine import DEFAULT_ALPHAS, simulate, sweep_alpha
from memo_sim.search.whatif import simulate_candidates
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig, get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile
from memo_sim.report.chrome_trace import chrome_trace, write_chrome_trace
from memo_sim.report.figures import (
    alpha_sweep_figure, gantt_figure, memory_figure, mfu_vs_seq_figure, parse_layer_range,
)
from memo_sim.timeline import Timeline

K = 1024
PROFILE = load_profile("a800-80gb")
GPT7B = get_model("gpt-7b")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def memo_run():
    return simulate(GPT7B, Layout(tp=4, cp=2), 1, 128 * K, get_policy("memo", 0.5), PROFILE)


def test_chrome_trace_is_valid_json_with_one_track_per_stream(memo_run, tmp_path):
    path = write_chrome_trace(memo_run.timeline, tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    ev = trace["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    streams = {(e.device, e.stream) for e in memo_run.timeline.events}
    assert len(names) == len(streams)  # one named track per (device, stream)
    tracks = {}
    for e in ev:
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in names
            assert e["dur"] >= 0 and e["ts"] >= 0
            tracks.setdefault((e["pid"], e["tid"]), set()).add(e["args"]["phase"])
    assert len(tracks) == len(streams)
    assert {"compute", "comm", "cp_comm", "d2h", "h2d"} <= {e.stream for e in memo_run.timeline.events}
    # microseconds: the last op ends at the iteration time
    end_us = max(e["ts"] + e["dur"] for e in ev if e["ph"] == "X")
    assert end_us == pytest.approx(memo_run.iteration_s * 1e6, rel=1e-9)
    counters = [e for e in ev if e["ph"] == "C"]
    assert {c["name"] for c in counters} == {"GPU memory (GiB)", "pinned host memory (GiB)"}
    # no stream runs two X events at once in the trace either
    for key in tracks:
        xs = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["ph"] == "X" and (e["pid"], e["tid"]) == key)
        assert all(b[0] >= a[1] - 1e-3 for a, b in zip(xs, xs[1:]))


def test_timeline_roundtrip_and_trace_of_a_read_timeline(memo_run, tmp_path):
    p = memo_run.timeline.write_json(tmp_path / "timeline.json")
    back = Timeline.read_json(p)
    assert back.events == memo_run.timeline.events
    assert chrome_trace(back) == chrome_trace(memo_run.timeline)


def test_figures_are_pngs(memo_run, tmp_path):
    for p in (gantt_figure(memo_run.timeline, tmp_path / "g.png", (10, 12)),
              gantt_figure(memo_run.timeline, tmp_path / "g_default.png"),
              memory_figure(memo_run.timeline, tmp_path / "m.png")):
        assert p.read_bytes()[:8] == PNG


def test_alpha_sweep_and_mfu_vs_seq_figures_mark_failures(tmp_path):
    seen = []
    res = sweep_alpha(GPT7B, Layout(tp=8), 1, 1024 * K, PROFILE, progress=lambda d, n: seen.append((d, n)))
    assert [r.policy.alpha for r in res] == list(DEFAULT_ALPHAS)
    assert seen[-1] == (len(DEFAULT_ALPHAS), len(DEFAULT_ALPHAS))
    statuses = [r.status for r in res]
    assert "OK" in statuses and "OOHM" in statuses  # 1M tokens: host memory bounds alpha
    first_fail = statuses.index("OOHM")
    assert all(s == "OOHM" for s in statuses[first_fail:])
    failed = res[first_fail]
    assert failed.iteration_s is None and failed.mfu is None and failed.failure.tensor.endswith(".offload")
    assert alpha_sweep_figure(res, tmp_path / "a.png").read_bytes()[:8] == PNG
    seq_runs = [simulate(GPT7B, Layout(tp=8), 1, s, get_policy(p), PROFILE, keep_timeline=False)
                for s in (64 * K, 256 * K) for p in ("store_all", "full_recompute", "full_offload")]
    assert any(r.status == "OOM" for r in seq_runs)
    assert mfu_vs_seq_figure(seq_runs, tmp_path / "s.png").read_bytes()[:8] == PNG


def test_layer_range_parsing():
    assert parse_layer_range("14:16", 32) == (14, 16)
    assert parse_layer_range("30:", 32) == (30, 31)
    assert parse_layer_range(None) is None
    from memo_sim.errors import MemoError

    assert parse_layer_range("0:31", 32) == (0, 31)
    with pytest.raises(MemoError, match=r"layers 0\.\.31.*e\.g\. --layers 0:31"):  # B past the last layer
        parse_layer_range("0:999", 32)
    for bad in ("5", "a:b", "6:2", "40:41"):
        with pytest.raises(MemoError):
            parse_layer_range(bad, 32)


def test_sim_result_fields(memo_run):
    r = memo_run
    d = r.to_dict()
    for k in ("status", "iteration_s", "mfu", "tgs_tokens_per_gpu_s", "peak_gpu_bytes", "peak_host_bytes_per_node",
              "exposed_copy_s", "layer_timings_s"):
        assert k in d
    lt = r.layer_timings
    assert set(lt) == {"forward", "backward", "recompute", "offload", "prefetch"}
    assert all(v > 0 for v in lt.values())
    assert 0 < r.mfu < 1 and r.tgs > 0
    json.dumps(d)


def test_dp_counts_every_replica_in_mfu():
    one = simulate(GPT7B, Layout(tp=8), 1, 64 * K, get_policy("memo", 0.3), PROFILE, contention=False,
                   keep_timeline=False)
    two = simulate(GPT7B, Layout(tp=8, dp=2), 1, 64 * K, get_policy("memo", 0.3), PROFILE, contention=False,
                   keep_timeline=False)
    # two replicas train twice the tokens in a little more time (the gradient all-reduce) on twice the GPUs
    assert two.iteration_s > one.iteration_s
    assert two.mfu == pytest.approx(one.mfu * one.iteration_s / two.iteration_s)


def test_simulate_candidates_feeds_the_plan(tmp_path):
    from memo_sim.search.plan_build import bare_plan
    from memo_sim.search.whatif import candidates_for

    res = candidates_for(GPT7B, 256 * K, 8, PROFILE, tp=8)
    sims = simulate_candidates(res.candidates[:3])
    assert len(sims) == 3 and all(c.simulated is not None for c in res.candidates[:3])
    plan = bare_plan(res.candidates[0])  # the memory plan aside (build_plan adds it)
    assert plan.predicted.source == "simulated"
    assert set(plan.layer_timings_s) == {"forward", "backward", "recompute", "offload", "prefetch"}


def _cli() -> click.Group:
    from memo_sim.cli import cli

    return cli


def test_simulate_and_plot_commands(tmp_path):
    toy = ModelConfig("toy", 4, 256, 8, 1024, vocab=1000)
    from memo_sim.plan.schema import Plan, write_plan

    plan = Plan(model=toy, batch=1, seq_tokens=4096, gpus=2, layout=Layout(tp=2), policy=get_policy("memo", 0.5),
                profile="a800-80gb", predicted={"status": "OK", "iteration_s": 0.01}, layer_timings_s={})
    write_plan(plan, tmp_path / "plan.json")
    runner = CliRunner()
    r = runner.invoke(_cli(), ["simulate", str(tmp_path / "plan.json"), "--out", str(tmp_path / "sim")],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output
    for f in ("timeline.json", "trace.json", "gantt.png", "memory.png", "summary.json"):
        assert (tmp_path / "sim" / f).exists(), f
    assert json.loads((tmp_path / "sim" / "summary.json").read_text())["status"] == "OK"
    r = runner.invoke(_cli(), ["plot", str(tmp_path / "sim" / "timeline.json"), "--out", str(tmp_path / "plot"),
                               "--layers", "0:1"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "plot" / "gantt.png").read_bytes()[:8] == PNG
    r = runner.invoke(_cli(), ["plot", str(tmp_path / "sim" / "timeline.json"), "--out", str(tmp_path / "plot"),
                               "--layers", "9:2"])
    assert r.exit_code == 2 and "--layers" in r.output
    r = runner.invoke(_cli(), ["sweep-alpha", str(tmp_path / "plan.json"), "--out", str(tmp_path / "sw"),
                               "--alphas", "0,0.5,1"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert len(json.loads((tmp_path / "sw" / "alpha_sweep.json").read_text())) == 3
    r = runner.invoke(_cli(), ["simulate", str(tmp_path / "missing.json"), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "no such plan file" in r.output


def test_a_multi_node_timeline_reads_back(tmp_path):
    """Node n's host memory is sampled as device -1 - n (engine.core.HOST_DEVICE_BASE); the file
    format reads back what the simulator writes for a second node (an SPPO timeline has them)."""
    from memo_sim.timeline import MemorySample, Timeline

    t = Timeline([], [MemorySample(0.0, 0, "gpu", 1.0), MemorySample(0.0, -1, "host", 2.0),
                      MemorySample(0.0, -2, "host", 3.0)], {"source": "simulated"})
    back = Timeline.read_json(t.write_json(tmp_path / "timeline.json"))
    assert [m.device for m in back.memory] == [0, -1, -2]


def test_a_failed_run_reports_no_peak():
    """sweep-seq's JSON gave an out-of-memory row peak_gpu_bytes 76 GiB, below the 78 GiB capacity: the memory in
    use when the run stopped (a review). A failed run's summary has no peak; how full the GPU was is said apart."""
    from memo_sim.engine.simulate import simulate
    from memo_sim.layout.parallel import Layout
    from memo_sim.model.config import get_model
    from memo_sim.policy import get_policy
    from memo_sim.profile.loader import load_profile

    r = simulate(get_model("gpt-7b"), Layout(tp=8), 1, 1 << 20, get_policy("store_all"), load_profile("a800-80gb"),
                 keep_timeline=False)
    assert r.status == "OOM"
    d = r.to_dict()
    assert d["peak_gpu_bytes"] is None and 0 < d["in_use_at_failure_bytes"] <= d["gpu_capacity_bytes"]
    assert d["peak_host_bytes_per_node"] is None and "in_use_at_failure_host_bytes_per_node" in d
