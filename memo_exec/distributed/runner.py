"""The distributed executor: one process per device, the plan's layout over torch.distributed.

`DistExecutor` is `memo_exec.runner.Executor`'s counterpart for a rank of a multi-device plan:
the same layer (`memo_exec.layer.LayerCompute`, one TP rank's shard via the registered TP
flavour), the same activation policies (with this rank's `storage_shapes`), the same
measurement (`memo_exec.measure.Recorder`, events on device = this rank), plus

- process groups from the layout (`memo_exec.distributed.context`),
- ring CP / Ulysses around the attention core (`memo_exec.distributed.attention`),
- gradient reduction, ZeRO 0-3 and FSDP/HSDP (`memo_exec.distributed.zero.GradSync`, hooked into
  every layer's forward and backward),
- a registered step schedule (`memo_exec.distributed.schedule`; pipelines plug in there),
- mixture-of-experts layers (`memo_exec.moe`): the expert-parallel, expert-tensor-parallel and expert-DP groups
  folded into each stage's GPUs, this rank's routed experts (drawn by global expert index; under etp > 1 its
  slice of each), the dispatcher, and with ep or etp > 1 the experts' own gradient all-reduce (expert-DP group)
  and optimizer;
- multi-token-prediction modules (`memo_exec.mtp`) on every rank of a single-stage plan, on the last rank of a
  micro-batch pipeline (`memo_exec.pipeline.schedules`; the schedule's ``holds_mtp``): each module's layer this
  rank's shard of a layer (a unit after the held layers), its norms and projection (TP-split) in the
  embedding's unit, its rows of every micro-batch from the same global batch.

Weights start identical to the single-device executor's for one seed: every layer is drawn
whole from the same generator sequence (`memo_exec.model.GPT.init_`) and each rank keeps its
shard. Tokens: `memo_exec.distributed.context.local_token_index`.

Everything that can be checked without communicating is checked in `__init__`, before any
allocation, identically on every rank (so every rank refuses with the same line).
"""

from __future__ import annotations

import dataclasses
import os
import signal

import torch
import torch.distributed as dist

from memo_exec.activations import make_policy
from memo_exec.activations.registry import POLICIES, sim_policy_name
from memo_exec.arena import AllocRecorder, ArenaScratch, CachingScratch
from memo_exec.attention import (CUDA_ONLY, auto_backend_for, device_why_not, meta_stand_in, preferred_backends,
                                 rank_attention_dims, select_backend)
from memo_exec.device import DTYPES, DeviceSpec, element_size, resolve_device
from memo_exec.distributed.attention import RingAttention, UlyssesAttention
from memo_exec.distributed.context import DistContext, layout_context, local_token_index
from memo_exec.distributed.schedule import schedule_for
from memo_exec.distributed.tp import flavour_for
from memo_exec.distributed.zero import GradSync, overlaps_reductions, workspace_count
from memo_exec.errors import ExecError, MemoryPlanError
from memo_exec.layer import LayerCompute, LayerStorage, LayerWeights, carve_storage, norm_stats_dtype, storage_bytes
from memo_exec.memory_estimate import PEAK_TERMS, STATIC_TERMS, TRANSIENT_TERMS, MemoryEstimate, peak_total
from memo_exec.model import GPT, ChainedHooks, LayerHooks, vocab_rows
from memo_exec.mtp import MTPRun, TPSplit, modules_recomputed, whole_projections
from memo_exec.optim import AdamW
from memo_exec.optim_offload import HostAdamW
from memo_exec.runner import ExecutorBase, RunOptions, RunResult, arena_description, make_flops_fn, plan_arena, \
    run_model, run_steps
from memo_exec.vocab_parallel import VocabSplit
from memo_sim.plan.schema import Plan


def check_plan_for_world(plan: Plan, world: int, opts: RunOptions) -> None:
    """The refusals that need no communication (every rank and the launcher run them alike): a policy this executor
    does not run among them, said by ``--nproc``'s launcher before it starts a rank (a review of the tests' times: the
    eight ranks of an offload_attn_experts plan took 18 s on the 2-core VM to start and each say the one line)."""
    lay = plan.layout
    if lay.gpus != world:
        procs = "process" if lay.gpus == 1 else "processes"
        raise ExecError(f"plan layout {lay.label()} needs {lay.gpus} {procs} (tp x cp x ulysses x pp x dp), "
                        f"but the world size is {world}; launch with --nproc {lay.gpus} "
                        f"(torchrun --nproc-per-node {lay.gpus})")
    flavour_for(lay.tp_mode)
    name = opts.attention_backend or plan.attention_backend
    if name in CUDA_ONLY:  # as every rank would refuse it (`DistExecutor`), before torchrun starts them
        device_why_not(name, resolve_device(opts.device).torch_device)
    model = run_model(plan, opts)
    if model.layers != plan.model.layers:  # --layers N: the schedule's split must hold for N layers
        plan = dataclasses.replace(plan, model=model)
    schedule_for(plan)  # the data parallelism and the split over the ranks: run_model's (memo_sim.plan.executor_scope)
    POLICIES.get(sim_policy_name(plan.policy))  # after schedule_for, which registers the plugins' policies (SPPO's)


def split_layer_why(lay, tp: int, moe: bool) -> str | None:
    """Why a rank's layer is not one the plan's memory plan (level 1) places, so that its scratch comes from the caching
    allocator (`DistExecutor._arena_why_not`), or None: a tensor split whose flavour has no meta-device dry run
    (`memo_exec.distributed.tp.base.TPFlavour.plans_memory`: METP's rings), a Ulysses split that keeps its head-sharded
    q, k, v and out from the forward to the backward (``Layout.ulysses_bwd_resend`` False: they outlive the forward's
    arena, which the plan's level 1 places them in), or routed experts. Megatron TP (with or without SP), ring CP and
    a re-sending Ulysses are planned: the simulator's level 1 is the rank's layer (memo_sim/memplan/trace_gen.py,
    sharded shapes, the SP gathers, the ring's and the all-to-alls' buffers), as the MEMO paper plans it per GPU."""
    split = []
    if tp > 1 and not flavour_for(lay.tp_mode).plans_memory():
        split.append(f"tp {tp} (tp_mode {lay.tp_mode})")
    if lay.ulysses > 1 and not lay.ulysses_bwd_resend:
        split.append(f"ulysses {lay.ulysses} keeping its head-sharded q, k, v, out for the backward "
                     f"(ulysses_bwd_resend false)")
    if split:
        return "no memory plan for a layer split by " + ", ".join(split)
    return "no memory plan for a mixture-of-experts layer" if moe else None


def split_label(lay, tp: int) -> str:
    """The splits inside a rank's layer, ``"tp 2, cp 2"`` (empty where none)."""
    return ", ".join(f"{k} {v}" for k, v in (("tp", tp), ("cp", lay.cp), ("ulysses", lay.ulysses)) if v > 1)


def meta_attention(lay, model, kernel: str | None):
    """The rank's attention as `DistExecutor` wraps it (ring CP around its own block kernels, Ulysses around the ring
    or the plan's ``kernel``, unused under a ring), for a sizes-only run on the meta device: the same scratch requests
    (the plan's ``cp_*`` and ``ulysses_*`` buffers, `memo_exec.distributed.attention`), nothing computed or
    communicated."""
    inner = (RingAttention(None, lay.cp, 0, dkv_fp32=lay.ring_dkv_fp32) if lay.cp > 1
             else meta_stand_in(kernel))
    if lay.ulysses > 1:
        r = lay.kv_repeat(model.n_kv_heads, model.heads)
        return UlyssesAttention(inner, None, lay.ulysses, r, resend=lay.ulysses_bwd_resend)
    return inner


class LayoutContext:
    """What a TP flavour reads of a `memo_exec.distributed.context.DistContext` when it is built (``layout``, ``size``,
    ``coord``, ``group``), from the layout alone: TP rank 0, no process group (every TP rank's layer has the same
    sizes). The launcher's note (`memory_plan_not_followed`) checks the plan's level 1 with it before a rank starts."""

    def __init__(self, layout) -> None:
        self.layout = layout

    def size(self, dim: str) -> int:
        return getattr(self.layout, dim)

    def coord(self, dim: str) -> int:
        return 0

    def group(self, dim: str):
        return None


def rank_layer_requests(plan: Plan, flavour, model, micro: int, dtype: torch.dtype, backend) -> AllocRecorder:
    """A split rank's layer scratch requests (TP, ring CP, Ulysses), recorded on the meta device: the layer's
    forward, the whole model's policy's recompute (as on one device: the plan's level 1 holds the recompute scratch)
    and backward through the flavour's ``sizes_only_compute`` (its collectives' buffers requested, nothing
    communicated) with the attention ``backend`` (a kernel's name, or the rank's ring / Ulysses built for the meta
    device, `meta_attention`: their buffers requested, nothing communicated), the rank's shard of the weights, its
    storage shapes and rows."""
    meta, lay = torch.device("meta"), plan.layout
    shard_seq = plan.seq_tokens // (lay.cp * lay.ulysses)
    T, shapes = flavour.local_tokens(micro * shard_seq), flavour.storage_shapes()
    rec = AllocRecorder()
    backend = meta_stand_in(backend) if isinstance(backend, str) else backend
    scratch = CachingScratch(meta, rec)
    comp = flavour.sizes_only_compute(micro, shard_seq, dtype, backend, scratch)
    if comp is None and flavour.size == 1:  # no tensor split (a flavour without a dry run, tp 1): the plain layer
        comp = LayerCompute(model, micro, shard_seq, dtype, meta, backend, scratch)
    w = flavour.make_weights(model.layers, meta, dtype, layer=0)
    for p in w.parameters():
        p.grad = torch.zeros_like(p)
    block = torch.empty(storage_bytes(model, T, dtype, shapes=shapes), dtype=torch.uint8, device=meta)
    st = LayerStorage(carve_storage(block, model, T, dtype, shapes=shapes),
                      torch.empty(4, T, dtype=norm_stats_dtype(dtype, meta), device=meta))
    policy = make_policy(plan.policy, model, 1, T, model.layers, dtype, meta, None, None, None, shapes=shapes,
                         balance=lay.balance)
    with torch.no_grad():
        comp.forward(w, st, torch.empty(T, model.hidden, dtype=dtype, device=meta), 0)
        policy.recompute(comp, w, st, 0)  # layer 0 is offloaded (and recomputed) whenever any layer is
        comp.backward(w, st, torch.empty(T, model.hidden, dtype=dtype, device=meta), 0)
    return rec


def rank_layer_arena(plan: Plan, flavour, model, micro: int, dtype: torch.dtype, backend):
    """The plan's level 1 checked against a split rank's layer (`rank_layer_requests`; `memo_exec.runner.plan_arena`:
    a `MemoryPlanError` names the tensor that does not fit), the plan's names mapped to the layer's (the flavour's
    ``plan_names``). Returns the arena and the scratch the plan does not place (the caching allocator's)."""
    rec = rank_layer_requests(plan, flavour, model, micro, dtype, backend)
    backend = meta_stand_in(backend) if isinstance(backend, str) else backend
    shard_seq = plan.seq_tokens // (plan.layout.cp * plan.layout.ulysses)
    return plan_arena(plan, model, micro, shard_seq, dtype, backend, None, requests=rec, names=flavour.plan_names())


def split_plan_refused(label: str, e: MemoryPlanError) -> str:
    """Why a split rank's scratch comes from the caching allocator where the plan's level 1 does not fit its layer
    (``label``: `split_label`)."""
    return f"the plan's level 1 does not fit a {label} rank's layer ({e})"


def memory_plan_not_followed(plan: Plan, use_memory_plan: bool = True, layers: int | None = None,
                             attention_backend: str | None = None, device: str | None = None) -> str | None:
    """The one console line memo-exec says at the start of a multi-device run (``run`` and ``validate``) whose plan
    carries a static memory plan that the ranks will not follow (`split_layer_why`; a split (TP, ring CP, Ulysses)
    rank's layer that the plan's level 1 does not fit, `rank_layer_arena`, checked here at the plan's dtype for
    ``layers`` of its layers with the attention backend asked for on ``device``; the layer's scratch then comes from
    the caching allocator), or None. The simulator priced that plan's arena (offsets fixed, no fragmentation:
    `memo_sim.memplan`), so the run's peak can exceed the prediction (a review: report.md alone said so)."""
    mp = plan.memory_plan
    if mp is None or not mp.phases or not use_memory_plan:
        return None
    lay = plan.layout
    why = split_layer_why(lay, lay.tp, plan.model.moe)
    label = split_label(lay, lay.tp)
    if why is None and label:
        model = dataclasses.replace(plan.model, layers=layers or plan.model.layers)
        flavour = flavour_for(lay.tp_mode)(LayoutContext(lay), model)
        name = attention_backend or plan.attention_backend
        micro = plan.micro_batch or plan.batch
        if name == "auto":  # what the rank's `select_backend` picks there, decided without running a kernel
            on_cpu = device.startswith("cpu") if device else not torch.cuda.is_available()
            name = auto_backend_for("cpu" if on_cpu else "cuda", DTYPES[plan.model.dtype],
                                    rank_attention_dims(lay, model, micro, plan.seq_tokens, flavour.size),
                                    preferred_backends(plan.priced_attention_kernel()))
        try:
            rank_layer_arena(plan, flavour, model, micro, DTYPES[plan.model.dtype],
                             meta_attention(lay, model, name))
        except MemoryPlanError as e:
            why = split_plan_refused(label, e)
    if why is None:
        return None
    return (f"note: the plan's static memory plan is not followed ({why}: every layer scratch tensor comes from the "
            f"caching allocator); the simulator priced its arena (no fragmentation), so peak memory may exceed the "
            f"prediction")


def host_id() -> int:
    """This host's number among the ranks (a CRC of its host name): the ranks with the same one share its memory."""
    import socket  # noqa: PLC0415
    import zlib  # noqa: PLC0415

    return zlib.crc32(socket.gethostname().encode())


def sized_ranks(plan: Plan, opts: RunOptions, world: int) -> list["DistExecutor"]:
    """Every rank of a CPU run of ``world`` processes set up in this process as far as its memory estimate, from
    the layout alone (`memo_exec.distributed.context.layout_context`: each rank's coordinates, no process group):
    what --nproc's launcher checks the host's free memory with before torchrun starts the ranks. The token file is
    not read again (the launcher checked it; it does not size anything)."""
    opts = dataclasses.replace(opts, tokens_file=None)
    return [DistExecutor(plan, opts, layout_context(plan.layout, r), DeviceSpec("cpu"), sizes_only=True)
            for r in range(world)]


def rank_estimates(plan: Plan, opts: RunOptions, world: int) -> list[MemoryEstimate]:
    """Every rank's memory estimate of a CPU run of ``world`` processes, made in this process (`sized_ranks`): the
    ranks' own (`tests/test_exec_roundtrip_review_dec2.py`)."""
    return [ex.estimate for ex in sized_ranks(plan, opts, world)]


def launcher_fit_error(plan: Plan, opts: RunOptions, world: int):
    """--nproc's launcher on a CPU, before torchrun starts the ranks: the `memo_exec.errors.FitError` of the ranks
    together against this host's free memory (every rank runs here, `ExecutorBase.fit_error` with the ranks' rows,
    the line of the rank that needs most), or None where they fit. The ranks check again once started
    (`DistExecutor.check_fit`), as they do where torchrun started them without the launcher."""
    ranks = sized_ranks(plan, opts, world)
    rows = [(ex.ctx.rank, ex.estimate.total, ex.estimate.host) for ex in ranks]
    big = max(ranks, key=lambda ex: ex.estimate.total + ex.estimate.host)
    return big.fit_error(rows, None, big.ctx.rank)


class _KillHook(LayerHooks):
    """Test hook: SIGKILL this rank after its first layer's forward in step ``ex.kill_at_step``."""

    def __init__(self, inner: LayerHooks, ex) -> None:
        self.inner, self.ex = inner, ex

    def before_forward(self, i: int) -> None:
        self.inner.before_forward(i)

    def after_forward(self, i: int) -> None:
        self.inner.after_forward(i)
        if i == 0 and self.ex.current_step == self.ex.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)

    def before_backward(self, i: int) -> None:
        self.inner.before_backward(i)

    def after_backward(self, i: int) -> None:
        self.inner.after_backward(i)


class DistExecutor(ExecutorBase):
    """One rank of a multi-device plan (or a one-device plan whose schedule lives here)."""

    def __init__(self, plan: Plan, opts: RunOptions, ctx: DistContext, device: DeviceSpec,
                 sizes_only: bool = False) -> None:
        """``sizes_only``: set up as far as the memory estimate, no fit check (no collective) and the process's CPU
        threads left alone: --nproc's launcher sizing a rank from the layout (`sized_ranks`, ``ctx`` a
        `memo_exec.distributed.context.layout_context`); such an executor is never allocated or run."""
        self.ctx, self.layout = ctx, plan.layout
        check_plan_for_world(plan, ctx.world, opts)
        lay = self.layout
        self.set_up(plan, opts, device, plan.batch * lay.dp)  # every rank draws the global batch's tokens
        self.micro = plan.micro_batch  # sequences per micro-batch: what one layer call computes
        self.global_tokens = self.tokens * lay.dp  # the loss is the mean over the global batch
        self.flavour = flavour_for(lay.tp_mode)(ctx, self.model)
        why = self.flavour.check()
        if why:
            raise ExecError(f"plan layout {lay.label()}: {why}")
        self.schedule = schedule_for(dataclasses.replace(plan, model=self.model))(self)
        why = self.schedule.check()
        if why:
            raise ExecError(f"plan layout {lay.label()}: {why}")
        self.shard_seq = self.seq // (lay.cp * lay.ulysses)  # sequence length of this rank's shard
        self.local_T = self.flavour.local_tokens(self.micro * self.shard_seq)  # one micro-batch's rows here
        m = self.model
        r = lay.kv_repeat(m.n_kv_heads, m.heads)  # K/V heads repeated before Ulysses' all-to-all (`layout.kv_heads`)
        inner_dims = rank_attention_dims(lay, m, self.micro, self.seq, self.flavour.size)
        if lay.cp > 1:
            device_why_not(self.backend_name, self.device)  # asked for, as a one-device run refuses it
            # dK/dV in fp32 or the model's dtype, as the plan prices them (``Layout.ring_dkv_fp32``)
            inner = RingAttention(ctx.group("cp"), lay.cp, ctx.coord("cp"), dkv_fp32=lay.ring_dkv_fp32)
        else:
            inner = select_backend(self.backend_name, self.device, self.dtype, inner_dims,
                                   run_probe=opts.probe_backend, prefer=self.attention_prefer)
        # the backward re-sends q, k, v, out or keeps the forward's head-sharded ones (``Layout.ulysses_bwd_resend``)
        self.backend = (UlyssesAttention(inner, ctx.group("ulysses"), lay.ulysses, r, resend=lay.ulysses_bwd_resend)
                        if lay.ulysses > 1 else inner)
        self.held = self.schedule.layer_indices()
        self.shapes = self.flavour.storage_shapes()
        per_set, self.activation_sets = self.schedule.activation_sets()
        self.policy = self._meta_policy(per_set)
        self.arena_plan, self.unplanned, self.no_arena = None, [], self._arena_why_not(plan, opts)
        label = split_label(lay, self.flavour.size)
        if self.no_arena is None and label:  # a split rank's layer (TP, ring CP, Ulysses) as the plan's level 1 has it
            kernel = inner.name if lay.cp == 1 else None  # the ring runs its own block kernels
            try:
                self.arena_plan, self.unplanned = rank_layer_arena(plan, self.flavour, m, self.micro, self.dtype,
                                                                   meta_attention(lay, m, kernel))
            except MemoryPlanError as e:  # the caching allocator, and the run says why (as the launcher did)
                self.no_arena = split_plan_refused(label, e)
        elif self.no_arena is None:  # this rank's layer is the one-device layer: its scratch at the plan's offsets
            # checked against the layer as the whole model's policy runs it (the plan's level 1 is the one-stage
            # layer's, recompute scratch included; a chunk too short to recompute simply leaves those unused)
            whole = make_policy(plan.policy, m, self.micro, self.shard_seq, m.layers, self.dtype, torch.device("meta"),
                                None, None, None, balance=lay.balance)
            self.arena_plan, self.unplanned = plan_arena(plan, m, self.micro, self.shard_seq, self.dtype, self.backend,
                                                         whole)
        self.token_index = local_token_index(ctx, self.batch, self.seq)
        self.micro_index = local_token_index(ctx, self.micro, self.seq)
        self.estimate = self._estimate()
        self.kill_at_step: int | None = None  # test hook (memo_exec.distributed.launch.KILL_ENV)
        if sizes_only:
            return
        self.check_fit()
        self.use_cpu_threads()

    def _arena_why_not(self, plan: Plan, opts: RunOptions) -> str | None:
        """Why this rank places its layer scratch with the caching allocator rather than at the memory
        plan's offsets (None: it uses the plan). The plan's level 1 names one GPU's layer tensors: a rank
        whose layer is the one-device layer (pipeline stages, data-parallel replicas) or a split one (Megatron TP,
        ring CP, a re-sending Ulysses: `rank_layer_arena`) places them in one arena per rank, reused by every layer
        phase of every micro-batch it runs (a stage runs one phase at a time); METP, a Ulysses that keeps its
        head-sharded tensors, or experts: `split_layer_why`."""
        mp = plan.memory_plan
        if mp is None or not mp.phases:
            return "no memory plan"
        if not opts.use_memory_plan:
            return "--no-memory-plan"
        return split_layer_why(self.layout, self.flavour.size, self.model.moe)

    # ------------------------------------------------------------------ sizes
    def _expert_range(self) -> tuple[int, int]:
        """(first, count) of the routed experts this rank holds (`memo_exec.moe.groups`)."""
        from memo_exec.moe.groups import expert_coords  # noqa: PLC0415

        lay, E = self.layout, self.model.experts
        e = expert_coords(self.ctx.rank, lay)[0] if self.ctx.world > 1 else 0
        return e * E // lay.ep, E // lay.ep

    def _expert_tp(self) -> tuple[int, int]:
        """(etp, this rank's ETP coordinate): which slice of each of its experts' FFN it holds."""
        from memo_exec.moe.groups import etp_coord  # noqa: PLC0415

        lay = self.layout
        return lay.etp, etp_coord(self.ctx.rank, lay) if self.ctx.world > 1 else 0

    def _make_layer(self, li: int, device, dtype):
        """This rank's shard of model layer ``li`` (a MoE layer with this rank's routed experts); ``li`` past the
        model's layers: a multi-token-prediction module's (of the last layer's kind, `memo_exec.mtp`)."""
        m = self.model
        if not m.moe:
            return self.flavour.make_weights(m.layers, device, dtype, layer=li)
        kind = {"moe": m.mtp_moe} if li >= m.layers else {}
        return self.flavour.make_weights(m.layers, device, dtype, layer=li, experts=self._expert_range(),
                                         expert_tp=self._expert_tp(), **kind)

    @property
    def tp_split(self) -> TPSplit:
        """This rank's split of the modules' projections (`memo_exec.mtp`)."""
        f = self.flavour
        return TPSplit(f.size, f.rank, f.group, bool(getattr(f, "sp", False)))

    def _local_param_numel(self) -> tuple[int, int, int, int, int, int]:
        """(all parameters, the largest layer unit without its routed experts, the first unit (the embedding's, the
        final norm's, the modules' norms and projections), the routed experts, the largest layer's routed experts)
        numbers of elements on this rank, and the layer units holding routed experts; the routed experts are counted
        apart under ep or etp > 1, where their own sync shards them over the expert-DP group (`memo_exec.moe.sync`),
        else they are 0 and their layer's."""
        from memo_exec.moe.groups import experts_apart  # noqa: PLC0415

        meta, m = torch.device("meta"), self.model
        D = m.mtp_layers if self.schedule.holds_mtp() else 0  # a pipeline's last rank alone holds the modules
        mtp = [m.layers + k for k in range(D)]  # the modules' layers, then their norms and projections
        split = m.moe and experts_apart(self.layout)
        sizes, routed = [], []
        for li in self.held + mtp:
            named = list(self._make_layer(li, meta, self.dtype).named_parameters())
            routed.append(sum(q.numel() for n, q in named if split and n.startswith("moe.expert_")))
            sizes.append(sum(q.numel() for _n, q in named) - routed[-1])
        # the embedding and an untied classifier: this TP rank's vocabulary rows (`memo_exec.vocab_parallel`)
        vocab = (1 if m.tied_embeddings else 2) * vocab_rows(m.vocab, self.flavour.size) * m.hidden
        rest = vocab + m.norm_params + D * (m.mtp_norm_params + m.mtp_projection_params // self.flavour.size)
        return (sum(sizes) + rest + sum(routed), max(sizes, default=0), rest, sum(routed), max(routed, default=0),
                sum(1 for r in routed if r))

    def _ulysses_kept_bytes(self) -> int:
        """One layer's head-sharded q, k, v and attention output that `UlyssesAttention` keeps from its forward to
        its backward where the plan's Ulysses does not re-send them (``Layout.ulysses_bwd_resend`` False), else 0:
        the inner attention's shapes (the micro-batch's CP shard, 1/(tp u) of the heads, each K/V head repeated r
        times), in the run's dtype (memo_exec/distributed/attention.py module docs)."""
        lay, m = self.layout, self.model
        if lay.ulysses == 1 or lay.ulysses_bwd_resend:
            return 0
        r = lay.kv_repeat(m.n_kv_heads, m.heads)
        rows = self.micro * self.seq // lay.cp
        width = m.q_dim + r * (m.kv_dim + m.v_dim) + m.attn_dim
        return rows * width // (self.flavour.size * lay.ulysses) * element_size(self.dtype)

    def _estimate(self) -> MemoryEstimate:
        """This rank's device memory: the static terms made here (model states after ZeRO, the policy's activation
        storage) and the transient ones the plan carries, the simulator's for one GPU of its layout
        (``predicted.memory_breakdown_bytes``: ``transient_peak_bytes``, ``layer_boundary_bytes``,
        ``classifier_peak_bytes``, `memo_sim.plan.contract.Prediction`; `_plan_transients`), under a memory plan at
        least this rank's arena. The single-device estimate sizes them from a dry run of the layer on the meta device,
        which cannot run this rank's collectives. A review: they were 0, so a plan whose transients alone exceed the
        device passed the check and died mid-step. A plan that carries none leaves them not estimated, as before."""
        total, layer_unit, first_unit, experts, expert_layer, expert_units = self._local_param_numel()
        # ZeRO 3 gathers the first unit at the step's start and keeps it to the optimizer (`GradSync.begin_step`),
        # beside the layer that runs and the next one's weights, gathered ahead
        largest = layer_unit + first_unit
        P = total - experts  # the dense units; the routed experts under ep or etp > 1 apart (`memo_exec.moe.sync`)
        e = element_size(self.dtype)
        lay = self.layout
        # the routed experts' own GradSync: ZeRO over the expert-DP group, its layer units (no first unit)
        De = lay.expert_dp if lay.zero and experts else 1
        ze = lay.zero if De > 1 else 0
        # FSDP beside pipeline stages: whole gradients through the step, each chunk's reduced after its last backward
        per_chunk = lay.grads_reduced_per_chunk
        # gathered at the peak: the largest layer's and the next one's, gathered ahead (`GradSync.prefetching`), or
        # under FSDP without resharding every layer's (as the dense)
        e_gathered = 2 * expert_layer if lay.dp_mode != "fsdp" or lay.reshard_after_forward else experts
        e_weights = experts * e if ze < 3 else experts * e // De + e_gathered * e
        # ZeRO 2 / 3 with each layer's reduction beside the next backward: two layers' workspaces (`GradSync`)
        hooks = self.schedule.layer_backwards_per_step()
        n_units = len(self.held) + (self.model.mtp_layers if self.schedule.holds_mtp() else 0)  # layer units
        e_ws = workspace_count(overlaps_reductions(lay, hooks, De), expert_units)
        e_grads = experts * e if ze < 2 or per_chunk else experts * e // De + e_ws * expert_layer * e
        e_shard = experts // De if ze >= 1 else experts
        D = self.ctx.size("data") if lay.zero else 1
        z = lay.zero if D > 1 else 0
        D = self.ctx.size("shard") if z >= 3 else D  # FSDP/HSDP: sharded over the shard group
        # gathered at the peak: the first unit, the largest layer's and the next one's prefetch, or under FSDP without
        # resharding every unit (each held layer kept from its forward to its backward, beside the embedding's)
        gathered = largest + layer_unit if lay.dp_mode != "fsdp" or lay.reshard_after_forward else P
        weights = (P * e if z < 3 else P * e // D + gathered * e) + e_weights
        # ZeRO 2 / 3: every unit's shard, the layers' shared workspace (two, overlapped) and the first unit whole
        # (`GradSync`)
        ws = workspace_count(overlaps_reductions(lay, hooks, self.ctx.size("data")), n_units)
        grads = (P * e if z < 2 or per_chunk else P * e // D + largest * e + (ws - 1) * layer_unit * e) + e_grads
        shard = (P // D if z >= 1 else P) + e_shard  # the parameters this rank's optimizers update
        optimizer = 0 if lay.optimizer_offload else AdamW.state_bytes_for(shard, self.dtype)
        states = weights + grads + optimizer  # optimizer offload: AdamW's states on the host
        m = self.model
        if m.gemm.quantised:  # the held layers' FP8 weight copies, each rank's TP shard (FP8 runs in dense layers, ZeRO
            # below 3 only: `memo_sim.plan.executor_scope`), as the one-device estimate counts them (a review: left out)
            held = len(self.held) + (m.mtp_layers if self.schedule.holds_mtp() else 0)
            states += int(m.gemm.quantised_bytes(held * m.linear_params() // lay.tp, weight=True))
        n = self.activation_sets  # one policy instance per micro-batch in flight (pipelines)
        # per slot, one instance per chunk size (an uneven split's chunks: `PipelineSchedule.build_runtimes`)
        sizes = self.schedule.activation_sizes()
        pols = [self.policy] if sizes == [self.policy.layers] else [self._meta_policy(k) for k in sizes]
        if self._modules_policy_alone():  # the modules re-run in an instance of their own per slot (an upper bound:
            # `PipelineSchedule.build_mtp`), over the rank's blocks where its layers made them
            pols = pols + [self._meta_policy(1, pipelined=bool(sizes) and self.schedule.pipelined)]
        devs = [p.device_bytes() for p in pols]

        # one slot's instances: the largest's blocks, which the smaller take a prefix of (`SlotBlocks`); where the
        # model mixes dense and MoE layers a smaller instance may keep more at a position and take a block of its
        # own there, so the sum over the slot's instances bounds it
        shared_slot = not self.model.mixes_dense_layers

        def slot(key: str) -> int:
            vals = [d.get(key, 0) for d in devs[:len(sizes)]]
            rest = sum(d.get(key, 0) for d in devs[len(sizes):])  # the modules' own instance (not a slot's)
            return (max(vals, default=0) if shared_slot else sum(vals)) + rest

        def once(key: str) -> int:  # the rank's own
            return max((d.get(key, 0) for d in devs), default=0)

        # the rank's own buffers (a recompute buffer, MEMO's four blocks: `SharedBlocks`) once; none without a layer
        buffers = 0 if not pols else once("buffers") if pols[0].shares_buffers else n * slot("buffers")
        terms = {"model_states": states, "skeletal_resident": n * slot("skeletal_resident") + once("rank_resident"),
                 "buffers": buffers, "lse": n * slot("lse"), "norm_stats": n * slot("norm_stats")}
        per_lse = pols[0].lse_bytes_per_layer() if pols else 0
        if per_lse:  # Ulysses keeping its head-sharded tensors in the attention's aux, which lives as its lse does
            terms["skeletal_resident"] += terms["lse"] // per_lse * self._ulysses_kept_bytes()
        carried = self._plan_transients()
        unknown = [k for k in TRANSIENT_TERMS if k not in carried]
        unknown += ["optimizer_step_peak"]  # the executor's own term (the simulator has none): not made here
        unknown += sorted({k for p in pols for k in p.unsized_terms})  # kept by autograd: not sized before the step
        for k in unknown:
            terms[k] = 0
        terms.update(carried)
        if self.arena_plan is not None:  # the layer's planned scratch: the arena this rank allocates
            terms["transient_peak"] = max(terms["transient_peak"], self.arena_plan.arena_bytes)
            if "transient_peak" in unknown:
                unknown.remove("transient_peak")
        # the one-device estimate's formula (`memo_exec.memory_estimate.peak_total`): every other term is static here
        terms["peak_total"] = peak_total(sum(v for k, v in terms.items() if k not in PEAK_TERMS), terms)
        slot_host = [p.host_bytes() for p in pols[:len(sizes)]]  # one slot's host slots, shared as its blocks
        # an offloading policy on a pipeline rank: each slot's host slots for the units the rank's order offloads
        # there (`PipelineSchedule.host_layers`), as `build_runtimes` sizes them (a review: every layer of every slot)
        per_slot = getattr(self.schedule, "host_layers", None) if sizes else None
        if per_slot is not None and hasattr(pols[0], "host_bytes_for"):
            pool = sum(pols[0].host_bytes_for(h) for h in per_slot().values())
        else:
            pool = n * max(slot_host, default=0)
        host = (pool + n * sum(p.host_bytes() for p in pols[len(sizes):])
                + (HostAdamW.host_bytes_for(shard, self.dtype) if lay.optimizer_offload else 0))
        # without the plan's transients, or with activations kept by autograd (not sized: 0 here), peak_total holds
        # part of the terms only: compared as none too (a review: SPPO's read -35% against the simulator's peak, the
        # gap its unsized skeletal_resident, lse and norm_stats)
        partial = any(k in unknown for k in (*TRANSIENT_TERMS, *STATIC_TERMS))
        return MemoryEstimate(terms, host, {}, not_estimated=(*unknown, *(["peak_total"] if partial else [])))

    def _plan_transients(self) -> dict[str, int]:
        """The transient terms the plan carries (``predicted.memory_breakdown_bytes``, the simulator's for one GPU of
        the plan's layout, in the plan's dtype) by this estimate's names, in the run's dtype: scaled by the ratio of
        element sizes (a CPU run trains a bf16 plan in fp32: twice the bytes); {} where the plan carries none."""
        from memo_exec.device import DTYPES  # noqa: PLC0415
        from memo_exec.memory_estimate import SIM_TERMS  # noqa: PLC0415

        bd = self.plan.predicted.memory_breakdown_bytes or {}
        plan_dtype = DTYPES.get(self.plan.model.dtype)
        scale = element_size(self.dtype) / element_size(plan_dtype) if plan_dtype is not None else 1.0
        out = {}
        for k in TRANSIENT_TERMS:
            v = bd.get(SIM_TERMS[k])
            if isinstance(v, (int, float)) and v >= 0:
                out[k] = int(v * scale)
        # a pipeline rank without the last virtual stage runs no classifier (the breakdown is the fullest stage's:
        # a review found rank 0 of pp 2 charged the last stage's, the whole of its estimate's +7%)
        if "classifier_peak" in out and not self.schedule.holds_mtp():
            out["classifier_peak"] = 0
        return out

    def check_fit(self) -> None:
        """Refuse in one line, before anything is allocated, a rank whose estimate does not fit its device
        (`memo_exec.runner.ExecutorBase.fit_error`), with the ranks on its host counted together
        (`ranks_on_this_host`: on a CPU their estimates and pools share the host's memory, on CUDA their pinned
        pools); every rank refuses when one does (a MAX all-reduce of the verdicts over the world: a rank that went
        on would wait in its first collective until --pg-timeout)."""
        host_ranks, host_free = self.ranks_on_this_host()
        err = self.fit_error(host_ranks, host_free, self.ctx.rank)
        flag = torch.tensor([1.0 if err is not None else 0.0], device=self._collective_device())
        if self.ctx.world > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if err is not None:
            raise err
        if flag.item() > 0:
            raise ExecError(f"rank {self.ctx.rank} stops: another rank's memory estimate does not fit its device "
                            f"(its line says which)")

    def _collective_device(self) -> torch.device:
        return self.device if self.device_spec.is_cuda else torch.device("cpu")

    def ranks_on_this_host(self) -> tuple[list[tuple[int, int, int]] | None, int | None]:
        """(rank, device bytes, host bytes) of every rank of the run on this rank's host (`host_id`), in rank order,
        and the host's available memory as the first of them measured it (so that every one of them refuses in the
        same line); (None, None) for a run of one process (an all-gather over the world)."""
        if self.ctx.world == 1 or not dist.is_initialized():
            return None, None
        from memo_exec.device import host_available_bytes  # noqa: PLC0415 - read when called (tests replace it)

        est = self.estimate
        mine = torch.tensor([self.ctx.rank, est.total, est.host, host_id(), host_available_bytes()],
                            dtype=torch.int64, device=self._collective_device())
        rows = [torch.empty_like(mine) for _ in range(self.ctx.world)]
        dist.all_gather(rows, mine)
        here = sorted(tuple(int(v) for v in r.tolist()) for r in rows)
        here = [r for r in here if r[3] == int(mine[3])]
        return [(r, t, h) for r, t, h, _, _ in here], here[0][4]

    def _meta_policy(self, layers: int, pipelined: bool | None = None):
        """An instance of the plan's activation policy over ``layers`` layers on the meta device, as the schedule
        will make it (its sizes, for the estimate)."""
        lay = self.layout
        pol = make_policy(self.plan.policy, self.model, 1, self.local_T, layers, self.dtype, torch.device("meta"),
                          None, None, None, shapes=self.shapes, balance=lay.balance, etp=lay.etp)
        pol.pipelined = self.schedule.pipelined if pipelined is None else pipelined
        return pol

    def _modules_policy_alone(self) -> bool:
        """Whether this rank holds the multi-token-prediction modules after a last chunk without layers, so that they
        re-run under the plan's policy in instances of their own (`memo_exec.pipeline.schedules.PipelineSchedule
        .build_mtp`)."""
        sch = self.schedule
        if not (sch.pipelined and self.model.mtp_layers and sch.holds_mtp()):  # one stage: the layers' policy
            return False
        return modules_recomputed(self.plan.policy) and not sch.chunk_layers(sch.vpp - 1)

    # ------------------------------------------------------------------ allocate
    def allocate(self) -> None:
        m, dev, dt, lay, ctx = self.model, self.device, self.dtype, self.layout, self.ctx
        rf = float(self.plan.policy.recompute_fraction)
        whole = make_flops_fn(m, self.micro, self.seq, rf)
        split = lay.tp * lay.cp * lay.ulysses
        self.start_recording(lambda op, layer, phase: whole(op, layer, phase) / split, self.estimate.host,
                             rank=ctx.rank)
        self.scratch = ArenaScratch(dev, self.arena_plan) if self.arena_plan is not None else CachingScratch(dev)
        # embedding, final norm, the multi-token-prediction modules where this rank holds them (its shards); the held
        # layers below (every rank draws the same generator sequence: a pipeline's copies of the embedding are equal)
        self.vocab_split = VocabSplit.of(self.flavour, ctx, m.vocab)  # this TP rank's vocabulary rows
        gpt = GPT(m, 0, dev, dt, mtp_layer=lambda li: self._make_layer(li, dev, dt),
                  tp=(self.flavour.size, self.flavour.rank), mtp=self.schedule.holds_mtp(),
                  vocab_split=self.vocab_split)
        gpt.layers = torch.nn.ModuleList(self._make_layer(li, dev, dt) for li in self.held)
        local = dict(zip(self.held, gpt.layers)) | {m.layers + k: mod.layer for k, mod in enumerate(gpt.mtp)}

        def shard(i: int, full: LayerWeights) -> None:
            if i in local:
                self.flavour.shard_(local[i], full)
                local[i].init_experts_(self.opts.seed)  # routed experts by global index

        gpt.init_(self.opts.seed, layer_fn=shard, layers=m.layers)
        self.gpt = gpt
        # routed experts under ep or etp > 1: their own gradient group and optimizer (`memo_exec.moe.sync`)
        from memo_exec.moe.groups import experts_apart  # noqa: PLC0415

        split_experts = m.moe and experts_apart(lay)
        is_expert = (lambda n: split_experts and n.startswith("moe.expert_"))  # noqa: E731
        units = [gpt.outer_parameters()]  # then a unit per held layer, and per module's layer
        units += [[(n, q) for n, q in lw.named_parameters() if not is_expert(n)] for lw in gpt.unit_layers()]
        replicated = [[not gpt.split_over_tp(n) for n, _ in units[0]]]
        replicated += [[self.flavour.replicated(n) for n, _ in u] for u in units[1:]]
        # each unit's collectives named by its model layer (a pipeline stage's held layers, then the modules')
        self.unit_model_layers = self.held + [m.layers + k for k in range(len(gpt.mtp))]
        self.sync = GradSync(ctx, units, replicated, lay.zero, dev, dt, self.opts.lr, self.opts.weight_decay,
                             self.recorder, layers=self.unit_model_layers,
                             backwards_per_step=self.schedule.layer_backwards_per_step())
        self.expert_groups = self.expert_sync = None
        if m.moe:
            self._set_up_experts(gpt, is_expert)
        for part in (self.backend, getattr(self.backend, "inner", None), getattr(self.flavour, "comm", None)):
            if part is not None and hasattr(part, "timer"):
                part.timer = self.recorder  # collectives become spans of this rank's Timeline
        self.compute = self.flavour.make_compute(self.micro, self.shard_seq, dt, dev, self.backend, self.scratch,
                                                 self.recorder)
        if m.moe:
            from memo_exec.moe.block import MoEBlock  # noqa: PLC0415
            from memo_exec.moe.dispatchers import dispatcher_for  # noqa: PLC0415
            from memo_exec.moe.etp import ExpertTP  # noqa: PLC0415

            g = self.expert_groups
            disp = dispatcher_for(lay.moe_dispatcher, m.experts, g)
            etp = ExpertTP(g.etp, g.etp_rank, g.etp_group)
            disp.timer = etp.timer = self.recorder  # their collectives become ep_comm spans of this rank's Timeline
            self.compute.moe = MoEBlock(m, disp, tp_size=self.flavour.size, tp_group=ctx.group("tp"), etp=etp)
            self.compute.moe.set_balance(lay.balance, self.micro_index % self.seq)  # positions of its rows
        hooks = self.sync if self.expert_sync is None else ChainedHooks(self.sync, self.expert_sync)
        self.layer_hooks = hooks if self.kill_at_step is None else _KillHook(hooks, self)
        self.schedule.build_runtimes()
        self.mtp = self.schedule.build_mtp()  # multi-token prediction (`memo_exec.mtp`), where this rank holds it
        self.allocated = True

    def _set_up_experts(self, gpt, is_expert) -> None:
        """The EP, ETP and expert-DP groups (every rank creates every group) and, with ep or etp > 1, the routed
        experts' own gradient sync, ZeRO stage and optimizer over the expert-DP group (`memo_exec.moe.sync`)."""
        from memo_exec.moe.groups import build_expert_groups  # noqa: PLC0415

        g = self.expert_groups = build_expert_groups(self.layout, self.ctx.rank, self.ctx.world)
        units = [[]] + [[(n, q) for n, q in lw.named_parameters() if is_expert(n)] for lw in gpt.unit_layers()]
        if any(units):
            self.expert_sync = GradSync(self.ctx, units, [[False] * len(u) for u in units], self.layout.zero,
                                        self.device, self.dtype, self.opts.lr, self.opts.weight_decay, self.recorder,
                                        over=(g.edp_group, g.edp, g.edp_rank), layers=self.unit_model_layers,
                                        backwards_per_step=self.schedule.layer_backwards_per_step())

    def make_mtp_run(self, policy) -> MTPRun:
        """The runtimes of the multi-token-prediction modules this rank holds, for one micro-batch's rows at a time
        (`memo_exec.mtp.MTPRun`), beside the layers' activation policy ``policy`` (where the modules re-run, their
        layers re-run in its recompute buffer)."""
        return MTPRun(self.gpt, self.compute, self.recorder, self.layer_hooks, 1, self.local_T, self.dtype,
                      self.device, policy, self.shapes, self.tp_split)

    def make_activation_policy(self, layers: int):
        """A new instance of the plan's activation policy over ``layers`` layers of this rank (not
        yet allocated), for one micro-batch's tokens."""
        return make_policy(self.plan.policy, self.model, 1, self.local_T, layers, self.dtype, self.device,
                           self.engine, self.recorder, self.compute, shapes=self.shapes, balance=self.layout.balance,
                           etp=self.layout.etp)

    # ------------------------------------------------------------------ run
    def _micro_batch_tokens(self, step: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole [micro_batch, seq] input and target rows of micro-batch ``k`` of the replica's batch
        (sequences ``k*micro_batch..`` of the replica's rows, `local_batch`)."""
        inputs, targets = self.data.batch_at(step)
        lo = self.ctx.coord("dp") * self.batch + k * self.micro
        return inputs[lo:lo + self.micro], targets[lo:lo + self.micro]

    def micro_batch_rows(self, step: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's input and target rows of micro-batch ``k``."""
        inputs, targets = self._micro_batch_tokens(step, k)
        idx = self.micro_index
        return inputs.reshape(-1)[idx].to(self.device), targets.reshape(-1)[idx].to(self.device)

    def micro_batch_mtp(self, step: int, k: int, run: MTPRun | None = None):
        """The multi-token-prediction modules' rows of micro-batch ``k`` on this rank (`memo_exec.mtp.MTPBatch`;
        their losses averaged over the global batch) for ``run`` (default ``self.mtp``), or None without modules."""
        run = self.mtp if run is None else run
        if run is None:
            return None
        inputs, targets = self._micro_batch_tokens(step, k)
        return run.batch(inputs, targets, self.micro_index, self.batch * self.layout.dp)

    def local_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's input and target rows (DP replica d takes rows d*batch.. of the global batch)."""
        inputs, targets = self.data.batch_at(step)
        d, b = self.ctx.coord("dp"), self.batch
        rows = slice(d * b, (d + 1) * b)
        idx = self.token_index
        return (inputs[rows].reshape(-1)[idx].to(self.device), targets[rows].reshape(-1)[idx].to(self.device))

    def _loss_sum(self, part: torch.Tensor) -> float:
        t = part.detach().to(torch.float64).reshape(1).clone()
        for g in ("tokens", "pp"):
            if self.ctx.group(g) is not None:
                dist.all_reduce(t, group=self.ctx.group(g))
        return float(t.item())

    def forward_backward(self, step: int) -> float:
        self.sync.begin_step()
        if self.expert_sync is not None:
            self.expert_sync.begin_step()
        self.policy.begin_step()
        part = self.schedule.forward_backward(step)
        self.policy.end_step()
        self.sync.end_backward()
        if self.expert_sync is not None:
            self.expert_sync.end_backward()
        return self._loss_sum(part)

    def end_micro_batch(self) -> None:
        """Between two micro-batches of a step: what ZeRO 2 / 3 reduce every micro-batch
        (`GradSync.end_micro_batch`)."""
        self.sync.end_micro_batch()
        if self.expert_sync is not None:
            self.expert_sync.end_micro_batch()

    def end_chunk(self, positions) -> None:
        """After a pipeline chunk's last micro-batch backward (its held layers at ``positions``): what FSDP beside
        stages reduces then (`GradSync.end_chunk`)."""
        self.sync.end_chunk(positions)
        if self.expert_sync is not None:
            self.expert_sync.end_chunk(positions)

    def optimizer_step(self) -> None:
        self.sync.step()
        self.sync.zero_grads()
        if self.expert_sync is not None:
            self.expert_sync.step()
            self.expert_sync.zero_grads()

    def zero_grads(self) -> None:
        """Zero every gradient this rank accumulates (the dense units' and the routed experts')."""
        self.sync.zero_grads()
        if self.expert_sync is not None:
            self.expert_sync.zero_grads()

    def wait_for_peers(self) -> None:
        """Every rank of the run waits here for the others (a barrier on the world group, outside any timed span):
        `memo_exec.runner.run_steps` calls it after a step's speed probe, so every rank starts the next step
        together. A group of one (an in-process run) does not wait."""
        if self.ctx.world > 1 and dist.is_initialized():
            dist.barrier()

    def run(self, progress=None) -> RunResult:
        def caching() -> list[str]:
            first = (f"every scratch tensor of the distributed layer ({self.no_arena})" if self.arena_plan is None
                     else "scratch tensors the memory plan does not place: " + (", ".join(self.unplanned) or "none"))
            return [first, "collective buffers (gathered activations, partial sums, ring blocks)"]

        return run_steps(self, len(self.held), caching, progress)

    # ------------------------------------------------------------------ checks
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter's whole weights by `GPT` parameter name (a collective; dense single-stage
        layouts: what the FSDP tests compare after a step)."""
        units = self.sync.full_params()
        out = self._whole_first_unit(units[0])
        for k, prefix in enumerate(self._unit_prefixes()):
            for n, w in self.flavour.unshard_grads(units[k + 1]).items():  # the same gather as a gradient's
                out[f"{prefix}.{n}"] = w
        return out

    def _whole_first_unit(self, named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The first unit's tensors with the TP-split ones gathered (the modules' projections, the vocabulary's
        rows; a collective)."""
        out = whole_projections(named, self.tp_split)
        return out if self.vocab_split is None else self.vocab_split.whole(out)

    def _unit_prefixes(self) -> list[str]:
        """The `GPT` parameter-name prefix of each layer unit: the held layers', then the modules' layers'."""
        return [f"layers.{li}" for li in self.held] + [f"mtp.{k}.layer" for k in range(len(self.gpt.mtp))]

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Every parameter's whole, reduced gradient by `GPT` parameter name (a collective; call
        after ``step(k, optimizer=False)``)."""
        units = self.sync.full_grads()
        out = self._whole_first_unit(units[0])
        prefixes = self._unit_prefixes()
        for k, prefix in enumerate(prefixes):
            for n, g in self.flavour.unshard_grads(units[k + 1]).items():
                out[f"{prefix}.{n}"] = g
        if self.expert_sync is not None:  # routed experts: each EP rank's [E/ep, ...] (ETP slices joined) [E, ...]
            from memo_exec.moe.sync import gather_experts  # noqa: PLC0415

            g = self.expert_groups
            for k, unit in enumerate(self.expert_sync.full_grads()[1:]):
                for n, q in unit.items():
                    out[f"{prefixes[k]}.{n}"] = gather_experts(q, g, n.rsplit(".", 1)[-1], self.model)
        pg = self.ctx.group("pp")
        if pg is None:
            return out
        # pipeline: every stage's layers; the embedding from stage 0 (its gradient summed with the last stage's copy
        # where that one has a gradient: tied, or multi-token prediction), the final norm, an untied classifier and
        # the multi-token-prediction modules (their norms, projections and layers, named as the one-process
        # model's: ``mtp.<k>.*``) from the last stage
        parts = [None] * self.layout.pp
        dist.all_gather_object(parts, out, group=pg)
        last = self.layout.pp - 1
        merged = {}
        for s, part in enumerate(parts):
            for n, g in part.items():
                if n.startswith("layers.") or (n == "wte" and s == 0) or (n != "wte" and s == last):
                    merged[n] = g.to(self.device)
        return merged

    def _arena_described(self) -> dict:
        """`arena_description`, with the plan's names this rank's layer calls otherwise (``plan_names``: phase ->
        {plan name: executor name}) where there are any."""
        ap = self.arena_plan
        return arena_description(ap, self.unplanned) | ({"plan_names": ap.renamed} if ap.renamed else {})

    def describe(self) -> dict:
        lay = self.layout
        return {
            **super().describe(), "tokens": self.global_tokens,
            "rank": self.ctx.rank, "world": self.ctx.world, "mesh": self.ctx.describe(),
            "tp_flavour": self.flavour.name, "schedule": self.schedule.name, "micro_batch": self.micro,
            "micro_batches": self.plan.micro_batches, "vpp": lay.vpp, "activation_sets": self.activation_sets,
            "local_tokens": self.local_T, "zero": lay.zero,
            **({"fsdp": {"shard": self.ctx.size("shard"), "replicas": self.ctx.size("replicate"),
                         "reshard_after_forward": lay.reshard_after_forward}} if lay.dp_mode == "fsdp" else {}),
            **({"experts": {"ep": lay.ep, "etp": lay.etp, "dispatcher": lay.moe_dispatcher,
                            "local": list(self._expert_range()), "expert_dp": lay.expert_dp}} if self.model.moe else {}),
            **({"memory_plan": self._arena_described()} if self.arena_plan is not None
               else {"memory_plan_not_used": self.no_arena}),
        }
