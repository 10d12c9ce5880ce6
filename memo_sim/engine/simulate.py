"""Simulate one training iteration: `simulate` (the one path every schedule takes) and `sweep_alpha`.

`simulate` looks the schedule up by name (`memo_sim.engine.schedules.registry`): the plan's or
candidate's ``schedule``, else `memo_sim.layout.schedule.default_schedule` for the layout and
policy (``sppo`` for the SPPO policy, ``single_stage`` without pipeline stages, ``1f1b`` with).

``batch`` is sequences per data-parallel replica per iteration (what `memo_sim.cost.activations`
splits across a replica's GPUs), so an iteration trains ``batch x dp`` sequences; MFU and TGS
count them all. ``micro_batch`` (default ``batch``) divides it: the iteration runs
``batch / micro_batch`` micro-batches and accumulates their gradients.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Callable, Iterable

from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS
from memo_sim.engine.result import (  # noqa: F401  (re-exported: the names callers import from here)
    SimResult, exposed_wait_parts, exposed_wait_seconds,
)
from memo_sim.engine.schedules import schedule_runner
from memo_sim.engine.schedules.single_stage import layer_timings  # noqa: F401
from memo_sim.engine.schedules.sppo import pipeline_layer_timings  # noqa: F401
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout, structure_why_not
from memo_sim.layout.schedule import check_schedule, default_schedule
from memo_sim.model.config import ModelConfig
from memo_sim.policy.base import Policy
from memo_sim.policy.registry import get_policy, policy_class
from memo_sim.profile.schema import HardwareProfile

DEFAULT_ALPHAS = tuple(i / 8 for i in range(9))  # 0, 0.125, ..., 1

Progress = Callable[[int, int], None]  # (done, total)


def simulate(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
             profile: HardwareProfile, *, schedule: str | None = None, micro_batch: int | None = None,
             contention: bool = True, classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS,
             keep_timeline: bool = True, record: bool = False, allocator_lag: int = 0, detail: str = "auto",
             fold: bool = True) -> SimResult:
    """Simulate one training iteration of ``model`` at ``seq`` tokens x ``batch`` sequences per
    data-parallel replica under ``layout``, ``policy`` and ``schedule`` on ``profile``, in
    micro-batches of ``micro_batch`` sequences.

    Representative GPUs are simulated (one, or one per pipeline stage); a node's shared PCIe
    switches and host memory see the traffic of every GPU of the node (see `memo_sim.engine.core`).
    ``contention=False`` gives every op its stand-alone time (the analytic model's assumptions).
    Running out of GPU or host memory is a result (``status`` OOM / OOHM with ``failure``), not an
    exception; a bad input raises `MemoError`. ``record=True`` also keeps the op graph (``ops``,
    with dependencies) and the links' load at every rate change (``link_log``).

    Single stage: a policy without a static memory plan runs on PyTorch's caching allocator (its
    iteration replayed, `memo_sim.memplan.iteration_replay`, each reorganisation's stall charged
    where it happens; ``allocator_lag``: layers the GPU lags behind the CPU); ``fold`` simulates
    identical layers once where the iteration is periodic (`memo_sim.engine.periodic`).
    SPPO: ``detail`` (ops, units or auto) sets how finely its pipeline is laid out.
    """
    model, layout, batch, seq, policy, profile, micro_batch = entry_arguments("simulate", model, layout, batch, seq,
                                                                              policy, profile, micro_batch)
    mb = batch if micro_batch is None else micro_batch
    name = schedule or default_schedule(layout.pp, policy.name, layout.vpp)
    why = check_schedule(name, pp=layout.pp, vpp=layout.vpp, layers=model.layers, batch=batch, micro_batch=mb,
                         uneven=layout.uneven,
                         policy_name=policy.name)
    if why:
        raise MemoError(f"{layout.label()} {policy.label()}: {why}")
    why = policy.model_why_not(model) or policy.layout_why_not(layout) or structure_why_not(layout, model) or (
        "the optimizer on the host is priced for single-stage layouts only" if layout.optimizer_offload
        and name != "single_stage" else None) or (
        "uneven stages run a micro-batch pipeline (1f1b, interleaved_1f1b)" if layout.uneven
        and name not in ("1f1b", "interleaved_1f1b") else None)
    if why:
        raise MemoError(f"{layout.label()} {policy.label()}: {why}")
    return schedule_runner(name)(model, layout, batch, seq, policy, profile, micro_batch=mb, contention=contention,
                                 classifier_chunk_tokens=classifier_chunk_tokens, keep_timeline=keep_timeline,
                                 record=record, allocator_lag=allocator_lag, detail=detail, fold=fold)


_DEGREES = ("tp", "cp", "ulysses", "dp", "pp", "vpp", "ep", "etp")  # a layout's degrees: whole numbers, 1 at least


def entry_arguments(who: str, model, layout, batch, seq, policy, profile, micro_batch=None):
    """``(model, layout, batch, seq, policy, profile, micro_batch)`` of a public entry's arguments (`simulate`'s,
    `memo_sim.api.estimate_iteration`'s),
    checked once per call as a program gives them: a model, policy or profile may be given by name (a preset or
    model file, a policy without an alpha, a profile's name or file), batch, seq and micro_batch are whole numbers of
    at least 1 (sequences, tokens, sequences; seq at most the command's cap), the layout a `Layout` of whole degrees
    of at least 1. Anything else raises one `MemoError` naming ``who``'s argument and what to pass."""
    from memo_sim.model.config import get_model  # noqa: PLC0415
    from memo_sim.units import MAX_TOKENS, tokens_cap_fix  # noqa: PLC0415

    def bad(name: str, value, fix: str) -> MemoError:
        return MemoError(f"{who}: {name} = {value!r}: {fix}")

    if isinstance(model, (str, os.PathLike)):
        model = get_model(model)
    elif not isinstance(model, ModelConfig):
        raise bad("model", model, "give a ModelConfig (memo_sim.api.get_model), a preset's name or a model file's path")
    if not isinstance(layout, Layout):
        raise bad("layout", layout, "give a Layout (memo_sim.api.Layout(tp=8, ...))")
    for f in _DEGREES:
        v = getattr(layout, f)
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:  # numpy's integers too
            raise bad(f"layout.{f}", v, "give a whole number of at least 1")
    zero = layout.zero
    if isinstance(zero, bool) or not isinstance(zero, numbers.Integral) or zero not in (0, 1, 2, 3):
        raise bad("layout.zero", layout.zero, "give a ZeRO stage 0 to 3")
    for name, v in (("batch", batch), ("seq", seq), ("micro_batch", micro_batch)):
        if v is None and name == "micro_batch":
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise bad(name, v, "give a whole number of at least 1 (" + ("tokens" if name == "seq" else "sequences")
                      + ("; None: the whole batch)" if name == "micro_batch" else ")"))
    if batch < 1 or seq < 1:
        raise MemoError(f"{who}: batch and seq must be positive, got batch={batch}, seq={seq}; give whole numbers of "
                        f"at least 1 (sequences per replica, tokens)")
    if micro_batch is not None and micro_batch < 1:
        raise bad("micro_batch", micro_batch, "give a whole number of at least 1, or None for the whole batch")
    if seq > MAX_TOKENS:
        raise bad("seq", seq, tokens_cap_fix())
    if isinstance(policy, str):
        if policy_class(policy).takes_alpha:
            raise bad("policy", policy, f"{policy} takes an alpha: pass memo_sim.api.get_policy({policy!r}, alpha) "
                      f"(memo_sim.api.memo_alpha solves MEMO's)")
        policy = get_policy(policy)
    elif not isinstance(policy, Policy):
        raise bad("policy", policy, "give a Policy (memo_sim.api.get_policy(name, alpha)) or a policy's name "
                  "(memo_sim.api.policy_names())")
    if isinstance(profile, (str, os.PathLike)):
        from memo_sim.profile.loader import load_profile  # noqa: PLC0415

        profile = load_profile(profile)
    elif not isinstance(profile, HardwareProfile):
        raise bad("profile", profile, "give a HardwareProfile (memo_sim.api.load_profile) or a profile's name")
    ints = {f: int(getattr(layout, f)) for f in _DEGREES + ("zero",)
            if type(getattr(layout, f)) is not int}  # numpy's integers as Python's, as the layout's checks take them
    if model.moe and not layout.moe:  # the label says where a mixture's experts are (`Layout.moe`)
        ints["moe"] = True
    if ints:
        from dataclasses import replace  # noqa: PLC0415

        layout = replace(layout, **ints)
    from memo_sim.cost.gemm_format import check_gemm_format  # noqa: PLC0415

    try:  # FP8 on an A100 says it needs FP8 tensor cores, not "add an fp8 peak" (a review), in the call's words
        check_gemm_format(model, profile)
    except MemoError as e:
        fmt = model.gemm_format
        e.args = (f"{who}: " + str(e).replace(f"drop --precision {fmt}", "give a model of bf16 GEMMs "
                                              "(memo_sim.model.config.with_overrides(model, gemm_format='bf16'))")
                  .replace(f"--precision {fmt}", f"model.gemm_format = {fmt!r}"),)
        raise
    return (model, layout, int(batch), int(seq), policy, profile,
            None if micro_batch is None else int(micro_batch))


def sweep_alpha(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                alphas: Iterable[float] = DEFAULT_ALPHAS, progress: Progress | None = None, *,
                contention: bool = True, keep_timeline: bool = False, schedule: str | None = None,
                micro_batch: int | None = None) -> list[SimResult]:
    """Simulate the memo policy at each alpha (default 0, 0.125, ..., 1); OOM / OOHM runs are
    kept as results. ``progress(done, total)`` is called after each run."""
    alphas = list(alphas)
    for a in alphas:
        if not (0.0 <= a <= 1.0) or math.isnan(a):
            raise MemoError(f"alpha must lie in [0, 1], got {a}")
    out = []
    for k, a in enumerate(alphas):
        out.append(simulate(model, layout, batch, seq, get_policy("memo", float(a)), profile, schedule=schedule,
                            micro_batch=micro_batch, contention=contention, keep_timeline=keep_timeline))
        if progress is not None:
            progress(k + 1, len(alphas))
    return out
