"""A review of the caching-allocator outputs (2026-12-01, second round): the classifier of a memory-planned run in
its arena (replay and snapshot), roundup_power2_divisions' '>' as PyTorch parses it, the values of the keys that
change no device memory checked as PyTorch checks them, the snapshot of a single-stage run from the replay that
summary.json reports, a replay that found no steady iteration saying so, memplan's fragmentation measured where
whatif measures it, memplan's --precision checked and used."""

from __future__ import annotations

import json

import pytest

from memo_sim.api import get_model, load_profile
from memo_sim.errors import MemoError
from memo_sim.layout.alloc_conf import parse_alloc_conf
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.iteration_replay import replay_iteration
from memo_sim.memplan.iteration_requests import chunk_in_arena, iteration_stream
from memo_sim.engine.simulate import simulate
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy
from memo_sim.report.memory_snapshot import predicted_snapshot
from tests.cli_run import one_line, run_sim

A800 = load_profile("a800-80gb")
TOY = ModelConfig("toy", 4, 256, 8, 1024, vocab=1024)
TOY_FLAGS = ["--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024"]


_run, _one_line = run_sim, one_line  # tests/cli_run.py


# ---- 1: the classifier of a memory-planned run sits in the arena --------------------------------------------------

def test_memo_replay_puts_the_classifier_chunk_in_the_arena_as_memo_exec_does():
    """A review: gpt-7b at 1M on MEMO's plan (tp 8, sp) ran out of memory in the replay at cls.chunk (14.48 GiB)
    where memo-exec puts the chunk in the 20 GiB arena (memo_exec/arena.py between_layers, memo_exec/model.py
    ChunkPlace); the replay now asks the caching allocator for no chunk and fits."""
    m, lay, seq = get_model("gpt-7b"), Layout(tp=8, sp=True), 1 << 20
    pol = get_policy("memo", 0.356)
    stream = iteration_stream(m, lay, 1, seq, pol)
    assert not any(bid == "cls.chunk" for _k, bid, _s in stream.iteration)
    r = replay_iteration(m, lay, 1, seq, pol, A800)
    assert not r.oom and r.static_memory_plan
    # on the caching allocator the chunk is still its own request; an arena that holds too few rows holds none
    assert any(bid == "cls.chunk" for _k, bid, _s in iteration_stream(m, lay, 1, seq,
                                                                       get_policy("full_recompute")).iteration)
    assert not chunk_in_arena(m, lay, 1, seq, 1 << 20)
    assert chunk_in_arena(m, lay, 1, seq, 20 << 30)


def test_memo_snapshot_of_the_1m_plan_fits_without_a_warning():
    """The review's `simulate --memory-snapshot` of the same plan warned that the lumped requests did not fit
    ('L1.fwd.working#7' needs 7679770624 B); the single-stage snapshot is now the replay's, which fits."""
    m, lay, seq = get_model("gpt-7b"), Layout(tp=8, sp=True), 1 << 20
    r = simulate(m, lay, 1, seq, get_policy("memo", 0.356), A800, record=True)
    snap = predicted_snapshot(r, A800, 0)
    assert "memo_note" not in snap
    assert sum(s["total_size"] for s in snap["segments"]) <= A800.usable_gpu_memory
    names = [e["frames"][0]["name"] for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert sum(n.startswith("static.memory_plan_arena") for n in names) == 1
    assert not any(n.startswith("cls.chunk") for n in names)


# ---- 2: roundup_power2_divisions' '>' ---------------------------------------------------------------------------

def test_roundup_list_greater_than_fills_after_the_last_key_as_the_current_parser():
    """PyTorch's AcceleratorAllocatorConfig::parseRoundUpPower2Divisions (c10/core/AllocatorConfig.cpp at
    0ac716637f) fills '>' from last_index + 1: the 1024 MiB class keeps its own 4 (the review read the older
    parser, which filled from last_index and gave 8 there); a leading '>' leaves interval 0 alone."""
    divs = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").roundup_power2_divisions
    assert divs == (1,) * 9 + (2, 4) + (8,) * 5
    assert parse_alloc_conf("roundup_power2_divisions:[>:2]").roundup_power2_divisions == (0,) + (2,) * 15


# ---- 3: the no-effect keys' values ------------------------------------------------------------------------------

@pytest.mark.parametrize("text,words", [
    ("release_lock_on_cudamalloc:yes", "release_lock_on_cudamalloc must be True or False"),
    ("pinned_use_cuda_host_register:1", "pinned_use_cuda_host_register must be True or False"),
    ("pinned_use_background_threads:true", "pinned_use_background_threads must be True or False"),
    ("pinned_num_register_threads:3", "pinned_num_register_threads must be a power of two from 1 to 128"),
    ("pinned_num_register_threads:256", "pinned_num_register_threads must be a power of two from 1 to 128"),
    ("pinned_num_register_threads:x", "pinned_num_register_threads must be an integer"),
    ("pinned_reserve_segment_size_mb:0", "pinned_reserve_segment_size_mb must be an integer > 0"),
])
def test_no_effect_keys_are_checked_as_pytorch_checks_them(text, words):
    """A review: release_lock_on_cudamalloc:yes and pinned_num_register_threads:3 were written into plan.json;
    PyTorch refuses both at start-up (c10/cuda/CUDAAllocatorConfig.cpp parseArgs)."""
    with pytest.raises(MemoError, match=words):
        parse_alloc_conf(text)


def test_no_effect_keys_with_good_values_are_kept_and_bad_ones_refused_on_the_command_line(tmp_path):
    conf = parse_alloc_conf("release_lock_on_cudamalloc:True,pinned_num_register_threads:8,"
                            "pinned_reserve_segment_size_mb:64")
    assert dict(conf.other) == {"release_lock_on_cudamalloc": "True", "pinned_num_register_threads": "8",
                                "pinned_reserve_segment_size_mb": "64"}
    out = _one_line(_run(["whatif", *TOY_FLAGS, "--seq", "2K", "--gpus", "1", "--policy", "full_recompute",
                          "--jobs", "1", "--alloc-conf", "release_lock_on_cudamalloc:yes",
                          "--out", tmp_path / "w"], code=2))
    assert "release_lock_on_cudamalloc" in out and "True or False" in out
    assert not (tmp_path / "w" / "plan.json").exists()


# ---- 4: the single-stage snapshot is the replay summary.json reports ---------------------------------------------

def _walk(snap: dict) -> tuple[int, int, int]:
    """(peak reserved, peak live requested bytes, reserved at the end) along the snapshot's trace."""
    res = live = peak_res = peak_live = 0
    for e in snap["device_traces"][0]:
        a = e["action"]
        res += e["size"] if a in ("segment_alloc", "segment_map") else -e["size"] if a in (
            "segment_free", "segment_unmap") else 0
        live += e["size"] if a == "alloc" else -e["size"] if a == "free_completed" else 0
        peak_res, peak_live = max(peak_res, res), max(peak_live, live)
    return peak_res, peak_live, res


def test_a_caching_allocator_plans_snapshot_is_the_replay_of_summary_json():
    """A review: the README toy under full_recompute wrote a snapshot of 122 MiB of segments and 104.99 MiB
    allocated beside summary.json's replay, 96 MiB reserved and 86.25 MiB allocated. The snapshot now replays the
    same requests on the same allocator: its segments peak at the replay's reserved peak, its live bytes at the
    stream's max-live, and it says what it is (``memo_what``)."""
    r = simulate(TOY, Layout(), 1, 2048, get_policy("full_recompute"), A800, record=True)
    snap = predicted_snapshot(r, A800, 0)
    al = r.to_dict()["allocator"]  # summary.json's allocator fields
    peak_res, peak_live, end = _walk(snap)
    assert peak_res == al["peak_reserved_bytes"]
    assert peak_live == al["max_live_bytes"]
    assert end == sum(s["total_size"] for s in snap["segments"])
    assert "caching-allocator replay" in snap["memo_what"] and "memo_note" not in snap


# ---- 5: a replay without a steady iteration says so -------------------------------------------------------------

def test_a_replay_without_a_steady_iteration_says_so():
    """A review: on the 672K memo-paper plan the replay's retries alternated 39/40 and nothing said the reported
    iteration was not what every iteration does. `IterationReplay.steadiness` (in `to_json_obj` too) says it,
    with the retries of every replayed iteration (``reorganizations_by_iteration``)."""
    pol = get_policy("full_recompute")
    one = replay_iteration(TOY, Layout(), 1, 2048, pol, A800, iterations=1)
    assert not one.steady and not one.oom and one.reorganizations_by_iteration == [0]
    assert one.steadiness().startswith("not steady: none of the 1 iterations replayed")
    assert one.to_json_obj()["steadiness"] == one.steadiness()
    steady = replay_iteration(TOY, Layout(), 1, 2048, pol, A800)
    assert steady.steady and steady.steadiness() == ""
    assert len(steady.reorganizations_by_iteration) == steady.iterations


# ---- 6: memplan's fragmentation where whatif measures it ----------------------------------------------------------

def test_memplan_csv_fragmentation_is_measured_when_the_allocation_peaks(tmp_path):
    """A review: memplan --csv printed 50.0% at the reserved peak where whatif and explain measure at the
    allocation peak (`IterationReplay.fragmentation_at_peak`); memplan now does too (the reserved-peak one kept
    under its own name)."""
    csv = tmp_path / "hc.csv"
    csv.write_text("id,lower,upper,size\na,0,4,1\nb,0,1,1572864\nc,0,4,12582913\nd,2,4,9437184\ne,2,4,1048577\n")
    ca = json.loads(_run(["memplan", "--csv", csv, "--json"]).output)["caching_allocator"]
    assert ca["reserved_at_peak_allocated_bytes"] == ca["peak_reserved_bytes"] == 42 << 20
    assert ca["fragmentation_at_peak"] == pytest.approx(1 - ca["peak_allocated_bytes"] / (42 << 20))
    assert ca["fragmentation_at_reserved_peak"] == pytest.approx(0.5, abs=1e-3)
    assert "fragmentation when the allocation peaks 46.4%" in _run(["memplan", "--csv", csv]).output


# ---- 7: memplan --precision --------------------------------------------------------------------------------------

def test_memplan_precision_is_checked_against_the_gpu_and_used():
    """A review: memplan --precision fp8-tensorwise/mxfp8/nvfp4 on an A100 was accepted and answered as bf16.
    The what-if's GEMM-format check refuses it; on an H100 FP8 is planned, its cast copies in the caching
    allocator's replay of the layer (outside the arena), and the answer names the format."""
    base = ["memplan", *TOY_FLAGS, "--seq", "2K", "--tp", "1", "--policy", "memo", "--alpha", "0.5",
            "--time-limit", "1", "--json"]
    out = _one_line(_run(base + ["--profile", "a100-sxm4-80gb", "--precision", "nvfp4"], code=2))
    assert "--precision nvfp4" in out and "a100-sxm4-80gb" in out
    bf16 = json.loads(_run(base + ["--profile", "h100-sxm5-80gb", "--precision", "bf16"]).output)
    fp8 = json.loads(_run(base + ["--profile", "h100-sxm5-80gb", "--precision", "fp8-tensorwise"]).output)
    assert (bf16["gemm_format"], fp8["gemm_format"]) == ("bf16", "fp8-tensorwise")
    assert fp8["caching_allocator_layer"]["peak_allocated_bytes"] > bf16["caching_allocator_layer"][
        "peak_allocated_bytes"]


def test_the_engines_allocator_summary_carries_the_replays_steadiness():
    """The replay's steadiness reaches what explain and summary.json read (`memo_sim.engine.result.allocator_summary`):
    explain says where no iteration was steady, with the retries of each."""
    from memo_sim.engine.result import allocator_summary

    pol = get_policy("full_recompute")
    one = allocator_summary(replay_iteration(TOY, Layout(), 1, 2048, pol, A800, iterations=1), A800)
    assert one["steady"] is False and one["iterations"] == 1 and one["reorganizations_by_iteration"] == [0]
    steady = allocator_summary(replay_iteration(TOY, Layout(), 1, 2048, pol, A800), A800)
    assert steady["steady"] is True
