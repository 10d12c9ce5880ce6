"""GPU checks of the executor (skipped without CUDA): bf16 runs of every policy and SDPA kernel
against the reference, copy streams delayed on the GPU (torch.cuda._sleep) without changing the
gradients, the race detector on CUDA, real copy/compute overlap on three streams (against what the
measured link speed allows), the pinned pool, the CUDA allocator history trace, and the CLI end to
end with a memory plan traced for CUDA. A kernel backend that fails at the test's size is skipped
with the reason (`tests.exec_helpers.skip_backend_failure`)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from memo_exec.cli import cli  # noqa: E402
from memo_exec.runner import Executor, RunOptions  # noqa: E402
from tests.exec_helpers import (  # noqa: E402
    achievable_offload_overlap, bf16_within_autograd_noise, executor_grads, make_plan, max_rel_error,
    reference_grads, skip_backend_failure, time_limit)
from memo_exec.trace import memory_plan_from_trace, record_cuda_history, record_layer_trace  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from memo_sim.plan.schema import write_plan  # noqa: E402
from memo_sim.policy import get_policy  # noqa: E402

MODEL = ModelConfig("gpu-test", 4, 1024, 8, 4096, vocab=1024)
SEQ = 8192
POLICIES = [get_policy("store_all"), get_policy("full_recompute"), get_policy("full_offload"),
            get_policy("memo", 0.0), get_policy("memo", 0.3), get_policy("memo", 1.0)]


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(300):
        yield


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
    plan = make_plan(MODEL, SEQ, get_policy("memo", 0.3), backend=backend, chunk=4096)
    with skip_backend_failure(backend):  # refused by the probe, or failing at this size: skipped with the reason
        loss, grads, ex = executor_grads(plan, device="cuda", dtype="bf16")
    ref_loss, _ = reference_grads(ex, dtype=torch.float32)
    assert abs(loss - ref_loss) <= 1e-2 * abs(ref_loss)
    bad = bf16_within_autograd_noise(ex, grads)
    assert not bad, bad


def test_a_plan_priced_on_cudnn_runs_cudnn_under_auto():
    """A plan whose attention was priced on cuDNN's fused attention (a Hopper profile's curves) runs
    SDPA's cuDNN kernel under ``auto``, with gradients as close to the reference as every backend's."""
    from dataclasses import replace

    plan = make_plan(MODEL, SEQ, get_policy("memo", 0.3), backend="auto", chunk=4096)
    plan.layout = replace(plan.layout, attention="cudnn")
    assert plan.priced_attention_kernel() == "cudnn"
    with skip_backend_failure("sdpa_cudnn"):
        loss, grads, ex = executor_grads(plan, device="cuda", dtype="bf16")
    if ex.backend.name != "sdpa_cudnn":
        pytest.skip(f"sdpa_cudnn refused by the probe here; auto ran {ex.backend.name}")
    assert ex.describe()["attention_kernel_priced"] == "cudnn"
    ref_loss, _ = reference_grads(ex, dtype=torch.float32)
    assert abs(loss - ref_loss) <= 1e-2 * abs(ref_loss)
    assert not bf16_within_autograd_noise(ex, grads)


def test_full_offload_bitwise_equals_store_all_in_bf16():
    """Offload/prefetch round-trips are exact copies (math backend: no atomics in its backward)."""
    a = executor_grads(make_plan(MODEL, SEQ, get_policy("store_all"), backend="math"), device="cuda",
                       dtype="bf16")
    b = executor_grads(make_plan(MODEL, SEQ, get_policy("full_offload"), backend="math"), device="cuda",
                       dtype="bf16")
    assert a[0] == b[0]
    assert all(torch.equal(a[1][k], b[1][k]) for k in a[1])


@pytest.mark.parametrize("streams", [("d2h",), ("h2d",), ("d2h", "h2d")])
def test_copy_streams_delayed_on_the_gpu_change_nothing(streams):
    """torch.cuda._sleep keeps a copy stream busy before each copy group, so the copies really run
    late on the GPU; with every wait in place the gradients are bitwise those of an undelayed run."""
    plan = make_plan(MODEL, SEQ, get_policy("memo", 0.3), backend="math", chunk=4096)
    loss, grads, _ = executor_grads(plan, device="cuda", dtype="bf16")

    def delay(ex):
        ex.engine.copy_delay = lambda stream, label: 0.02 if stream in streams else 0.0

    loss2, grads2, _ = executor_grads(plan, device="cuda", dtype="bf16", setup=delay)
    assert loss2 == loss
    assert all(torch.equal(grads2[k], grads[k]) for k in grads)


def test_a_missing_wait_is_a_race_on_cuda_too(monkeypatch):
    from memo_exec.activations.token_offload import TokenOffload
    from memo_exec.happens_before import RaceError

    monkeypatch.setattr(TokenOffload, "_output_write_waits_for_offload", lambda self, j: None)
    with pytest.raises(RaceError, match="race on"):
        executor_grads(make_plan(MODEL, SEQ, get_policy("memo", 0.3), backend="math", chunk=4096), device="cuda",
                       dtype="bf16")


def test_copies_overlap_compute_and_pool_is_pinned(tmp_path):
    """More than half of the overlap the measured link allows: each offload beside the next layer's
    forward at the copies' measured bandwidth (`achievable_offload_overlap`), so a slow link (copies
    longer than compute) lowers the bar instead of failing a correct run."""
    m = ModelConfig("overlap", 6, 2048, 16, 8192, vocab=1024)
    plan = make_plan(m, 32768, get_policy("memo", 0.5), backend="sdpa_flash", chunk=8192)
    ex = Executor(plan, RunOptions(device="cuda", steps=2))
    try:
        with skip_backend_failure("sdpa_flash"):
            ex.allocate()
            assert ex.policy.pool.buf.is_pinned(), ex.policy.pool.describe()
            rec = ex.step(0)
            rec = ex.step(1)
    finally:
        ex.close()
    comp = [e for e in rec.events if e.stream == "compute" and e.phase == "fwd" and e.layer is not None]
    offl = [e for e in rec.events if e.stream == "d2h"]
    assert offl, "no offload copies measured"
    overlapped = sum(max(0.0, min(o.end, c.end) - max(o.start, c.start)) for o in offl for c in comp)
    achievable = achievable_offload_overlap(offl, comp)
    copy_s = sum(o.duration for o in offl)
    gbps = sum(o.nbytes for o in offl) / copy_s / 1e9
    assert achievable > 0, f"no forward compute beside the offloads ({len(comp)} compute spans)"
    assert overlapped > 0.5 * achievable, (f"overlapped {overlapped:.4f} s of {copy_s:.4f} s of copies at "
                                           f"{gbps:.1f} GB/s; achievable {achievable:.4f} s")


def test_cuda_allocator_history_trace():
    m = ModelConfig("hist", 2, 512, 8, 2048, vocab=512)
    plan = make_plan(m, 4096, get_policy("memo", 0.3), backend="sdpa_flash")
    tr = record_cuda_history(plan, "cuda", "bf16")
    assert len(tr) > 5 and {b.phase for b in tr.buffers} == {"fwd", "bwd"}
    own = record_layer_trace(plan, "cuda", "bf16")
    assert {b.name for b in own.buffers} >= {"proj", "fc2", "d_act", "d_q"}


def test_cli_on_gpu_with_memory_plan(tmp_path):
    plan = make_plan(MODEL, SEQ, get_policy("memo", 0.3), backend="auto", chunk=4096,
                     predicted={"status": "OK", "iteration_s": 0.1, "peak_gpu_bytes": 4e9},
                     layer_timings={"forward": 0.005, "backward": 0.01})
    plan.memory_plan = memory_plan_from_trace(record_layer_trace(plan, "meta"))
    p = write_plan(plan, tmp_path / "plan.json")
    r = CliRunner().invoke(cli, ["run", str(p), "--device", "cuda", "--steps", "3", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "o" / "measured.json").read_text())["meta"]
    assert meta["memory_plan"]["offset_scale"] == 1 and meta["dtype"] == "bfloat16"
    assert meta["steady_state"]["peak_allocated_bytes"] > 0


@pytest.mark.parametrize("fmt,capability", [("fp8-tensorwise", (8, 9)), ("fp8-rowwise", (9, 0)),
                                            ("fp8-blockwise", (9, 0))])
def test_fp8_runs_on_cuda_and_every_policy_gives_store_alls_gradients(fmt, capability):
    """`torch._scaled_mm` on CUDA takes a row-major first and a column-major second operand of dimensions divisible
    by 16 and no E5M2 x E5M2 pair: the executor's three GEMMs keep to that (`memo_exec.gemm_formats`), and MEMO's
    recompute with the forward's scales gives store-all's gradients in bf16 too. The row- and block-scaled formats
    (`memo_exec.gemm_scaled`, Hopper and newer) likewise, their rebuilt rows cast by their own scales."""
    import dataclasses

    if torch.cuda.get_device_capability() < capability:
        pytest.skip(f"{fmt} GEMMs need an sm{capability[0]}{capability[1]}+ GPU")
    m = ModelConfig("fp8-gpu", 4, 512, 8, 1024, vocab=1024, kv_heads=4, norm="rmsnorm", ffn_type="swiglu", bias="none",
                    tied_embeddings=False, gemm_format=fmt)
    base = executor_grads(make_plan(m, 2048, get_policy("store_all")), device="cuda", dtype="bf16")
    plain = executor_grads(make_plan(dataclasses.replace(m, gemm_format="bf16"), 2048, get_policy("store_all")),
                           device="cuda", dtype="bf16")
    assert abs(base[0] - plain[0]) < 0.05 * abs(plain[0]) and base[0] != plain[0]
    for pol in (get_policy("full_recompute"), get_policy("memo", 0.3)):
        loss, grads, _ = executor_grads(make_plan(m, 2048, pol), device="cuda", dtype="bf16")
        assert loss == base[0]
        err, worst = max_rel_error(grads, base[1])
        assert err == 0.0, (fmt, pol.label(), worst, err)
