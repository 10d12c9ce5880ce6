"""``memo-exec trace``: record one layer's real malloc/free sequence as a memo-trace.

The layer's forward, its recompute (as the plan's policy does it for an offloaded layer) and its
backward run once on the chosen device (``meta`` runs the same code without memory, for sizes
that do not fit here) with a recording scratch allocator: every transient tensor the layer asks
for, in order, with its real size. Skeletal tensors are not in the trace: the policies keep them
in preallocated buffers. On CUDA, ``cuda_history`` additionally records what the caching
allocator itself saw (``torch.cuda.memory._record_memory_history``), kernel-internal workspaces
and aten-allocated outputs included.

`memory_plan_from_trace` turns a trace into plan.json's ``memory_plan`` with the greedy DSA
placement of `memo_sim.memplan.greedy` (one arena shared by the forward and backward phases).
"""

from __future__ import annotations

import dataclasses
import os

import torch

from memo_exec.arena import AllocRecorder, CachingScratch
from memo_exec.activations import make_policy, sim_policy_name
from memo_exec.attention import (AttentionBackend, AttnDims, auto_backend_for, meta_stand_in, preferred_backends,
                                 rank_attention_dims, select_backend)
from memo_exec.device import DTYPES, compute_dtype, resolve_device
from memo_exec.errors import ExecError
from memo_exec.layer import LayerCompute, LayerStorage, LayerWeights, carve_storage, norm_stats_dtype, \
    storage_bytes
from memo_sim.api import greedy_trace
from memo_sim.request_trace import Buffer, RequestTrace
from memo_sim.plan.schema import Plan


def _rank_shape(plan: Plan) -> tuple[int, int, int, object, dict | None]:
    """(attention sequence length, layer-input rows, TP size, TP comm, storage shapes) of one rank
    of the plan's layout (rank 0; every rank's layer has the same sizes)."""
    lay = plan.layout
    if plan.model.moe:  # a review: the trace recorded the dense FFN a MoE layer never runs, and --write-plan placed it
        raise ExecError(f"plan model {plan.model.name}: {plan.model.experts} experts: memo-exec trace records a dense "
                        f"layer's scratch, and a MoE layer's block allocates through the caching allocator (memo-exec "
                        f"run places no memory plan for it); trace a dense model's plan")
    if lay.gpus == 1:
        from memo_exec.layer import IDENTITY_TP  # noqa: PLC0415

        return plan.seq_tokens, plan.batch * plan.seq_tokens, 1, IDENTITY_TP, None
    if lay.metp or lay.pp > 1:
        raise ExecError(f"plan layout {lay.label()}: memo-exec trace records Megatron TP / CP / Ulysses / DP layers; "
                        f"{f'tp_mode {lay.tp_mode}' if lay.metp else f'pp = {lay.pp}'} is not traced")
    from memo_sim.plan.executor_scope import split_why_not  # noqa: PLC0415
    from memo_exec.distributed.tp.megatron import SizesOnlyComm  # noqa: PLC0415
    from memo_exec.layer import storage_shapes  # noqa: PLC0415

    why = split_why_not(lay, plan.model, plan.batch, plan.seq_tokens)
    if why:
        raise ExecError(f"plan layout {lay.label()}: {why}")
    sp = bool(lay.sp) and lay.tp > 1
    seq = plan.seq_tokens // (lay.cp * lay.ulysses)
    rows = plan.batch * seq // (lay.tp if sp else 1)
    kept = sp and lay.sp_input_kept
    comm = SizesOnlyComm(None, lay.tp, sp, kept) if lay.tp > 1 else None
    if comm is None:
        from memo_exec.layer import IDENTITY_TP as comm  # noqa: PLC0415, N811
    return seq, rows, lay.tp, comm, storage_shapes(plan.model, lay.tp, sp, kept)


class _SeqParallelStandIn(AttentionBackend):
    """On the meta device: the attention of one CP / Ulysses rank without its communication. The
    inner kernel runs on the head-sharded shapes Ulysses gives it (its scratch requests are real);
    ring CP's blocks come from the caching allocator, so with CP no kernel scratch is recorded. No sinks or
    windows, as the ring and Ulysses backends it stands for (`memo_sim.plan.executor_scope`)."""

    uses_scratch = False

    def __init__(self, inner, plan: Plan) -> None:
        self.inner, self.lay = inner, plan.layout
        m = plan.model
        self.r = plan.layout.kv_repeat(m.n_kv_heads, m.heads)  # K/V heads repeated (`memo_sim.layout.kv_heads`)
        self.name = inner.name

    def _dims(self, dims: AttnDims) -> AttnDims:
        u = self.lay.ulysses
        return AttnDims(dims.batch, dims.seq * u, dims.heads // u, dims.kv_heads * self.r // u, dims.head_dim)

    def _shaped(self, t, dims, r: int = 1):
        """The head-sharded shape of ``t`` (K/V: each head repeated ``r`` times first)."""
        return torch.empty(t.shape[0] * self.lay.ulysses, t.shape[1] * r // self.lay.ulysses, dtype=t.dtype,
                           device=t.device)

    def _qkv(self, q, k, v, dims):
        return self._shaped(q, dims), self._shaped(k, dims, self.r), self._shaped(v, dims, self.r)

    def forward(self, q, k, v, out, dims, scratch):
        if self.lay.cp > 1:
            return {"lse": None}
        qh, kh, vh = self._qkv(q, k, v, dims)
        return self.inner.forward(qh, kh, vh, torch.empty_like(qh), self._dims(dims), scratch)

    def backward(self, dout, q, k, v, out, aux, dq, dk, dv, dims, scratch):
        if self.lay.cp > 1:
            return
        qh, kh, vh = self._qkv(q, k, v, dims)
        self.inner.backward(torch.empty_like(qh), qh, kh, vh, torch.empty_like(qh), aux, torch.empty_like(qh),
                            torch.empty_like(kh), torch.empty_like(vh), self._dims(dims), scratch)

    def outside_bytes(self, dims, esize, phase) -> int:
        return 0


def _setup(plan: Plan, device: torch.device, dtype: torch.dtype, backend, recorder: AllocRecorder | None):
    m = plan.model
    seq, T, tp, comm, shapes = _rank_shape(plan)
    if plan.layout.gpus > 1:
        backend = _SeqParallelStandIn(backend, plan) if plan.layout.seq_split > 1 else backend
    comp = LayerCompute(m, plan.batch, seq, dtype, device, backend, CachingScratch(device, recorder), tp=comm)
    w = LayerWeights(m, m.layers, device, dtype, tp=tp)
    if device.type != "meta":
        w.init_(torch.Generator(device=device).manual_seed(0))
    for p in w.parameters():
        p.grad = torch.zeros_like(p)
    block = torch.empty(storage_bytes(m, T, dtype, shapes=shapes), dtype=torch.uint8, device=device)
    st = LayerStorage(carve_storage(block, m, T, dtype, shapes=shapes),
                      torch.empty(4, T, dtype=norm_stats_dtype(dtype, device), device=device))
    if device.type != "meta":
        st.x.normal_()
    st.shapes = shapes
    return comp, w, st, block


def _run_layer(plan: Plan, comp: LayerCompute, w, st, between_phases=None) -> None:
    T = comp.T
    m = plan.model
    policy = make_policy(plan.policy, m, 1, T, m.layers, comp.dtype, comp.device, None, None, None,
                         shapes=getattr(st, "shapes", None), balance=plan.layout.balance)
    y = torch.empty(T, m.hidden, dtype=comp.dtype, device=comp.device)
    with torch.no_grad():
        comp.forward(w, st, y, 0)
        if between_phases is not None:
            between_phases()
        policy.recompute(comp, w, st, 0)  # as the policy does it before an offloaded layer's backward
        dy = torch.ones_like(y) if comp.device.type != "meta" else torch.empty_like(y)
        comp.backward(w, st, dy, 0)
    if comp.device.type == "cuda":
        torch.cuda.synchronize(comp.device)


def record_layer_trace(plan: Plan, device: str | None = None, dtype: str | None = None,
                       attention_backend: str | None = None, target: str = "cuda") -> RequestTrace:
    """One layer's scratch requests (forward, recompute, backward) on ``device`` (cpu, cuda or meta).

    On a real device the attention backend is the one `select_backend` picks there. On ``meta``
    (sizes only) ``auto`` resolves to what it will pick on the ``target`` device type (cuda or cpu),
    so the trace -- and a memory plan made from it -- names the scratch tensors of the backend that
    will run."""
    if device == "meta":
        dev = torch.device("meta")
        name = dtype or plan.model.dtype
        if name not in DTYPES:
            raise ExecError(f"--dtype must be one of {', '.join(DTYPES)}, got {name!r}")
        if target not in ("cuda", "cpu"):
            raise ExecError(f"--target must be cuda or cpu, got {target!r}")
        dt = DTYPES[name]
        bname = attention_backend or plan.attention_backend
        if bname == "auto":
            bname = auto_backend_for(target, dt, _dims(plan), preferred_backends(plan.priced_attention_kernel()))
        backend, backend_name = meta_stand_in(bname), bname
    else:
        if plan.layout.gpus > 1:
            raise ExecError(f"plan layout {plan.layout.label()}: one rank's layer trace of a multi-device plan runs on "
                            f"--device meta (the collectives need the distributed run)")
        spec = resolve_device(device)
        dev = spec.torch_device
        dt = compute_dtype(plan.model.dtype, spec, dtype)
        backend = select_backend(attention_backend or plan.attention_backend, dev, dt, _dims(plan),
                             prefer=preferred_backends(plan.priced_attention_kernel()))
        backend_name = backend.name
    rec = AllocRecorder()
    comp, w, st, _ = _setup(plan, dev, dt, backend, rec)
    _run_layer(plan, comp, w, st)
    T = comp.T
    meta = {"source": "memo-exec trace", "model": plan.model.name, "hidden": plan.model.hidden,
            "batch": plan.batch, "seq_tokens": plan.seq_tokens, "tokens": T, "dtype": str(dt).replace("torch.", ""),
            "layout": plan.layout.label(), "rank_tokens": T, "attention_seq": comp.seq,
            "policy": plan.policy.label(), "attention_backend": backend_name, "device": str(dev),
            "phases": ["fwd", "bwd"],
            "note": "transient scratch tensors of one layer; recompute (rc_*) runs at the start of bwd. "
                    "Not in the trace (caching allocator): LayerNorm outputs, dy/dx, the attention kernel's own "
                    "outputs and workspaces, the lse."}
    return rec.trace(name=f"{plan.model.name}-{plan.seq_tokens}-{sim_policy_name(plan.policy)}-layer", meta=meta)


def _dims(plan: Plan) -> AttnDims:
    """The attention kernel's dims on one rank (the whole layer on one device)."""
    return rank_attention_dims(plan.layout, plan.model, plan.batch, plan.seq_tokens, plan.layout.tp)


def record_cuda_history(plan: Plan, device: str | None = None, dtype: str | None = None,
                        attention_backend: str | None = None) -> RequestTrace:
    """What the CUDA caching allocator saw for one layer's forward (phase fwd) and backward (bwd)."""
    spec = resolve_device(device or "cuda")
    if not spec.is_cuda:
        raise ExecError("the CUDA allocator history needs --device cuda")
    if plan.layout.gpus > 1:
        raise ExecError(f"plan layout {plan.layout.label()}: --cuda-history records single-device plans only")
    dev = spec.torch_device
    dt = compute_dtype(plan.model.dtype, spec, dtype)
    backend = select_backend(attention_backend or plan.attention_backend, dev, dt, _dims(plan),
                             prefer=preferred_backends(plan.priced_attention_kernel()))
    comp, w, st, _ = _setup(plan, dev, dt, backend, None)
    snaps = []
    mem = torch.cuda.memory

    def cut():
        torch.cuda.synchronize(dev)
        snaps.append(mem._snapshot())
        mem._record_memory_history(None)
        mem._record_memory_history("all", context="alloc", stacks="python", clear_history=True)

    mem._record_memory_history("all", context="alloc", stacks="python", clear_history=True)
    try:
        _run_layer(plan, comp, w, st, between_phases=cut)
        snaps.append(mem._snapshot())
    finally:
        mem._record_memory_history(None)
    bufs: list[Buffer] = []
    step = 0
    for phase, snap in zip(("fwd", "bwd"), snaps):
        traces = snap.get("device_traces", [])
        entries = traces[spec.index] if spec.index < len(traces) else []
        open_: dict[int, tuple[int, int, str]] = {}
        k = 0
        for e in entries:
            act = e.get("action")
            if act == "alloc":
                open_[e["addr"]] = (step, int(e["size"]), _frame_name(e.get("frames") or []))
                step += 1
            elif act in ("free_requested", "free_completed") and e.get("addr") in open_:
                lo, size, name = open_.pop(e["addr"])
                bufs.append(Buffer(f"{phase}:cuda{k}", size, lo, max(step, lo + 1), phase=phase, layer=0,
                                   kind="other", name=name))
                k += 1
                step += 1
        for addr, (lo, size, name) in open_.items():
            bufs.append(Buffer(f"{phase}:cuda{k}", size, lo, step + 1, phase=phase, layer=0, kind="other", name=name))
            k += 1
        step += 1
    meta = {"source": "torch.cuda.memory._record_memory_history", "device": spec.describe(),
            "model": plan.model.name, "tokens": plan.batch * plan.seq_tokens, "policy": plan.policy.label(),
            "attention_backend": backend.name}
    return RequestTrace(sorted(bufs, key=lambda b: (b.lower, b.id)), name="cuda-allocator-layer", meta=meta)


def _frame_name(frames: list[dict]) -> str:
    for f in frames:
        fn = str(f.get("filename", ""))
        if "memo_exec" in fn:
            return f"{os.path.basename(fn)}:{f.get('line')}:{f.get('name')}"
    if frames:
        f = frames[0]
        return f"{os.path.basename(str(f.get('filename', '?')))}:{f.get('line')}:{f.get('name')}"
    return "?"


def memory_plan_from_trace(trace: RequestTrace) -> dict:
    """plan.json ``memory_plan`` from a layer trace: greedy DSA placement per phase, one shared arena."""
    phases = {}
    for ph in ("fwd", "bwd"):
        bufs = [b for b in trace.buffers if b.phase == ph]
        if not bufs:
            continue
        names = [b.name or b.id for b in bufs]
        if len(set(names)) != len(names):
            raise ExecError(f"trace phase {ph}: a tensor name occurs twice; offsets are per name")
        sub = RequestTrace([dataclasses.replace(b, id=b.name or b.id) for b in bufs], name=f"{trace.name}-{ph}")
        offsets, peak, how = greedy_trace(sub)
        phases[ph] = {"peak_bytes": int(peak), "offsets": {k: int(v) for k, v in offsets.items()},
                      "method": f"greedy ({how})", "lower_bound_bytes": int(sub.max_live_bytes())}
    arena = max((p["peak_bytes"] for p in phases.values()), default=0)
    out = {"arena_bytes": int(arena), "phases": phases, "source": "memo-exec trace + memo_sim.memplan.greedy"}
    dt = (trace.meta or {}).get("dtype")
    if dt in TRACE_DTYPE_BYTES:
        out["element_bytes"] = TRACE_DTYPE_BYTES[dt]  # sizes were recorded at this width
    return out


TRACE_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
