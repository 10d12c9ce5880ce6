"""The caching allocator's settings beyond the defaults, on hand-made request sequences whose
outcome PyTorch's rules fix (c10/cuda/CUDACachingAllocator.cpp and c10/core/AllocatorConfig.cpp,
pytorch/pytorch at 001074d25084fdb87a799823e395a50f5ec044d3): roundup_power2_divisions, the
garbage collection under a memory fraction, per-stream pools, and the setting string as
PYTORCH_CUDA_ALLOC_CONF writes it (parsed once, refused in one line, carried by the layout)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.errors import MemoError
from memo_sim.layout.alloc_conf import ROUNDUP_INTERVALS, merged_alloc_conf, parse_alloc_conf
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.allocator_config import roundup_power2_next_division
from memo_sim.memplan.caching_allocator import AllocatorConfig, AllocatorOutOfMemory, CachingAllocatorModel

MiB = 1 << 20
BIG = 1 << 40


# ---- roundup_power2_divisions -------------------------------------------------------------------
def test_roundup_power2_next_division_matches_pytorch_examples():
    # PyTorch's comment: with 4 divisions, 1200 MiB lies between 1024 and 2048 MiB, whose quarter
    # steps are 1280, 1536, 1792: it rounds up to 1280 MiB
    assert roundup_power2_next_division(1200 * MiB, 4) == 1280 * MiB
    assert roundup_power2_next_division(1024 * MiB, 4) == 1024 * MiB  # a power of two stays
    assert roundup_power2_next_division(1280 * MiB, 4) == 1280 * MiB  # on a step stays
    assert roundup_power2_next_division(1281 * MiB, 2) == 1536 * MiB  # halves: 1024, 1536, 2048
    assert roundup_power2_next_division(1537 * MiB, 2) == 2048 * MiB


def test_round_size_uses_the_size_class_divisions():
    plain = AllocatorConfig(capacity_bytes=BIG)
    assert plain.round_size(1200 * MiB + 1) == 1200 * MiB + 512  # 512-byte rounding by default
    four = AllocatorConfig(capacity_bytes=BIG, roundup_power2_divisions=(4,) * ROUNDUP_INTERVALS)
    assert four.round_size(1200 * MiB) == 1280 * MiB
    assert four.round_size(1000) == 1024  # below 512 x 4 bytes: plain rounding
    # the list form: 4 divisions only from the 1 GiB class up (interval log2(1024 MiB) = 10)
    conf = parse_alloc_conf("roundup_power2_divisions:[1024:4]")
    assert conf.roundup_power2_divisions[:11] == (4,) * 11  # the first key also fills every class below it
    conf = parse_alloc_conf("roundup_power2_divisions:[256:1,>:4]")
    assert conf.roundup_power2_divisions[8] == 1 and conf.roundup_power2_divisions[9:] == (4,) * 7
    cfg = AllocatorConfig.from_conf(BIG, conf)
    assert cfg.round_size(200 * MiB + 7) == 200 * MiB + 512  # 1 division: plain
    assert cfg.round_size(1200 * MiB) == 1280 * MiB


def test_roundup_makes_growing_requests_reuse_one_block():
    """Requests of 1100 then 1200 MiB: with plain rounding the second cannot use the first's freed
    1100 MiB segment (a new cudaMalloc); with 4 divisions both round to 1280 MiB and the second
    reuses the first's block."""
    def mallocs(cfg: AllocatorConfig) -> int:
        m = CachingAllocatorModel(cfg)
        m.malloc("a", 1100 * MiB)
        m.free("a")
        m.malloc("b", 1200 * MiB)
        m.check_invariants()
        return m.num_cuda_malloc

    assert mallocs(AllocatorConfig(capacity_bytes=BIG)) == 2
    assert mallocs(AllocatorConfig(capacity_bytes=BIG, roundup_power2_divisions=(4,) * ROUNDUP_INTERVALS)) == 1


# ---- per-stream pools -----------------------------------------------------------------------------
def test_a_block_freed_by_one_stream_does_not_serve_another():
    m = CachingAllocatorModel(AllocatorConfig(capacity_bytes=BIG))
    m.malloc("comm", 40 * MiB, stream=1)  # e.g. an all-gather output allocated on a side stream
    m.free("comm")
    m.malloc("act", 40 * MiB, stream=0)  # the compute stream cannot take the cached 40 MiB block
    assert m.num_cuda_malloc == 2 and m.reserved_bytes == 80 * MiB
    m.free("act")
    m.malloc("comm2", 40 * MiB, stream=1)  # its own stream's block serves it
    assert m.num_cuda_malloc == 2
    assert {s["stream"] for s in m.segments()} == {0, 1}
    m.check_invariants()


def test_the_retry_frees_every_streams_cache():
    """Capacity 100 MiB: 60 MiB cached by stream 1, then 60 MiB asked by stream 0: cudaMalloc
    fails, the retry frees stream 1's unsplit segment (every pool) and succeeds."""
    m = CachingAllocatorModel(AllocatorConfig(capacity_bytes=100 * MiB))
    m.malloc("x", 60 * MiB, stream=1)
    m.free("x")
    m.malloc("y", 60 * MiB, stream=0)
    assert m.num_reorganizations == 1 and m.reserved_bytes == 60 * MiB
    m.check_invariants()


def test_expandable_segments_grow_one_segment_per_stream():
    cfg = AllocatorConfig(capacity_bytes=1 << 34, expandable_segments=True)
    m = CachingAllocatorModel(cfg)
    m.malloc("a", 100 * MiB, stream=0)
    m.malloc("b", 100 * MiB, stream=0)
    m.malloc("c", 100 * MiB, stream=2)
    assert m.num_segments() == 2  # one virtual segment for stream 0's large pool, one for stream 2's
    m.check_invariants()


# ---- garbage collection -------------------------------------------------------------------------
def test_garbage_collection_frees_old_cached_segments_without_a_retry():
    """Limit 0.5 x 200 MiB = 100 MiB, threshold 0.5: collect above 50 MiB reserved. Two 30 MiB
    blocks cached, then a 40 MiB request misses the cache: reserved (60 MiB) is above 50 MiB,
    so the collection cudaFrees the cached unsplit segments at least as old as the mean (both,
    never reused) before the cudaMalloc: no retry, no synchronisation."""
    cfg = AllocatorConfig(capacity_bytes=200 * MiB, garbage_collection_threshold=0.5, memory_fraction=0.5)
    assert cfg.limit_bytes == 100 * MiB and cfg.gc_active
    m = CachingAllocatorModel(cfg)
    m.malloc("a", 30 * MiB)
    m.malloc("b", 30 * MiB)
    m.free("a")
    m.free("b")
    m.malloc("c", 40 * MiB)
    assert m.num_gc_releases == 2 and m.num_reorganizations == 0
    assert m.reserved_bytes == 40 * MiB
    m.check_invariants()
    # without the collection the same requests fit (60 + 40 <= 100) and keep the cache
    m2 = CachingAllocatorModel(AllocatorConfig(capacity_bytes=200 * MiB, memory_fraction=0.5))
    for op, bid, size in (("m", "a", 30), ("m", "b", 30), ("f", "a", 0), ("f", "b", 0), ("m", "c", 40)):
        m2.malloc(bid, size * MiB) if op == "m" else m2.free(bid)
    assert m2.num_gc_releases == 0 and m2.reserved_bytes == 100 * MiB


def test_the_memory_fraction_limits_what_is_reserved():
    m = CachingAllocatorModel(AllocatorConfig(capacity_bytes=100 * MiB, memory_fraction=0.5))
    m.malloc("a", 40 * MiB)
    with pytest.raises(AllocatorOutOfMemory):
        m.malloc("b", 20 * MiB)  # 60 MiB > the 50 MiB the fraction allows


def test_the_memory_fraction_is_of_the_devices_total_memory():
    """PyTorch's allowed_memory_maximum is the fraction of cudaMemGetInfo's total, not of what is
    left after the memory outside the allocator; the device never gives more than that capacity."""
    conf = parse_alloc_conf("per_process_memory_fraction:0.5")
    assert AllocatorConfig.from_conf(60 * MiB, conf, device_bytes=100 * MiB).limit_bytes == 50 * MiB
    assert AllocatorConfig.from_conf(40 * MiB, conf, device_bytes=100 * MiB).limit_bytes == 40 * MiB
    assert AllocatorConfig.from_conf(60 * MiB, conf).limit_bytes == 30 * MiB  # no device total: of the capacity


# ---- the setting string -------------------------------------------------------------------------
def test_alloc_conf_parses_and_writes_back():
    text = "expandable_segments:True,max_split_size_mb:512,roundup_power2_divisions:4"
    conf = parse_alloc_conf(text)
    assert conf.expandable_segments and conf.max_split_size_mb == 512
    assert parse_alloc_conf(conf.text()) == conf
    assert conf.text(with_expandable=False) == "max_split_size_mb:512,roundup_power2_divisions:4"
    cfg = AllocatorConfig.from_conf(BIG, conf)
    assert cfg.expandable_segments and cfg.max_split_size_bytes == 512 * MiB
    assert parse_alloc_conf("") == parse_alloc_conf(" ")  # PyTorch's defaults
    assert parse_alloc_conf("release_lock_on_cudamalloc:True").other == (("release_lock_on_cudamalloc", "True"),)
    # fractions are written back exactly
    exact = parse_alloc_conf("garbage_collection_threshold:0.9999999,per_process_memory_fraction:0.12345678")
    assert parse_alloc_conf(exact.text()) == exact


@pytest.mark.parametrize("text, words", [
    ("max_split_size_mb:10", "max_split_size_mb must be >= 20"),
    ("roundup_power2_divisions:3", "power of two"),
    ("roundup_power2_divisions:0", "power of two"),
    ("max_non_split_rounding_mb:64", "not modelled"),
    ("garbage_collection_threshold:0.6", "per_process_memory_fraction"),
    ("garbage_collection_threshold:1.5,per_process_memory_fraction:0.9", "(0, 1)"),
    ("expandable_segments:yes", "True or False"),
    ("backend:cudaMallocAsync", "not modelled"),
    ("max_split_sz_mb:512", "unknown key"),
    ("max_split_size_mb", "key:value"),
    ("max_split_size_mb:512,max_split_size_mb:256", "twice"),
])
def test_bad_alloc_conf_is_one_line(text, words):
    with pytest.raises(MemoError, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
        parse_alloc_conf(text)
    assert "\n" not in str(info.value)


def test_layout_carries_the_settings_and_refuses_bad_ones():
    lay = Layout(tp=2, dp=4, alloc_conf="max_split_size_mb:512")
    assert Layout.from_dict(lay.to_dict()) == lay
    assert "alloc_conf" not in Layout(tp=2, dp=4).to_dict()
    assert merged_alloc_conf(True, "roundup_power2_divisions:2").expandable_segments
    with pytest.raises(MemoError, match="layout's own field"):
        merged_alloc_conf(False, "expandable_segments:True")


def test_whatif_prices_the_settings_and_refuses_bad_text():
    args = ["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "128K", "--profile", "a800-80gb", "--tp", "4",
            "--cp", "2", "--zero", "1", "--policy", "full_recompute", "--no-plan", "--json"]
    r = CliRunner().invoke(cli, args + ["--alloc-conf", "max_split_size_mb:10"])
    assert r.exit_code == 2 and "max_split_size_mb must be >= 20" in r.output
    ok = CliRunner().invoke(cli, args + ["--alloc-conf", "expandable_segments:True,roundup_power2_divisions:4"])
    assert ok.exit_code == 0, ok.output
    assert '"alloc_conf": "roundup_power2_divisions:4"' in ok.output
    assert '"expandable_segments": true' in ok.output


# ---- who places the transients: --allocator caching | plan | both ------------------------------
def _whatif_json(*extra):
    import json

    args = ["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "512K", "--profile", "a800-80gb", "--tp", "4",
            "--cp", "2", "--zero", "1", "--sp", "--policy", "full_recompute", "--policy", "memo", "--no-plan", "--json",
            *extra]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["candidates"]


def test_allocator_both_prices_each_policy_on_the_caching_allocator_and_on_a_plan():
    rows = _whatif_json("--allocator", "both")
    labels = [(c["layout"], c["policy"]["policy"] if isinstance(c["policy"], dict) else c["policy"]) for c in rows]
    recompute = [c for c in rows if "full_recompute" in str(c["policy"])]
    memo = [c for c in rows if "memo" in str(c["policy"])]
    assert len(recompute) == 2 and len(memo) == 1, labels  # MEMO has its own plan: never doubled
    cached = next(c for c in recompute if "memplan" not in c["layout"])
    planned = next(c for c in recompute if "memplan" in c["layout"])
    assert cached["transient_source"] == "caching allocator" and planned["transient_source"] == "static memory plan"
    assert cached["simulated_allocator"]["static_memory_plan"] is False
    assert cached["simulated_allocator"]["memory_stats"]["num_alloc_retries"] == cached["simulated_allocator"][
        "reorganizations"]
    assert planned["simulated_allocator"]["static_memory_plan"] is True
    # the plan removes the fragmentation the replay finds: a lower peak at the same time (no retries here)
    assert cached["simulated_allocator"]["fragmentation_at_peak"] > 0.05
    assert planned["simulated_peak_gpu_bytes"] < cached["simulated_peak_gpu_bytes"]
    assert planned["simulated_iteration_s"] == pytest.approx(cached["simulated_iteration_s"], rel=1e-9)


def test_allocator_plan_puts_every_policy_on_a_plan():
    """Every row on a static plan, MEMO's own among them (once, on its own plan)."""
    rows = _whatif_json("--allocator", "plan")
    assert all(c["transient_source"] == "static memory plan" for c in rows)
    memo = [c for c in rows if "memo" in str(c["policy"])]
    assert len(memo) == 1 and "memplan" not in memo[0]["layout"]
    assert any("full_recompute" in str(c["policy"]) and "memplan" in c["layout"] for c in rows)


def test_a_lagging_gpu_makes_the_caching_allocator_retry_and_pay_for_it():
    """With the collectives' blocks held 4 layers (record_stream, the CPU ahead of the GPU) the
    replay of the same plan retries and its iteration is longer than the memory-planned one by
    the stalls it prices; with the GPU keeping up it does not retry."""
    rows = _whatif_json("--allocator", "both", "--allocator-lag", "4", "--policy", "full_recompute")
    cached = next(c for c in rows if "memplan" not in c["layout"] and "full_recompute" in str(c["policy"]))
    planned = next(c for c in rows if "memplan" in c["layout"])
    a = cached["simulated_allocator"]
    assert a["reorganizations"] > 0 and a["stall_s"] > 0
    # the fragmentation is read when the allocation peaks; the retries make reserved peak elsewhere
    assert a["fragmentation_at_peak"] == pytest.approx(
        1 - a["peak_allocated_bytes"] / a["reserved_at_peak_allocated_bytes"], abs=1e-12)
    assert a["reserved_at_peak_allocated_bytes"] < a["peak_reserved_bytes"]
    assert cached["simulated_iteration_s"] > planned["simulated_iteration_s"]
    assert cached["simulated_iteration_s"] - planned["simulated_iteration_s"] == pytest.approx(a["stall_s"], rel=0.05)


def test_explain_says_what_fragmentation_costs_and_what_a_plan_saves(tmp_path):
    import json

    out = tmp_path / "p"
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "512K", "--profile",
                                 "a800-80gb", "--tp", "4", "--cp", "2", "--zero", "1", "--sp", "--policy",
                                 "full_recompute", "--out", str(out)])
    assert r.exit_code == 0, r.output
    e = CliRunner().invoke(cli, ["explain", str(out / "plan.json"), "--json"])
    assert e.exit_code == 0, e.output
    words = json.loads(e.output)["allocator_fragmentation"]
    assert "reserved when the allocation peaks is not allocated" in words and "--allocator plan" in words
    text = CliRunner().invoke(cli, ["explain", str(out / "plan.json")]).output
    assert "fragmentation:" in text


# ---- collectives' buffers held by recordStream (the framework's PyTorch) --------------------------
def test_record_stream_frameworks_retry_more_as_the_sequence_grows():
    """GPT-7B on 8 A800s, TP 4 with SP, CP 2, ZeRO-1, full recompute. Where the framework's PyTorch
    records the NCCL stream on collective tensors (memo-paper, Megatron-LM of 2021-2023) a freed
    collective buffer waits for the next synchronisation, the CPU being ahead of the GPU: the
    caching allocator retries every iteration, more as the sequence grows (128K to 512K), and the
    iteration pays the priced stalls against the memory-planned run. Where the collectives stash
    their tensors (Megatron-LM today) the same iteration never retries."""
    from memo_sim.layout import Layout
    from memo_sim.memplan.iteration_replay import record_stream_lag, replay_iteration
    from memo_sim.model import get_model
    from memo_sim.policy import get_policy
    from memo_sim.profile import load_profile
    from memo_sim.search.frameworks import get_framework

    assert get_framework("memo-paper").mechanism("nccl_record_stream") is True
    assert get_framework("megatron").mechanism("nccl_record_stream") is False
    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy("full_recompute")
    held, stashed = Layout(tp=4, cp=2, zero=1, nccl_record_stream=True), Layout(tp=4, cp=2, zero=1)
    K = 1024
    retries = []
    for seq in (128 * K, 256 * K, 512 * K):
        r = replay_iteration(m, held, 1, seq, pol, prof)
        assert not r.oom and r.stream_lag_phases == record_stream_lag(m, held, 1, seq, pol)
        retries.append(r.reorganizations)
        assert replay_iteration(m, stashed, 1, seq, pol, prof).reorganizations == 0
    assert 0 < retries[0] < retries[1] < retries[2], retries
    # an explicit lag still wins over the framework's
    assert replay_iteration(m, held, 1, 128 * K, pol, prof, stream_lag_phases=1).reorganizations == 0
    rows = _whatif_json("--allocator", "both", "--framework", "memo-paper", "--seq", "128K")
    cached = next(c for c in rows if "memplan" not in c["layout"] and "full_recompute" in str(c["policy"]))
    planned = next(c for c in rows if "memplan" in c["layout"])
    assert cached["simulated_allocator"]["reorganizations"] == retries[0]
    stall = cached["simulated_allocator"]["stall_s"]
    assert stall > 0 and cached["simulated_iteration_s"] > planned["simulated_iteration_s"]
    assert cached["simulated_iteration_s"] - planned["simulated_iteration_s"] == pytest.approx(stall, rel=0.05)
