"""How one training step runs over the layers a rank holds: schedules registered by name.

A schedule is a class registered with ``@register_schedule(name)`` under one of the plan's
schedule names (`memo_sim.layout.schedule.SCHEDULE_NAMES`: ``single_stage``, ``1f1b``,
``interleaved_1f1b``, ``sppo``); `schedule_for(plan)` returns the class registered under
``plan.schedule`` after importing the modules of `SCHEDULE_MODULES` (explicit imports: an import
error is an error). A plan whose schedule does not fit its layout (``plan.check_schedule()``) or
has no registered class is refused before allocation, naming the schedules this executor runs.

A schedule is built as ``cls(ex)`` with the `memo_exec.distributed.runner.DistExecutor` (before
it allocates: ``ex.ctx``, ``ex.model``, ``ex.plan``, ``ex.layout``) and provides:

- ``check() -> str | None``: the one-line reason it cannot run this plan;
- ``layer_indices() -> list[int]``: the model layers this rank holds (all of them for one stage;
  a stage's layers for a pipeline). The executor allocates weights and ZeRO units for these
  only, in this order;
- ``activation_sets() -> tuple[int, int]``: (layers per activation-policy instance, instances):
  one instance over every held layer by default; a pipeline keeps one per micro-batch in flight;
- ``activation_sizes() -> list[int]``: the layer counts of the instances one set holds (an uneven
  pipeline split: one instance per chunk size);
- ``build_runtimes()``: allocate the activation policy (``ex.policy``, with ``begin_step`` /
  ``end_step`` / ``close``) and the layer runtimes; the default builds one policy over the held
  layers and ``ex.runtimes`` (one `memo_exec.model.LayerRuntime` per held layer);
- ``layer_backwards_per_step() -> int | None``: how many backwards each held layer runs in a step with the layer
  hooks around each (``plan.micro_batches``; None where the class sets ``calls_layer_hooks`` False, and the
  data-parallel collectives do not overlap the backward, `memo_exec.distributed.zero.GradSync`);
- ``holds_mtp() -> bool``: whether this rank holds the multi-token-prediction modules (`memo_exec.mtp`; every
  rank of one stage by default, a pipeline's last rank alone), and ``build_mtp()``, after ``build_runtimes``: their
  runtimes (``ex.mtp``; the default one `memo_exec.mtp.MTPRun` over ``ex.policy``, None without modules);
- ``forward_backward(step) -> torch.Tensor``: run the step's forward and backward over the plan's
  ``plan.micro_batches`` micro-batches (``ex.micro_batch_rows(step, k)`` gives this rank's input
  and target token rows of micro-batch k, ``ex.gpt`` the embedding/final norm/classifier weights,
  ``ex.global_tokens`` the divisor of the loss: the global batch's tokens, so that the parts sum
  to the global-batch mean) accumulating the gradients, and return this rank's part of the loss
  (a 0-dim tensor; zero on ranks without the classifier). The executor sums the parts over the
  ``tokens`` group (and the ``pp`` group) for the reported loss, then reduces what is left of the gradients
  (`memo_exec.distributed.zero.GradSync.end_backward`: all of them below ZeRO 2; under ZeRO 2 / 3 each layer's
  went out after each micro-batch's backward, and the single stage's embedding and head after each micro-batch
  too, `GradSync.end_micro_batch`) and steps the optimizer.

Optional hook: ``write_outputs(out_dir, plan_file) -> list[Path]``, called on every rank after
rank 0 wrote the run's merged ``measured.json`` and ``report.md`` (no collective may run in it;
return ``[]`` off rank 0). Every Markdown file it returns is appended to ``report.md``.
"""

from __future__ import annotations

import contextlib
import importlib

import torch

from memo_exec.errors import ExecError
from memo_exec.model import LayerRuntime, forward_loss
from memo_sim.layout.schedule import SCHEDULE_NAMES
from memo_sim.registry import Registry

# the modules that register the schedules besides ``single_stage`` (imported by `schedule_for`)
SCHEDULE_MODULES = ("memo_exec.pipeline.schedules", "memo_exec.sppo.plugin")

SCHEDULES: Registry[type] = Registry("schedule", error=ExecError, allowed=SCHEDULE_NAMES, sort=True,
                                     unknown="{what} {name!r}: the executor runs {known}")


def register_schedule(name: str):
    if name not in SCHEDULE_NAMES:
        raise ValueError(f"schedule {name!r} is not a plan schedule name ({', '.join(SCHEDULE_NAMES)})")
    return SCHEDULES.register(name)


def registered() -> tuple[str, ...]:
    for mod in SCHEDULE_MODULES:
        importlib.import_module(mod)
    return SCHEDULES.names()


def schedule_for(plan) -> type:
    """The schedule class registered under ``plan.schedule`` (ExecError when it cannot run)."""
    registered()
    why = plan.check_schedule()
    if why:
        raise ExecError(f"schedule {plan.schedule}: {why}")
    return SCHEDULES.get(plan.schedule)


class Schedule:
    name = "base"
    pipelined = False  # a micro-batch pipeline's rank: its activation policies' instances share its buffers
    # whether each held layer's forward and backward run in `memo_exec.model.LayerRuntime`s with the layer hooks,
    # one backward per micro-batch (`layer_backwards_per_step`)
    calls_layer_hooks = True

    def __init__(self, ex) -> None:
        self.ex = ex

    def check(self) -> str | None:
        return None

    def layer_indices(self) -> list[int]:
        raise NotImplementedError

    def activation_sets(self) -> tuple[int, int]:
        return len(self.layer_indices()), 1

    def activation_sizes(self) -> list[int]:
        """The layer counts of the policy instances one activation set holds (one over every held layer)."""
        return [self.activation_sets()[0]]

    def build_runtimes(self) -> None:
        ex = self.ex
        ex.policy = ex.make_activation_policy(len(ex.held))
        ex.policy.allocate()
        ex.runtimes = [LayerRuntime(k, w, ex.policy, ex.compute, ex.recorder, ex.layer_hooks)
                       for k, w in enumerate(ex.gpt.layers)]

    def holds_mtp(self) -> bool:
        return True

    def layer_backwards_per_step(self) -> int | None:
        """How many backwards each held layer runs in a step, the layer hooks called around each (one per
        micro-batch): what lets `memo_exec.distributed.zero.GradSync` reduce a layer's gradient beside the next
        backward once it is complete; None where the schedule runs its layers otherwise (nothing overlaps then)."""
        return self.ex.plan.micro_batches if self.calls_layer_hooks else None

    def build_mtp(self):
        ex = self.ex
        return ex.make_mtp_run(ex.policy) if ex.gpt.mtp else None

    def forward_backward(self, step: int) -> torch.Tensor:
        raise NotImplementedError


@register_schedule("single_stage")
class SingleStage(Schedule):
    """Every layer on this rank: per micro-batch embedding -> layers -> final norm -> classifier (with the
    multi-token-prediction modules' rows, `memo_exec.mtp`), then its backward (the gradients accumulate; one
    activation policy serves the micro-batches one after the other)."""

    def layer_indices(self) -> list[int]:
        return list(range(self.ex.model.layers))

    def forward_backward(self, step: int) -> torch.Tensor:
        ex = self.ex
        total = torch.zeros((), dtype=torch.float64, device=ex.device)  # the loss's device (no CUDA->CPU add)
        m = ex.plan.micro_batches
        for k in range(m):
            inputs, targets = ex.micro_batch_rows(step, k)
            span = ex.recorder.span(f"fwd_bwd@mb{k}", None, "micro_batch", stream="pipeline") if m > 1 \
                else contextlib.nullcontext()
            with span:
                loss = forward_loss(ex.gpt, ex.runtimes, inputs, targets, ex.plan.classifier_chunk_tokens,
                                    ex.recorder, norm_tokens=ex.global_tokens, mtp=ex.micro_batch_mtp(step, k))
                loss.backward()
            if k < m - 1:
                ex.end_micro_batch()  # ZeRO 2 / 3: the embedding's and the head's gradients reduced now as well
            total += loss.detach().to(torch.float64)
        return total
