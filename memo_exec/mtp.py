"""Multi-token prediction (``ModelConfig.mtp_layers`` = D; DeepSeek-V3 sec. 2.2, Megatron-LM's
megatron/core/transformer/multi_token_prediction.py): D modules after the last layer, module k predicting the
token k + 1 places ahead, on single-stage plans and on the last stage of a 1F1B / interleaved pipeline (one `MTPRun`
per activation slot of its last chunk, the embedding's copy there: `memo_exec.pipeline.schedules`;
`memo_sim.plan.executor_scope.plan_why_not` refuses the other schedules in one line).

Math, on this rank's rows (the weights: `memo_exec.model.MTPWeights`): with h_0 the last layer's output before
the final norm, for k = 1..D

    h_k = Layer_k(W_k [norm_e(Emb(tokens shifted left by k)); norm_h(h_{k-1})])

(``Emb`` the model's own embedding; W_k 2h -> h without bias; the module's layer of the last layer's kind,
`ModelConfig.mtp_moe`; its three norms of the model's norm type), then the module's final norm and the model's
own classifier against the labels shifted by k. A position t with t + k past its sequence's end embeds token 0
(Megatron-LM's ``roll_tensor``) and is masked out of the module's loss, the mean over the other B x (S - k)
positions of the global batch; causal attention keeps it from every earlier position. The loss is the model's
plus (`MTP_LOSS_SCALE` / D) times the sum of the modules' losses.

One pass of the classifier: the modules' final-normed rows join the model's (`memo_exec.model.ChunkedHead` with
a weight per row: 1 / tokens for the model's rows, scale / (D x the depth's unmasked tokens) for a module's, 0
where masked), so one [V, h] weight gradient serves them all; the simulator prices a further pass of the
classifier and loss per module (`memo_sim.cost.boundary.mtp_seconds`), the same FLOPs.

Activations, as `memo_sim.cost.memory.mtp_activation_bytes` prices them in the classifier's peak
(`mtp_kept_bytes`), by the plan's policy (`modules_recomputed`):

- a policy that re-runs whole layers (``Policy.recomputes_mtp``: full recompute, checkpoint offload): Megatron-LM's
  checkpointed module (multi_token_prediction.py ``_checkpointed_forward``; the simulator's ``recompute_mtp``).
  Each module keeps its two inputs, the hidden state h_{k-1} and the embedded tokens [T, h] each, before their
  norms (`_Checkpointed`), and re-runs its norms, projection and layer forward before its backward: the layer in
  the main policy's recompute buffer (`ModuleRecompute`), its input the re-run projection's output, its MoE block
  routing the tokens again (nothing of the layer kept, its routing neither);
- every other policy: the module's layer keeps everything from its forward to its backward (`ModuleStore`, store
  all), and autograd keeps what the norms and the projection save: the embedded tokens [T, h], the concatenation
  [T, 2h] and the layer's output [T, h] (the next module's and the final norm's input) a module.

Tensor parallelism (Megatron's flavour): W_k is column-parallel (this rank's h/p output rows), its output
gathered back to whole rows as Megatron-LM does (``gather_from_tensor_model_parallel_region``, then with
sequence parallelism ``scatter_to_sequence_parallel_region``): with SP the rows all-gathered into the GEMM and
the rank's columns, padded to h, reduce-scattered (`memo_exec.moe.comm`); without SP the input copied into the
region (its gradient all-reduced) and the padded columns all-reduced (`project`). The rest is row-wise or the
layer's own (`memo_exec.layer.LayerCompute` as the flavour builds it: TP, CP's ring, Ulysses, the MoE block
with EP). The modules' layers are units after the model's layers (runtime index ``layers + k``: ZeRO's
gathers and reductions, fp32 main gradients); their norms and projections join the embedding's unit.

Measurement: the modules' spans are op ``mtp`` without a layer (`ModuleTimer`): the simulator prices them in
the classifier's time, not as layers; each span carries the FLOPs of what it times.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from torch.autograd.function import once_differentiable

from memo_exec.activations.base import ActivationPolicy
from memo_exec.activations.store_all import StoreAll
from memo_exec.device import acc_dtype, element_size
from memo_exec.errors import ExecError
from memo_exec.layer import LayerStorage, skeletal_names
from memo_exec.model import GPT, LayerFn, LayerHooks, LayerRuntime, norm
from memo_exec.moe.block import MoESaved
from memo_exec.moe.comm import sp_gather_linear, sp_reduce_scatter
from memo_sim.model.config import ModelConfig
from memo_sim.model.flops import gemm_flops
from memo_sim.policy import get_policy

# The modules' share of the loss: Megatron-LM's --mtp-loss-scaling-factor default (megatron/training/arguments.py),
# divided by D as its process_mtp_loss does; DeepSeek-V3 trained with 0.3 for its first 10T tokens, 0.1 after.
MTP_LOSS_SCALE = 0.1
SPAN = "mtp"  # the op name of every span the modules record (`ModuleTimer`)


@dataclass(frozen=True)
class TPSplit:
    """This rank's place in the TP group the projections are split over (size 1: whole)."""

    size: int = 1
    rank: int = 0
    group: object = None
    sp: bool = False


class _CopyIn(torch.autograd.Function):
    """Entering a column-parallel region without SP (Megatron-LM's copy_to_tensor_model_parallel_region): the
    identity, its gradient (each rank's part, from its own output columns) all-reduced over the TP group."""

    @staticmethod
    def forward(ctx, t, group):
        ctx.group = group
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _SumOut(torch.autograd.Function):
    """The TP group's parts summed (all-reduce); the gradient, the same on every rank, passes as it is."""

    @staticmethod
    def forward(ctx, t, group):
        out = t.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        return g, None


def project(c: torch.Tensor, w: torch.Tensor, tp: TPSplit) -> torch.Tensor:
    """``c @ W^T`` for this rank's rows of ``c`` [T, 2h], whole rows [T, h] out; ``w`` this rank's output rows
    of W (module docs)."""
    if tp.size == 1:
        return F.linear(c, w)
    n = w.shape[0]
    pad = (tp.rank * n, (tp.size - 1 - tp.rank) * n)  # this rank's columns of the whole output
    if tp.sp:
        return sp_reduce_scatter(F.pad(sp_gather_linear(c, w, tp.size, tp.group), pad), tp.size, tp.group)
    return _SumOut.apply(F.pad(F.linear(_CopyIn.apply(c, tp.group), w), pad), tp.group)


def whole_projections(named: dict[str, torch.Tensor], tp: TPSplit) -> dict[str, torch.Tensor]:
    """``named`` (unit 0's tensors by parameter name) with each projection's rows gathered over the TP group
    (a collective; checks and tests)."""
    out = dict(named)
    if tp.size == 1:
        return out
    for name, t in named.items():
        if name.rsplit(".", 1)[-1] == "eh_proj":
            parts = [torch.empty_like(t) for _ in range(tp.size)]
            dist.all_gather(parts, t.contiguous(), group=tp.group)
            out[name] = torch.cat(parts, 0)
    return out


class ModuleTimer:
    """The recorder as the modules see it (module docs): every span op `SPAN`, no layer, with the FLOPs of the
    layer op it times (the recorder's ``flops_fn`` for a layer's op) unless given."""

    def __init__(self, recorder) -> None:
        self.recorder = recorder

    def span(self, op: str, layer: int | None, phase: str, stream: str = "compute", nbytes: float = 0,
             flops: float | None = None):
        fn = getattr(self.recorder, "flops_fn", None)
        if flops is None:
            flops = fn(op, 0, phase) if fn is not None else 0.0
        return self.recorder.span(SPAN, None, phase, stream, nbytes, flops)

    def __getattr__(self, name: str):
        return getattr(self.recorder, name)


class ModuleStore(StoreAll):
    """Store all over the D modules' layers (module docs): runtime index ``first + k`` is module k's layer, of
    the last layer's kind; each layer's output is a fresh tensor (the next module's layer reads its projection's
    output, not it)."""

    def __init__(self, model: ModelConfig, batch: int, seq: int, dtype: torch.dtype, device: torch.device, timer,
                 compute, first: int, shapes=None) -> None:
        super().__init__(get_policy("store_all"), model, batch, seq, model.mtp_layers, dtype, device, None, timer,
                         compute, shapes)
        self.first = first

    def moe_layer(self, layer: int) -> bool:
        return self.model.mtp_moe

    def _names(self, i: int) -> tuple[str, ...]:
        """A MoE layer writes no fc1 and act (its block keeps its own), whatever the model's other layers."""
        return tuple(n for n in skeletal_names(self.model) if not (self.model.mtp_moe and n in ("fc1", "act")))

    def storage_for_forward(self, i: int):
        return self.storages[i - self.first]

    def storage_for_backward(self, i: int, weights):
        return self.storages[i - self.first]  # store all: nothing to rebuild

    def output_for(self, i: int) -> None:
        return None


class ModuleRecompute(ActivationPolicy):
    """Full recompute over the D modules' layers, Megatron-LM's checkpointed module (module docs): runtime index
    ``first + k`` is module k's layer. No layer keeps a tensor: each runs in ``main``'s recompute buffer
    (`ActivationPolicy.recompute_buffer`: free from the last model layer's forward to its recompute, which is when
    the modules run), its input x the projection's output `bound` hands it (forward, and again re-run before the
    backward), and re-runs its forward from it before its backward (`memo_exec.layer.LayerCompute.recompute_full`),
    as `memo_exec.activations.full_recompute` re-runs a layer; a MoE block routes its tokens again in its
    backward's re-run (its routing is not kept). Each layer has its own storage view (its attention state and FP8
    scales between its forward and backward) over the shared tensors."""

    def __init__(self, main: ActivationPolicy, model: ModelConfig, batch: int, seq: int, dtype: torch.dtype,
                 device: torch.device, timer, compute, first: int, shapes=None) -> None:
        super().__init__(main.choice, model, batch, seq, model.mtp_layers, dtype, device, None, timer, compute, shapes)
        self.main, self.first = main, first

    def device_bytes(self) -> dict[str, int]:
        return {}  # the main policy's buffer; the modules' inputs are autograd's (`mtp_kept_bytes`)

    def allocate(self) -> None:
        buf = self.main.recompute_buffer()
        if buf is None or self.main.tokens != self.tokens:
            raise ExecError(f"multi-token prediction under policy {self.name}: the layers' policy has no recompute "
                            f"buffer of {self.tokens} tokens for the modules' layers to re-run in")
        self.storages = [LayerStorage(dict(buf.tensors), buf.stats) for _ in range(self.layers)]

    @contextlib.contextmanager
    def bound(self, i: int, x: torch.Tensor):
        """Layer ``i``'s input ``x`` (its projection's output [T, h]) in its storage for its forward or its backward
        (whose re-run reads it), released after."""
        st = self.storages[i - self.first]
        st.tensors["x"] = x
        try:
            yield
        finally:
            del st.tensors["x"]

    def storage_for_forward(self, i: int) -> LayerStorage:
        return self.storages[i - self.first]

    def output_for(self, i: int) -> None:
        return None

    def after_forward(self, i: int) -> None:
        st = self.storages[i - self.first]
        # the attention state and a MoE block's routing are rebuilt by the re-run; kept: the model layer a routing
        # keyed by layer drew from (`memo_exec.moe.balance`: a pipeline's backward binds another chunk's numbering)
        st.aux = None
        st.moe = None if st.moe is None else MoESaved(None, route_layer=st.moe.route_layer)

    def recompute(self, compute, weights, storage, i: int) -> None:
        kept = storage.moe
        compute.recompute_full(weights, storage, i)
        if weights.moe is not None:  # the block's backward re-runs it, routing the rebuilt ln2 again
            storage.moe = MoESaved(None, route_layer=kept.route_layer if kept is not None else
                                   compute.moe.route_layer(i))

    def storage_for_backward(self, i: int, weights) -> LayerStorage:
        st = self.storages[i - self.first]
        self.recompute(self.compute, weights, st, i)
        return st

    def after_backward(self, i: int) -> None:
        self.storages[i - self.first].aux = None


def modules_recomputed(choice) -> bool:
    """Whether the modules re-run under the simulator's policy ``choice`` (module docs): where it re-runs whole
    layers (`memo_sim.policy.base.Policy.recomputes_mtp`, the simulator's ``recompute_mtp``)."""
    return bool(getattr(choice, "recomputes_mtp", False))


def mtp_kept_bytes(model: ModelConfig, batch: int, seq: int, dtype: torch.dtype, recompute: bool = False) -> int:
    """What the D modules keep on one device from their forward to their backward (module docs); 0 without modules.
    Kept (store all): their layers' store-all storage (skeletal tensors, norm statistics, lse, a MoE block's graph)
    and 4 [T, h] a module (the embedded tokens, the concatenation, the layer's output). Re-run (``recompute``): 2
    [T, h] a module, its two inputs: the embedded tokens and the hidden state (module 1's the last layer's output,
    which the head counts; each module's output is the next one's input, and its final norm's). The simulator's
    counterpart: `memo_sim.cost.memory.mtp_activation_bytes` (without the norm statistics and the loss's state)."""
    if not model.mtp_layers:
        return 0
    row = batch * seq * model.hidden * element_size(dtype)
    if recompute:
        return model.mtp_layers * 2 * row
    store = ModuleStore(model, batch, seq, dtype, torch.device("meta"), None, None, model.layers)
    return sum(store.device_bytes().values()) + model.mtp_layers * 4 * row


def _input_parameters(mod) -> list[torch.Tensor]:
    """A module's parameters before its layer: its two norms' and its projection."""
    return [p for p in (mod.enorm_w, mod.enorm_b, mod.hnorm_w, mod.hnorm_b, mod.eh_proj) if p is not None]


class _Checkpointed(torch.autograd.Function):
    """Module k under full recompute (module docs): from its inputs ``h`` (h_{k-1}) and ``e`` (the embedded tokens),
    the only tensors it keeps, its layer's output; the backward re-runs the norms and the projection (autograd) and
    the layer (`ModuleRecompute`), then runs their backwards. ``params``: the norms' and projection's parameters,
    whose gradients it returns."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, e: torch.Tensor, run: "MTPRun", k: int, *params) -> torch.Tensor:
        ctx.run, ctx.k, ctx.params = run, k, params
        ctx.save_for_backward(h, e)
        return run.layer_forward(k, run.inputs(k, e, h, "fwd"))

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: torch.Tensor):
        run, k = ctx.run, ctx.k
        h, e = ctx.saved_tensors
        params = ctx.params
        with torch.enable_grad():
            h, e = h.detach().requires_grad_(True), e.detach().requires_grad_(True)
            y = run.inputs(k, e, h, "recompute")
        rt = run.runtimes[k]
        with run.store.bound(rt.index, y.detach()):
            dy = rt.backward(dout)
        with run.timer.span(SPAN, None, "bwd", flops=2 * run.proj_flops):
            grads = torch.autograd.grad(y, [h, e, *params], dy)
        return (grads[0], grads[1], None, None, *grads[2:])


class MTPRun:
    """The modules of one executor (module docs): their layers' runtimes over a `ModuleStore` or, where they re-run,
    a `ModuleRecompute` (allocated here;
    ``batch`` x ``seq`` tokens a layer call, ``shapes`` this rank's `memo_exec.layer.storage_shapes`), ``hooks``
    the executor's layer hooks, ``tp`` this rank's split of the projections."""

    def __init__(self, gpt: GPT, compute, recorder, hooks: LayerHooks, batch: int, seq: int, dtype: torch.dtype,
                 device: torch.device, policy: ActivationPolicy, shapes=None, tp: TPSplit = TPSplit()) -> None:
        """``policy``: the model layers' activation policy (whether the modules re-run: `modules_recomputed`; then
        its recompute buffer holds their layers)."""
        m = gpt.cfg
        self.gpt, self.tp, self.D, self.dtype, self.device = gpt, tp, m.mtp_layers, dtype, device
        self.timer = ModuleTimer(recorder)
        comp = dataclasses.replace(compute, timer=self.timer)  # the layer's math, its spans the modules'
        first = len(gpt.layers)
        self.recompute = modules_recomputed(policy.choice)
        self.store = (ModuleRecompute(policy, m, batch, seq, dtype, device, self.timer, comp, first, shapes)
                      if self.recompute else ModuleStore(m, batch, seq, dtype, device, self.timer, comp, first, shapes))
        self.store.allocate()
        self.runtimes = [LayerRuntime(first + k, mod.layer, self.store, comp, self.timer, hooks)
                         for k, mod in enumerate(gpt.mtp)]
        self.proj_flops = gemm_flops(comp.Tg, 2 * m.hidden, m.hidden // tp.size)  # the GEMM's rows: gathered by SP

    def batch(self, inputs: torch.Tensor, targets: torch.Tensor, index: torch.Tensor | None = None,
              sequences: int | None = None) -> "MTPBatch":
        """The modules' rows of one batch: ``inputs`` / ``targets`` its whole [b, S] token rows, ``index`` the flat
        indices of this rank's rows among them (`memo_exec.distributed.context.local_token_index`; None: all),
        ``sequences`` the sequences the loss averages over (the global batch's; default b)."""
        b, S = inputs.shape
        n = sequences or b
        pos = torch.arange(S)
        rows = []
        for k in range(1, self.D + 1):
            tok, lab = torch.zeros_like(inputs), torch.zeros_like(targets)
            tok[:, :S - k], lab[:, :S - k] = inputs[:, k:], targets[:, k:]
            w = (pos < S - k).to(torch.float64).mul_(MTP_LOSS_SCALE / self.D / max(1, n * (S - k))).expand(b, S)
            part = [t.reshape(-1) if index is None else t.reshape(-1)[index] for t in (tok, lab, w)]
            rows.append((part[0].to(self.device), part[1].to(self.device),
                         part[2].to(self.device, acc_dtype(self.dtype))))
        return MTPBatch(self, rows)

    def inputs(self, k: int, e: torch.Tensor, h: torch.Tensor, phase: str) -> torch.Tensor:
        """Module k's layer input ``W_k [norm_e(e); norm_h(h)]`` from the embedded tokens ``e`` and the hidden state
        ``h`` (autograd where grad mode is on; ``phase``: its span's)."""
        mod = self.gpt.mtp[k]
        with self.timer.span(SPAN, None, phase, flops=self.proj_flops):
            c = torch.cat([norm(e, mod.enorm_w, mod.enorm_b), norm(h, mod.hnorm_w, mod.hnorm_b)], -1)
            return project(c, mod.eh_proj, self.tp)

    def layer_forward(self, k: int, y: torch.Tensor) -> torch.Tensor:
        """Module k's layer on its input ``y`` under `ModuleRecompute` (no autograd: `_Checkpointed`)."""
        rt = self.runtimes[k]
        with self.store.bound(rt.index, y):
            return rt.forward(y)

    def module(self, k: int, h: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """Module k's layer output (autograd) from the hidden state ``h`` and its tokens ``tok`` (module docs)."""
        with self.timer.span(SPAN, None, "fwd", flops=0.0):
            e = self.gpt.embed(tok)
        if self.recompute:
            return _Checkpointed.apply(h, e, self, k, *_input_parameters(self.gpt.mtp[k]))
        y = self.inputs(k, e, h, "fwd")
        del e
        return LayerFn.apply(y, self.runtimes[k])


class MTPBatch:
    """One batch's rows for the modules (`MTPRun.batch`): per module (tokens, labels, loss weights) on this rank."""

    def __init__(self, run: MTPRun, rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        self.run, self.rows = run, rows

    def forward(self, gpt: GPT, x: torch.Tensor, hf: torch.Tensor, targets: torch.Tensor, norm_tokens: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the modules on the last layer's output ``x`` [T, h] (autograd); return the classifier's rows: the
        model's final-normed ``hf`` and its ``targets``, then each module's, and every row's loss weight (module
        docs; the model's 1 / ``norm_tokens``)."""
        run = self.run
        hfs, tgs = [hf], [targets]
        ws = [torch.full((hf.shape[0],), 1.0 / norm_tokens, dtype=self.rows[0][2].dtype, device=hf.device)]
        h = x
        for k, (mod, (tok, lab, w)) in enumerate(zip(gpt.mtp, self.rows)):
            h = run.module(k, h, tok)
            with run.timer.span(SPAN, None, "fwd", flops=0.0):
                hfs.append(norm(h, mod.norm_w, mod.norm_b))
            tgs.append(lab)
            ws.append(w)
        return torch.cat(hfs), torch.cat(tgs), torch.cat(ws)
