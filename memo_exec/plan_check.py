"""The executor's check of a plan before anything runs: the simulator's own checker.

`memo-sim check-plan` and `memo-exec run` refuse the same plans with the same line
(`memo_sim.search.plan_check.runnable_problems`, through `memo_sim.api`): the GEMM format against the profile's GPU,
the policy's plan fields and MEMO's static memory plan (every transient tensor of the layer placed or named as unplaced,
no two live tensors overlapping, all inside the arena). A memory plan placed from the executor's
recorded layer (`memo-exec trace --write-plan`) is checked by the same function against that
layer, recorded again on the meta device. ``memo-exec run --no-memory-plan`` does not use the
memory plan, so it does not check it.
"""

from __future__ import annotations

import torch

from memo_exec.errors import ExecError
from memo_sim.plan.schema import Plan

TRACE_WIDTH = {2: "bf16", 4: "fp32", 8: "fp64"}  # a memory plan's element_bytes -> the dtype it was recorded at


def check_plan_contract(plan: Plan, plan_file, use_memory_plan: bool = True, device: str | None = None,
                        attention_backend: str | None = None, profile: str | None = None) -> None:
    """Refuse a plan `memo-sim check-plan` refuses, with its first line (`memo_sim.search.plan_check`:
    the policy's plan fields and the static memory plan, e.g. a tensor without an offset), before
    anything runs. With ``--no-memory-plan`` the memory plan is not used, so it is not checked. A
    memory plan placed from the executor's recorded layer (`memo-exec trace --write-plan`) is
    checked by the same function against that layer, recorded again on the meta device for the
    run's device type (``device``) and attention backend (``attention_backend``, default the plan's),
    at the width the plan was recorded at. The plan's GEMM format is checked against the profile the run predicts
    with (``profile``, ``--profile``: a name or file; else the plan's) as check-plan checks it, and, on CUDA, against
    the device's own compute capability (`check_device_gemm_format`)."""
    from memo_sim.api import runnable_problems, traced_by_executor  # noqa: PLC0415

    from memo_sim.plan.executor_scope import ring_merge_why_not  # noqa: PLC0415

    why = ring_merge_why_not(plan.layout)  # before the device count: one line on any run
    if why:
        raise ExecError(why)
    traces = None
    if use_memory_plan and traced_by_executor(plan):  # placed from this executor's own layer: check against it
        traces = executor_layer_traces(plan, device, attention_backend)
    prof = None
    if profile is not None and plan.model.gemm.quantised:  # the run's --profile (one that does not load: its line)
        from memo_sim.profile.loader import load_profile  # noqa: PLC0415

        prof = load_profile(profile)
    problems = runnable_problems(plan, memory_plan=use_memory_plan, traces=traces, profile=prof)
    if problems:
        fix = "; or run it with --no-memory-plan" if problems[0].startswith("memory_plan") else ""
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ExecError(f"{plan_file}: {problems[0]}{more}{fix}")
    check_device_gemm_format(plan, plan_file, device)


def check_device_gemm_format(plan: Plan, plan_file, device: str | None) -> None:
    """On CUDA, refuse (one line) a plan whose GEMM format the device's compute capability has no tensor cores for
    (``torch.cuda.get_device_capability``, against `memo_sim.cost.gemm_format.MIN_CAPABILITY`, read through
    `memo_sim.api`: FP8 from 8.9, Ada and Hopper, as TransformerEngine's _compute_fp8_support checks it;
    ``torch._scaled_mm`` refuses below it), before
    anything runs: the profile may say another GPU than the one the run is on. A CPU run emulates the FP8 GEMMs
    (`memo_exec.gemm_formats.scaled_mm`), so it is not refused."""
    from memo_sim.api import GEMM_MIN_CAPABILITY as MIN_CAPABILITY  # noqa: PLC0415

    need = MIN_CAPABILITY.get(plan.model.gemm_format)
    dev = device or "auto"
    if need is None or not torch.cuda.is_available() or not (dev == "auto" or dev.startswith("cuda")):
        return
    index = torch.device(dev).index if dev.startswith("cuda") else None
    cc = tuple(torch.cuda.get_device_capability(index))
    if cc < need:
        name = torch.cuda.get_device_name(index)
        raise ExecError(f"{plan_file}: model.gemm_format {plan.model.gemm_format}: this device, {name}, has compute "
                        f"capability {cc[0]}.{cc[1]}; {plan.model.gemm_format} GEMMs need {need[0]}.{need[1]} or "
                        f"higher; fix: run the plan on such a GPU, or plan afresh with --precision bf16")


def executor_layer_traces(plan: Plan, device: str | None, attention_backend: str | None = None) -> dict:
    """{phase: the executor's layer requests of that phase} on the meta device, as `memo-exec trace`
    records them for ``device``'s type at the plan's recorded element width."""
    from memo_exec.trace import record_layer_trace  # noqa: PLC0415
    from memo_sim.request_trace import RequestTrace  # noqa: PLC0415

    width = plan.memory_plan.element_bytes
    dtype = TRACE_WIDTH.get(width) if width else None
    target = "cpu" if (device or "auto") == "cpu" or (device in (None, "auto") and not torch.cuda.is_available()) \
        else "cuda"
    tr = record_layer_trace(plan, "meta", dtype, attention_backend, target)
    return {ph: RequestTrace([b for b in tr.buffers if b.phase == ph], name=f"{tr.name}-{ph}") for ph in ("fwd", "bwd")}
