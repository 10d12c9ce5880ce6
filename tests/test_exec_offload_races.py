"""Break-the-offload tests. The copy engine runs on worker threads, so copies really run late
when delayed, and the results must not change (bitwise, fp64). Whether a wait is missing is
decided deterministically by the happens-before race detector, not by timing: the negative
control removes the compute stream's waits and must raise `RaceError` however loaded the
machine is (tests/test_exec_mutations.py removes every other wait one at a time)."""

from __future__ import annotations

import random

import pytest
import torch

from memo_exec.activations import offload_token_count
from memo_exec.activations.token_offload import TokenOffload
from memo_exec.happens_before import RaceError
from tests.exec_helpers import executor_grads, make_plan, max_rel_error, policy, reference_grads, time_limit
from memo_sim.model.config import ModelConfig
from memo_sim.policy.rounding_buffers import KEPT_LAYERS

torch.set_num_threads(1)

MODEL = ModelConfig("race", 6, 64, 4, 256, vocab=128)
SEQ = 512
MEMO = policy("memo", 0.3)


@pytest.fixture(autouse=True)
def _time_limit():
    # a deadlock guard, not a speed test: generous enough that a loaded machine (these tests take
    # ~20 s at most when 5 suites share 2 cores) never trips it; a deadlock still fails, later
    with time_limit(600):
        yield


def _run(pol=MEMO, setup=None, model=MODEL, seq=SEQ, batch=1, dtype="fp64"):
    return executor_grads(make_plan(model, seq, pol, batch=batch, chunk=200), dtype=dtype, setup=setup)


@pytest.fixture(scope="module")
def baseline():
    loss, grads, _ = _run()
    return loss, grads


def _delay(streams: tuple[str, ...], seconds: float | None = None, seed: int = 0):
    rng = random.Random(seed)

    def setup(ex):
        ex.engine.copy_delay = lambda stream, label: (seconds if seconds is not None else rng.uniform(0, 0.03)) \
            if stream in streams else 0.0
    return setup


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in b)


@pytest.mark.parametrize("streams", [("d2h",), ("h2d",), ("d2h", "h2d")])
def test_delayed_copies_change_nothing(baseline, streams):
    loss, grads, _ = _run(setup=_delay(streams, 0.02))
    assert loss == baseline[0]
    assert _same(grads, baseline[1])


def test_random_delays_change_nothing(baseline):
    for seed in (1, 2):
        _, grads, _ = _run(setup=_delay(("d2h", "h2d"), None, seed))
        assert _same(grads, baseline[1])


@pytest.mark.parametrize("delay", ["none", "late copies", "random"])
def test_negative_control_skipped_compute_waits_are_races(monkeypatch, delay):
    """Without the compute stream's waits (before the output write, before recompute/backward) the
    run is refused at the first unordered access, whatever the copies' timing: the same error with
    copies on time, copies 20 ms late and copies randomly late (the detector reads the issue order,
    never the clock, so a loaded machine cannot change the outcome)."""
    monkeypatch.setattr(TokenOffload, "_output_write_waits_for_offload", lambda self, j: None)
    monkeypatch.setattr(TokenOffload, "_backward_waits_for_prefetch", lambda self, j: None)
    setup = {"none": None, "late copies": _delay(("d2h", "h2d"), 0.02),
             "random": _delay(("d2h", "h2d"), None, seed=3)}[delay]
    with pytest.raises(RaceError, match="offload\\(0\\) reads it on d2h and forward\\(1\\) output writes it"):
        _run(setup=setup)


def test_parity_buffers_are_reused_and_correct(baseline):
    loss, grads, ex = _run()
    st = ex.policy.storages
    for i in range(MODEL.layers - 2):
        assert st[i].x.data_ptr() == st[i + 2].x.data_ptr()  # layer i and i+2 share rounding buffer i%2
        assert st[i].fc1.data_ptr() == st[i + 2].fc1.data_ptr()
        assert st[i].x.data_ptr() != st[i + 1].x.data_ptr()
    assert len(ex.policy.blocks) == 2
    assert len(ex.policy.host) == MODEL.layers - KEPT_LAYERS
    assert len({h["x"].data_ptr() for h in ex.policy.host}) == len(ex.policy.host)
    ref_loss, ref_grads = reference_grads(ex)
    assert abs(loss - ref_loss) <= 1e-10 * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= 1e-10, f"{worst}: {err:.2e}"


@pytest.mark.parametrize("batch,seq,alpha,n_off", [(1, 2048, 0.3, 614), (1, 257, 0.5, 128), (3, 85, 0.3, 76),
                                                   (1, 129, 1 / 3, 43), (2, 63, 0.999, 125), (1, 97, 0.001, 0)])
def test_uneven_token_splits(batch, seq, alpha, n_off):
    assert offload_token_count(alpha, batch * seq) == n_off
    loss, grads, ex = _run(policy("memo", alpha), model=ModelConfig("split", 4, 64, 4, 256, vocab=128),
                           seq=seq, batch=batch)
    assert ex.policy.n_off == n_off
    ref_loss, ref_grads = reference_grads(ex)
    assert abs(loss - ref_loss) <= 1e-10 * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= 1e-10, f"{worst}: {err:.2e}"


def test_only_the_first_n_minus_2_layers_move():
    from memo_exec.runner import Executor, RunOptions

    ex = Executor(make_plan(MODEL, SEQ, MEMO, chunk=200), RunOptions(device="cpu", dtype="fp64", steps=1))
    try:
        rec = ex.step(0)
    finally:
        ex.close()
    off = sorted(e.layer for e in rec.events if e.stream == "d2h")
    pre = sorted(e.layer for e in rec.events if e.stream == "h2d")
    rc = sorted({e.layer for e in rec.events if e.phase == "recompute"})
    want = list(range(MODEL.layers - KEPT_LAYERS))
    assert off == want and pre == want and rc == want
    nbytes = {e.nbytes for e in rec.events if e.stream in ("d2h", "h2d")}
    assert nbytes == {ex.policy.layer_offload_bytes()}
    T, h = SEQ, MODEL.hidden
    others = sum(ex.policy.widths[n] for n in ex.policy.split)
    assert ex.policy.layer_offload_bytes() == 8 * (2 * T * h + ex.policy.n_off * others)
