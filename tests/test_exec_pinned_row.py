"""The executor report compares a rank's pinned host pool with its share of the node's prediction."""

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from memo_exec.report import _pinned_row  # noqa: E402


def _res(world, pool):
    return SimpleNamespace(meta={"world": world, "pinned_host_bytes": pool}, plan=SimpleNamespace(profile="a800-80gb"))


def test_single_rank_compares_the_node():
    q, _u, pred, meas, _s = _pinned_row(_res(1, 100), {"peak_host_bytes_per_node": 100.0}, "sim")
    assert q == "pinned host memory" and pred == 100.0 and meas == 100


def test_a_rank_of_four_compares_its_share():
    # tp2cp2 on one host: the plan's node holds the 4 ranks (a800: 8 GPUs per node), each its quarter
    q, _u, pred, meas, _s = _pinned_row(_res(4, 25), {"peak_host_bytes_per_node": 100.0}, "sim")
    assert pred == 25.0 and meas == 25 and "4 ranks" in q
    q, _u, pred, _m, _s = _pinned_row(_res(16, 25), {"peak_host_bytes_per_node": 800.0}, "sim")
    assert pred == 100.0 and "8 ranks" in q  # 16 ranks: 8 per a800 node
