"""Helpers to check the executor against the plain-autograd reference (tests, GPU sessions)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import torch

from tests.exec_reference import RefGPT
from memo_exec.runner import Executor, RunOptions
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.plan.schema import Plan
from memo_sim.policy import get_policy


def policy(name: str, alpha: float | None = None):
    """The simulator's policy object ``name`` (with ``alpha`` for MEMO)."""
    return get_policy(name, alpha)


def make_plan(model: ModelConfig, seq: int, policy, *, batch: int = 1, backend: str = "math",
              chunk: int = 700, memory_plan: dict | None = None, predicted: dict | None = None,
              layer_timings: dict | None = None, profile: str = "h100-sxm5-80gb") -> Plan:
    return Plan(model, batch, seq, 1, Layout(), policy, profile, dict(predicted or {"status": "OK"}),
                dict(layer_timings or {}), attention_backend=backend, classifier_chunk_tokens=chunk,
                memory_plan=memory_plan)


def executor_grads(plan: Plan, *, device: str = "cpu", dtype: str = "fp32", step: int = 0, setup=None,
                   **opts) -> tuple[float, dict[str, torch.Tensor], Executor]:
    """Loss and every parameter gradient of one forward+backward (no optimizer step)."""
    ex = Executor(plan, RunOptions(device=device, dtype=dtype, steps=1, **opts))
    ex.allocate()
    if setup is not None:
        setup(ex)
    try:
        loss = ex.forward_backward(step)
        ex.engine.synchronize()
        grads = {n: (ex.main_grads.main[p] if ex.main_grads is not None else p.grad).detach().clone()
                 for n, p in ex.gpt.named_parameters()}
    finally:
        ex.close()
    return float(loss.item()), grads, ex


def reference_grads(ex: Executor, step: int = 0, dtype: torch.dtype | None = None
                    ) -> tuple[float, dict[str, torch.Tensor]]:
    """The reference model with the executor's weights (unchanged by forward_backward) on batch ``step``,
    in ``dtype`` (default: the executor's; pass float32 to judge a bf16 run against fp32 math)."""
    ref = RefGPT(ex.model, ex.model.layers, ex.device, dtype or ex.dtype)
    ref.load_from(ex.gpt)
    inp, tgt = ex.data.batch_at(step)
    loss = ref(inp.to(ex.device), tgt.to(ex.device))
    loss.backward()
    return float(loss.item()), {k: v.detach().clone() for k, v in ref.grads_by_exec_name().items()}


def max_rel_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest norm-wise relative error over parameters: ||got - want|| / ||want||."""
    worst, name = 0.0, ""
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    for k in want:
        w = want[k].double()
        e = float((got[k].double() - w).norm() / w.norm().clamp_min(1e-300))
        if e > worst:
            worst, name = e, k
    return worst, name


def per_param_errors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float((got[k].double() - want[k].double()).norm() / want[k].double().norm().clamp_min(1e-300))
            for k in want}


def bf16_within_autograd_noise(ex: Executor, grads: dict[str, torch.Tensor], factor: float = 2.0,
                               slack: float = 1e-2) -> list[str]:
    """Parameters whose bf16 gradient error (against an fp32 reference) exceeds ``factor`` times the
    error of plain bf16 autograd on the same weights, plus ``slack``; empty when the run is as good
    as bf16 autograd."""
    _, ref32 = reference_grads(ex, dtype=torch.float32)
    _, ref16 = reference_grads(ex, dtype=ex.dtype)
    ours, theirs = per_param_errors(grads, ref32), per_param_errors(ref16, ref32)
    return [f"{k}: {ours[k]:.3g} vs autograd {theirs[k]:.3g}" for k in ref32 if ours[k] > factor * theirs[k] + slack]


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise `TimeoutError` in the main thread after ``seconds`` (SIGALRM), so a test whose copy
    threads deadlock fails instead of hanging. Elsewhere than the main thread it only yields."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"test exceeded its {seconds:g} s time limit")

    old = signal.signal(signal.SIGALRM, expire)
    outer, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    t0 = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer:  # an enclosing time limit keeps running
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer - (time.monotonic() - t0)), interval)


def achievable_offload_overlap(copies, compute) -> float:
    """Seconds of offload copy time that can run under forward compute at the measured link speed:
    the copies' bandwidth is their bytes over their busy time, and layer i's offload can only run
    beside layer i+1's forward (the rounding-buffer rule, `memo_sim.policy.rounding_buffers`:
    layer i+2 writes its input into layer i's buffer), so each copy contributes
    min(its bytes / bandwidth, layer i+1's forward compute). ``copies``/``compute``: events with
    ``layer``, ``duration`` (and ``nbytes`` for copies)."""
    nbytes = sum(c.nbytes for c in copies)
    busy = sum(c.duration for c in copies)
    if nbytes <= 0 or busy <= 0:
        return 0.0
    bandwidth = nbytes / busy
    fwd: dict[int, float] = {}
    for c in compute:
        fwd[c.layer] = fwd.get(c.layer, 0.0) + c.duration
    return sum(min(c.nbytes / bandwidth, fwd.get(c.layer + 1, 0.0)) for c in copies)


@contextlib.contextmanager
def skip_backend_failure(backend: str):
    """A kernel backend (anything but the executor's own math) that fails at the real size -- probed
    fine on a tiny problem, then refused or out of memory at length -- skips its test with the
    reason instead of failing it; a math failure is a failure."""
    import pytest  # noqa: PLC0415 - tests only

    from memo_exec.errors import BackendError  # noqa: PLC0415

    try:
        yield
    except BackendError as e:
        pytest.skip(str(e))
    except RuntimeError as e:  # includes torch.OutOfMemoryError and cuDNN / CUDA kernel errors
        if backend == "math":
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        pytest.skip(f"attention backend {backend} failed at the test's size: {type(e).__name__}: {first}")


def one_process_run(plan: Plan, steps: int = 0) -> tuple:
    """The single-process fp64 reference of a plan: its loss and gradients, and the losses of
    ``steps`` training steps (none when 0)."""
    from memo_exec.runner import Executor, RunOptions

    loss, grads, _ = executor_grads(plan, dtype="fp64")
    losses = []
    if steps:
        ex = Executor(plan, RunOptions(device="cpu", dtype="fp64", steps=steps))
        try:
            losses = [s["loss"] for s in ex.run().summaries]
        finally:
            ex.close()
    return loss, grads, losses


def whatif_plan_of_config(tmp_path, config: dict, *args: str):
    """A Hugging Face ``config`` written to ``tmp_path`` and planned by `memo-sim whatif` in process (one GPU, 256
    tokens, fp32, MEMO, h100-sxm5-80gb, then ``args``): the path of the plan.json it wrote."""
    import json

    from click.testing import CliRunner

    from memo_sim.cli import cli as sim_cli

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    r = CliRunner().invoke(sim_cli, ["whatif", "--model", str(cfg), "--gpus", "1", "--seq", "256", "--dtype", "fp32",
                                     "--policy", "memo", "--profile", "h100-sxm5-80gb", "--out", str(tmp_path / "p"),
                                     *args])
    assert r.exit_code == 0, r.output
    return tmp_path / "p" / "plan.json"


def plan_step_on_rank(rank: int, world: int, *plan_files: str) -> list[tuple]:
    """One fp64 step of each plan on this gloo rank (no optimizer), one process group for all (`tests.dist_harness.spawn`
    runs it): per plan the summed loss, rank 0's whole gradients, the run's JSON memory-plan entries and the arena
    ranges still placed after the step (nothing placed is live between steps)."""
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor
    from memo_sim.plan.schema import read_plan

    out = []
    for plan_file in plan_files:
        plan = read_plan(plan_file)
        ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=1), build_context(plan.layout,
                          torch.device("cpu")), DeviceSpec("cpu"))
        d = ex.describe()
        ex.allocate()
        rec = ex.step(0, optimizer=False)
        grads = ex.full_gradients()
        placed = sorted(getattr(ex.scratch, "_ranges", {}))
        ex.close()
        out.append((rec.loss, grads if rank == 0 else None, d.get("memory_plan"), d.get("memory_plan_not_used"),
                    placed))
    return out


def assert_matches_reference(result, reference, tol: float) -> None:
    """A `plan_step_on_rank` result of rank 0: its loss and gradients equal the single-process run's
    (``reference``: loss, gradients) within ``tol`` relative."""
    ref_loss, ref_grads = reference
    assert abs(result[0] - ref_loss) <= tol * abs(ref_loss), (result[0], ref_loss)
    err, name = max_rel_error(result[1], ref_grads)
    assert err <= tol, (name, err)
