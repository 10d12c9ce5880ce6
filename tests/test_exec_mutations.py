"""Mutation tests of the offload and prefetch paths: remove any single wait, or move a prefetch to
the neighbouring layer, and a test fails -- deterministically, by the happens-before race
detector (`memo_exec.happens_before`), by a wrong gradient, or by an op order that no longer
matches the simulator's graph. Nothing here depends on timing: the detector reasons on the issue
order, so these results are the same on an idle and on a loaded machine."""

from __future__ import annotations

import pytest
import torch

from memo_exec.activations import token_offload
from memo_exec.activations.token_offload import TokenOffload
from memo_exec.happens_before import RaceError
from tests.exec_op_order import describe, issued_edges, schedule_edges
from memo_exec.runner import Executor, RunOptions
from tests.exec_helpers import executor_grads, make_plan, max_rel_error, policy, reference_grads, time_limit
from memo_sim.engine.schedules import build_iteration
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy.rounding_buffers import is_offloaded
from memo_sim.profile.loader import load_profile

torch.set_num_threads(1)

MODEL = ModelConfig("mutant", 6, 64, 4, 256, vocab=128)
SEQ = 256
POLICIES = {"memo": policy("memo", 0.3), "full_offload": policy("full_offload"),
            "checkpoint_offload": policy("checkpoint_offload"), "offload_attn": policy("offload_attn")}
WAITS = ("_offload_waits_for_forward", "_output_write_waits_for_offload", "_prefetch_waits_for_backward",
         "_backward_waits_for_prefetch")


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(120):
        yield


def _grads(pol):
    return executor_grads(make_plan(MODEL, SEQ, pol, chunk=100), dtype="fp64")


@pytest.fixture(scope="module")
def baseline():
    loss, grads, ex = _grads(POLICIES["memo"])
    return loss, grads, ex


def test_unmutated_run_is_checked_race_free_and_exact(baseline):
    loss, grads, ex = baseline
    assert ex.engine.hb.checked > 100  # the detector saw every buffer and host access
    ref_loss, ref_grads = reference_grads(ex)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= 1e-10, f"{worst}: {err:.2e}"


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("wait", WAITS)
def test_removing_a_wait_for_every_layer_is_a_race(monkeypatch, wait, name):
    monkeypatch.setattr(TokenOffload, wait, lambda self, i: None)
    with pytest.raises(RaceError, match="race on"):
        _grads(POLICIES[name])


@pytest.mark.parametrize("wait", WAITS)
@pytest.mark.parametrize("layer", [0, 1, 3])
def test_removing_a_wait_for_one_layer_is_a_race(monkeypatch, wait, layer):
    """Layer indices are those the wait method receives (the layer whose event it waits on)."""
    orig = getattr(TokenOffload, wait)
    target = {"_prefetch_waits_for_backward": layer + 2}.get(wait, layer)  # edge 3 waits on backward(j+2)
    monkeypatch.setattr(TokenOffload, wait, lambda self, i: None if i == target else orig(self, i))
    with pytest.raises(RaceError, match="race on"):
        _grads(POLICIES["memo"])


def test_prefetch_from_the_neighbouring_layer_gives_wrong_gradients(monkeypatch, baseline):
    """Swap the host slots the prefetch reads (layer 0 <-> 1, 2 <-> 3): every copy is ordered, so
    the race detector is silent, but the data is another layer's and the gradients show it."""
    orig = TokenOffload._copy

    def swapped(self, i, to_host):
        pairs, reads, writes = orig(self, i, to_host)
        if to_host:
            return pairs, reads, writes
        theirs, their_reads, _ = orig(self, i ^ 1, to_host)
        return [(dst, src) for (dst, _), (_, src) in zip(pairs, theirs)], their_reads, writes

    monkeypatch.setattr(TokenOffload, "_copy", swapped)
    _, grads, _ = _grads(POLICIES["memo"])
    err, _ = max_rel_error(grads, baseline[1])
    assert err > 1e-3


def _edges(pol) -> tuple[set, set]:
    ex = Executor(make_plan(MODEL, SEQ, pol, chunk=100), RunOptions(device="cpu", dtype="fp64", steps=1))
    try:
        rec = ex.step(0)
    finally:
        ex.close()
    sim = schedule_edges(build_iteration(MODEL, Layout(), 1, SEQ, pol, load_profile("h100-sxm5-80gb")))
    return issued_edges(rec.issued), sim


def test_prefetching_one_layer_late_breaks_the_op_order(monkeypatch):
    """After backward(i) prefetch layer i-1 instead of i-2: still correct data, but the prefetch no
    longer runs beside a backward; the op order differs from the simulator's graph."""
    def late(layer, n):
        j = layer - 1
        return j if is_offloaded(j, n) else None

    ours, sim = _edges(POLICIES["memo"])
    assert ours == sim
    monkeypatch.setattr(token_offload, "prefetch_launched_after_backward", late)
    ours, sim = _edges(POLICIES["memo"])
    assert ours != sim, describe(ours)


def test_prefetching_one_layer_early_is_a_race(monkeypatch):
    """After backward(i) prefetch layer i-3: it overwrites the buffer backward(i-1) still has to read."""
    def early(layer, n):
        j = layer - 3
        return j if is_offloaded(j, n) else None

    monkeypatch.setattr(token_offload, "prefetch_launched_after_backward", early)
    with pytest.raises(RaceError, match="race on"):
        _grads(POLICIES["memo"])
