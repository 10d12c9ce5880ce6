"""GPU checks of the executor (skipped without CUDA): bf16 runs of every policy and SDPA kernel
against the reference, real copy/compute overlap on three streams, the pinned pool, the CUDA
allocator history trace, and the CLI end to end."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from memo_exec.cli import cli  # noqa: E402
from memo_exec.runner import Executor, RunOptions  # noqa: E402
from memo_exec.testing import (  # noqa: E402
    bf16_within_autograd_noise, executor_grads, make_plan, max_rel_error, reference_grads)
from memo_exec.trace import memory_plan_from_trace, record_cuda_history, record_layer_trace  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from memo_sim.plan.schema import write_plan  # noqa: E402
from memo_sim.policy.policies import PolicyChoice  # noqa: E402

MODEL = ModelConfig("gpu-test", 4, 1024, 8, 4096, vocab=1024)
SEQ = 8192
POLICIES = [PolicyChoice("store_all"), PolicyChoice("full_recompute"), PolicyChoice("full_offload"),
            PolicyChoice("memo", 0.0), PolicyChoice("memo", 0.3), PolicyChoice("memo", 1.0)]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.label())
def test_fp32_policies_match_reference_on_gpu(policy):
    plan = make_plan(MODEL, SEQ, policy, backend="math", chunk=4096)
    loss, grads, ex = executor_grads(plan, device="cuda", dtype="fp32")
    ref_loss, ref_grads = reference_grads(ex)
    assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= 1e-4, f"{worst}: {err:.2e}"  # fp32 without TF32; GPU reduction orders differ from CPU


@pytest.mark.parametrize("backend", ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "math"])
def test_bf16_backends_close_to_reference(backend):
    plan = make_plan(MODEL, SEQ, PolicyChoice("memo", 0.3), backend=backend, chunk=4096)
    try:
        loss, grads, ex = executor_grads(plan, device="cuda", dtype="bf16")
    except Exception as e:  # a backend this GPU/torch lacks is refused with BackendError
        from memo_exec.errors import BackendError

        if isinstance(e, BackendError):
            pytest.skip(str(e))
        raise
    ref_loss, _ = reference_grads(ex, dtype=torch.float32)
    assert abs(loss - ref_loss) <= 1e-2 * abs(ref_loss)
    bad = bf16_within_autograd_noise(ex, grads)
    assert not bad, bad


def test_full_offload_bitwise_equals_store_all_in_bf16():
    """Offload/prefetch round-trips are exact copies (math backend: no atomics in its backward)."""
    a = executor_grads(make_plan(MODEL, SEQ, PolicyChoice("store_all"), backend="math"), device="cuda",
                       dtype="bf16")
    b = executor_grads(make_plan(MODEL, SEQ, PolicyChoice("full_offload"), backend="math"), device="cuda",
                       dtype="bf16")
    assert a[0] == b[0]
    assert all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def test_copies_overlap_compute_and_pool_is_pinned(tmp_path):
    m = ModelConfig("overlap", 6, 2048, 16, 8192, vocab=1024)
    plan = make_plan(m, 32768, PolicyChoice("memo", 0.5), backend="sdpa_flash", chunk=8192)
    ex = Executor(plan, RunOptions(device="cuda", steps=2))
    try:
        ex.allocate()
        assert ex.policy.pool.buf.is_pinned()
        rec = ex.step(0)
        rec = ex.step(1)
    finally:
        ex.close()
    comp = [e for e in rec.events if e.stream == "compute" and e.phase == "fwd" and e.layer is not None]
    offl = [e for e in rec.events if e.stream == "d2h"]
    assert offl, "no offload copies measured"
    overlapped = sum(max(0.0, min(o.end, c.end) - max(o.start, c.start)) for o in offl for c in comp)
    assert overlapped > 0.5 * sum(o.duration for o in offl)


def test_cuda_allocator_history_trace():
    m = ModelConfig("hist", 2, 512, 8, 2048, vocab=512)
    plan = make_plan(m, 4096, PolicyChoice("memo", 0.3), backend="sdpa_flash")
    tr = record_cuda_history(plan, "cuda", "bf16")
    assert len(tr) > 5 and {b.phase for b in tr.buffers} == {"fwd", "bwd"}
    own = record_layer_trace(plan, "cuda", "bf16")
    assert {b.name for b in own.buffers} >= {"proj", "fc2", "d_act", "d_q"}


def test_cli_on_gpu_with_memory_plan(tmp_path):
    plan = make_plan(MODEL, SEQ, PolicyChoice("memo", 0.3), backend="auto", chunk=4096,
                     predicted={"status": "OK", "iteration_s": 0.1, "peak_gpu_bytes": 4e9},
                     layer_timings={"forward": 0.005, "backward": 0.01})
    plan.memory_plan = memory_plan_from_trace(record_layer_trace(plan, "meta"))
    p = write_plan(plan, tmp_path / "plan.json")
    r = CliRunner().invoke(cli, ["run", str(p), "--device", "cuda", "--steps", "3", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "o" / "measured.json").read_text())["meta"]
    assert meta["memory_plan"]["offset_scale"] == 1 and meta["dtype"] == "bfloat16"
    assert meta["steady_state"]["peak_allocated_bytes"] > 0
