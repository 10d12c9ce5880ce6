"""Distributed-executor check cases shared by the gloo tests (tests/test_dist_exec.py): a small
model, plans for a layout, per-rank functions that return loss and whole gradients, and the
single-process reference they are compared with."""

from __future__ import annotations

import torch

from memo_exec.device import DeviceSpec
from memo_exec.distributed.context import build_context
from memo_exec.distributed.runner import DistExecutor
from memo_exec.runner import RunOptions
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from tests.exec_helpers import make_plan, one_process_run, policy

SMALL = ModelConfig("small", 4, 256, 8, 1024, vocab=512, dtype="fp32")
POLICIES = ("store_all", "full_recompute", "memo")


def policy_of(name: str):
    return policy("memo", 0.5) if name == "memo" else policy(name)


def plan_for(layout: Layout, seq: int, pol: str, batch: int = 1, model: ModelConfig = SMALL, chunk: int = 256):
    p = make_plan(model, seq, policy_of(pol), batch=batch, chunk=chunk)
    p.layout = layout
    p.gpus = layout.gpus
    return p


def reference(seq: int, pol: str, batch: int, steps: int = 0, model: ModelConfig = SMALL):
    """Single-process fp64 loss and gradients of the same global batch, and the losses of
    ``steps`` training steps."""
    return one_process_run(plan_for(Layout(), seq, pol, batch=batch, model=model), steps)


def loss_and_grads(plan, rank: int, events: list | None = None) -> tuple:
    """One fp64 step of ``plan`` on this rank (no optimizer): the summed loss and, on rank 0, every parameter's
    whole gradient (None elsewhere); ``events``: a list the step's recorded spans are appended to."""
    ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=1), build_context(plan.layout,
                      torch.device("cpu")), DeviceSpec("cpu"))
    ex.allocate()
    rec = ex.step(0, optimizer=False)
    if events is not None:
        events.extend(rec.events)
    grads = ex.full_gradients()
    ex.close()
    return rec.loss, grads if rank == 0 else None


def rank_case(rank: int, world: int, cases) -> list:
    """Per case (layout kwargs, seq, policy, batch per replica, training steps): the summed loss,
    rank 0's whole gradients, the number of layers this rank recomputed (or token-recomputed),
    and the losses of the training steps."""
    out = []
    for lay_kw, seq, pol, batch, steps in cases:
        lay = Layout(**lay_kw)
        plan = plan_for(lay, seq, pol, batch=batch)
        ctx = build_context(lay, torch.device("cpu"))
        ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=max(1, steps)), ctx, DeviceSpec("cpu"))
        ex.allocate()
        rec = ex.step(0, optimizer=False)
        grads = ex.full_gradients()
        recomputed = len({e.layer for e in rec.events if e.phase == "recompute"})
        losses = []
        if steps:
            ex.zero_grads()
            losses = [ex.step(k).loss for k in range(steps)]
        ex.close()
        out.append((rec.loss, grads if rank == 0 else None, recomputed, losses))
    return out
