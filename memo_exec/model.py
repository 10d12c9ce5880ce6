"""The decoder for the executor: embedding, n explicit layers, final norm, chunked classifier +
cross-entropy, in the plan model's architecture (`memo_sim.model.config`: LayerNorm or RMSNorm,
the biases its ``bias`` setting names, a classifier tied to the embedding or its own ``lm_head``),
and the model's multi-token-prediction modules (``mtp``, `MTPWeights`; run by `memo_exec.mtp`).
No positional embedding (causal attention orders tokens; memo's own plans price no rotary op, ``Layout.rope``
none, and a framework's plan that prices one is named in the report: `memo_exec.report.rope_note`), so the
parameter count is exactly `ModelConfig.params()` + `ModelConfig.mtp_params()`
(`ModelConfig.trained_params`, which the MFU formula and the model states use), plus the vocabulary's
padding rows (`padded_vocab`). Under tensor parallelism the embedding and the classifier hold the TP rank's
vocabulary rows (``vocab_split``: `memo_exec.vocab_parallel`), as the simulator prices them.

Each layer is one `torch.autograd.Function` whose backward is written by hand
(`memo_exec.layer.LayerCompute`); what it keeps for the backward is decided by the activation
policy, never by autograd. The classifier computes logits ``classifier_chunk_tokens`` at a time
and its gradients in the same pass, so a ``[tokens, vocab]`` matrix never exists.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from memo_exec.device import acc_dtype
from memo_exec.layer import LN_EPS, LayerCompute, LayerWeights, norm_stats_dtype, rms_norm, rms_norm_backward
from memo_sim.model.config import ModelConfig

def check_architecture(model: ModelConfig, built: dict[str, tuple], path: str, instead: str) -> str | None:
    """Why ``path`` (which builds the architectures in ``built``: `memo_sim.model.config` field ->
    the values it builds) cannot run ``model``, or None: running another architecture would measure
    another model than the plan predicts. ``instead``: what to plan to run this model. Every path
    builds every architecture but full METP, whose travelling MHA block carries the QKV bias."""
    for field_, values in built.items():
        have = getattr(model, field_)
        if have not in values:
            return (f"model {model.name}: {field_} = {have!r}: {path} builds {field_} = "
                    f"{' or '.join(repr(v) for v in values)} only; {instead}")
    return None


VOCAB_ROW_MULTIPLE = 128  # Megatron-LM's --make-vocab-size-divisible-by default


def padded_vocab(vocab: int, tp: int = 1) -> int:
    """Rows of the embedding and classifier weights: the vocabulary padded to a multiple of 128 (x ``tp`` under
    tensor parallelism, each TP rank then holding 1/tp of the rows: `memo_exec.vocab_parallel`), as Megatron-LM
    pads it (``--make-vocab-size-divisible-by`` x tp). The classifier's GEMMs then have aligned leading
    dimensions: on an H100 (2026-11-25, benchmarks/gpu/probe_executor.py) the 32K-token classifier of GPT-7B
    took 338 ms with 50,257 rows and 85 ms with 50,304 (its GEMMs at 113-152 vs 684-768 TFLOP/s). The padded
    rows start at zero, are never looked up and get no probability (`ChunkedHead` masks their
    logits), so the model computes what the unpadded one does."""
    m = VOCAB_ROW_MULTIPLE * tp
    return -(-vocab // m) * m


def vocab_rows(vocab: int, tp: int = 1) -> int:
    """Rows of the embedding (and of the classifier) one of ``tp`` TP ranks holds."""
    return padded_vocab(vocab, tp) // tp


def vocab_padding_params(model: ModelConfig) -> int:
    """Parameters of the padding rows (`padded_vocab`): beyond ``model.params()``."""
    return (padded_vocab(model.vocab) - model.vocab) * model.hidden * (1 if model.tied_embeddings else 2)


class MTPWeights(nn.Module):
    """One multi-token-prediction module's own weights (`ModelConfig.mtp_module_params` exactly; run by
    `memo_exec.mtp`): the norms of the embedded tokens and of the incoming hidden state (``enorm_*``,
    ``hnorm_*``: DeepSeek-V3's RMSNorms, the model's norm type), the projection ``eh_proj`` [h, 2h] of their
    concatenation (no bias; Megatron-LM's column-parallel linear: this rank's h/tp output rows under TP), the
    module's layer ``layer`` (model layer ``layers + k``, of the last layer's kind: `ModelConfig.mtp_moe`) and
    its final norm ``norm_*``. The token embedding and the classifier are the model's (`GPT.wte`, `GPT.head`)."""

    TP_ROWS = ("eh_proj",)  # split over the TP ranks by output rows; the norms are whole on every rank

    def __init__(self, model: ModelConfig, layer: nn.Module, device, dtype, tp: tuple[int, int] = (1, 0)) -> None:
        super().__init__()
        h = model.hidden
        mk = lambda *s: nn.Parameter(torch.empty(*s, device=device, dtype=dtype))  # noqa: E731
        shift = model.norm == "layernorm"
        self.enorm_w, self.enorm_b = mk(h), mk(h) if shift else None
        self.hnorm_w, self.hnorm_b = mk(h), mk(h) if shift else None
        self.tp_size, self.tp_rank = tp
        self.eh_proj = mk(h // self.tp_size, 2 * h)
        self.norm_w, self.norm_b = mk(h), mk(h) if shift else None
        self.layer = layer

    def outer_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) of the module's norms and projection (its layer's are a unit of their own)."""
        return list(self.named_parameters(recurse=False))

    def init_(self, gen: torch.Generator, std: float = 0.02) -> None:
        """The norms at one and zero, the projection drawn whole from ``gen`` (this rank keeps its rows), so
        every TP split starts from the one-process weights."""
        with torch.no_grad():
            for name, p in self.outer_parameters():
                if name == "eh_proj":
                    n = p.shape[0]
                    whole = torch.randn((n * self.tp_size, p.shape[1]), generator=gen, dtype=torch.float32,
                                        device=p.device)
                    p.copy_(whole[self.tp_rank * n:(self.tp_rank + 1) * n].mul_(std))
                else:
                    p.fill_(1.0 if name.endswith("_w") else 0.0)


class GPT(nn.Module):
    def __init__(self, model: ModelConfig, layers: int, device: torch.device, dtype: torch.dtype,
                 mtp_layer=None, tp: tuple[int, int] = (1, 0), mtp: bool = True, vocab_split=None) -> None:
        """``layers`` of the model's layers (the distributed executor adds its own); the model's
        ``mtp_layers`` modules, each ``MTPWeights`` around ``mtp_layer(i)`` (model layer i = ``model.layers +
        k``; default one device's whole layer of the last layer's kind) with ``tp`` = (size, rank) of its
        projection's split; none where ``mtp`` is False (a pipeline rank before the last: the modules live on the
        last stage, `memo_exec.pipeline.schedules`). ``vocab_split``: this rank's rows of the vocabulary under TP
        (`memo_exec.vocab_parallel.VocabSplit`: the embedding and the classifier hold them, its collectives run
        the lookup and the loss); None: every row (one device)."""
        super().__init__()
        self.cfg = model
        self.vocab_split = vocab_split
        h = model.hidden
        rows = vocab_rows(model.vocab) if vocab_split is None else vocab_split.rows
        self.vocab_start = 0 if vocab_split is None else vocab_split.start  # this rank's first vocabulary row
        self.wte = nn.Parameter(torch.empty(rows, h, device=device, dtype=dtype))
        # the untied classifier [V, h]; its gradient comes from the classifier only, wte's from the input side
        self.lm_head = (None if model.tied_embeddings
                        else nn.Parameter(torch.empty(rows, h, device=device, dtype=dtype)))
        self.lnf_w = nn.Parameter(torch.empty(h, device=device, dtype=dtype))
        self.lnf_b = nn.Parameter(torch.empty(h, device=device, dtype=dtype)) if model.norm == "layernorm" else None
        self.layers = nn.ModuleList(LayerWeights(model, layers, device, dtype, layer=i) for i in range(layers))
        if mtp_layer is None:
            mtp_layer = lambda i: LayerWeights(model, model.layers, device, dtype, layer=i,  # noqa: E731
                                               moe=model.mtp_moe)
        self.mtp = nn.ModuleList(MTPWeights(model, mtp_layer(model.layers + k), device, dtype, tp)
                                 for k in range(model.mtp_layers if mtp else 0))

    @property
    def head(self) -> nn.Parameter:
        """The classifier's weight [V, h]: the tied embedding or the untied ``lm_head``."""
        return self.wte if self.lm_head is None else self.lm_head

    VOCAB_ROWS = ("wte", "lm_head")  # split over the TP ranks by vocabulary rows where ``vocab_split`` is given

    def split_over_tp(self, name: str) -> bool:
        """Whether the outer parameter ``name`` (`outer_parameters`) holds this TP rank's part only (its gradient is
        not summed over the TP group): the vocabulary's rows under ``vocab_split``, the modules' projections."""
        return ((self.vocab_split is not None and name in self.VOCAB_ROWS)
                or name.rsplit(".", 1)[-1] in MTPWeights.TP_ROWS)

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        """The token embedding of ``inputs`` (autograd; this rank's rows under TP + SP): a lookup, or under
        ``vocab_split`` the masked lookup of this rank's vocabulary rows summed over the TP group."""
        if self.vocab_split is None:
            return F.embedding(inputs, self.wte)
        return self.vocab_split.embed(inputs, self.wte)

    def classify(self, hf: torch.Tensor, targets: torch.Tensor, chunk: int, norm_tokens: int | None = None,
                 scratch: torch.Tensor | None = None, row_weights: torch.Tensor | None = None) -> torch.Tensor:
        """The chunked classifier and cross-entropy of the final-normed rows ``hf`` (`ChunkedHead`), over this
        rank's vocabulary rows under ``vocab_split``."""
        return ChunkedHead.apply(hf, self.head, targets, chunk, norm_tokens, self.vocab, scratch, row_weights,
                                 self.vocab_split)

    def outer_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) of everything outside the layers (embedding, classifier, final norm, and the
        multi-token-prediction modules' norms and projections)."""
        return [(n, p) for n, p in self.named_parameters(recurse=False)] + [
            (f"mtp.{k}.{n}", p) for k, mod in enumerate(self.mtp) for n, p in mod.outer_parameters()]

    def unit_layers(self) -> list[nn.Module]:
        """Every layer this model runs, in the order of their runtimes' indices: the layers, then the
        multi-token-prediction modules' (`memo_exec.mtp`)."""
        return [*self.layers, *(mod.layer for mod in self.mtp)]

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm (autograd), LayerNorm or RMSNorm as the layers'."""
        return norm(x, self.lnf_w, self.lnf_b)

    def init_(self, seed: int, layer_fn=None, layers: int | None = None) -> None:
        """Seeded init (the generator lives on the parameters' device, so CUDA init is fast; CPU and
        CUDA runs with one seed therefore start from different weights). With ``layer_fn`` (the
        distributed executor) each of the model's ``layers`` layers is drawn whole, in the same
        generator order, and handed to ``layer_fn(i, whole_layer)`` to keep a shard of; a MoE layer's
        routed experts are left out of the whole layer: ``layer_fn`` draws its own by expert index
        (`memo_exec.moe.weights.MoEWeights.init_experts_`). The multi-token-prediction modules come
        last, each its layer (model layer ``layers + k``, handed over alike) then its projection."""
        g = torch.Generator(device=self.wte.device).manual_seed(seed)
        with torch.no_grad():
            _init_rows_(self.wte, self.cfg.vocab, g, self.vocab_start)
            self.lnf_w.fill_(1.0)
            if self.lnf_b is not None:
                self.lnf_b.zero_()
            if self.lm_head is not None:
                _init_rows_(self.lm_head, self.cfg.vocab, g, self.vocab_start)
        if layer_fn is None:
            for lw in self.layers:
                lw.init_(g, seed=seed)
            for mod in self.mtp:  # after the layers: each module's layer, then its projection
                mod.layer.init_(g, seed=seed)
                mod.init_(g)
            return
        for i in range(layers):  # a MoE layer drawn whole but for its routed experts (seeded per expert)
            whole = LayerWeights(self.cfg, layers, self.wte.device, self.wte.dtype, layer=i, experts=(0, 0))
            whole.init_(g)
            layer_fn(i, whole)
            del whole
        L = self.cfg.layers
        for k, mod in enumerate(self.mtp):
            whole = LayerWeights(self.cfg, L, self.wte.device, self.wte.dtype, layer=L + k, experts=(0, 0),
                                 moe=self.cfg.mtp_moe)
            whole.init_(g)
            layer_fn(L + k, whole)
            del whole
            mod.init_(g)

    @property
    def vocab(self) -> int:
        """The real vocabulary (the weights hold `padded_vocab` rows)."""
        return self.cfg.vocab

    def alloc_grads(self) -> None:
        """Preallocate every ``.grad`` (layer backwards accumulate into them in place)."""
        for p in self.parameters():
            p.grad = torch.zeros_like(p)

    def zero_grads(self) -> None:
        for p in self.parameters():
            if p.grad is not None:
                p.grad.zero_()

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters())


class LayerHooks:
    """What runs around a layer besides its math (the distributed executor's ZeRO gathers and
    gradient reductions, `memo_exec.distributed.zero.GradSync`); nothing on one device.
    ``i`` is the position of the layer in the runtime list, which is also its unit."""

    def before_forward(self, i: int) -> None:
        return None

    def after_forward(self, i: int) -> None:
        return None

    def before_backward(self, i: int) -> None:
        return None

    def after_backward(self, i: int) -> None:
        return None


NO_HOOKS = LayerHooks()


class ChainedHooks(LayerHooks):
    """Several hooks around each layer, in order (the dense units' `GradSync`, then the routed experts')."""

    def __init__(self, *hooks: LayerHooks) -> None:
        self.hooks = hooks

    def before_forward(self, i: int) -> None:
        for h in self.hooks:
            h.before_forward(i)

    def after_forward(self, i: int) -> None:
        for h in self.hooks:
            h.after_forward(i)

    def before_backward(self, i: int) -> None:
        for h in self.hooks:
            h.before_backward(i)

    def after_backward(self, i: int) -> None:
        for h in self.hooks:
            h.after_backward(i)


class MainGrads(LayerHooks):
    """Megatron's fp32 main gradients on one device. Every parameter keeps a ``dtype`` (fp32) main
    gradient the optimizer reads; a layer's backward accumulates into 16-bit ``.grad`` buffers that
    exist only during that backward (`before_backward` allocates them, `after_backward` adds them
    into the main gradients and frees them); the other parameters' 16-bit gradients (embedding,
    final norm, classifier), formed by autograd during the backward, are added by `fold_rest`."""

    def __init__(self, gpt: "GPT", dtype: torch.dtype) -> None:
        self.gpt = gpt
        self.main = {p: torch.zeros_like(p, dtype=dtype) for p in gpt.parameters()}
        self.layers = gpt.unit_layers()  # by runtime index: the layers, then the modules' (`memo_exec.mtp`)
        layer_ids = {id(p) for lw in self.layers for p in lw.parameters()}
        self.rest = [p for p in gpt.parameters() if id(p) not in layer_ids]
        for p in gpt.parameters():
            p.grad = None

    def before_backward(self, i: int) -> None:
        for p in self.layers[i].parameters():
            p.grad = torch.zeros_like(p)

    def after_backward(self, i: int) -> None:
        with torch.no_grad():
            for p in self.layers[i].parameters():
                self.main[p].add_(p.grad)
                p.grad = None

    def fold_rest(self) -> None:
        with torch.no_grad():
            for p in self.rest:
                if p.grad is not None:
                    self.main[p].add_(p.grad)
                    p.grad = None

    def zero_(self) -> None:
        for g in self.main.values():
            g.zero_()

    @staticmethod
    def layer_grad_bytes(weights: "LayerWeights") -> int:
        """The 16-bit gradients one layer's backward holds beside its other transients."""
        return sum(p.numel() * p.element_size() for p in weights.parameters())


class LayerRuntime:
    """Binds layer i's weights to the shared compute and the activation policy."""

    def __init__(self, index: int, weights: LayerWeights, policy, compute: LayerCompute, timer,
                 hooks: LayerHooks = NO_HOOKS) -> None:
        self.index, self.weights, self.policy, self.compute, self.timer = index, weights, policy, compute, timer
        self.hooks = hooks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.hooks.before_forward(self.index)
        try:
            return self._forward(x)
        finally:
            self.hooks.after_forward(self.index)

    def backward(self, dy: torch.Tensor) -> torch.Tensor:
        self.hooks.before_backward(self.index)
        dx = self._backward(dy)
        self.hooks.after_backward(self.index)
        return dx

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        i, pol, comp = self.index, self.policy, self.compute
        st = pol.storage_for_forward(i)
        if x.data_ptr() != st.x.data_ptr():
            with self.timer.span("input_copy", i, "fwd"):
                st.x.copy_(x.reshape(st.x.shape))
        out = pol.output_for(i)
        if out is None:
            out = torch.empty(comp.T, comp.h, dtype=comp.dtype, device=comp.device)
        comp.forward(self.weights, st, out, i, before_output=lambda: pol.before_output_write(i))
        pol.after_forward(i)
        self.timer.memory_sample()
        return out.detach()

    def _backward(self, dy: torch.Tensor) -> torch.Tensor:
        i, pol = self.index, self.policy
        st = pol.storage_for_backward(i, self.weights)
        dx = self.compute.backward(self.weights, st, dy, i)
        pol.after_backward(i)
        self.timer.memory_sample()
        return dx


class LayerFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, rt: LayerRuntime) -> torch.Tensor:
        ctx.rt = rt
        return rt.forward(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        return ctx.rt.backward(dy), None


def _init_rows_(w: torch.Tensor, vocab: int, g: torch.Generator, start: int = 0) -> None:
    """Rows ``start..`` of the weight whose first ``vocab`` rows are drawn as an unpadded weight would be (drawn
    whole: the generator advances alike on every TP rank, which keeps its rows), the padding rows zero."""
    whole = torch.randn((vocab, w.shape[1]), generator=g, device=w.device)
    w.zero_()
    n = max(0, min(w.shape[0], vocab - start))
    w[:n].copy_(whole[start:start + n].mul_(0.02))


class ChunkedHead(torch.autograd.Function):
    """Cross-entropy of ``hf @ W^T`` over chunks, summed and divided by ``norm_tokens`` (default:
    the rows here, i.e. the mean; a rank of a distributed run passes the global token count so
    that the ranks' parts sum to the mean); gradients are formed in the forward pass. With
    ``row_weights`` (one per row, in the accumulation dtype) each row's loss and gradient are
    weighted by it instead (the model's and its multi-token-prediction modules' rows in one pass,
    `memo_exec.mtp`: 1 / tokens for the model's, 0 for a position a module has no label for).
    With ``split`` (`memo_exec.vocab_parallel.VocabSplit`) ``W`` is this TP rank's vocabulary rows: the
    TP group's rows in, each chunk's log-sum-exp and target logits combined over the group, ``d_hf``
    summed back to this rank's rows (the loss this rank's rows' part)."""

    @staticmethod
    def forward(ctx, hf: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, chunk: int,
                norm_tokens: int | None = None, vocab: int | None = None,
                scratch: torch.Tensor | None = None, row_weights: torch.Tensor | None = None,
                split=None) -> torch.Tensor:
        T = norm_tokens or hf.shape[0]
        acc = acc_dtype(hf.dtype)
        own = None  # under TP + SP: which of the group's rows are this rank's (its loss)
        if split is not None:
            hf, targets, row_weights, own = split.rows_in(hf, targets, row_weights)
        start = 0 if split is None else split.start  # the vocabulary row of W's first
        d_hf = torch.empty_like(hf)
        d_w = torch.zeros_like(w)
        total = torch.zeros((), dtype=acc, device=hf.device)
        rows = hf.shape[0]
        place = ChunkPlace(scratch, min(chunk, rows), w.shape[0], hf.dtype, acc)
        chunk = place.rows or chunk
        for c0 in range(0, rows, chunk):
            c1 = min(rows, c0 + chunk)
            hc, tc = hf[c0:c1], targets[c0:c1]
            logits = torch.mm(hc, w.t(), out=place.logits(c1 - c0)) if place.rows else torch.mm(hc, w.t())
            lf = place.widened(logits) if place.rows else (logits.to(acc) if logits.dtype != acc else logits)
            if vocab is not None and vocab - start < lf.shape[1]:
                lf[:, max(0, vocab - start):] = float("-inf")  # padding rows (`padded_vocab`): no probability
            wc = row_weights[c0:c1] if row_weights is not None else None
            if split is None:
                lse = torch.logsumexp(lf, dim=-1)
                nll = lse - lf.gather(1, tc.unsqueeze(1)).squeeze(1)
                at, hit = tc.unsqueeze(1), None
            else:
                lse, nll, at, hit = split.lse_nll(lf, tc)
            if own is not None:
                nll = nll * own[c0:c1]
            total += nll.sum() if wc is None else (nll * wc).sum()
            lf.sub_(lse.unsqueeze(1)).exp_()
            one = (torch.full((c1 - c0, 1), -1.0, dtype=acc, device=hf.device) if hit is None
                   else -hit.to(acc).unsqueeze(1))  # the target's column where this rank holds it
            lf.scatter_add_(1, at, one)
            if wc is None:
                lf.mul_(1.0 / T)
            else:
                lf.mul_(wc.unsqueeze(1))
            g = place.narrowed(lf, logits) if place.rows else (lf.to(hf.dtype) if lf.dtype != hf.dtype else lf)
            torch.mm(g, w, out=d_hf[c0:c1])
            d_w.addmm_(g.t(), hc)
            del logits, lf, lse, g, nll
        if split is not None:
            d_hf = split.rows_out(d_hf)
        ctx.save_for_backward(d_hf, d_w)
        return (total / T).to(acc) if row_weights is None else total.to(acc)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        d_hf, d_w = ctx.saved_tensors
        scale = g.to(d_hf.dtype)
        return d_hf.mul_(scale), d_w.mul_(scale), None, None, None, None, None, None, None


class ChunkPlace:
    """Where `ChunkedHead` puts one chunk's logits ([rows, V], compute dtype; its gradient ``g``
    reuses them) and their fp32 copy: in ``scratch`` (the memory plan's arena, free between the
    layers' forward and backward) when at least `MIN_ARENA_ROWS` rows fit, the chunk cut to the
    rows that fit (a multiple of 128); else (``rows`` 0) from the caching allocator."""

    MIN_ARENA_ROWS = 1024

    def __init__(self, scratch: torch.Tensor | None, chunk: int, V: int, dtype: torch.dtype,
                 acc: torch.dtype) -> None:
        self.V, self.dtype, self.acc = V, dtype, acc
        e = torch.empty((), dtype=dtype, device="meta").element_size()
        a = torch.empty((), dtype=acc, device="meta").element_size() if acc != dtype else 0
        self.split = 0
        self.rows = 0
        if scratch is None:
            return
        self.a = a
        rows = self.rows_for(scratch.numel(), chunk, V, e, a)
        if rows:
            self.rows, self.scratch = rows, scratch
            self.split = -(-rows * V * e // self.ALIGN) * self.ALIGN  # the fp32 copy starts aligned

    ALIGN = 256

    @classmethod
    def rows_for(cls, scratch_bytes: int, chunk: int, V: int, e: int, a: int) -> int:
        """Rows of a chunk placed in ``scratch_bytes`` (0: not placed) for ``V`` logits of ``e``
        bytes and their ``a``-byte copy (0 when the compute dtype is fp32 already)."""
        fit = max(0, scratch_bytes - cls.ALIGN) // (V * (e + a))
        rows = min(chunk, fit if fit >= chunk else fit // 128 * 128)
        return rows if rows >= min(chunk, cls.MIN_ARENA_ROWS) else 0

    def logits(self, n: int) -> torch.Tensor:
        return self._carve(0, n, self.dtype)

    def widened(self, logits: torch.Tensor) -> torch.Tensor:
        return self._carve(self.split, logits.shape[0], self.acc).copy_(logits) if self.a else logits

    def _carve(self, offset: int, n: int, dtype: torch.dtype) -> torch.Tensor:
        """[n, V] of ``dtype`` at byte ``offset`` of the scratch (exactly its bytes: the arena's
        length need not be a multiple of the element size)."""
        nb = n * self.V * torch.empty((), dtype=dtype, device="meta").element_size()
        return self.scratch[offset:offset + nb].view(dtype).view(n, self.V)

    def narrowed(self, lf: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return lf if lf is logits else logits.copy_(lf)


def forward_loss(gpt: GPT, runtimes: list[LayerRuntime], inputs: torch.Tensor, targets: torch.Tensor,
                 chunk: int, timer, norm_tokens: int | None = None, arena=None, mtp=None) -> torch.Tensor:
    """Embedding -> layers -> final norm -> chunked classifier; returns the mean loss (autograd),
    or this rank's part of it when ``norm_tokens`` is the global token count. ``arena``: the memory
    plan's `memo_exec.arena.ArenaScratch`, whose arena holds the classifier's chunk tensors. ``mtp``:
    the multi-token-prediction modules' rows of this batch (`memo_exec.mtp.MTPBatch`): they run on the
    last layer's output and join the classifier's rows, the loss then the model's plus theirs, weighted."""
    h = gpt.cfg.hidden
    with timer.span("embedding", None, "fwd"):
        x = gpt.embed(inputs.reshape(-1))
    for rt in runtimes:
        x = LayerFn.apply(x, rt)
    with timer.span("final_norm", None, "fwd"):
        hf = gpt.final_norm(x.reshape(-1, h))
    targets, weights = targets.reshape(-1), None
    if mtp is not None:
        hf, targets, weights = mtp.forward(gpt, x.reshape(-1, h), hf, targets, norm_tokens or hf.shape[0])
    with timer.span("classifier", None, "fwd"):
        scratch = arena.between_layers() if arena is not None else None  # `memo_exec.arena.ArenaScratch`
        loss = gpt.classify(hf, targets, chunk, norm_tokens, scratch, weights)
    return loss


def norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The model's norm over the last dimension with autograd: LayerNorm when it has a shift ``b``,
    else RMSNorm (the layers' kernel and hand-written backward)."""
    if b is not None:
        return F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)
    return _RMSNormFn.apply(x.reshape(-1, x.shape[-1]), w).view(x.shape)


class _RMSNormFn(torch.autograd.Function):
    """The final RMSNorm with the layers' forward and hand-written backward (`memo_exec.layer`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        rstd = torch.empty(x.shape[0], dtype=norm_stats_dtype(x.dtype, x.device), device=x.device)
        rms_norm(x, w, LN_EPS, out, rstd)
        ctx.save_for_backward(x, w, rstd)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: torch.Tensor):
        x, w, rstd = ctx.saved_tensors
        dw = torch.zeros_like(w)
        dx = rms_norm_backward(dout.contiguous(), x, rstd.unsqueeze(1), w, dw)
        return dx, dw
