"""How one training step runs over the layers a rank holds: registered schedules.

A schedule is a class registered with ``@register_schedule(name, applies)`` where
``applies(layout, policy) -> bool`` says which plans it runs (the plan's `Layout` and its
activation policy, e.g. ``policy.name == "sppo"``); `schedule_for` picks the first registered
schedule other than ``single_stage`` that claims the plan (after importing the plugin packages of
`memo_exec.distributed.tp.PLUGIN_PACKAGES`, e.g. ``memo_exec.sppo``), else ``single_stage`` for
``pp == 1``. A plan with ``pp > 1`` that no schedule claims is refused before allocation.

A schedule is built as ``cls(ex)`` with the `memo_exec.distributed.runner.DistExecutor` (before
it allocates: ``ex.ctx``, ``ex.model``, ``ex.plan``, ``ex.layout``) and provides:

- ``check() -> str | None``: the one-line reason it cannot run this plan;
- ``layer_indices() -> list[int]``: the model layers this rank holds (all of them for one stage;
  a stage's contiguous block for a pipeline). The executor allocates weights, activation storage
  and ZeRO units for these only, in this order, and builds ``ex.runtimes`` (one
  `memo_exec.model.LayerRuntime` per held layer, its ``index`` the position in this list);
- ``forward_backward(step) -> torch.Tensor``: run the step's forward and backward on this rank
  (``ex.local_batch(step)`` gives this rank's input and target token rows, ``ex.gpt`` the
  embedding/final norm/classifier weights, ``ex.global_tokens`` the divisor of the loss) and
  return this rank's part of the loss (a 0-dim tensor; zero on ranks without the classifier).
  The executor sums the parts over the ``tokens`` group (and the ``pp`` group) for the reported
  loss, then reduces gradients (`memo_exec.distributed.zero.GradSync.end_backward`) and steps
  the optimizer; the runtimes' hooks already do ZeRO's per-layer gathers and reductions.

Optional hook: ``write_outputs(out_dir, plan_file) -> list[Path]``, called on every rank after
rank 0 wrote the run's merged ``measured.json`` and ``report.md`` (no collective may run in it;
return ``[]`` off rank 0). Every Markdown file it returns is appended to ``report.md`` (e.g. the
SPPO pipeline's measured-vs-simulated table).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from memo_exec.errors import ExecError
from memo_exec.model import forward_loss

_SCHEDULES: dict[str, tuple[type, Callable]] = {}


def register_schedule(name: str, applies: Callable):
    def deco(cls):
        if name in _SCHEDULES and _SCHEDULES[name][0] is not cls:
            raise ValueError(f"schedule {name!r} registered twice")
        cls.name = name
        _SCHEDULES[name] = (cls, applies)
        return cls
    return deco


def schedule_for(layout, policy=None) -> type:
    """The schedule that runs a plan of this layout and activation policy (module docs)."""
    from memo_exec.distributed.tp import discover  # noqa: PLC0415

    discover()
    for name, (cls, applies) in _SCHEDULES.items():
        if name != "single_stage" and applies(layout, policy):
            return cls
    if layout.pp == 1:
        return _SCHEDULES["single_stage"][0]
    raise ExecError(f"layout.pp = {layout.pp}: no pipeline schedule is registered in the executor yet; "
                    f"plan with pp 1 (memo-sim whatif without --pp)")


class Schedule:
    name = "base"

    def __init__(self, ex) -> None:
        self.ex = ex

    def check(self) -> str | None:
        return None

    def layer_indices(self) -> list[int]:
        raise NotImplementedError

    def forward_backward(self, step: int) -> torch.Tensor:
        raise NotImplementedError


@register_schedule("single_stage", lambda layout, policy: layout.pp == 1)
class SingleStage(Schedule):
    """Every layer on this rank: embedding -> layers -> final norm -> classifier, then backward."""

    def layer_indices(self) -> list[int]:
        return list(range(self.ex.model.layers))

    def forward_backward(self, step: int) -> torch.Tensor:
        ex = self.ex
        inputs, targets = ex.local_batch(step)
        loss = forward_loss(ex.gpt, ex.runtimes, inputs, targets, ex.plan.classifier_chunk_tokens, ex.recorder,
                            norm_tokens=ex.global_tokens)
        loss.backward()
        return loss.detach()
