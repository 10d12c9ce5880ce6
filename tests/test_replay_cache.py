"""`replay_iteration` remembers replays by what they read (`memo_sim.memplan.iteration_replay`):
the stream's requests and phases (its recipe) and the allocator's settings. A remembered replay
must be exactly what an uncached one returns (the name and policy label of the call included),
must not be shared between streams that differ in one request, and must not be corruptible by
the caller."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.layout import Layout
from memo_sim.memplan import iteration_replay as ir
from memo_sim.memplan import iteration_requests as req
from memo_sim.memplan import replay_cache as rc
from memo_sim.memplan.caching_allocator import AllocatorConfig
from memo_sim.model import get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile

K = 1024


@pytest.fixture(autouse=True)
def _fresh_cache():
    ir.clear_replay_cache()
    yield
    ir.clear_replay_cache()


def uncached(model, layout, seq, policy, prof, chunk=ir.CLASSIFIER_CHUNK_TOKENS, lag=None, series=False):
    """`replay_iteration` without its memo: the stream replayed directly."""
    cfg = AllocatorConfig(capacity_bytes=int(prof.usable_gpu_memory))
    return ir.replay_stream(ir.iteration_stream(model, layout, 1, seq, policy, chunk), cfg, policy=policy,
                            stream_lag_phases=lag, series=series)


def test_a_cached_replay_is_the_uncached_one_under_its_own_name():
    """Two layouts that differ only in dp (no ZeRO) give one request stream: the second call is
    served from the cache, and equals the uncached replay of its own stream field by field,
    name (which holds the layout) included."""
    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy("full_recompute")
    a, b = Layout(tp=8), Layout(tp=8, dp=2)
    sa, sb = ir.iteration_stream(m, a, 1, 128 * K, pol), ir.iteration_stream(m, b, 1, 128 * K, pol)
    assert (sa.static, sa.iteration, sa.phase_of) == (sb.static, sb.iteration, sb.phase_of) and sa.name != sb.name
    ra = ir.replay_iteration(m, a, 1, 128 * K, pol, prof)
    assert len(rc._REPLAYS) == 1
    rb = ir.replay_iteration(m, b, 1, 128 * K, pol, prof)
    assert len(rc._REPLAYS) == 1  # a hit
    assert ra.to_json_obj() == uncached(m, a, 128 * K, pol, prof).to_json_obj()
    assert rb.to_json_obj() == uncached(m, b, 128 * K, pol, prof).to_json_obj()
    assert rb.name == sb.name != ra.name


@pytest.mark.parametrize("policy, lag, series", [("full_recompute", 4, False), ("store_all", None, True)])
def test_hits_equal_misses_with_lag_and_series(policy, lag, series):
    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy(policy)
    lay = Layout(tp=8)
    first = ir.replay_iteration(m, lay, 1, 128 * K, pol, prof, stream_lag_phases=lag, series=series)
    again = ir.replay_iteration(m, lay, 1, 128 * K, pol, prof, stream_lag_phases=lag, series=series)
    want = uncached(m, lay, 128 * K, pol, prof, lag=lag, series=series).to_json_obj()
    assert first.to_json_obj() == again.to_json_obj() == want
    assert bool(want["series_reserved_bytes"]) == series
    # the settings are part of the key: the other lag / series is not served from this entry
    other = ir.replay_iteration(m, lay, 1, 128 * K, pol, prof, stream_lag_phases=None if lag else 4)
    assert other.stream_lag_phases == (0 if lag else 4) and len(rc._REPLAYS) == 2


def test_streams_differing_in_one_request_size_do_not_share():
    """The classifier chunk changes only the requests of the chunk's tensors (its logits and the loss's fp32
    tensors, each its own request: `memo_sim.memplan.iteration_requests._loss_requests`); the two replays are kept
    apart and each is its own stream's uncached replay."""
    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy("full_recompute")
    lay, seq = Layout(tp=8), 128 * K
    s1, s2 = (ir.iteration_stream(m, lay, 1, seq, pol, c) for c in (4 * K, 128 * K))
    assert s1.static == s2.static and s1.phase_of == s2.phase_of and len(s1.iteration) == len(s2.iteration)
    differ = [(x, y) for x, y in zip(s1.iteration, s2.iteration) if x != y]
    assert differ and differ[0][0][1] == "cls.chunk"
    assert all(x[1] == y[1] and x[1].startswith("cls.") and x[1].endswith("chunk") and x[2] != y[2] for x, y in differ)
    r1 = ir.replay_iteration(m, lay, 1, seq, pol, prof, classifier_chunk_tokens=4 * K)
    r2 = ir.replay_iteration(m, lay, 1, seq, pol, prof, classifier_chunk_tokens=128 * K)
    assert len(rc._REPLAYS) == 2
    assert r1.to_json_obj() == uncached(m, lay, seq, pol, prof, chunk=4 * K).to_json_obj()
    assert r2.to_json_obj() == uncached(m, lay, seq, pol, prof, chunk=128 * K).to_json_obj()
    assert r1.peak_allocated_bytes < r2.peak_allocated_bytes  # a whole-sequence chunk makes the peak


def test_the_caller_cannot_corrupt_the_cache():
    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy("full_recompute")
    lay = Layout(tp=8)
    want = ir.replay_iteration(m, lay, 1, 256 * K, pol, prof, stream_lag_phases=4).to_json_obj()
    assert want["phase_counts"] and want["reorganization_requests"]  # something mutable to spoil
    r = ir.replay_iteration(m, lay, 1, 256 * K, pol, prof, stream_lag_phases=4)
    r.reorganizations = -1
    r.reorganization_requests.append("spoiled")
    next(iter(r.phase_counts.values()))["reorganizations"] = 10**9
    r.warmup.clear()
    r.name = "spoiled"
    assert ir.replay_iteration(m, lay, 1, 256 * K, pol, prof, stream_lag_phases=4).to_json_obj() == want


def test_the_cache_is_bounded(monkeypatch):
    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy("full_recompute")
    monkeypatch.setattr(rc, "REPLAY_CACHE_SIZE", 2)
    for seq in (64 * K, 96 * K, 128 * K):
        ir.replay_iteration(m, Layout(tp=8), 1, seq, pol, prof)
    assert len(rc._REPLAYS) == 2


def test_bad_settings_still_fail_as_before():
    from memo_sim.errors import MemoError

    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy("full_recompute")
    for kw in ({"iterations": 0}, {"iterations": 1.5}, {"stream_lag_phases": -1}, {"stream_lag_phases": True}):
        with pytest.raises(MemoError):
            ir.replay_iteration(m, Layout(tp=8), 1, 64 * K, pol, prof, **kw)
    assert not rc._REPLAYS


def test_recipe_equality_is_content_equality():
    """The key is the recipe's content: one request size changed in a layer template makes it a
    different key, and the key decodes back to the recipe (no two recipes share one)."""
    m, pol = get_model("gpt-7b"), get_policy("full_recompute")
    r = req._stream_recipe(m, Layout(tp=8), 1, 64 * K, pol)
    fwd = list(r.templates.forward)
    j = next(i for i, q in enumerate(fwd) if q[0] == ir.MALLOC)
    fwd[j] = (fwd[j][0], fwd[j][1], fwd[j][2] + 1)
    other = replace(r, templates=replace(r.templates, forward=tuple(fwd)))
    assert other != r and other.content_key() != r.content_key()
    assert replace(r) == r and replace(r).content_key() == r.content_key()
    # the key is lossless: the recipe's content comes back from it
    import ast
    import zlib

    t = r.templates
    assert ast.literal_eval(zlib.decompress(r.content_key()).decode()) == (
        r.static, r.x, r.logits, t.forward, t.backward, t.backward_recompute, t.arena, r.recomputes)


# ------------------------------------------------- one replay for streams that differ in static sizes
def _replays(monkeypatch):
    """Count the replays `replay_iteration` actually runs."""
    calls = []
    real = ir.replay_stream

    def counted(*a, **k):
        calls.append(a[0].name)
        return real(*a, **k)

    monkeypatch.setattr(ir, "replay_stream", counted)
    return calls


@pytest.mark.parametrize("policy, first, second", [
    # ZeRO 1 -> 2: the gradients shrink; the large pool's static free bytes differ (1.1 vs 2.2 MB)
    # and the warm-up's fragmentation failures with them (1 vs 2)
    ("full_offload", Layout(ulysses=8, zero=1), Layout(ulysses=8, zero=2)),
    # a re-sending Ulysses (memo's own plans): one that keeps the kernel's head-sharded tensors holds the attention
    # output twice a layer (`memo_sim.cost.activations.ulysses_kept_scale`) and runs out of memory here at 128K
    ("store_all", Layout(tp=2, ulysses=4, dp=4, zero=2, ulysses_bwd_resend=True),
     Layout(tp=2, ulysses=4, dp=2, zero=3, ulysses_bwd_resend=True)),
    ("full_recompute", Layout(tp=8, dp=2, zero=1), Layout(tp=8, dp=4, zero=1)),
])
def test_static_sizes_alone_share_a_replay(monkeypatch, policy, first, second):
    """Two layouts whose iterations make the same requests and differ only in their model
    states (ZeRO stage, dp) share one replay where no cudaMalloc failed: the second is moved by
    the static bytes and recounts its fragmentation failures, and equals its own uncached
    replay field by field."""
    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy(policy)
    seq = 128 * K
    r1, r2 = req._stream_recipe(m, first, 1, seq, pol), req._stream_recipe(m, second, 1, seq, pol)
    assert r1.static != r2.static and r1.content_key(static=False) == r2.content_key(static=False)
    calls = _replays(monkeypatch)
    a = ir.replay_iteration(m, first, 1, seq, pol, prof)
    b = ir.replay_iteration(m, second, 1, seq, pol, prof)
    assert len(calls) == 1 and not a.oom and a.reorganizations == 0  # the second was not replayed
    monkeypatch.undo()
    assert a.to_json_obj() == uncached(m, first, seq, pol, prof).to_json_obj()
    want = uncached(m, second, seq, pol, prof).to_json_obj()
    assert b.to_json_obj() == want
    assert b.static_bytes != a.static_bytes and b.peak_reserved_bytes != a.peak_reserved_bytes


def test_recounted_fragmentation_failures_differ_where_the_static_free_bytes_do(monkeypatch):
    """The recount is exercised: the shared replay's warm-up counts 1 failure, the second
    stream's own replay 2 (its static segments leave more free bytes in the large pool)."""
    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy("full_offload")
    a = ir.replay_iteration(m, Layout(ulysses=8, zero=1), 1, 128 * K, pol, prof)
    b = ir.replay_iteration(m, Layout(ulysses=8, zero=2), 1, 128 * K, pol, prof)
    assert len(rc._SHARED) == 1
    assert (a.warmup["fragmentation_failures"], b.warmup["fragmentation_failures"]) == (1, 2)


def test_a_capacity_without_room_for_the_shared_replay_replays(monkeypatch):
    """A shared replay serves only capacities that hold what it reserved; below that the stream
    is replayed at its own capacity (and there reorganises or runs out of memory)."""
    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy("full_recompute")
    lay, seq = Layout(tp=8, dp=2, zero=1), 128 * K
    calls = _replays(monkeypatch)
    a = ir.replay_iteration(m, lay, 1, seq, pol, prof)
    cfg = AllocatorConfig(capacity_bytes=int(prof.usable_gpu_memory))
    ra, rb = (rc._StaticBase.of(req._stream_recipe(m, x, 1, seq, pol), cfg).reserved
              for x in (lay, Layout(tp=8, dp=4, zero=1)))
    assert rb < ra  # the second has less static, so the first's reserved peak is no bound for it
    tight = rb + (a.peak_reserved_bytes - ra) - 64 * 1024 * 1024  # 64 MB short of the shared replay's room
    b = ir.replay_iteration(m, Layout(tp=8, dp=4, zero=1), 1, seq, pol, prof, capacity_bytes=tight)
    assert len(calls) == 2
    monkeypatch.undo()
    cfg = AllocatorConfig(capacity_bytes=tight)
    want = ir.replay_stream(ir.iteration_stream(m, Layout(tp=8, dp=4, zero=1), 1, seq, pol), cfg, policy=pol)
    assert b.to_json_obj() == want.to_json_obj()
    assert b.oom or b.reorganizations + b.warmup["reorganizations"] > 0


def test_replays_that_met_the_capacity_are_not_shared():
    """A replay that reorganised (or ran out of memory) depends on the capacity itself: it is
    remembered for its exact stream and capacity only."""
    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy("full_recompute")
    r = ir.replay_iteration(m, Layout(tp=8), 1, 256 * K, pol, prof, stream_lag_phases=4)
    assert r.reorganizations > 0 and len(rc._REPLAYS) == 1 and not rc._SHARED


def test_expandable_segments_are_never_shared():
    m, prof, pol = get_model("gpt-7b"), load_profile("a800-80gb"), get_policy("full_recompute")
    ir.replay_iteration(m, Layout(tp=8), 1, 64 * K, pol, prof, expandable_segments=True)
    assert len(rc._REPLAYS) == 1 and not rc._SHARED
