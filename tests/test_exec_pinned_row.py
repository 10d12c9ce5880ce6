"""The executor report compares a rank's pinned host pool with its share of the node's prediction."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from memo_exec.report import _pinned_row  # noqa: E402


def _res(world, pool, optimizer_offload=False, host_optimizer=0, dp=1):
    lay = SimpleNamespace(optimizer_offload=optimizer_offload, dp=dp)
    return SimpleNamespace(meta={"world": world, "pinned_host_bytes": pool, "host_optimizer_bytes": host_optimizer},
                           plan=SimpleNamespace(profile="a800-80gb", layout=lay))


def test_single_rank_compares_the_node():
    q, _u, pred, meas, _s = _pinned_row(_res(1, 100), {"peak_host_bytes_per_node": 100.0}, "sim")
    assert q == "pinned host memory" and pred == 100.0 and meas == 100


def test_a_rank_of_four_compares_its_share():
    # tp2cp2 on one host: the plan's node holds the 4 ranks (a800: 8 GPUs per node), each its quarter
    q, _u, pred, meas, _s = _pinned_row(_res(4, 25), {"peak_host_bytes_per_node": 100.0}, "sim")
    assert pred == 25.0 and meas == 25 and "4 ranks" in q
    q, _u, pred, _m, _s = _pinned_row(_res(16, 25), {"peak_host_bytes_per_node": 800.0}, "sim")
    assert pred == 100.0 and "8 ranks" in q  # 16 ranks: 8 per a800 node


def test_an_offloaded_optimizer_is_measured_beside_the_pool():
    """The simulator's host bytes hold the optimizer's states on the host too (review of 2026-11-26: the
    pool alone read -100%): the measured side adds what the host optimizer allocated."""
    q, _u, pred, meas, _s = _pinned_row(_res(1, 10, True, 90), {"peak_host_bytes_per_node": 100.0}, "sim")
    assert meas == 100 and pred == 100.0 and "optimizer" in q
    q, _u, _p, meas, _s = _pinned_row(_res(1, 10, False, 90), {"peak_host_bytes_per_node": 100.0}, "sim")
    assert meas == 10 and q == "pinned host memory"


def test_tokens_per_gpu_divide_the_jobs_tokens_over_its_ranks():
    from memo_exec.report import _replica_gpus

    # a multi-rank run's meta["tokens"] is the job's (batch x seq x dp): per GPU it is over every rank
    assert _replica_gpus(_res(2, 0, dp=1)) == 2  # TP 2: one sequence over two GPUs
    assert _replica_gpus(_res(2, 0, dp=2)) == 2  # DP 2: two sequences over two GPUs
    assert _replica_gpus(_res(8, 0, dp=2)) == 8
    assert _replica_gpus(_res(1, 0, dp=1)) == 1
