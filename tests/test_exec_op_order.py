"""The executor's op order (compute ops, copies, event records and waits, as issued) has exactly
the copy dependencies of the simulator's op graph, for every policy, and both are the rule of
`memo_sim.policy.rounding_buffers`: offload(i) after forward(i); forward(i)'s last op (the write
of layer i+1's input) after offload(i-1); prefetch(j) after backward(j+2); recompute / backward
of layer j after prefetch(j)."""

from __future__ import annotations

import pytest
import torch

from tests.exec_op_order import describe, issued_edges, schedule_edges
from memo_exec.runner import Executor, RunOptions
from tests.exec_helpers import make_plan, policy, time_limit
from memo_sim.engine.schedules import build_iteration
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy.rounding_buffers import (
    is_offloaded, output_write_waits_for, prefetch_after_backward_of,
)
from memo_sim.profile.loader import load_profile

torch.set_num_threads(1)

SEQ = 256
POLICIES = [("store_all", None), ("full_recompute", None), ("full_offload", None), ("memo", 0.0), ("memo", 0.3),
            ("memo", 1.0)]


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(120):
        yield


def executor_edges(model: ModelConfig, pol) -> set:
    ex = Executor(make_plan(model, SEQ, pol, chunk=100), RunOptions(device="cpu", dtype="fp64", steps=1))
    try:
        rec = ex.step(0)
    finally:
        ex.close()
    return issued_edges(rec.issued)


def simulator_edges(model: ModelConfig, pol) -> set:
    return schedule_edges(build_iteration(model, Layout(), 1, SEQ, pol, load_profile("h100-sxm5-80gb")))


def rule_edges(n: int, pol) -> set:
    """The rule's four edges for an n-layer model, from the functions of rounding_buffers."""
    if not pol.offloads:
        return set()
    edges = set()
    for i in range(n):
        j = output_write_waits_for(i, n)
        if j is not None:
            edges.add((("fwd", i, "last"), ("offload", j)))
        if is_offloaded(i, n):
            edges.add((("offload", i), ("fwd", i, "last")))
            edges.add((("prefetch", i), ("bwd", prefetch_after_backward_of(i, n), "last")))
            first = "recompute" if pol.recompute_fraction > 0 else "bwd"
            edges.add(((first, i, "first"), ("prefetch", i)))
    return edges


@pytest.mark.parametrize("name,alpha", POLICIES, ids=[f"{n}-{a}" if a is not None else n for n, a in POLICIES])
@pytest.mark.parametrize("layers", [6, 3, 2])
def test_executor_copies_follow_the_simulators_graph_and_the_rule(name, alpha, layers):
    model = ModelConfig("order", layers, 64, 4, 256, vocab=128)
    pol = policy(name, alpha)
    ours = executor_edges(model, pol)
    rule = rule_edges(layers, pol)
    assert ours == rule, "\n".join(["executor:", *describe(ours), "rule:", *describe(rule)])
    sim = simulator_edges(model, pol)
    assert ours == sim, "\n".join(["executor:", *describe(ours), "simulator:", *describe(sim)])


def test_the_output_write_is_the_only_forward_op_that_waits():
    """Layer i's forward runs beside offload(i-1) up to its last op: no compute wait before it."""
    model = ModelConfig("order", 6, 64, 4, 256, vocab=128)
    ex = Executor(make_plan(model, SEQ, policy("memo", 0.3), chunk=100), RunOptions(device="cpu", dtype="fp64"))
    try:
        rec = ex.step(0)
    finally:
        ex.close()
    log = rec.issued
    for k, e in enumerate(log):
        if e.stream == "compute" and e.kind == "wait" and e.op.startswith("offloaded"):
            nxt = next(x for x in log[k + 1:] if x.stream == "compute" and x.kind == "op")
            prev = [x for x in log[:k] if x.stream == "compute" and x.kind == "op"][-1]
            assert (prev.op, nxt.op, nxt.phase) == ("fc2", "add2", "fwd"), (prev, nxt)
