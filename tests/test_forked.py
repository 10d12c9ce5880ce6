"""`memo_sim.forked.beside`: one list of calls here, the other in a forked child at the same time,
results in order; an error in the child is raised here; a child that dies without an answer has
its calls run here again; without fork everything runs here."""

from __future__ import annotations

import os

import pytest

from memo_sim import forked
from memo_sim.forked import beside


def _pid_and(x):
    return os.getpid(), x


def test_results_come_back_in_order_one_side_from_a_child():
    out = beside([(_pid_and, (i,)) for i in range(3)], [(_pid_and, (i,)) for i in range(3, 5)])
    assert [x for _pid, x in out] == list(range(5))
    pids = [pid for pid, _x in out]
    assert pids[:3] == [os.getpid()] * 3
    assert len(set(pids[3:])) == 1 and pids[3] != os.getpid()


def _boom(x):
    raise ValueError(f"bad {x}")


def test_an_error_in_the_child_is_raised_here():
    with pytest.raises(ValueError, match="bad 2"):
        beside([(_pid_and, (1,))], [(_boom, (2,))])


PARENT = os.getpid()


def _die(x):
    if os.getpid() != PARENT:
        os._exit(3)
    return x


def test_a_child_that_dies_has_its_calls_run_here():
    assert beside([(_die, (1,))], [(_die, (2,)), (_die, (3,))]) == [1, 2, 3]


def test_without_fork_or_with_one_side_empty_everything_runs_here(monkeypatch):
    assert [pid for pid, _x in beside([], [(_pid_and, (1,))])] == [os.getpid()]
    monkeypatch.setattr(forked, "FORKS", False)
    out = beside([(_pid_and, (0,))], [(_pid_and, (i,)) for i in range(1, 3)])
    assert out == [(os.getpid(), i) for i in range(3)]
