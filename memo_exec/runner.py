"""Execute a plan: check everything, allocate once, train N steps, measure.

Order matters: every check that can fail for a user-fixable reason (schema, layout, device,
dtype, attention backend, token file, memory plan, memory fit) runs before any large allocation;
the backend probe and the meta-device dry run of one layer allocate only a few KB.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from memo_exec.activations import ActivationPolicy, make_policy
from memo_exec.alloc_settings import apply_fraction, capped_free, cpu_line, fraction, plan_text
from memo_exec.arena import AllocRecorder, ArenaPlan, ArenaScratch, CachingScratch, parse_memory_plan, \
    validate_memory_plan
from memo_exec.attention import AttnDims, layer_needs, meta_stand_in, preferred_backends, select_backend
from memo_exec.data import TokenSource
from memo_exec.device import (compute_dtype, device_free_bytes, element_size, host_available_bytes,
                              profile_provenance, resolve_device, use_calibrated_threads)
from memo_exec.errors import ExecError, FitError
from memo_exec.host_malloc import keep_freed_memory
from memo_exec.layer import LayerCompute, LayerStorage, LayerWeights, carve_storage, norm_stats_dtype, \
    storage_bytes
from memo_exec.allocator_counters import run_block
from memo_exec.measure import Recorder, StepRecord, steady_state, summarize_step
from memo_exec.memory_estimate import MemoryEstimate, check_fit, estimate_memory
from memo_exec.model import GPT, NO_HOOKS, LayerRuntime, MainGrads, forward_loss
from memo_exec.mtp import MTP_LOSS_SCALE, MTPRun
from memo_exec.optim import NonFiniteGradient, main_grad_dtype
from memo_exec.optim_offload import make_adamw
from memo_exec.speed_probe import probe_for_profile
from memo_exec.streams import make_engine
from memo_sim.model.flops import ATTN_BWD_FACTOR, classifier_flops, op_flops
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES, forward_ops
from memo_sim.plan.schema import Plan


@dataclass
class RunOptions:
    device: str | None = None  # cuda | cuda:N | cpu | None (auto)
    steps: int = 3
    layers: int | None = None  # run fewer layers than the plan's model
    attention_backend: str | None = None  # None: the plan's
    dtype: str | None = None  # None: bf16 on CUDA (the plan's), fp32 on CPU
    tokens_file: str | None = None
    seed: int = 0
    lr: float = 3e-4
    weight_decay: float = 0.1
    use_memory_plan: bool = True
    probe_backend: bool = True
    profile: str | None = None  # predict with this profile (name or file) instead of the plan's

    def __post_init__(self) -> None:
        # refused before anything is allocated: a run that cannot train sensibly is a typo
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ExecError(f"--steps must be a whole number of at least 1, got {self.steps!r}")
        if self.layers is not None and (isinstance(self.layers, bool) or not isinstance(self.layers, int)
                                        or self.layers < 1):
            raise ExecError(f"--layers must be a positive integer, got {self.layers!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and 0 < self.lr <= 1):
            raise ExecError(f"--lr must be a finite learning rate in (0, 1], got {self.lr!r}")
        if not (isinstance(self.weight_decay, (int, float)) and math.isfinite(self.weight_decay)
                and self.weight_decay >= 0):
            raise ExecError(f"weight decay must be finite and >= 0, got {self.weight_decay!r}")


def use_profile(plan, profile: str | None) -> None:
    """Point ``plan`` at ``profile`` (a name or a file path) once it loads: the run's re-simulation
    then predicts with exactly that file. A profile that does not load is a one-line `ProfileError`,
    never a fall-back to a built-in profile of the same name."""
    if profile is None:
        return
    from pathlib import Path  # noqa: PLC0415

    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    prof = load_profile(profile)
    plan.profile = str(Path(prof.path).resolve()) if prof.path and Path(prof.path).exists() else prof.name


def run_model(plan: Plan, opts: RunOptions) -> ModelConfig:
    """The model a run trains: the plan's, with ``--layers`` of its layers when given (never more).
    A plan the executor does not run as priced (its GEMM format, attention, MoE layers, compiled kernels, ...)
    is refused in one line (`memo_sim.plan.executor_scope.plan_why_not`): it would measure another plan than the
    one predicted."""
    from memo_sim.plan.executor_scope import plan_why_not  # noqa: PLC0415

    why = plan_why_not(plan.model, plan.layout, plan.policy, plan.schedule, plan.batch,
                       plan.micro_batch or plan.batch, plan.seq_tokens)
    if why:
        raise ExecError(why)
    if opts.layers is not None and opts.layers > plan.model.layers:
        raise ExecError(f"--layers {opts.layers}: the plan's model has {plan.model.layers} layers; run at most that many")
    lay = plan.layout
    if opts.layers is not None and (why := lay.split_why_not(opts.layers)):
        # the plan's pipeline split must hold for N layers (`Layout.split_why_not`, the check the ranks' schedules
        # make): refused here, before --nproc launches a rank (a review: each rank failed after 15 s without
        # naming --layers); the check's memo-sim fix (its flags) is left out
        fit = [str(n) for n in range(1, plan.model.layers + 1) if lay.split_why_not(n) is None]
        raise ExecError(f"--layers {opts.layers}: plan layout {lay.label()} cannot split them over its "
                        f"{lay.pp * lay.vpp} model chunks ({why.split(';')[0]}); give --layers "
                        f"{', '.join(fit[:-1]) + ' or ' if len(fit) > 1 else ''}{fit[-1]}")
    return dataclasses.replace(plan.model, layers=opts.layers or plan.model.layers)


class NonFiniteLoss(ExecError):
    """Training produced a loss or a gradient norm that is not a finite number: the run stops at
    that step (a non-finite gradient norm before the optimizer updates anything)."""


def make_flops_fn(model: ModelConfig, batch: int, seq: int, recompute_fraction: float):
    """FLOPs of a timed span, from memo_sim.model.flops (for the trace's annotations)."""
    fops = {op.name: (op.kind, op_flops(op, model, batch, seq)) for op in forward_ops(model)}
    cls = classifier_flops(model, batch, seq) * (1 + model.mtp_layers)  # its pass over the modules' rows too

    def fn(op: str, layer: int | None, phase: str) -> float:
        if layer is None:
            return 3.0 * cls if op == "classifier" else 0.0
        if op not in fops:
            return 0.0
        kind, f = fops[op]
        if phase == "fwd":
            return f
        if phase == "recompute":
            return f if kind == "attention" else f * recompute_fraction
        if phase == "bwd":
            return {"gemm": 2.0 * f, "attention": ATTN_BWD_FACTOR * f}.get(kind, f)
        return 0.0

    return fn


def dry_run_layer(model: ModelConfig, batch: int, seq: int, dtype: torch.dtype, backend_name: str,
                  policy) -> AllocRecorder:
    """One layer's forward, recompute (as the executor ``policy`` does it) and backward on the
    meta device with the attention backend that will run (``backend_name``, already resolved),
    recording every scratch request. Nothing is allocated."""
    meta = torch.device("meta")
    rec = AllocRecorder()
    scratch = CachingScratch(meta, rec)
    comp = LayerCompute(model, batch, seq, dtype, meta, meta_stand_in(backend_name), scratch)
    T = batch * seq
    w = LayerWeights(model, model.layers, meta, dtype)
    for p in w.parameters():
        p.grad = torch.zeros_like(p)
    block = torch.empty(storage_bytes(model, T, dtype), dtype=torch.uint8, device=meta)
    st = LayerStorage(carve_storage(block, model, T, dtype),
                      torch.empty(4, T, dtype=norm_stats_dtype(dtype, meta), device=meta))
    y = torch.empty(T, model.hidden, dtype=dtype, device=meta)
    with torch.no_grad():
        comp.forward(w, st, y, 0)
        policy.recompute(comp, w, st, 0)  # layer 0 is offloaded (and recomputed) whenever any layer is
        comp.backward(w, st, torch.empty(T, model.hidden, dtype=dtype, device=meta), 0)
    return rec


@dataclass
class PlanSizes:
    policy: ActivationPolicy  # the executor policy, sizes only
    requests: AllocRecorder  # one layer's scratch requests, recorded on the meta device
    arena_plan: ArenaPlan | None
    unplanned: list[str]  # scratch the memory plan does not place
    estimate: MemoryEstimate


def size_plan(plan: Plan, model: ModelConfig, dtype: torch.dtype, backend, use_memory_plan: bool = True
              ) -> PlanSizes:
    """Everything the executor knows before allocating: its policy's sizes, the layer's requests
    with the attention backend that will run (``backend``, already resolved for the device), the
    memory plan checked against them, and the memory estimate. Needs no device: a CUDA plan can be
    sized on a CPU with the backend `memo_exec.attention.auto_backend_for` names."""
    batch, seq = plan.batch, plan.seq_tokens
    policy = make_policy(plan.policy, model, batch, seq, model.layers, dtype, torch.device("meta"), None, None, None,
                         balance=plan.layout.balance)
    requests = dry_run_layer(model, batch, seq, dtype, backend.name, policy)
    arena_plan, unplanned = None, []
    mp = plan.memory_plan
    if mp is not None and use_memory_plan and mp.phases:
        arena_plan, unplanned = _checked_arena(plan, requests, dtype, backend.name, model.layers)
    dims = AttnDims(batch, seq, model.heads, model.n_kv_heads, model.qk_head_dim)
    meta_gpt = GPT(model, model.layers, torch.device("meta"), dtype)
    largest = max(p.numel() for p in meta_gpt.parameters())
    grad_dtype = main_grad_dtype(plan.model.recipe, dtype)  # the plan's precision recipe
    layer_grads = MainGrads.layer_grad_bytes(meta_gpt.layers[0]) if grad_dtype != dtype else 0
    est = estimate_memory(model, batch, seq, dtype, policy, backend, dims, requests, arena_plan,
                          plan.classifier_chunk_tokens, largest, grad_dtype=grad_dtype,
                          layer_grad_bytes=layer_grads, optimizer_on_host=plan.layout.optimizer_offload)
    return PlanSizes(policy, requests, arena_plan, unplanned, est)


def host_optimizer_bytes(ex) -> int:
    """Bytes the run's optimizers hold on the host (`HostAdamW.host_state_bytes`, summed over the
    dense optimizer and the experts' where they run on the host; 0 with the optimizer on the device)."""
    found = [getattr(ex, "optimizer", None)] + [getattr(getattr(ex, a, None), "optimizer", None)
                                                for a in ("sync", "expert_sync")]
    return int(sum(o.host_state_bytes() for o in found if hasattr(o, "host_state_bytes")))


@dataclass
class RunResult:
    plan: Plan
    options: RunOptions
    meta: dict
    estimate: MemoryEstimate
    steps: list[StepRecord] = field(default_factory=list)
    summaries: list[dict] = field(default_factory=list)

    @property
    def steady(self) -> dict:
        return steady_state(self.summaries)


class ExecutorBase:
    """The set-up and the step every executor shares, one device (`Executor`) or one rank of many
    (`memo_exec.distributed.runner.DistExecutor`): the model the run trains (`run_model`), the
    device and compute dtype, the batch, the token source, the attention backend asked for, the
    recorder and copy engine, one training step (forward and backward, then the optimizer),
    closing, and the description of the run. A subclass sets up its layer, policy and memory
    estimate, and provides ``allocate``, ``forward_backward(step)`` (the loss) and
    ``optimizer_step()``."""

    def fit_error(self, host_ranks: list[tuple[int, int, int]] | None = None, host_free: int | None = None,
                  rank: int = 0) -> FitError | None:
        """`check_fit`'s refusal of this executor's estimate against its device's free memory, or None where it
        fits (the single-device executor raises it; a distributed rank first agrees with the others,
        `memo_exec.distributed.runner.DistExecutor.check_fit`). ``host_ranks``: (rank, device bytes, host bytes) of
        every rank of the run on this host (``rank`` this one), which share its memory; ``host_free``: the host's
        available memory as one of them measured it (so that they refuse in one line), else measured here."""
        free, total = device_free_bytes(self.device_spec)
        host = host_available_bytes() if host_free is None else host_free
        if host_free is not None and not self.device_spec.is_cuda:  # a CPU's device memory is the host's
            free = host_free
        free = capped_free(self.plan.layout, self.device_spec, free, total)
        what = f"{self.model.name} ({self.model.layers} layers, {self.tokens} tokens, {self.plan.policy.label()})"
        where = f"cuda:{self.device_spec.index}" if self.device_spec.is_cuda else "this host"
        if self.device_spec.is_cuda and (f := fraction(self.plan.layout)) is not None:
            where += f" under the plan's per_process_memory_fraction {f:g}"
        try:
            check_fit(self.estimate, device_free=free, host_available=host, on_cuda=self.device_spec.is_cuda,
                      what=what, where=where, hint="; try --layers N" if self.model.layers > 2 else "",
                      host_ranks=host_ranks, rank=rank)
        except FitError as e:
            return e
        return None

    def set_up(self, plan: Plan, opts: RunOptions, device_spec, data_rows: int) -> None:
        """The shared set-up: checks, model, device, dtype, batch, tokens (``data_rows`` sequences
        per iteration: the replica's, or the global batch for a rank of many)."""
        if plan.classifier_chunk_tokens < 1:
            raise ExecError("classifier_chunk_tokens must be positive")
        self.plan, self.opts = plan, opts
        self.model = run_model(plan, opts)
        self.device_spec, self.device = device_spec, device_spec.torch_device
        apply_fraction(plan.layout, device_spec)  # the plan's memory fraction, before the first CUDA allocation
        self.cpu_threads, self._threads_before = None, torch.get_num_threads()
        if not device_spec.is_cuda:  # the CPU's caching allocator, as `memo-exec calibrate` measured with
            keep_freed_memory()
        self.dtype = compute_dtype(plan.model.dtype, device_spec, opts.dtype)
        self.batch, self.seq = plan.batch, plan.seq_tokens
        self.tokens = self.batch * self.seq  # one replica's tokens per iteration
        self.data = TokenSource(self.model.vocab, data_rows, self.seq, opts.seed, opts.tokens_file)
        self.backend_name = opts.attention_backend or plan.attention_backend
        self.priced_kernel = plan.priced_attention_kernel()  # what auto runs first on CUDA
        self.attention_prefer = preferred_backends(self.priced_kernel)
        self.engine = None
        self.mtp = None  # the multi-token-prediction modules' runtimes once allocated (`memo_exec.mtp.MTPRun`)
        self.allocated = False
        self.current_step = -1

    def use_cpu_threads(self) -> None:
        """On a CPU, torch's threads as the plan's profile was calibrated with (`use_calibrated_threads`): the
        last step of a constructor, so that a set-up that fails leaves the process's count alone; `close`
        gives it back."""
        if not self.device_spec.is_cuda:
            self.cpu_threads = use_calibrated_threads(self.plan.profile)

    def start_recording(self, flops_fn, host_bytes: int, **rank) -> None:
        """The step recorder (spans, FLOPs by ``flops_fn``) and the copy engine that reports to it."""
        self.recorder = Recorder(self.device, flops_fn, host_bytes, **rank)
        self.engine = make_engine(self.device)
        self.engine.sink = self.recorder

    def step(self, step: int, optimizer: bool = True) -> StepRecord:
        if not self.allocated:
            self.allocate()
        self.current_step = step
        self.recorder.begin_step(step)
        loss = self.forward_backward(step)
        if optimizer:
            with self.recorder.span("optimizer", None, "optimizer"):
                self.optimizer_step()
        rec = self.recorder.end_step(self.engine)
        rec.loss = float(loss.detach().item()) if torch.is_tensor(loss) else float(loss)
        return rec

    def close(self) -> None:
        if self.allocated:
            self.policy.close()
            self.engine.close()
        if getattr(self, "cpu_threads", None):  # the process's own thread count again (a run inside a longer one)
            torch.set_num_threads(self._threads_before)

    def describe(self) -> dict:
        m = self.model
        return {
            "plan_model": self.plan.model.name, "model": m.name, "layers": m.layers,
            "plan_layers": self.plan.model.layers, "batch": self.batch, "seq_tokens": self.seq,
            "tokens": self.tokens, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.n_kv_heads,
            "ffn": m.ffn, "ffn_type": m.ffn_type, "vocab": m.vocab, "params": m.params(),
            "policy": self.plan.policy.label(), "policy_detail": self.policy.describe(),
            "layout": self.plan.layout.label(), "device": self.device_spec.describe(),
            "device_kind": self.device_spec.kind, "dtype": str(self.dtype).replace("torch.", ""),
            "attention_backend": self.backend.name, "attention_backend_requested": self.backend_name,
            "attention_kernel_priced": self.priced_kernel, "gemm_format": m.gemm_format,
            "classifier_chunk_tokens": self.plan.classifier_chunk_tokens, "data": self.data.describe(),
            "memory_plan": None, "memory_estimate_bytes": self.estimate.terms,
            "memory_estimate_detail_bytes": self.estimate.detail,
            "memory_estimate_total_bytes": self.estimate.total, "host_estimate_bytes": self.estimate.host,
            "profile": self.plan.profile, "cpu_threads": self.cpu_threads,
            "allocator_settings": plan_text(self.plan.layout),
            "allocator_settings_note": cpu_line(self.plan.layout, self.device_spec),
            **({"mtp_layers": m.mtp_layers, "mtp_params": m.mtp_params(), "mtp_loss_scale": MTP_LOSS_SCALE}
               if m.mtp_layers else {}),
        }


def distributed_only(plan: Plan) -> str | None:
    """Why a one-device plan runs in the distributed executor rather than `Executor`'s loop (its
    schedule, SPPO with pp = 1, or gradient accumulation lives there), or None. `memo-exec run`
    runs such a plan in its own process as a process group of one."""
    from memo_exec.distributed.schedule import SingleStage, schedule_for  # noqa: PLC0415

    sched = schedule_for(plan)
    if sched is not SingleStage:
        return f"policy {plan.policy.label()} runs as the distributed executor's {sched.name} schedule"
    if plan.micro_batches > 1:
        return (f"micro_batch {plan.micro_batch} of batch {plan.batch}: gradient accumulation over "
                f"{plan.micro_batches} micro-batches runs in the distributed executor")
    return None


class Executor(ExecutorBase):
    """One device: the whole model, its scratch in the memory plan's arena (or the caching allocator)."""

    def __init__(self, plan: Plan, opts: RunOptions) -> None:
        lay = plan.layout
        if lay.gpus != 1 or plan.gpus != 1:
            raise ExecError(f"plan layout {lay.label()} uses {plan.gpus} GPUs; this executor runs single-device plans "
                            f"(tp=cp=ulysses=dp=1): run it with memo-exec run --nproc {lay.gpus} (or torchrun), "
                            f"which uses memo_exec.distributed")
        why = distributed_only(plan)
        if why:
            raise ExecError(f"{why}, not this single-device loop: `memo-exec run` runs it in one process "
                            f"(or --nproc 1: torchrun --nproc-per-node 1 -m memo_exec run)")
        self.set_up(plan, opts, resolve_device(opts.device), plan.batch)
        m = self.model
        self.dims = AttnDims(self.batch, self.seq, m.heads, m.n_kv_heads, m.qk_head_dim, **layer_needs(m))
        # resolved on this device (auto probes the candidates) before the layer's requests are recorded
        self.backend = select_backend(self.backend_name, self.device, self.dtype, self.dims,
                                      run_probe=opts.probe_backend, prefer=self.attention_prefer)
        sz = size_plan(plan, m, self.dtype, self.backend, opts.use_memory_plan)
        self.policy = sz.policy  # computes sizes only until allocate() replaces it
        self.layer_requests, self.arena_plan, self.unplanned = sz.requests, sz.arena_plan, sz.unplanned
        self.estimate = sz.estimate
        self._check_fit()
        self.use_cpu_threads()

    # ------------------------------------------------------------------ sizes
    def _check_fit(self) -> None:
        err = self.fit_error()
        if err is not None:
            raise err

    # ------------------------------------------------------------------ allocate
    def allocate(self) -> None:
        m, dev, dt = self.model, self.device, self.dtype
        rf = float(self.plan.policy.recompute_fraction)
        self.start_recording(make_flops_fn(m, self.batch, self.seq, rf), self.policy.host_bytes())
        if self.arena_plan is not None:
            self.scratch = ArenaScratch(dev, self.arena_plan)
        else:
            self.scratch = CachingScratch(dev)
        self.gpt = GPT(m, m.layers, dev, dt)
        self.gpt.init_(self.opts.seed)
        gdt = main_grad_dtype(self.plan.model.recipe, dt)  # the plan's precision recipe
        self.main_grads = MainGrads(self.gpt, gdt) if gdt != dt else None
        if self.main_grads is None:
            self.gpt.alloc_grads()
        self.optimizer = make_adamw(self.gpt.parameters(), self.plan.layout.optimizer_offload, lr=self.opts.lr,
                                    weight_decay=self.opts.weight_decay,
                                    main_grads=self.main_grads.main if self.main_grads is not None else None)
        self.compute = LayerCompute(m, self.batch, self.seq, dt, dev, self.backend, self.scratch, self.recorder)
        if m.moe:  # every row's position in its sequence, for a balance that routes by it (`memo_exec.moe.balance`)
            self.compute.moe.set_balance(self.plan.layout.balance,
                                         torch.arange(self.batch * self.seq, device=dev) % self.seq)
        self.policy = make_policy(self.plan.policy, m, self.batch, self.seq, m.layers, dt, dev, self.engine,
                                  self.recorder, self.compute, balance=self.plan.layout.balance)
        self.policy.allocate()
        self.runtimes = [LayerRuntime(i, w, self.policy, self.compute, self.recorder, self.main_grads or NO_HOOKS)
                         for i, w in enumerate(self.gpt.layers)]
        self.mtp = (MTPRun(self.gpt, self.compute, self.recorder, self.main_grads or NO_HOOKS, self.batch, self.seq,
                           dt, dev, self.policy) if m.mtp_layers else None)  # multi-token prediction (`memo_exec.mtp`)
        self.allocated = True

    # ------------------------------------------------------------------ run
    def forward_backward(self, step: int) -> torch.Tensor:
        inputs, targets = self.data.batch_at(step)
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        self.policy.begin_step()
        mtp = self.mtp.batch(inputs, targets) if self.mtp is not None else None
        loss = forward_loss(self.gpt, self.runtimes, inputs, targets, self.plan.classifier_chunk_tokens,
                            self.recorder, arena=self.scratch if isinstance(self.scratch, ArenaScratch) else None,
                            mtp=mtp)
        loss.backward()
        if self.main_grads is not None:
            self.main_grads.fold_rest()
        self.policy.end_step()
        return loss

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.gpt.zero_grads()
        if self.main_grads is not None:
            self.main_grads.zero_()

    def run(self, progress=None) -> RunResult:
        """``progress(done, total, step_record)`` is called after every step."""
        return run_steps(self, self.model.layers, self.caching_allocator_tensors, progress)

    # ------------------------------------------------------------------ description
    def caching_allocator_tensors(self) -> list[str]:
        """What does not go through a preallocated buffer or the arena (for the report)."""
        out = [
            "LayerNorm forward outputs and statistics (aten native_layer_norm has no real out= kernel; "
            "copied into the skeletal slot; RMSNorm writes its slot directly)",
            "norm backward outputs (d_h1_part, dx), RMSNorm backward temporaries and the norm weight/bias "
            "gradient reductions",
            "incoming/outgoing layer gradients dy/dx (owned by autograd between layer backwards)",
            "the last layer's output, final LayerNorm output and gradient, embedding output and its dense "
            "gradient, classifier chunk logits/probabilities and its weight gradient",
            "the attention lse (and RNG state) each layer keeps",
            "optimizer temporaries (one parameter at a time)",
        ]
        if self.model.mtp_layers:
            out.append("the multi-token-prediction modules' embedded tokens, normed and concatenated inputs, "
                       "projection outputs and final norms (their layers' store-all storage is preallocated; under "
                       "full recompute they keep their embedded tokens and outputs, their layers re-run in the "
                       "layers' recompute buffer)")
        if not self.backend.uses_scratch:
            out.insert(0, f"attention output and q/k/v gradients of {self.backend.name} (the aten kernels allocate "
                          "them; they are copied into the planned slots)")
            if self.model.n_kv_heads != self.model.heads:
                out.insert(1, "GQA: k and v expanded to all heads for the SDPA kernel, and their gradients")
        if self.arena_plan is not None:
            unpl = [u for u in self.unplanned]
            if unpl:
                out.insert(0, "scratch tensors the memory plan does not place: " + ", ".join(unpl))
        else:
            out.insert(0, "every layer scratch tensor (no memory plan): " +
                       ", ".join(sorted({f"{ph}:{n}" for op, ph, n, _ in self.layer_requests.events})))
        return out

    def describe(self) -> dict:
        d = super().describe()
        if self.arena_plan is not None:
            d["memory_plan"] = arena_description(self.arena_plan, self.unplanned)
        return d


def arena_description(ap: ArenaPlan, unplanned: list[str]) -> dict:
    """What a run's report says of the memory plan it placed its layer scratch by."""
    return {"arena_bytes": ap.arena_bytes, "phase_peak_bytes": ap.peaks, "plan_model_arena_bytes": ap.model_arena_bytes,
            "offset_scale": ap.scale, "placed": {ph: sorted(o) for ph, o in ap.offsets.items()},
            "unplaced_by_plan": unplanned, "plan_names_not_placed": ap.ignored}


def plan_arena(plan: Plan, model: ModelConfig, batch: int, seq: int, dtype: torch.dtype, backend, policy,
               requests: AllocRecorder | None = None, names: dict[str, dict[str, str]] | None = None
               ) -> tuple[ArenaPlan, list[str]]:
    """The plan's level-1 memory plan checked against the executor's layer (``batch`` x ``seq`` tokens,
    the attention ``backend`` that will run, the executor ``policy``'s recompute), recorded on the meta
    device: the arena to place the layer's scratch in, and the scratch it leaves to the caching allocator.
    ``requests``: the layer's requests recorded already (a distributed rank's split layer,
    `memo_exec.distributed.runner.DistExecutor`), with ``names`` mapping the plan's names to its layer's
    (`memo_exec.arena.parse_memory_plan`)."""
    if requests is None:
        requests = dry_run_layer(model, batch, seq, dtype, backend.name, policy)
    return _checked_arena(plan, requests, dtype, backend.name, model.layers, names)


def _checked_arena(plan: Plan, requests: AllocRecorder, dtype: torch.dtype, backend_name: str, layers: int,
                   names: dict[str, dict[str, str]] | None = None) -> tuple[ArenaPlan, list[str]]:
    """The plan's level 1 scaled to the executor's element width (its names mapped by ``names``) and checked against
    the recorded ``requests`` of a run of ``layers`` layers (a `MemoryPlanError` names what does not fit); with the
    names it leaves unplaced. A run of fewer layers than the plan's (``--layers``) may leave a planned tensor
    unallocated: MEMO recomputes no token of a 2-layer run, so the plan's re-run tensors are not requested."""
    mp = plan.memory_plan
    ap = parse_memory_plan(mp, mp.element_bytes or DTYPE_BYTES[plan.model.dtype], element_size(dtype), names)
    fewer = (layers, plan.model.layers) if layers < plan.model.layers else None
    return ap, validate_memory_plan(ap, requests, backend_name, fewer)


def run_steps(ex, layers: int, caching_allocator_tensors, progress=None) -> RunResult:
    """The training loop of an executor (single-device or one distributed rank): allocate, run
    ``opts.steps`` steps, summarise each over ``layers`` layers, report progress."""
    if not ex.allocated:
        ex.allocate()
    res = RunResult(ex.plan, ex.opts, ex.describe(), ex.estimate)
    last_finite: tuple[int, float] | None = None
    # the machine's speed after each step, where a CPU calibration's is there to compare it with
    probe = probe_for_profile(profile_provenance(ex.plan.profile)[0]) if ex.device.type == "cpu" else None
    for k in range(ex.opts.steps):
        before = f"the last finite loss was {last_finite[1]:.6g} at step {last_finite[0]}" if last_finite else \
            "no step had a finite loss"
        try:
            rec = ex.step(k)
        except NonFiniteGradient as e:
            raise NonFiniteLoss(f"step {k}: {e} ({before}); lower --lr or check the token data") from None
        if not math.isfinite(rec.loss):
            raise NonFiniteLoss(f"step {k}: the loss is {rec.loss} ({before}); lower --lr or check the token data")
        last_finite = (k, rec.loss)
        res.steps.append(rec)
        # a layer's times per micro-batch, as the plan prices them (SPPO's pieces add up to one sequence's layer)
        plan = getattr(ex, "plan", None)
        s = summarize_step(rec, layers, plan.micro_batches if plan is not None and plan.schedule != "sppo" else 1)
        s["step"] = k
        res.summaries.append(s)
        if probe is not None:  # outside the step's timing
            probe.sample()
        if progress is not None:
            progress(k + 1, ex.opts.steps, rec)
        if probe is not None and k + 1 < ex.opts.steps and hasattr(ex, "wait_for_peers"):
            # the ranks reach this point at different times (each its own step's end, and a probe of 0.1-0.4 s);
            # without the wait the first to go on waits for the others inside the next step's first collective,
            # timed as that step's (a review: rank 0's optimizer span 157 ms, rank 1's embedding span 293 ms,
            # +430% and +724% on a plan that took 52-82 ms without the probe)
            ex.wait_for_peers()
    if probe is not None:
        res.meta["speed_probe"] = probe.summary()
    res.meta["pinned_host_bytes"] = int(getattr(ex.policy, "pinned_bytes", 0))
    res.meta["host_optimizer_bytes"] = host_optimizer_bytes(ex)
    pool = getattr(ex.policy, "pool", None)
    if hasattr(pool, "describe"):  # the offload pool: how it was page-locked, and any fallback's warning
        res.meta["host_pool"] = pool.describe()
    res.meta["caching_allocator"] = caching_allocator_tensors()
    res.meta["allocator"] = run_block(ex.device, [(r.step, r.allocator) for r in res.steps])
    return res


def tokens_per_second(tokens: int, iteration_s: float) -> float:
    return tokens / iteration_s if iteration_s > 0 else math.nan
