"""The predicted memory snapshot (`memo_sim.report.memory_snapshot`): PyTorch's own memory_viz
reads it; a single-stage run's is its caching-allocator replay (its trace's peak the replayed requests' max-live),
a pipeline stage's the simulator's allocations (its trace's peak the simulated peak)."""

from __future__ import annotations

import pickle

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.plan.schema import read_plan
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.memplan.iteration_requests import iteration_stream
from memo_sim.report.memory_snapshot import _lump_snapshot, allocation_stream, predicted_snapshot, trace_peak_bytes

mv = pytest.importorskip("torch.cuda._memory_viz")

TOY = ModelConfig("toy", 4, 256, 8, 1024, vocab=1024)


@pytest.mark.parametrize("policy,layout,schedule,batch", [
    (("store_all",), Layout(), None, 1), (("full_recompute",), Layout(), None, 1),
    (("full_offload",), Layout(), None, 1), (("memo", 0.3), Layout(), None, 1),
    (("memo", 0.3), Layout(tp=2, cp=2), None, 1), (("full_recompute",), Layout(pp=2), "1f1b", 4),
], ids=["store_all", "full_recompute", "full_offload", "memo", "memo-tp2-cp2", "1f1b-pp2"])
def test_snapshot_peak_is_the_simulated_peak_and_memory_viz_reads_it(policy, layout, schedule, batch):
    """A single stage's snapshot is the replay (a review: it was the simulator's lumps, which summary.json's
    allocator fields do not report); a pipeline stage's the simulator's allocations."""
    profile = load_profile("a800-80gb")
    r = simulate(TOY, layout, batch, 2048, get_policy(*policy), profile, record=True, schedule=schedule,
                 micro_batch=1 if schedule else None)
    assert r.ok
    devices = sorted({o.device for o in r.ops})
    for d in devices:
        snap = predicted_snapshot(r, profile, d)
        if schedule is None:
            assert trace_peak_bytes(snap) == iteration_stream(TOY, layout, batch, 2048,
                                                              get_policy(*policy)).max_live_bytes()
            assert "caching-allocator replay" in snap["memo_what"]
        else:
            stream = allocation_stream(r, d)
            assert len(stream) == len([s for s in r.timeline.memory if s.device == d and s.kind == "gpu"])
            peak = max(s.nbytes for s in r.timeline.memory if s.device == d and s.kind == "gpu")
            assert abs(trace_peak_bytes(snap) - peak) <= len(stream)  # bytes rounded to whole ones per request
        assert "<html" in mv.trace_plot(snap).lower() and "<html" in mv.segment_plot(snap).lower()
        assert "segments:" in mv.segsum(snap) and f"{len(snap['device_traces'][0])} entries" in mv.trace(snap)
        allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
        frees = [e for e in snap["device_traces"][0] if e["action"] == "free_completed"]
        assert allocs and all(e["frames"][0]["name"] for e in allocs)
        assert len(frees) <= len(allocs)
    if schedule is not None:
        assert max(abs(trace_peak_bytes(predicted_snapshot(r, profile, d))) for d in devices) == pytest.approx(
            r.peak_gpu_bytes, abs=1e3)


def test_simulate_writes_the_snapshot(tmp_path):
    r = CliRunner().invoke(cli, ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024",
                                 "--vocab", "1024", "--seq", "2K", "--gpus", "1", "--policy", "memo", "--alpha", "0.3",
                                 "--jobs", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["simulate", str(tmp_path / "plan.json"), "--out", str(tmp_path / "sim"),
                                 "--memory-snapshot"])
    assert r.exit_code == 0, r.output
    snap = pickle.loads((tmp_path / "sim" / "memory_snapshot.pickle").read_bytes())
    plan = read_plan(tmp_path / "plan.json")  # the replay's requests (the arena one of them), as the snapshot's
    stream = iteration_stream(plan.model, plan.layout, plan.micro_batch or plan.batch, plan.seq_tokens, plan.policy,
                              plan.classifier_chunk_tokens)
    assert trace_peak_bytes(snap) == stream.max_live_bytes()
    assert "manifest.json" in {p.name for p in (tmp_path / "sim").iterdir()}


def _max_reserved(snap: dict) -> int:
    cur = peak = 0
    for e in snap["device_traces"][0]:
        cur += e["size"] if e["action"] == "segment_alloc" else -e["size"] if e["action"] == "segment_free" else 0
        peak = max(peak, cur)
    return peak


def test_the_snapshots_segments_stay_within_the_gpu():
    """A review: the snapshot's allocator had no capacity, so a plan that fits (peak 70 GiB of 78) showed 79.59 GiB
    of segments in memory_viz. On the profile's usable memory a request that finds no room frees the cached
    segments and tries again, as PyTorch does (``segment_free``), and the segments never exceed the GPU. (A
    single stage's snapshot is now its replay, which has its capacity; the simulator's lumps, a pipeline stage's
    snapshot, are checked here on a single stage's run.)"""
    from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS
    from dataclasses import replace

    from memo_sim.model.config import PRESETS
    from memo_sim.profile.schema import Quantity

    prof = load_profile("h100-sxm5-80gb")
    r = simulate(replace(PRESETS["llama-3.1-8b"], layers=4), Layout(cp=8, zero=3), 1, 128 * 1024,
                 get_policy("full_recompute"), prof, record=True)
    unbounded = _max_reserved(_lump_snapshot(r, None, 0, CLASSIFIER_CHUNK_TOKENS))
    assert unbounded > r.peak_gpu_bytes * 1.1  # the unbounded model caches more than the peak needs
    cap = (r.peak_gpu_bytes + unbounded) / 2
    small = replace(prof, gpu=replace(prof.gpu, memory_bytes=Quantity(cap + float(prof.gpu.reserved_bytes), "test")))
    snap = _lump_snapshot(r, small, 0, CLASSIFIER_CHUNK_TOKENS)
    assert "memo_note" not in snap
    assert r.peak_gpu_bytes <= _max_reserved(snap) <= small.usable_gpu_memory
    assert any(e["action"] == "segment_free" for e in snap["device_traces"][0])
    assert abs(trace_peak_bytes(snap) - r.peak_gpu_bytes) <= len(allocation_stream(r, 0))
    assert "<html" in mv.segment_plot(snap).lower()
