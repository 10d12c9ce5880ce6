"""Break-the-offload tests: the copy engine runs on worker threads, so a missing or misplaced
wait turns into a wrong gradient. Every test here compares bitwise (fp64) with an undisturbed run,
or with the reference; the negative control proves a skipped wait is caught."""

from __future__ import annotations

import random

import pytest
import torch

from memo_exec.activations import offload_token_count
from memo_exec.testing import executor_grads, make_plan, max_rel_error, reference_grads
from memo_sim.model.config import ModelConfig
from memo_sim.policy.policies import NO_OFFLOAD_LAST_LAYERS, PolicyChoice

torch.set_num_threads(1)

MODEL = ModelConfig("race", 6, 64, 4, 256, vocab=128)
SEQ = 512
MEMO = PolicyChoice("memo", 0.3)


def _run(policy=MEMO, setup=None, model=MODEL, seq=SEQ, batch=1, dtype="fp64"):
    return executor_grads(make_plan(model, seq, policy, batch=batch, chunk=200), dtype=dtype, setup=setup)


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


def test_negative_control_skipped_waits_are_caught(baseline):
    """Without the compute-stream waits the same delays corrupt the gradients: the tests above have teeth."""
    def setup(ex):
        _delay(("d2h", "h2d"), 0.02)(ex)
        ex.engine.unsafe_skip_compute_waits = True

    _, grads, _ = _run(setup=setup)
    err, _ = max_rel_error(grads, baseline[1])
    assert err > 1e-3


def test_parity_buffers_are_reused_and_correct(baseline):
    loss, grads, ex = _run()
    st = ex.policy.storages
    for i in range(MODEL.layers - 2):
        assert st[i].x.data_ptr() == st[i + 2].x.data_ptr()  # layer i and i+2 share rounding buffer i%2
        assert st[i].fc1.data_ptr() == st[i + 2].fc1.data_ptr()
        assert st[i].x.data_ptr() != st[i + 1].x.data_ptr()
    assert len(ex.policy.blocks) == 2
    assert len(ex.policy.host) == MODEL.layers - NO_OFFLOAD_LAST_LAYERS
    assert len({h["x"].data_ptr() for h in ex.policy.host}) == len(ex.policy.host)
    ref_loss, ref_grads = reference_grads(ex)
    assert abs(loss - ref_loss) <= 1e-10 * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= 1e-10, f"{worst}: {err:.2e}"


@pytest.mark.parametrize("batch,seq,alpha,n_off", [(1, 2048, 0.3, 614), (1, 257, 0.5, 129), (3, 85, 0.3, 77),
                                                   (1, 129, 1 / 3, 43), (2, 63, 0.999, 126), (1, 97, 0.001, 0)])
def test_uneven_token_splits(batch, seq, alpha, n_off):
    assert offload_token_count(alpha, batch * seq) == n_off
    loss, grads, ex = _run(PolicyChoice("memo", alpha), model=ModelConfig("split", 4, 64, 4, 256, vocab=128),
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
    want = list(range(MODEL.layers - NO_OFFLOAD_LAST_LAYERS))
    assert off == want and pre == want and rc == want
    nbytes = {e.nbytes for e in rec.events if e.stream in ("d2h", "h2d")}
    assert nbytes == {ex.policy.layer_offload_bytes()}
    T, h = SEQ, MODEL.hidden
    others = sum(ex.policy.widths[n] for n in ex.policy.split)
    assert ex.policy.layer_offload_bytes() == 8 * (2 * T * h + ex.policy.n_off * others)
