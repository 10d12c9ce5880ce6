"""Units of the executor: stream/event semantics of the CPU copy engine and its happens-before race
detector, attention backends against torch's SDPA and their resolution before tracing, the AdamW
update against torch.optim.AdamW, token files, sizes before allocation, host memory limits."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from memo_exec.arena import AllocRecorder, CachingScratch
from memo_exec.attention import AttnDims, MathAttention, SDPAFlash, auto_backend_for, meta_stand_in, select_backend
from memo_exec.data import TokenSource
from memo_exec.errors import BackendError, ExecError
from memo_exec.optim import AdamW
from memo_exec.happens_before import HappensBefore, RaceError, Region
from memo_exec.streams import CopyLabel, HostStreams
from tests.exec_helpers import make_plan, policy, time_limit
from memo_sim.model.config import ModelConfig

torch.set_num_threads(1)
LBL = CopyLabel("offload", 0, "offload", 0)


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(60):
        yield


def test_copy_stream_waits_for_event_recorded_on_compute():
    eng = HostStreams()
    try:
        src, dst = torch.zeros(1000), torch.empty(1000)
        ev = eng.event()
        src.fill_(1.0)
        eng.compute.record(ev)
        eng.d2h.wait_event(ev)
        eng.d2h.copy_group([(dst, src)], LBL)
        done = eng.event()
        eng.d2h.record(done)
        eng.compute.wait_event(done)
        assert torch.equal(dst, src)
    finally:
        eng.close()


def test_compute_waits_for_delayed_copy_and_rerecorded_events():
    eng = HostStreams()
    eng.copy_delay = lambda stream, label: 0.05
    try:
        src, dst = torch.arange(10.0), torch.zeros(10)
        ev = eng.event()
        for k in range(3):  # the same event recorded again: a wait refers to the latest record
            src.add_(1)
            snap = src.clone()
            eng.d2h.copy_group([(dst, snap)], LBL)
            eng.d2h.record(ev)
            assert not ev.query()
            eng.compute.wait_event(ev)
            assert ev.query() and torch.equal(dst, snap)
    finally:
        eng.close()


def test_copy_stream_order_and_cross_stream_wait():
    eng = HostStreams()
    order = []
    lock = threading.Lock()

    def delay(stream, label):
        with lock:
            order.append((stream, label.layer))
        return 0.03 if stream == "d2h" else 0.0

    eng.copy_delay = delay
    try:
        a, b, c = torch.ones(10), torch.zeros(10), torch.zeros(10)
        e1 = eng.event()
        eng.d2h.copy_group([(b, a)], CopyLabel("offload", 1, "offload", 0))
        eng.d2h.record(e1)
        eng.h2d.wait_event(e1)  # h2d must not start its copy before d2h's finished
        eng.h2d.copy_group([(c, b)], CopyLabel("prefetch", 2, "prefetch", 0))
        eng.synchronize()
        assert torch.equal(c, a)
        assert order == [("d2h", 1), ("h2d", 2)]
    finally:
        eng.close()


def test_unrecorded_event_wait_is_a_noop_and_failures_surface():
    eng = HostStreams()
    try:
        eng.compute.wait_event(eng.event())
        eng.d2h.copy_group([(torch.zeros(3), torch.zeros(4))], LBL)  # shape mismatch fails in the worker
        with pytest.raises(ExecError, match="copy stream failed"):
            eng.synchronize()
    finally:
        eng.close()


def _attn_ref(q, k, v, dims):
    b, s, H, Hk, d = dims.batch, dims.seq, dims.heads, dims.kv_heads, dims.head_dim
    qb = q.view(b, s, H, d).transpose(1, 2)
    kb = k.view(b, s, Hk, d).transpose(1, 2)
    vb = v.view(b, s, Hk, d).transpose(1, 2)
    o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=Hk != H)
    return o.transpose(1, 2).reshape(b * s, H * d)


@pytest.mark.parametrize("backend", [MathAttention(), MathAttention(score_budget_bytes=8 * 4 * 2 * 100), SDPAFlash()],
                         ids=["math", "math-small-chunks", "sdpa_flash-cpu"])
@pytest.mark.parametrize("dims", [AttnDims(2, 300, 4, 4, 16), AttnDims(1, 257, 8, 2, 8)], ids=["mha", "gqa"])
def test_attention_backends_match_sdpa(backend, dims):
    g = torch.Generator().manual_seed(0)
    T, h, kv = dims.tokens, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    q, k, v = (torch.randn(T, w, generator=g, dtype=torch.float64) for w in (h, kv, kv))
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    ref = _attn_ref(qr, kr, vr, dims)
    dout = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    ref.backward(dout)
    rec = AllocRecorder()
    scr = CachingScratch("cpu", rec)
    out = torch.empty(T, h, dtype=torch.float64)
    aux = backend.forward(q, k, v, out, dims, scr)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    backend.backward(dout, q, k, v, out, aux, dq, dk, dv, dims, scr)
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    for got, want in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-11)
    assert aux["lse"].shape == (dims.batch, dims.heads, dims.seq)
    if backend.uses_scratch:
        assert rec.trace().max_live_bytes() > 0 and not scr._live


def test_backend_refusals():
    dims = AttnDims(1, 64, 4, 4, 16)
    with pytest.raises(BackendError, match="CUDA"):
        select_backend("sdpa_efficient", torch.device("cpu"), torch.float32, dims)
    with pytest.raises(BackendError, match="one of"):
        select_backend("xformers", torch.device("cpu"), torch.float32, dims)
    assert select_backend("auto", torch.device("cpu"), torch.float32, dims).name == "math"


def test_adamw_matches_torch():
    g = torch.Generator().manual_seed(0)
    p1 = torch.nn.Parameter(torch.randn(30, 20, generator=g, dtype=torch.float64))
    p2 = torch.nn.Parameter(p1.detach().clone())
    ours = AdamW([p1], lr=1e-2, weight_decay=0.1)
    theirs = torch.optim.AdamW([p2], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for _ in range(5):
        gr = torch.randn(30, 20, generator=g, dtype=torch.float64)
        p1.grad, p2.grad = gr.clone(), gr.clone()
        ours.step()
        theirs.step()
    assert torch.allclose(p1, p2, rtol=1e-13, atol=1e-15)


def test_adamw_steps_each_parameter_as_torch_does_with_a_changed_rate():
    """A parameter without a gradient is not stepped (its own bias correction stays behind, as torch.optim's
    per-parameter step counts), and a rate set between steps (a schedule's) is the one the next step uses."""
    g = torch.Generator().manual_seed(1)
    ps = [torch.nn.Parameter(torch.randn(6, 5, generator=g, dtype=torch.float64)) for _ in range(2)]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    ours = AdamW(ps, lr=1e-2, weight_decay=0.1)
    theirs = torch.optim.AdamW(qs, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for k in range(4):
        for p, q, with_grad in zip(ps, qs, (True, k % 2 == 0)):
            gr = torch.randn(6, 5, generator=g, dtype=torch.float64) if with_grad else None
            p.grad, q.grad = gr, None if gr is None else gr.clone()
        ours.lr = 1e-2 / (k + 1)
        for group in theirs.param_groups:
            group["lr"] = 1e-2 / (k + 1)
        ours.step()
        theirs.step()
    for p, q in zip(ps, qs):
        assert torch.allclose(p, q, rtol=1e-13, atol=1e-15)


def test_adamw_does_not_import_torchdynamo():
    """The executor's optimizer starts without TorchDynamo (a torch.optim.Optimizer's constructor imports it:
    2 s of every rank's start on a CPU)."""
    code = ("import sys, torch; from memo_exec.optim import AdamW; p = torch.nn.Parameter(torch.ones(4)); "
            "o = AdamW([p]); p.grad = torch.ones(4); o.step(); print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_adamw_bf16_keeps_fp32_master():
    p = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
    opt = AdamW([p], lr=1e-4, weight_decay=0.0)
    p.grad = torch.ones(8, dtype=torch.bfloat16)
    opt.step()
    assert opt.master[0].dtype == torch.float32 and opt.m[0].dtype == torch.float32
    assert float(opt.master[0][0]) == pytest.approx(1 - 1e-4, rel=1e-6)
    assert opt.state_bytes() == 12 * 8 == AdamW.state_bytes_for(8, torch.bfloat16)


def test_token_sources(tmp_path):
    syn = TokenSource(100, 2, 16, seed=3)
    a, b = syn.batch_at(0)
    assert a.shape == b.shape == (2, 16) and torch.equal(a[:, 1:], b[:, :-1])
    assert torch.equal(syn.batch_at(0)[0], a) and not torch.equal(syn.batch_at(1)[0], a)
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "t.bin")
    fb = TokenSource(1000, 1, 10, path=tmp_path / "t.bin")
    x, y = fb.batch_at(1)
    assert x.tolist() == [list(range(10, 20))] and y.tolist() == [list(range(11, 21))]
    np.save(tmp_path / "bad.npy", np.array([1, 2, 5000]))
    with pytest.raises(ExecError, match="outside the model's vocabulary"):
        TokenSource(1000, 1, 2, path=tmp_path / "bad.npy")
    with pytest.raises(ExecError, match="need at least"):
        TokenSource(1000, 1, 2000, path=tmp_path / "t.bin")


def test_sizes_known_before_allocation():
    from memo_exec.runner import Executor, RunOptions

    m = ModelConfig("s", 6, 64, 4, 256, vocab=128)
    ex = Executor(make_plan(m, 128, policy("memo", 0.5)), RunOptions(device="cpu"))
    assert not ex.allocated
    est = ex.estimate.terms
    assert est["model_states"] == m.params() * 4 * 4  # fp32: weight, gradient, Adam m and v
    assert est["buffers"] == 2 * 128 * (64 * 8 + 256 * 2) * 4 and est["skeletal_resident"] == 0  # two rounding buffers
    pol = ex.policy
    assert pol.n_off == 64
    # host: x and attn whole, plus 64 of 128 tokens of ln1, q, k, v, h1, ln2, fc1, act, for 4 layers
    per_layer = 4 * (2 * 128 * 64 + 64 * (64 * 6 + 256 * 2))
    assert pol.layer_offload_bytes() == per_layer
    assert pol.host_bytes() >= 4 * per_layer
    ex.allocate()
    assert ex.policy.pool.nbytes == pol.host_bytes()
    ex.close()


def test_scratch_discipline():
    scr = CachingScratch("cpu", AllocRecorder())
    t = scr.get("a", (4,), torch.float32)
    with pytest.raises(ExecError, match="twice"):
        scr.get("a", (4,), torch.float32)
    with pytest.raises(ExecError, match="still live"):
        scr.set_phase("bwd")
    scr.free("a")
    with pytest.raises(ExecError, match="not live"):
        scr.free("a")
    del t


def test_threads_do_not_leak():
    before = threading.active_count()
    for _ in range(3):
        HostStreams().close()
    time.sleep(0.05)
    assert threading.active_count() <= before


# -- happens-before race detector ------------------------------------------------------------------
def _r(tensor="x", rows=(0, 10), space="buffer", index=0):
    return Region.logical(space, index, tensor, rows)


def test_hb_event_wait_orders_accesses():
    hb = HappensBefore()
    hb.access("compute", "forward(0)", writes=[_r()])
    snap = hb.snapshot("compute")
    hb.join("d2h", snap)
    hb.access("d2h", "offload(0)", reads=[_r()], writes=[_r(space="host")])
    hb.join("compute", hb.snapshot("d2h"))
    hb.access("compute", "forward(2)", writes=[_r()])  # overwrites what the offload read: ordered by the wait


def test_hb_missing_wait_is_a_race_naming_both_accesses():
    hb = HappensBefore()
    hb.access("compute", "forward(0)", writes=[_r()])
    with pytest.raises(RaceError, match=r"rounding buffer 0 x\[0:10\]: forward\(0\) writes it on compute and "
                                        r"offload\(0\) reads it on d2h"):
        hb.access("d2h", "offload(0)", reads=[_r()])


def test_hb_rows_and_reads():
    hb = HappensBefore()
    hb.access("h2d", "prefetch(0)", writes=[_r(rows=(0, 4))])
    hb.access("compute", "recompute(0)", writes=[_r(rows=(4, 10))])  # disjoint rows: no conflict
    hb.access("d2h", "a", reads=[_r("q")])
    hb.access("compute", "b", reads=[_r("q")])  # two reads never conflict
    with pytest.raises(RaceError):
        hb.access("compute", "backward(0)", reads=[_r(rows=(3, 5))])  # overlaps the unordered prefetch rows


def test_hb_wait_refers_to_the_latest_record_and_barrier_orders_all():
    hb = HappensBefore()
    hb.access("compute", "w1", writes=[_r()])
    snap = hb.snapshot("compute")  # recorded here ...
    hb.access("compute", "w2", writes=[_r()])  # ... so a wait on it does not cover this write
    hb.join("d2h", snap)
    with pytest.raises(RaceError, match="w2"):
        hb.access("d2h", "copy", reads=[_r()])
    hb2 = HappensBefore()
    hb2.access("compute", "w", writes=[_r()])
    hb2.join("d2h", None)  # a never-recorded event orders nothing
    hb2.barrier()
    hb2.access("d2h", "copy", reads=[_r()])
    assert hb2.history[_r().key][-1].what == "copy"


def test_engine_reports_races_of_copies_at_issue_time():
    eng = HostStreams()
    try:
        a, b = torch.ones(10), torch.zeros(10)
        eng.compute.access("fill", writes=[_r()])
        with pytest.raises(RaceError, match="fill writes it on compute"):
            eng.d2h.copy_group([(b, a)], LBL, reads=[_r()], writes=[_r(space="host")])
        ev = eng.event("done")
        eng.compute.record(ev)
        eng.d2h.wait_event(ev)
        eng.d2h.copy_group([(b, a)], LBL, reads=[_r()], writes=[_r(space="host")])
        eng.synchronize()
        assert torch.equal(a, b)
    finally:
        eng.close()


# -- attention backend resolution before tracing ---------------------------------------------------
def test_auto_resolves_per_device_before_tracing():
    dims = AttnDims(1, 64, 4, 4, 16)
    assert auto_backend_for("cpu", torch.float32, dims) == "math"
    cuda16 = auto_backend_for("cuda", torch.bfloat16, dims)
    assert cuda16 in ("flash_attn", "sdpa_flash")
    assert auto_backend_for("cuda", torch.float32, dims) == "sdpa_efficient"  # flash kernels need 16 bit
    assert not meta_stand_in(cuda16).uses_scratch and meta_stand_in("math").uses_scratch


def test_auto_runs_the_kernel_the_plan_was_priced_on_first(monkeypatch):
    """A plan priced on cuDNN's fused attention (a Megatron-LM plan on a Hopper profile) ran
    FlashAttention-2 under ``auto``, 1.8x slower than predicted at long sequence: ``auto`` now
    tries the priced kernel's backend first on CUDA, then its own order."""
    import memo_exec.attention as A
    from memo_exec.attention import preferred_backends, priced_kernel_note

    dims = AttnDims(1, 64, 4, 4, 16)
    tried = []

    class Fake:
        def __init__(self, name):
            self.name = name

    def fake_probe(backend, device, dtype, d):
        tried.append(backend.name)
        if backend.name in failing:
            raise BackendError(f"{backend.name} does not run here")

    monkeypatch.setattr(A, "_instantiate", Fake)
    monkeypatch.setattr(A, "probe", fake_probe)
    cuda = torch.device("cuda")  # the device object only: nothing runs on it
    failing: set[str] = set()
    assert select_backend("auto", cuda, torch.bfloat16, dims, prefer=preferred_backends("cudnn")).name == "sdpa_cudnn"
    assert tried == ["sdpa_cudnn"]
    tried.clear()
    failing = {"sdpa_cudnn", "flash_attn"}  # refused here: auto's own order follows, cuDNN not tried twice
    assert select_backend("auto", cuda, torch.bfloat16, dims, prefer=preferred_backends("cudnn")).name == "sdpa_flash"
    assert tried == ["sdpa_cudnn", "flash_attn", "sdpa_flash"]
    tried.clear()
    failing = set()
    assert select_backend("auto", cuda, torch.bfloat16, dims, prefer=preferred_backends("flash")).name == "flash_attn"
    assert preferred_backends("flash") == () and preferred_backends("materialised") == ()
    assert auto_backend_for("cuda", torch.bfloat16, dims, preferred_backends("cudnn")) == "sdpa_cudnn"
    assert auto_backend_for("cuda", torch.float32, dims, preferred_backends("cudnn")) == "sdpa_efficient"
    assert auto_backend_for("cpu", torch.bfloat16, dims, preferred_backends("cudnn")) == "math"
    note = priced_kernel_note("cudnn", "sdpa_flash", "cuda")
    assert note and "sdpa_flash" in note and "--attention-backend sdpa_cudnn" in note
    assert priced_kernel_note("cudnn", "sdpa_cudnn", "cuda") is None
    assert priced_kernel_note("cudnn", "math", "cpu") is None
    assert priced_kernel_note("flash", "sdpa_flash", "cuda") is None


def test_a_step_of_several_micro_batches_gives_one_micro_batchs_layer_times():
    """A pipeline or gradient-accumulation step runs each layer once per micro-batch; the report compared their
    sum with the plan's one-micro-batch layer time (+154% on a 4-micro-batch 1F1B run whose step was -36%; a user's
    review): the layer times are now one micro-batch's."""
    from memo_exec.measure import StepRecord, summarize_step
    from memo_sim.timeline import TimelineEvent

    ev = [TimelineEvent(f"L{layer}.{ph}", layer, ph, "compute", 0, 0.0, dt)
          for layer in range(2) for _mb in range(4) for ph, dt in (("fwd", 0.01), ("bwd", 0.02))]
    rec = StepRecord(0, 1.0, ev, [], 0, 0)
    one, four = summarize_step(rec, 2), summarize_step(rec, 2, micro_batches=4)
    assert one["layer_forward_s"] == pytest.approx(0.04) and four["layer_forward_s"] == pytest.approx(0.01)
    assert four["layer_backward_s"] == pytest.approx(0.02) and four["per_layer"]["fwd"]["1"] == pytest.approx(0.01)
    assert four["iteration_s"] == 1.0  # the step itself is the step's


def test_a_plan_names_the_kernel_its_attention_was_priced_on():
    """cuDNN is priced on its own curves only where the profile has them (Hopper); elsewhere on
    FlashAttention-2's, and the executor then runs FlashAttention-2."""
    from dataclasses import replace

    from memo_sim.profile import load_profile

    plan = make_plan(ModelConfig(name="t", layers=2, hidden=64, heads=4, ffn=128, vocab=128), 64, policy("store_all"))
    assert plan.priced_attention_kernel() == "flash"
    plan.layout = replace(plan.layout, attention="cudnn")
    hopper, ampere = load_profile("h100-sxm5-80gb"), load_profile("a100-sxm4-80gb")
    assert hopper.efficiency.priced_attention_kernel("cudnn") == "cudnn"
    assert ampere.efficiency.priced_attention_kernel("cudnn") == "flash"
    plan.profile = "h100-sxm5-80gb"
    assert plan.priced_attention_kernel() == "cudnn"
    plan.profile = "a100-sxm4-80gb"
    assert plan.priced_attention_kernel() == "flash"
    plan.profile = "/nowhere/written-on-another-machine.yaml"
    assert plan.priced_attention_kernel() == "cudnn"  # the layout's kernel


def test_meta_trace_for_cuda_has_no_math_scratch_and_a_math_plan_is_refused_with_a_hint():
    from memo_exec.errors import MemoryPlanError
    from memo_exec.runner import size_plan
    from memo_exec.trace import memory_plan_from_trace, record_layer_trace

    m = ModelConfig("s", 3, 64, 4, 256, vocab=128, dtype="bf16")
    plan = make_plan(m, 256, policy("memo", 0.3), backend="auto")
    cuda = record_layer_trace(plan, "meta")
    cpu = record_layer_trace(plan, "meta", target="cpu")
    assert cuda.meta["attention_backend"] in ("flash_attn", "sdpa_flash")
    assert not any(b.name.startswith("attn_") for b in cuda.buffers)
    assert any(b.name.startswith("attn_") for b in cpu.buffers) and cpu.meta["attention_backend"] == "math"
    plan.memory_plan = memory_plan_from_trace(cpu)  # a plan made for the math backend ...
    with pytest.raises(MemoryPlanError, match="recorded with the math attention backend.*--attention-backend "
                                              "sdpa_flash"):
        size_plan(plan, m, torch.bfloat16, SDPAFlash())  # ... checked against what CUDA runs
    plan.memory_plan = memory_plan_from_trace(cuda)
    assert size_plan(plan, m, torch.bfloat16, SDPAFlash()).unplanned == []


# -- measured vs predicted per stream ----------------------------------------------------------------
def test_stream_stats_busy_overlapped_exposed():
    from memo_exec.compare import op_rows, stream_rows, stream_stats
    from memo_sim.timeline import Timeline, TimelineEvent

    def ev(stream, s, e, phase="fwd", layer=0, op="x"):
        return TimelineEvent(op, layer, phase, stream, 0, s, e)

    tl = Timeline([ev("compute", 0, 4), ev("compute", 4, 10, "bwd"), ev("compute", 10, 12, "stall", op="wait"),
                   ev("d2h", 5, 12, "offload"), ev("h2d", 20, 21, "prefetch")])
    st = stream_stats(tl)
    assert st["compute"] == {"busy_s": 10, "overlapped_s": 5, "exposed_s": 5}  # the stall is not work
    assert st["d2h"] == {"busy_s": 7, "overlapped_s": 5, "exposed_s": 2}
    assert st["h2d"] == {"busy_s": 1, "overlapped_s": 0, "exposed_s": 1}
    half = Timeline([TimelineEvent(e.op, e.layer, e.phase, e.stream, 0, e.start / 2, e.end / 2) for e in tl.events])
    rows = {(r["stream"], r["quantity"]): r for r in stream_rows([tl], half)}
    assert rows[("d2h", "busy")]["rel_error"] == pytest.approx(1.0)
    ops = {(r["layer"], r["op"]): r for r in op_rows([tl, half], tl)}
    assert ops[(0, "forward")]["measured_s"] == pytest.approx(3.0) and ops[(0, "forward")]["predicted_s"] == 4
    assert ops[(0, "offload")]["rel_error"] == pytest.approx(-0.25)
    assert all(r["layer"] is not None for r in ops.values())  # no head ran on either side: no head row


def test_the_head_row_compares_the_executors_classifier_and_modules_with_the_simulators_classifier_op():
    """The simulator prices the classifier and the multi-token-prediction modules as one ``classifier`` op; the
    executor records ``classifier`` and ``mtp`` spans (a span inside another counted once)."""
    from memo_exec.compare import HEAD_MTP_OP, HEAD_OP, op_rows
    from memo_sim.timeline import Timeline, TimelineEvent

    def ev(op, s, e, phase="fwd", layer=None, stream="compute"):
        return TimelineEvent(op, layer, phase, stream, 0, s, e)

    run = Timeline([ev("x", 0, 4, layer=0), ev("classifier", 4, 5), ev("mtp", 5, 7), ev("mtp", 5.5, 6.5),
                    ev("mtp", 8, 9, "bwd"), ev("optimizer", 9, 10, "optimizer"), ev("classifier", 4, 9, "bwd",
                                                                                        stream="dp_comm")])
    sim = Timeline([ev("x", 0, 4, layer=0), ev("classifier@m0", 4, 6, "classifier"),
                    ev("classifier@m1", 7, 9, "classifier"), ev("optimizer", 9, 10, "optimizer")])
    rows = op_rows([run], sim, mtp=True)
    assert rows[-1]["layer"] is None and rows[-1]["op"] == HEAD_MTP_OP
    assert rows[-1]["measured_s"] == pytest.approx(4.0) and rows[-1]["predicted_s"] == pytest.approx(4.0)
    assert op_rows([run], None)[-1]["op"] == HEAD_OP and op_rows([run], None)[-1]["predicted_s"] is None


def test_time_limit_interrupts_a_hanging_wait():
    import threading as th

    never = th.Event()
    with pytest.raises(TimeoutError, match="0.2 s time limit"):
        with time_limit(0.2):
            never.wait(5)
    with pytest.raises(TimeoutError, match="0.3 s time limit"):  # the enclosing limit is restored
        with time_limit(0.3):
            with time_limit(10):
                pass
            never.wait(5)


@pytest.mark.parametrize("name,content,needle", [
    ("empty.npy", b"", "the file is empty"),
    ("empty.bin", b"", "the file is empty"),
    ("odd.bin", b"\x01\x00\x02", "not a whole number of uint16 ids"),
    ("junk.npy", b"not numpy at all", "not a .npy array"),
])
def test_token_files_that_cannot_hold_ids_are_one_line_errors(tmp_path, name, content, needle):
    """[robust-runs] an empty or malformed --tokens file is refused in one line, not a traceback."""
    from memo_exec.data import load_tokens
    from memo_exec.errors import ExecError

    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(ExecError) as e:
        load_tokens(f)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw,needle", [
    (dict(lr=float("inf")), "--lr"), (dict(lr=float("nan")), "--lr"), (dict(lr=1e30), "--lr"), (dict(lr=0.0), "--lr"),
    (dict(steps=0), "--steps"), (dict(layers=0), "--layers"), (dict(weight_decay=float("nan")), "weight decay"),
])
def test_run_options_that_cannot_train_are_refused(kw, needle):
    """[robust-runs] flags that cannot be finite or sensible are refused before anything runs."""
    from memo_exec.runner import RunOptions

    with pytest.raises(ExecError, match=needle):
        RunOptions(**kw)


def test_layers_beyond_the_plan_are_refused():
    from exec_helpers import make_plan, policy

    from memo_exec.runner import RunOptions, run_model
    from memo_sim.model.config import ModelConfig

    plan = make_plan(ModelConfig("s", 2, 64, 4, 256, vocab=128), 64, policy("store_all"))
    assert run_model(plan, RunOptions(layers=1)).layers == 1
    with pytest.raises(ExecError, match=f"has {plan.model.layers} layers"):
        run_model(plan, RunOptions(layers=plan.model.layers + 1))


def _fake_executor(step_loss, steps: int = 4):
    """An executor stand-in for `run_steps`: ``step_loss(k)`` gives step k's loss (or raises);
    the steps it was asked for are appended to its ``ran``."""
    from memo_exec.measure import StepRecord
    from memo_exec.runner import RunOptions

    class Fake:
        allocated, estimate, plan, policy = True, None, None, None
        device = torch.device("meta")  # no machine-speed probe between the steps (a CPU run has one)
        opts = RunOptions(steps=steps)
        ran: list = []

        def describe(self):
            return {}

        def step(self, k):
            self.ran.append(k)
            return StepRecord(step=k, iteration_s=0.1, events=[], memory=[], peak_allocated_bytes=0,
                              peak_reserved_bytes=0, loss=step_loss(k))

    return Fake()


def test_training_stops_at_the_first_non_finite_loss():
    """[robust-runs] a NaN/inf loss ends the run at that step with the last finite loss named."""
    from memo_exec.runner import NonFiniteLoss, run_steps

    losses = [2.5, 2.25, float("nan"), 1.0]
    ex = _fake_executor(lambda k: losses[k])
    with pytest.raises(NonFiniteLoss) as e:
        run_steps(ex, 1, lambda: [])
    assert ex.ran == [0, 1, 2]
    assert str(e.value) == ("step 2: the loss is nan (the last finite loss was 2.25 at step 1); "
                            "lower --lr or check the token data")


def test_optimizer_refuses_a_non_finite_gradient_before_any_update():
    """[robust-runs] a NaN/inf gradient norm stops the step before AdamW touches a parameter."""
    import torch

    from memo_exec.optim import AdamW, NonFiniteGradient

    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    a.grad, b.grad = torch.ones(3), torch.tensor([1.0, float("inf")])
    opt = AdamW([a, b], lr=0.1)
    with pytest.raises(NonFiniteGradient, match="the gradient norm is inf"):
        opt.step()
    assert torch.equal(a.detach(), torch.ones(3)) and opt.step_count == 0  # nothing was updated
    b.grad = torch.ones(2)
    opt.step()
    assert opt.step_count == 1 and not torch.equal(a.detach(), torch.ones(3))


def test_training_stops_at_a_non_finite_gradient_norm():
    """[robust-runs] the step whose gradient norm is not finite ends the run, naming the last finite loss."""
    from memo_exec.optim import NonFiniteGradient
    from memo_exec.runner import NonFiniteLoss, run_steps

    def loss(k):
        if k == 1:
            raise NonFiniteGradient(float("nan"))
        return 3.5

    ex = _fake_executor(loss)
    with pytest.raises(NonFiniteLoss) as e:
        run_steps(ex, 1, lambda: [])
    assert ex.ran == [0, 1]
    assert str(e.value) == ("step 1: the gradient norm is nan (the last finite loss was 3.5 at step 0); "
                            "lower --lr or check the token data")


def test_rel_error_is_none_where_the_prediction_is_a_float_residue_of_zero():
    # an H200 validation printed a d2h exposed time predicted at a float residue (~1e-19 s) against
    # 70 us measured as an error of 6.3e13 %; a zero prediction has no relative error
    from memo_exec.compare import rel_error  # noqa: PLC0415

    assert rel_error(70e-6, 1.1e-19) is None
    assert rel_error(70e-6, 0.0) is None
    assert rel_error(None, 1.0) is None
    assert rel_error(1.1, 1.0) == pytest.approx(0.1)


def test_the_simulators_memory_breakdown_beside_a_run_is_one_micro_batchs():
    """memo-exec's memory table compared the executor's estimate (one micro-batch in flight) with the simulator's
    terms of the whole batch (a review: rounding buffers 6.41 against 1.60 GiB at 4 micro-batches)."""
    from memo_exec.compare import sim_memory_breakdown
    from memo_sim.api import get_policy, load_profile
    from memo_sim.memplan.footprint import memory_breakdown
    from memo_sim.model.config import ModelConfig
    from tests.exec_helpers import make_plan

    m = ModelConfig("ga", 2, 64, 4, 256, vocab=128, dtype="fp32")
    plan = make_plan(m, 256, get_policy("full_recompute"), batch=4)
    plan.micro_batch = 1  # 4 micro-batches of one sequence
    got = sim_memory_breakdown(plan, 2)
    one = memory_breakdown(m, plan.layout, 1, 256, plan.policy, load_profile(plan.profile),
                           plan.classifier_chunk_tokens)
    assert got == one.to_dict()
