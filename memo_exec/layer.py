"""One pre-norm transformer layer with a hand-written backward, in the op order of
`memo_sim.model.layer_graph` (ln1, qkv, attention, out_proj, add1, ln2, fc1, act, fc2, add2).

The layer never allocates its skeletal tensors: it reads and writes the `LayerStorage` the
activation policy hands it (x, ln1, q, k, v, attn, h1, ln2, fc1, act as token-major ``[T, width]``
tensors, plus the norm statistics and the attention backend's lse). The norms are the model's
(`ModelConfig.norm`): LayerNorm (aten's kernels) or RMSNorm (`rms_norm`, `rms_norm_backward`);
the linears carry the biases `layer_biases` names. Transient tensors come
from a scratch allocator by name (`memo_exec.arena`). Weight and bias gradients are accumulated
in place into preallocated ``.grad`` tensors (``addmm_`` / ``addmv_``), so the backward returns
only the gradient of the layer input.

The last op (add2) writes y straight into the next layer's input slot, which may be a rounding
buffer an offload copy still reads; ``forward`` calls a ``before_output`` callback right before
that op, so the policy's wait sits exactly where the memory is overwritten.

Token-wise recompute (MEMO): every op but the attention core is row-wise, so ``recompute_tokens``
rebuilds rows ``[start, T)`` of ln1, q, k, v, h1, ln2, fc1, act from x and the attention output.

Mixture of experts (`memo_exec.moe`): on a MoE layer (weights with ``moe``) the block replaces fc1,
act and fc2: forward writes ``y = h1 + block(ln2)``; backward asks the block for d ln2 (it rebuilds
its internals from ln2 and its kept routing unless a store-all storage kept them) and goes on from
ln2's backward; the recomputes stop after ln2 (fc1 and act stay unused on such a layer).

Tensor parallelism (`memo_exec.distributed.tp`): the same code runs one TP rank's shard of the
layer. ``tp`` is a `TPComm` with two collectives, ``gather`` (entering a column-parallel region:
all-gather of the sequence with Megatron SP, identity without) and ``reduce`` (leaving a
row-parallel region: reduce-scatter with SP, all-reduce without); its size p shards q/k/v/attn
(heads), fc1/act (FFN columns) and the weights. The tensors with ``tp_split`` (layer graph) have
``row_mult`` rows per local token (p with SP: gathered rows, in the interleaved order
`memo_exec.distributed.context` assigns tokens in, so the first n local tokens of every rank
are the first n*p gathered rows), the others one; `storage_shapes` says so, and token-wise
recompute rebuilds local rows ``[start, T)`` and gathered rows ``[start*p, T*p)``. With
``IDENTITY_TP`` (one rank) every hook is the identity and nothing is copied.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from memo_exec.attention import AttentionBackend, AttnDims, layer_needs, value_width
from memo_exec.attention_sinks import apply_sinks, sinks_grad
from memo_exec.errors import BackendError, ExecError
from memo_exec.device import acc_dtype
from memo_exec.gemm_formats import layer_gemm
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import SKELETAL_NAMES, layer_tensors, sp_kept_inputs

# weights every TP rank holds whole whose gradient each rank sums over its own heads only: the QK norms'
# (summed over the TP group with or without sequence parallelism, `memo_exec.distributed.zero.GradSync`)
HEAD_SHARED = ("lnq_w", "lnk_w")
SKELETAL = SKELETAL_NAMES  # the layer graph's saved tensors; lse lives in the backend's aux
ALIGN = 256
LN_EPS = 1e-5


def dense_view(model: ModelConfig) -> ModelConfig:
    """``model`` without its experts: the dense layer whose skeletal tensors the executor saves for
    every layer of a MoE model too (fc1 and act for its ``dense_layers``; a MoE layer's block keeps its
    own state instead, `memo_exec.moe.block`)."""
    return model.dense_view()


def _tensor_specs(model: ModelConfig):
    return layer_tensors(dense_view(model))


MLA_LATENTS = ("q_lat", "q_latn", "kv_lat", "kv_latn")  # latent attention's kept latents (the layer graph's)


def skeletal_names(model: ModelConfig) -> tuple[str, ...]:
    """The skeletal tensors of ``model``'s layer: `SKELETAL`, with latent attention's latents after ln1 (the layer
    graph's order: `memo_sim.model.layer_graph`; q_lat and q_latn where the queries have a latent)."""
    if not model.mla:
        return SKELETAL
    specs = _tensor_specs(model)
    return SKELETAL[:2] + tuple(n for n in MLA_LATENTS if n in specs) + SKELETAL[2:]


def written_skeletal(model: ModelConfig) -> tuple[str, ...]:
    """The skeletal tensors some layer of ``model`` writes: `skeletal_names`, less fc1 and act where every layer is a
    MoE layer (its block replaces fc1, act and fc2 and keeps its own tensors, `memo_exec.moe.block`; the
    simulator's MoE layer has neither)."""
    names = skeletal_names(model)
    if model.moe and not model.mixes_dense_layers:
        return tuple(n for n in names if n not in ("fc1", "act"))
    return names


def skeletal_widths(model: ModelConfig) -> dict[str, int]:
    specs = _tensor_specs(model)
    return {n: specs[n].width for n in skeletal_names(model)}


def storage_shapes(model: ModelConfig, tp: int = 1, sp: bool = True, kept: bool = False) -> dict[str, tuple[int, int]]:
    """Skeletal tensor -> (rows per local token, width) on one rank of a Megatron TP group of size
    ``tp``: the ``tp_split`` tensors (q, k, v, attn, fc1, act) are 1/tp as wide and, with sequence
    parallelism, hold the gathered rows of the whole group (tp rows per local token); so do the
    column-parallel GEMMs' inputs (ln1, ln2) where the layer keeps them gathered for the weight
    gradients (``kept``: the plan's ``sp_input_kept``, torch's ColwiseParallel; `layer_graph.sp_kept_inputs`)."""
    specs = _tensor_specs(model)
    gathered = sp_kept_inputs(model) if kept and sp and tp > 1 else {}
    out = {}
    for n in skeletal_names(model):
        s = specs[n]
        if s.tp_split and tp > 1:
            out[n] = (tp if sp else 1, s.width // tp)
        elif n in gathered:
            out[n] = (tp, s.width)
        else:
            out[n] = (1, s.width)
    return out


def _shapes(model: ModelConfig, shapes) -> dict[str, tuple[int, int]]:
    return shapes if shapes is not None else {n: (1, w) for n, w in skeletal_widths(model).items()}


def skeletal_roles(model: ModelConfig) -> dict[str, str]:
    specs = _tensor_specs(model)
    return {n: specs[n].role for n in skeletal_names(model)}


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def storage_bytes(model: ModelConfig, tokens: int, dtype: torch.dtype, names=None, shapes=None) -> int:
    """Bytes of the named skeletal tensors (default every one, `skeletal_names`) for ``tokens`` local tokens
    (``shapes``: `storage_shapes`)."""
    esize = torch.empty((), dtype=dtype, device="meta").element_size()
    sh = _shapes(model, shapes)
    return sum(_align(tokens * sh[n][0] * sh[n][1] * esize) for n in (names or skeletal_names(model)))


def stats_bytes(tokens: int, dtype: torch.dtype) -> int:
    return 4 * tokens * torch.empty((), dtype=acc_dtype(dtype), device="meta").element_size()


_STATS_DTYPE: dict[tuple[str, torch.dtype], torch.dtype] = {}


def norm_stats_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """dtype of LayerNorm's saved mean/rstd as this device's kernel returns them (fp32 for bf16 on CUDA,
    the input dtype on CPU); the backward kernel wants them back in that dtype."""
    key = (torch.device(device).type, dtype)
    if key not in _STATS_DTYPE:
        _, mean, _ = torch.native_layer_norm(torch.zeros(1, 8, dtype=dtype, device=device), [8], None, None, LN_EPS)
        _STATS_DTYPE[key] = mean.dtype
    return _STATS_DTYPE[key]


class LayerStorage:
    """Where one layer's skeletal tensors live: named ``[T, width]`` views, norm stats, attention aux."""

    def __init__(self, tensors: dict[str, torch.Tensor], stats: torch.Tensor) -> None:
        self.tensors = tensors
        self.stats = stats  # [4, T]: mean1, rstd1, mean2, rstd2 (RMSNorm: the mean rows are unused)
        self.aux: Any = None  # attention backend state for the backward (lse, RNG state)
        # FP8 GEMMs: the scale each GEMM's input was cast with in the forward, by op, which a recompute of some rows
        # casts them with again (their own amax would give other values than the forward's; `LayerCompute._cast`)
        self.fp8_scales: dict[str, Any] = {}
        self.moe: Any = None  # a MoE layer's routing (and, under store all, its block's graph): `memo_exec.moe.block`
        self.keep_moe_internals = False  # set by a policy that keeps every activation (store all)
        self.moe_recompute_act = False  # kept internals but the routed experts' activation output (recompute_norm_act)
        self.ln2_rebuilt = False  # ln2 in a buffer other layers overwrite, rebuilt before this layer's backward

    def __getattr__(self, name: str) -> torch.Tensor:
        try:
            return self.__dict__["tensors"][name]
        except KeyError:
            raise AttributeError(name) from None

    def with_x(self, x: torch.Tensor) -> "LayerStorage":
        t = dict(self.tensors)
        t["x"] = x
        s = LayerStorage(t, self.stats)
        s.aux, s.moe, s.keep_moe_internals, s.fp8_scales = self.aux, self.moe, self.keep_moe_internals, self.fp8_scales
        s.moe_recompute_act, s.ln2_rebuilt = self.moe_recompute_act, self.ln2_rebuilt
        return s


def carve_storage(block: torch.Tensor, model: ModelConfig, tokens: int, dtype: torch.dtype,
                  names=None, shapes=None) -> dict[str, torch.Tensor]:
    """Cut named ``[rows, width]`` views out of one uint8 block (256-byte aligned); rows = tokens x
    the tensor's rows per token (``shapes``: `storage_shapes`; default one row of the full width)."""
    sh = _shapes(model, shapes)
    esize = torch.empty((), dtype=dtype, device="meta").element_size()
    out, off = {}, 0
    for n in names or skeletal_names(model):
        rows, w = tokens * sh[n][0], sh[n][1]
        nb = rows * w * esize
        out[n] = block[off:off + nb].view(dtype).view(rows, w)
        off += _align(nb)
    return out


def layer_biases(model: ModelConfig) -> tuple[str, ...]:
    """The bias parameters one layer carries under the model's ``bias`` setting (`memo_sim.model.config`):
    bqkv (all, qkv), bo (all), b1 and b2 (all, GELU FFN only: a SwiGLU FFN never has biases)."""
    out = ("bqkv",) if model.bias in ("all", "qkv") else ()
    if model.bias == "all":
        out += ("bo",) + (() if model.ffn_type == "swiglu" else ("b1", "b2"))
    return out


class LayerWeights(nn.Module):
    """Weights of one layer; sizes match `ModelConfig.layer_params` exactly. A parameter the model's
    architecture does not have (an RMSNorm's shift ``ln*_b``, a bias `layer_biases` leaves out) is
    None and absent from ``named_parameters()``."""

    # parameters whose rows (dim 0) / columns (dim 1) are split over the TP ranks; the rest
    # (the norms, the row-parallel biases bo and b2) are replicated on every TP rank; the sinks are per query head
    TP_ROWS = ("wqkv", "bqkv", "w1", "b1", "sinks")
    TP_COLS = ("wo", "w2")

    def __init__(self, model: ModelConfig, layers: int, device, dtype, tp: int = 1, layer: int | None = None,
                 experts: tuple[int, int] | None = None, moe: bool | None = None,
                 expert_tp: tuple[int, int] = (1, 0)) -> None:
        """``layer``: the model layer these weights are (None: a dense layer, for sizes and traces); a MoE
        model's layer that is not a dense one (`ModelConfig.dense_layer_at`; ``moe`` given: where it is True,
        as a multi-token-prediction module's layer ``layers + k`` is of the last layer's kind, `memo_exec.mtp`)
        has the MoE block ``moe`` (`memo_exec.moe.weights`) instead of w1/w2/b1/b2, holding routed experts
        ``[first, first + n)`` = ``experts`` (default all), each as slice ``expert_tp[1]`` of ``expert_tp[0]`` under
        expert tensor parallelism (`memo_exec.moe.weights`)."""
        super().__init__()
        h, kv, f = model.hidden, model.kv_dim // tp, model.ffn // tp
        hq = model.q_dim // tp  # the queries' width: heads x head size (hidden, but where head_dim says otherwise)
        mk = lambda *s: nn.Parameter(torch.empty(*s, device=device, dtype=dtype))  # noqa: E731
        biases = layer_biases(model)
        opt = lambda name, *s: mk(*s) if name in biases else None  # noqa: E731
        shift = model.norm == "layernorm"
        self.ln1_w, self.ln1_b = mk(h), mk(h) if shift else None
        if model.mla:  # latent attention (DeepSeek-V2/V3): down projections, their RMSNorms, up projections
            r, lr, tail = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_dim
            self.wqkv = self.bqkv = None
            self.wq = None if r else mk(hq, h)
            self.wq_down, self.ln_qlat_w, self.wq_up = (mk(r, h), mk(r), mk(hq, r)) if r else (None, None, None)
            self.wkv_down, self.ln_kvlat_w = mk(lr + tail, h), mk(lr)
            self.wkv_up = mk(model.heads * (model.head_dim + model.value_head_dim) // tp, lr)
        else:
            self.wqkv, self.bqkv = mk(hq + 2 * kv, h), opt("bqkv", hq + 2 * kv)
            self.wq = self.wq_down = self.ln_qlat_w = self.wq_up = self.wkv_down = self.ln_kvlat_w = None
            self.wkv_up = None
        self.wo, self.bo = mk(h, model.attn_dim // tp), opt("bo", h)
        # QK norms (Qwen3): one RMSNorm weight over the head size for every query head, one for every key head
        self.lnq_w, self.lnk_w = (mk(model.qk_head_dim), mk(model.qk_head_dim)) if model.qk_norm else (None, None)
        # attention sinks (GPT-OSS): one learned logit per query head in every softmax's denominator
        # (`memo_exec.attention_sinks`)
        self.sinks = mk(model.heads // tp) if model.attention_sinks else None
        self.ln2_w, self.ln2_b = mk(h), mk(h) if shift else None
        self.swiglu = model.ffn_type == "swiglu"
        self.index = layer
        # the keys each query sees: the last ``window`` tokens (a sliding-window layer), or every earlier one (0)
        self.window = model.window_at(layer) or 0 if layer is not None else 0
        # a chunked layer's (Llama 4): each query sees the earlier keys of its own ``chunk`` tokens (0: not chunked)
        self.chunk = model.chunk_at(layer) or 0 if layer is not None else 0
        if model.moe and layer is not None and (not model.dense_layer_at(layer) if moe is None else moe):
            from memo_exec.moe.weights import MoEWeights  # noqa: PLC0415

            first, n = experts if experts is not None else (0, model.experts)
            self.moe = MoEWeights(model, device, dtype, tp, first, n, expert_tp)
            self.w1 = self.w2 = self.b1 = self.b2 = None
        else:
            self.moe = None
            self.w1 = mk(model.fc1_width // tp, h)
            self.w2 = mk(h, f)
            self.b1 = opt("b1", f)
            self.b2 = opt("b2", h)
        self._layers = layers
        self.tp = tp

    def init_(self, gen: torch.Generator, std: float = 0.02, seed: int | None = None) -> None:
        """Draw the weights from ``gen`` in parameter order; a MoE layer's routed experts are not
        drawn from it but from their own seeds (``seed``: the run's; `memo_exec.moe.weights`), so a
        layer holding some or none of them consumes ``gen`` exactly as one holding all."""
        out_std = std / (2 * self._layers) ** 0.5
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("moe.expert_"):
                    continue
                if name.startswith("ln") and name.endswith("_w"):
                    p.fill_(1.0)
                elif name.startswith("b") or name.endswith("_b"):
                    p.zero_()
                else:
                    s = out_std if name in ("wo", "w2", "moe.shared_w2") else std
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32, device=p.device).mul_(s))
        if seed is not None:
            self.init_experts_(seed, std)

    def init_experts_(self, seed: int, std: float = 0.02) -> None:
        """A MoE layer's routed experts from their own seeds (after `init_` drew the rest)."""
        if self.moe is not None:
            self.moe.init_experts_(seed, self.index, std, std / (2 * self._layers) ** 0.5)

    def grad(self, name: str) -> torch.Tensor:
        return getattr(self, name).grad


class _NullTimer:
    @contextlib.contextmanager
    def span(self, op, layer, phase, stream="compute", nbytes=0, flops=0):
        yield


class TPComm:
    """Tensor parallelism of size 1: both hooks are the identity (no copy, no scratch).

    A TP flavour's communicator (`memo_exec.distributed.tp`) overrides:
    ``gather(t, X, name)``: ``[n, h]`` local rows -> ``[n*row_mult, h]`` (a scratch tensor named
    ``name`` from ``X``, or ``t`` itself); ``reduce(partial, out)``: partial sums
    ``[n*row_mult, h]`` -> ``out`` ``[n, h]`` (in place allowed when row_mult is 1);
    ``release(X, name)`` frees what ``gather`` took.
    """

    size = 1
    row_mult = 1
    sp = False
    kept = False  # the column-parallel GEMMs' gathered inputs kept in the layer's storage (``sp_input_kept``)

    def gather(self, t: torch.Tensor, X, name: str) -> torch.Tensor:
        return t

    def gather_into(self, t: torch.Tensor, out: torch.Tensor) -> None:
        """``gather`` into ``out`` (a kept input's full-length storage rows) rather than a scratch buffer."""
        out.copy_(t)

    def reduce(self, partial: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if out.data_ptr() != partial.data_ptr():
            out.copy_(partial)
        return out

    def release(self, X, name: str) -> None:
        return None


IDENTITY_TP = TPComm()


class HeadNorms:
    """QK norms (Qwen3) for a layer's compute: `LayerCompute` and METP's (`memo_exec.metp.flavour`), which set
    ``qk_norm``, ``head`` (the head size), ``scratch``, ``dtype`` and ``eps``."""

    def _attention_qk(self, p: LayerWeights, S: LayerStorage) -> tuple[torch.Tensor, torch.Tensor]:
        """The queries and keys the attention core reads: the kept projections q and k or, with QK norms
        (Qwen3), their RMSNorm over each head in scratch (``q_normed``, ``k_normed``, freed by
        `_release_qk`). The layer keeps the projections, which its token-wise recompute rebuilds row by
        row, and normalises them again wherever the core runs: forward, recompute and backward."""
        if not self.qk_norm:
            return S.q, S.k
        X = self.scratch
        qn = X.get("q_normed", tuple(S.q.shape), self.dtype)
        kn = X.get("k_normed", tuple(S.k.shape), self.dtype)
        head_rms_norm(S.q, p.lnq_w, self.head, self.eps, qn)
        head_rms_norm(S.k, p.lnk_w, self.head, self.eps, kn)
        return qn, kn

    def _release_qk(self) -> None:
        if self.qk_norm:
            self.scratch.free("q_normed")
            self.scratch.free("k_normed")

    def _qk_norm_backward(self, p: LayerWeights, S: LayerStorage, d_q: torch.Tensor, d_k: torch.Tensor) -> None:
        """The gradients of the normalised heads become the projections' (in place); the norms' weight gradients
        accumulate."""
        if self.qk_norm:
            head_rms_norm_backward(d_q, S.q, p.lnq_w, self.head, self.eps)
            head_rms_norm_backward(d_k, S.k, p.lnk_w, self.head, self.eps)


@dataclass
class LayerCompute(HeadNorms):
    """The math of one layer (one TP rank's shard of it) for a given token count; shared by all
    layers (weights differ). ``seq`` is the sequence length the attention sees on this rank (its
    CP/Ulysses shard, TP-gathered); the layer input has ``batch*seq / tp.row_mult`` rows."""

    model: ModelConfig
    batch: int
    seq: int
    dtype: torch.dtype
    device: torch.device
    backend: AttentionBackend
    scratch: Any
    timer: Any = field(default_factory=_NullTimer)
    eps: float = LN_EPS
    tp: Any = IDENTITY_TP
    moe: Any = None  # the MoE block (`memo_exec.moe.block.MoEBlock`; a distributed rank's is set by its executor)

    def __post_init__(self) -> None:
        m, p = self.model, self.tp.size
        if m.moe and self.moe is None:
            from memo_exec.moe.block import MoEBlock  # noqa: PLC0415

            self.moe = MoEBlock(m, tp_size=p, tp_group=getattr(self.tp, "group", None))
        kvh = m.heads if m.mla else m.n_kv_heads  # latent attention's keys and values: one per query head
        self.dims = AttnDims(self.batch, self.seq, m.heads // p, kvh // p, m.qk_head_dim, v_head_dim=value_width(m))
        why = self.backend.why_not(replace(self.dims, **layer_needs(m)))  # windows, sinks: the layer's own kernel
        if why:
            raise BackendError(why)
        self.m = self.tp.row_mult
        self.Tg = self.batch * self.seq  # rows of the TP-split tensors (q, k, v, attn, fc1, act)
        self.T = self.Tg // self.m  # rows of x, ln1, h1, ln2 and the layer output
        self.h = m.hidden
        self.hq, self.kv, self.f = m.q_dim // p, m.kv_dim // p, m.ffn // p
        self.kvv, self.ha = m.v_dim // p, m.attn_dim // p  # the values' and the attention output's widths
        self.qk_norm, self.head = m.qk_norm, m.qk_head_dim
        self.gemm = layer_gemm(m.gemm_format)  # the linear GEMMs in the plan's format (`memo_exec.gemm_formats`)
        self.fc1w = m.fc1_width // p
        self.swiglu = m.ffn_type == "swiglu"
        self.rms = m.norm == "rmsnorm"
        self.ones = torch.ones(self.Tg, dtype=self.dtype, device=self.device)

    # ------------------------------------------------------------------ helpers
    def _norm(self, x, w, b, out, mean_out, rstd_out) -> None:
        """LayerNorm (mean and rstd saved) or, for an RMSNorm model, RMSNorm (rstd saved; the mean
        slot is left unused)."""
        if self.rms:
            rms_norm(x, w, self.eps, out, rstd_out)
            return
        o, mean, rstd = torch.native_layer_norm(x, [self.h], w, b, self.eps)
        out.copy_(o)
        mean_out.copy_(mean.view(-1))
        rstd_out.copy_(rstd.view(-1))

    def _norm_backward(self, dout, x, mean, rstd, w, b) -> torch.Tensor:
        if self.rms:
            return rms_norm_backward(dout, x, rstd, w, w.grad)
        return _layer_norm_backward(dout, x, mean, rstd, w, b)

    def _cast(self, x: torch.Tensor, S: LayerStorage, op: str, phase: str):
        """The GEMM input ``x`` of ``op`` cast as its format casts it (None: nothing to cast), with the scale the
        forward cast it with when a recompute rebuilds rows of it (MEMO's token-wise recompute casts the dropped
        rows alone, whose own amax would give other values than the forward's; a full recompute gets the same)."""
        if self.gemm.name == "bf16":
            return None
        keep = self.gemm.recompute_needs_scales  # per-tensor scales; a row's or a tile's own is the forward's
        cast = self.gemm.cast_input(x, S.fp8_scales.get(op) if phase == "recompute" and keep else None)
        if cast is not None and phase == "fwd" and keep:
            S.fp8_scales[op] = cast[1]
        return cast

    def _linear_backward(self, dout, inp, weight, bias, ones, d_in):
        """`_linear_backward` in the layer's GEMM format: weight (and bias) gradients accumulated, d_in = dout W."""
        self.gemm.wgrad(dout, inp, weight.grad)
        if bias is not None:
            bias.grad.addmv_(dout.t(), ones)
        return self.gemm.dgrad(dout, weight, d_in)

    def _qkv_slices(self, t: torch.Tensor):
        hq, kv = self.hq, self.kv
        return t[:hq], t[hq:hq + kv], t[hq + kv:]

    def _row_parallel(self, inp, w, b, out, X, name: str, cast=None) -> None:
        """out[n, h] = reduce(inp[n*m, :] @ w^T) + b (the TP group's partial sums reduced); ``cast``: `_cast`'s."""
        if self.tp.size == 1:
            self.gemm.forward(inp, w, out, b, cast)
            return
        part = X.get(name + "_partial", (inp.shape[0], self.h), self.dtype)
        self.gemm.forward(inp, w, part, None, cast)
        self.tp.reduce(part, out)
        X.free(name + "_partial")
        if b is not None:
            out.add_(b)

    def _dims(self, p: LayerWeights) -> AttnDims:
        """The attention shape of layer ``p``: a sliding-window layer's window (`ModelConfig.window_at`), a chunked
        layer's chunk (`ModelConfig.chunk_at`)."""
        return replace(self.dims, window=p.window, chunk=p.chunk) if p.window or p.chunk else self.dims

    def _attend(self, p: LayerWeights, q, k, v, out: torch.Tensor, X):
        """The attention core of layer ``p`` into ``out``: the backend's kernel over its window, then the layer's
        sinks (`memo_exec.attention_sinks`); what the backward needs (the backend's state)."""
        dims = self._dims(p)
        aux = self.backend.forward(q, k, v, out, dims, X)
        if p.sinks is not None:
            apply_sinks(out, aux, p.sinks, dims)
        return aux

    def _norm_out(self, stored: torch.Tensor, r: slice, X, name: str) -> torch.Tensor:
        """Where a norm writes the rank's rows of a column-parallel GEMM's input: its storage rows, or, where the
        layer keeps the input gathered (``tp.kept``), a scratch shard the gather reads (`_gathered_input`)."""
        return X.get(f"{name}_shard", (r.stop - r.start, self.h), self.dtype) if self.tp.kept else stored[r]

    def _gathered_input(self, shard: torch.Tensor, stored: torch.Tensor, rg: slice, X, name: str) -> torch.Tensor:
        """A column-parallel GEMM's input over the TP group's tokens from the rank's rows ``shard`` (`_norm_out`):
        gathered into scratch (Megatron's SP, gathered again in the backward) or into the layer's storage rows
        ``stored[rg]``, kept for the weight gradient (``tp.kept``)."""
        if not self.tp.kept:
            return self.tp.gather(shard, X, f"{name}_gathered")
        self.tp.gather_into(shard, stored[rg])
        X.free(f"{name}_shard")
        return stored[rg]

    def _release_input(self, X, name: str) -> None:
        if not self.tp.kept:
            self.tp.release(X, f"{name}_gathered")

    def _fwd_ops(self, p: LayerWeights, S: LayerStorage, layer: int, phase: str, start: int, attention: bool,
                 y_out: torch.Tensor | None, before_output: Callable[[], None] | None = None) -> None:
        X, sp, r, rg = self.scratch, self.timer.span, slice(start, self.T), slice(start * self.m, self.Tg)
        n, h, f = self.T - start, self.h, self.f
        ng = n * self.m
        with sp("ln1", layer, phase):
            ln1_out = self._norm_out(S.ln1, r, X, "ln1")
            self._norm(S.x[r], p.ln1_w, p.ln1_b, ln1_out, S.stats[0, r], S.stats[1, r])
        with sp("qkv", layer, phase):
            ln1 = self._gathered_input(ln1_out, S.ln1, rg, X, "ln1")
            del ln1_out
            if p.wqkv is None:  # latent attention (one TP rank: the rows are the rank's own)
                self._mla_forward(p, S, ln1, rg, X)
            else:
                bs = self._qkv_slices(p.bqkv) if p.bqkv is not None else (None, None, None)
                cast = self._cast(ln1, S, "qkv", phase)  # the fused projection's input, cast once (FP8)
                for w, b, out in zip(self._qkv_slices(p.wqkv), bs, (S.q, S.k, S.v)):
                    self.gemm.forward(ln1, w, out[rg], b, cast)
                del cast
            self._release_input(X, "ln1")
            del ln1
        if attention:
            with sp("attention", layer, phase):
                q, k = self._attention_qk(p, S)
                S.aux = self._attend(p, q, k, S.v, S.attn, X)
                self._release_qk()
                del q, k
        with sp("out_proj", layer, phase):
            proj = X.get("proj", (n, h), self.dtype)
            self._row_parallel(S.attn[rg], p.wo, p.bo, proj, X, "proj", self._cast(S.attn[rg], S, "out_proj", phase))
        with sp("add1", layer, phase):
            torch.add(S.x[r], proj, out=S.h1[r])
            X.free("proj")
            del proj
        with sp("ln2", layer, phase):
            ln2_out = S.ln2[r] if p.moe is not None else self._norm_out(S.ln2, r, X, "ln2")
            self._norm(S.h1[r], p.ln2_w, p.ln2_b, ln2_out, S.stats[2, r], S.stats[3, r])
        if p.moe is not None:  # a MoE layer: the block in place of fc1, act, fc2 (recompute: rebuilt in backward)
            if y_out is None:
                return
            with sp("moe", layer, phase):  # the block allocates its own tensors (caching allocator)
                moe_out = torch.empty(n, h, dtype=self.dtype, device=self.device)
                self.moe.forward(p.moe, S, moe_out, layer, phase)
            if before_output is not None:
                before_output()
            with sp("add2", layer, phase):
                torch.add(S.h1, moe_out, out=y_out)
                del moe_out
            return
        with sp("fc1", layer, phase):
            ln2 = self._gathered_input(ln2_out, S.ln2, rg, X, "ln2")
            self.gemm.forward(ln2, p.w1, S.fc1[rg], p.b1, self._cast(ln2, S, "fc1", phase))
            self._release_input(X, "ln2")
            del ln2, ln2_out
        with sp("act", layer, phase):
            if self.swiglu:
                sg = X.get("silu_gate", (ng, f), self.dtype)
                torch.ops.aten.silu.out(S.fc1[rg, :f], out=sg)
                torch.mul(sg, S.fc1[rg, f:], out=S.act[rg])
                X.free("silu_gate")
                del sg
            else:
                torch.ops.aten.gelu.out(S.fc1[rg], approximate="none", out=S.act[rg])
        if y_out is None:
            return
        with sp("fc2", layer, phase):
            fc2 = X.get("fc2", (n, h), self.dtype)
            self._row_parallel(S.act, p.w2, p.b2, fc2, X, "fc2", self._cast(S.act, S, "fc2", phase))
        if before_output is not None:
            before_output()  # y_out may be memory a copy still reads: the policy waits here, not earlier
        with sp("add2", layer, phase):
            torch.add(S.h1, fc2, out=y_out)
            X.free("fc2")
            del fc2

    # ------------------------------------------------------------------ public
    def forward(self, p: LayerWeights, S: LayerStorage, y_out: torch.Tensor, layer: int,
                before_output: Callable[[], None] | None = None) -> None:
        """Full forward: fills every skeletal tensor of ``S`` (x must be in place) and writes y.
        ``before_output`` runs right before the last op (add2) writes ``y_out``."""
        self.scratch.set_phase("fwd")
        self._fwd_ops(p, S, layer, "fwd", 0, True, y_out, before_output)

    def recompute_tokens(self, p: LayerWeights, S: LayerStorage, start: int, layer: int) -> None:
        """MEMO: rebuild local rows [start, T) (TP-split tensors: [start*m, T*m)) of ln1, q, k, v, h1,
        ln2, fc1, act from x and attn."""
        if start >= self.T:
            return
        self.scratch.set_phase("bwd")
        self.scratch.prefix = "rc_"
        try:
            self._fwd_ops(p, S, layer, "recompute", start, False, None)
        finally:
            self.scratch.prefix = ""

    def recompute_norms(self, p: LayerWeights, S: LayerStorage, layer: int,
                        norms: tuple[str, ...] = ("ln1", "ln2")) -> None:
        """Megatron's ``--recompute-modules layernorm``: rebuild the ``norms``' outputs (and their statistics) from
        the kept x and h1 before the layer's backward (`memo_sim.model.layer_graph.separate_norms`: the pre-MLP
        norm, and the input norm where it is a module of its own)."""
        sp = self.timer.span
        if "ln1" in norms:
            with sp("ln1", layer, "recompute"):
                self._norm(S.x, p.ln1_w, p.ln1_b, S.ln1, S.stats[0], S.stats[1])
        if "ln2" in norms:
            with sp("ln2", layer, "recompute"):
                self._norm(S.h1, p.ln2_w, p.ln2_b, S.ln2, S.stats[2], S.stats[3])

    def recompute_mlp(self, p: LayerWeights, S: LayerStorage, layer: int) -> None:
        """Megatron's ``--recompute-modules mlp`` (the MLP checkpointed whole, its pre-MLP norm fused into fc1 under
        TransformerEngine): rebuild ln2 (and its statistics) from the kept h1, fc1 with its sequence-parallel
        all-gather and the activation, and re-run fc2 with its reduce-scatter into scratch, as Megatron's checkpoint
        re-runs the whole MLP forward before its backward (the simulator prices that: `memo_sim.policy.
        recompute_modules.RecomputeMlp`); fc2's output is dropped (the backward reads act, not it)."""
        if p.moe is not None:
            raise ExecError(f"layer {layer} is a MoE layer: recompute_mlp re-runs a dense MLP (plan recompute_moe or "
                            "recompute_norm_act)")
        X, sp, tp, f = self.scratch, self.timer.span, self.tp, self.f
        X.set_phase("bwd")
        X.prefix = "rc_"
        try:
            with sp("ln2", layer, "recompute"):
                self._norm(S.h1, p.ln2_w, p.ln2_b, S.ln2, S.stats[2], S.stats[3])
            with sp("fc1", layer, "recompute"):
                ln2 = tp.gather(S.ln2, X, "ln2_gathered")
                self.gemm.forward(ln2, p.w1, S.fc1, p.b1, self._cast(ln2, S, "fc1", "recompute"))
                tp.release(X, "ln2_gathered")
                del ln2
            with sp("act", layer, "recompute"):
                if self.swiglu:
                    sg = X.get("silu_gate", (self.Tg, f), self.dtype)
                    torch.ops.aten.silu.out(S.fc1[:, :f], out=sg)
                    torch.mul(sg, S.fc1[:, f:], out=S.act)
                    X.free("silu_gate")
                    del sg
                else:
                    torch.ops.aten.gelu.out(S.fc1, approximate="none", out=S.act)
            with sp("fc2", layer, "recompute"):
                fc2 = X.get("fc2", (self.T, self.h), self.dtype)
                self._row_parallel(S.act, p.w2, p.b2, fc2, X, "fc2", self._cast(S.act, S, "fc2", "recompute"))
                X.free("fc2")
                del fc2
        finally:
            X.prefix = ""

    def recompute_attention(self, p: LayerWeights, S: LayerStorage, layer: int) -> None:
        """Selective recompute: re-run the attention core from the kept q, k, v, rebuilding the
        backend's state (lse) for the backward. Its output is written to scratch and dropped: the
        kept ``attn`` holds the same values, and rewriting it in place would bump the version of
        the layer's storage block, which a MoE block's kept autograd graph (its ln2 leaf) shares."""
        X = self.scratch
        X.set_phase("bwd")
        X.prefix = "rc_"
        try:
            with self.timer.span("attention", layer, "recompute"):
                out = X.get("attn_out", tuple(S.attn.shape), self.dtype)
                q, k = self._attention_qk(p, S)
                S.aux = self._attend(p, q, k, S.v, out, X)
                self._release_qk()
                X.free("attn_out")
                del out, q, k
        finally:
            X.prefix = ""

    def recompute_full(self, p: LayerWeights, S: LayerStorage, layer: int) -> None:
        """Full recompute: re-run the forward (attention included) from x, without fc2 and y."""
        self.scratch.set_phase("bwd")
        self.scratch.prefix = "rc_"
        try:
            self._fwd_ops(p, S, layer, "recompute", 0, True, None)
        finally:
            self.scratch.prefix = ""

    def backward(self, p: LayerWeights, S: LayerStorage, dy: torch.Tensor, layer: int) -> torch.Tensor:
        X, sp, T, Tg, h, f, dt, tp = self.scratch, self.timer.span, self.T, self.Tg, self.h, self.f, self.dtype, self.tp
        self.scratch.set_phase("bwd")
        ph = "bwd"
        dy = dy.reshape(T, h)
        if not dy.is_contiguous() or dy._base is not None:
            dy = dy.clone(memory_format=torch.contiguous_format)  # we accumulate into dy in place
        one, oneg = self.ones[:T], self.ones
        if p.moe is not None:
            with sp("moe", layer, ph):
                d_ln2 = self.moe.backward(p.moe, S, dy, layer, self.timer)
            return self._backward_attention(p, S, dy, d_ln2, layer, scratch_d_ln2=False)
        with sp("fc2", layer, ph):
            if p.b2 is not None:
                p.b2.grad.addmv_(dy.t(), one)
            dyg = tp.gather(dy, X, "dy_gathered")
            d_act = self._linear_backward(dyg, S.act, p.w2, None, oneg, X.get("d_act", (Tg, f), dt))
            tp.release(X, "dy_gathered")
            del dyg
        with sp("act", layer, ph):
            d_fc1 = X.get("d_fc1", (Tg, self.fc1w), dt)
            if self.swiglu:
                gate, up = S.fc1[:, :f], S.fc1[:, f:]
                sg = X.get("silu_gate", (Tg, f), dt)
                torch.ops.aten.silu.out(gate, out=sg)
                torch.mul(d_act, sg, out=d_fc1[:, f:])
                torch.mul(d_act, up, out=sg)
                torch.ops.aten.silu_backward.grad_input(sg, gate, grad_input=d_fc1[:, :f])
                X.free("silu_gate")
                del sg
            else:
                torch.ops.aten.gelu_backward.grad_input(d_act, S.fc1, approximate="none", grad_input=d_fc1)
            X.free("d_act")
            del d_act
        with sp("fc1", layer, ph):
            ln2 = S.ln2 if tp.kept else tp.gather(S.ln2, X, "ln2_gathered")
            if tp.size == 1:
                d_ln2 = X.get("d_ln2", (T, h), dt)
                self._linear_backward(d_fc1, ln2, p.w1, p.b1, oneg, d_ln2)
                tp.release(X, "ln2_gathered")
                X.free("d_fc1")
                del d_fc1, ln2
            else:
                # the simulator's order, which the plan's level 1 places (memo_sim/memplan/trace_gen.py
                # ``_layer_backward_trace``): the GEMMs (wgrad reads the gathered input first, `_linear_backward`)
                # into the partial sum, then the gathered input and d_fc1 freed, then the reduce's output
                d_ln2p = self._linear_backward(d_fc1, ln2, p.w1, p.b1, oneg, X.get("d_ln2_partial", (Tg, h), dt))
                self._release_input(X, "ln2")
                X.free("d_fc1")
                del d_fc1, ln2
                d_ln2 = X.get("d_ln2", (T, h), dt)
                tp.reduce(d_ln2p, d_ln2)
                X.free("d_ln2_partial")
                del d_ln2p
        return self._backward_attention(p, S, dy, d_ln2, layer)

    def _backward_attention(self, p: LayerWeights, S: LayerStorage, dy: torch.Tensor, d_ln2: torch.Tensor,
                            layer: int, scratch_d_ln2: bool = True) -> torch.Tensor:
        """From d ln2 (``dy`` holds the output gradient, accumulated into in place) to dx."""
        X, sp, T, Tg, dt, tp = self.scratch, self.timer.span, self.T, self.Tg, self.dtype, self.tp
        ph = "bwd"
        one, oneg = self.ones[:T], self.ones
        with sp("ln2", layer, ph):
            dn = self._norm_backward(d_ln2, S.h1, S.stats[2].view(T, 1), S.stats[3].view(T, 1), p.ln2_w, p.ln2_b)
            if scratch_d_ln2:
                X.free("d_ln2")
            del d_ln2
            d_h1 = dy.add_(dn)  # the residual gradient accumulates into dy in place
            del dn
        with sp("out_proj", layer, ph):
            if p.bo is not None:
                p.bo.grad.addmv_(d_h1.t(), one)
            d_h1g = tp.gather(d_h1, X, "d_h1_gathered")
            d_attn = self._linear_backward(d_h1g, S.attn, p.wo, None, oneg, X.get("d_attn", (Tg, self.ha), dt))
            tp.release(X, "d_h1_gathered")
            del d_h1g
        with sp("attention", layer, ph):
            d_q = X.get("d_q", (Tg, self.hq), dt)
            d_k = X.get("d_k", (Tg, self.kv), dt)
            d_v = X.get("d_v", (Tg, self.kvv), dt)
            q, k = self._attention_qk(p, S)
            dims = self._dims(p)
            if p.sinks is not None:  # before the kernel's backward, which may reuse d_attn (module attention_sinks)
                p.sinks.grad.add_(sinks_grad(d_attn, S.attn, S.aux, p.sinks, dims))
            self.backend.backward(d_attn, q, k, S.v, S.attn, S.aux, d_q, d_k, d_v, dims, X)
            self._release_qk()
            X.free("d_attn")
            del d_attn, q, k
            self._qk_norm_backward(p, S, d_q, d_k)
        with sp("qkv", layer, ph):
            if p.wqkv is None:  # latent attention: d ln1 from both down projections
                d_ln1 = self._mla_backward(p, S, d_q, d_k, d_v, X)
                del d_q, d_k, d_v  # freed in the scratch there
            else:
                d_ln1 = self._qkv_backward(p, S, d_q, d_k, d_v, X)
                del d_q, d_k, d_v  # freed in the scratch there: no reference left here either
        with sp("ln1", layer, ph):
            dx = self._norm_backward(d_ln1, S.x, S.stats[0].view(T, 1), S.stats[1].view(T, 1), p.ln1_w, p.ln1_b)
            X.free("d_ln1")
            del d_ln1
            dx.add_(d_h1)
            del d_h1
        return dx

    def _qkv_backward(self, p: LayerWeights, S: LayerStorage, d_q, d_k, d_v, X) -> torch.Tensor:
        """The fused QKV projection's backward: its weight (and bias) gradients, d_q / d_k / d_v freed, d ln1 (the TP
        group's partial sums reduced) returned in scratch ``d_ln1``."""
        T, Tg, h, dt, tp, oneg = self.T, self.Tg, self.h, self.dtype, self.tp, self.ones
        ln1 = S.ln1 if tp.kept else tp.gather(S.ln1, X, "ln1_gathered")
        ws, gws = self._qkv_slices(p.wqkv), self._qkv_slices(p.wqkv.grad)
        gbs = self._qkv_slices(p.bqkv.grad) if p.bqkv is not None else (None, None, None)
        cast = self.gemm.cast_wgrad_input(ln1)  # the fused projection's input, cast once (FP8)
        for d, gw, gb in zip((d_q, d_k, d_v), gws, gbs):
            self.gemm.wgrad(d, ln1, gw, cast)
            if gb is not None:
                gb.addmv_(d.t(), oneg)
        self._release_input(X, "ln1")
        del ln1, cast
        d_ln1p = X.get("d_ln1", (T, h), dt) if tp.size == 1 else X.get("d_ln1_partial", (Tg, h), dt)
        self.gemm.dgrad(d_q, ws[0], d_ln1p)
        self.gemm.dgrad(d_k, ws[1], d_ln1p, accumulate=True)
        self.gemm.dgrad(d_v, ws[2], d_ln1p, accumulate=True)
        for n in ("d_q", "d_k", "d_v"):
            X.free(n)
        del d_q, d_k, d_v
        if tp.size == 1:
            return d_ln1p
        # the reduce's output after d_q/d_k/d_v are freed, as the simulator orders it (see ``backward``)
        d_ln1 = X.get("d_ln1", (T, h), dt)
        tp.reduce(d_ln1p, d_ln1)
        X.free("d_ln1_partial")
        return d_ln1

    # ------------------------------------------------------------------ latent attention (one TP rank)
    def _latent_rstd(self, x: torch.Tensor, X, name: str) -> torch.Tensor:
        """A latent RMSNorm's rstd [n, 1] of ``x``'s rows, in scratch ``name`` (the norm's statistics are not kept:
        the backward forms them again from the kept latent, a row reduction)."""
        rstd = X.get(name, (x.shape[0],), acc_dtype(self.dtype))
        torch.linalg.vector_norm(x, 2, -1, dtype=rstd.dtype, out=rstd)
        rstd.square_().mul_(1.0 / x.shape[-1]).add_(self.eps).rsqrt_()
        return rstd.unsqueeze(1)

    def _latent_norm(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, X) -> None:
        rstd = self._latent_rstd(x, X, "latent_rstd")
        torch.mul(x, rstd, out=out)
        out.mul_(w)
        X.free("latent_rstd")

    def _mla_forward(self, p: LayerWeights, S: LayerStorage, ln1: torch.Tensor, r: slice, X) -> None:
        """Rows ``r`` of q, k, v from ln1's (`memo_sim.model.layer_graph._mla_ops`): q = up(norm(down(ln1))) (or one
        projection), kv_lat = down(ln1) = [latent | shared rope key], k = [up(norm(latent)) keys | rope key on every
        head], v = up(norm(latent)) values. Every op is row-wise, so MEMO's recompute rebuilds any rows."""
        m, n = self.model, ln1.shape[0]
        nope, tail, dv, lr, H = m.head_dim, m.qk_rope_dim, m.value_head_dim, m.kv_lora_rank, m.heads
        if p.wq is not None:
            self.gemm.forward(ln1, p.wq, S.q[r])
        else:
            self.gemm.forward(ln1, p.wq_down, S.q_lat[r])
            self._latent_norm(S.q_lat[r], p.ln_qlat_w, S.q_latn[r], X)
            self.gemm.forward(S.q_latn[r], p.wq_up, S.q[r])
        self.gemm.forward(ln1, p.wkv_down, S.kv_lat[r])
        self._latent_norm(S.kv_lat[r, :lr], p.ln_kvlat_w, S.kv_latn[r], X)
        kvu = X.get("kv_up", (n, H * (nope + dv)), self.dtype)
        self.gemm.forward(S.kv_latn[r], p.wkv_up, kvu)
        kvu3, k3 = kvu.view(n, H, nope + dv), S.k[r].view(n, H, nope + tail)
        k3[..., :nope].copy_(kvu3[..., :nope])
        k3[..., nope:].copy_(S.kv_lat[r, lr:].unsqueeze(1))
        S.v[r].view(n, H, dv).copy_(kvu3[..., nope:])
        X.free("kv_up")

    def _mla_backward(self, p: LayerWeights, S: LayerStorage, d_q, d_k, d_v, X) -> torch.Tensor:
        """`_mla_forward`'s backward: every latent projection's and norm's weight gradient accumulated, d_q / d_k / d_v
        freed, d ln1 returned in scratch ``d_ln1`` (the shared rope key's gradient the sum over the heads). The
        scratch the simulator's level-1 trace names (d_kv_latn, d_kv_lat, d_q_latn, d_q_lat, d_ln1) is taken and
        freed in its order, so a static memory plan places them (its d_ln1 comes after the latents' gradients:
        the key path's share of it waits in ``d_ln1_kv``, which the plan does not place)."""
        m, T, dt, one = self.model, self.T, self.dtype, self.ones
        nope, tail, dv, lr, H = m.head_dim, m.qk_rope_dim, m.value_head_dim, m.kv_lora_rank, m.heads
        d_kvu = X.get("d_kv_up", (T, H * (nope + dv)), dt)
        dk3, du3 = d_k.view(T, H, nope + tail), d_kvu.view(T, H, nope + dv)
        du3[..., :nope].copy_(dk3[..., :nope])
        du3[..., nope:].copy_(d_v.view(T, H, dv))
        d_kpe = dk3[..., nope:].sum(1)
        X.free("d_k")
        X.free("d_v")
        d_kv_latn = self._linear_backward(d_kvu, S.kv_latn, p.wkv_up, None, one, X.get("d_kv_latn", (T, lr), dt))
        X.free("d_kv_up")
        d_kv_lat = X.get("d_kv_lat", (T, lr + tail), dt)
        d_kv_lat[:, lr:].copy_(d_kpe)
        del d_kpe
        rstd = self._latent_rstd(S.kv_lat[:, :lr], X, "latent_rstd")
        d_kv_lat[:, :lr].copy_(rms_norm_backward(d_kv_latn, S.kv_lat[:, :lr], rstd, p.ln_kvlat_w, p.ln_kvlat_w.grad))
        X.free("latent_rstd")
        X.free("d_kv_latn")
        d_ln1_kv = self._linear_backward(d_kv_lat, S.ln1, p.wkv_down, None, one, X.get("d_ln1_kv", (T, self.h), dt))
        X.free("d_kv_lat")
        if p.wq is not None:
            self.gemm.wgrad(d_q, S.ln1, p.wq.grad)
            d_ln1 = X.get("d_ln1", (T, self.h), dt)
            self.gemm.dgrad(d_q, p.wq, d_ln1)
            X.free("d_q")
        else:
            r = m.q_lora_rank
            d_q_latn = self._linear_backward(d_q, S.q_latn, p.wq_up, None, one, X.get("d_q_latn", (T, r), dt))
            X.free("d_q")
            rstd = self._latent_rstd(S.q_lat, X, "latent_rstd")
            d_q_lat = X.get("d_q_lat", (T, r), dt)
            d_q_lat.copy_(rms_norm_backward(d_q_latn, S.q_lat, rstd, p.ln_qlat_w, p.ln_qlat_w.grad))
            X.free("latent_rstd")
            X.free("d_q_latn")
            self.gemm.wgrad(d_q_lat, S.ln1, p.wq_down.grad)
            d_ln1 = X.get("d_ln1", (T, self.h), dt)
            self.gemm.dgrad(d_q_lat, p.wq_down, d_ln1)
            X.free("d_q_lat")
        d_ln1.add_(d_ln1_kv)
        X.free("d_ln1_kv")
        return d_ln1


def _layer_norm_backward(dout, x, mean, rstd, weight, bias):
    """LayerNorm backward over the last dimension; accumulates the weight and bias gradients."""
    dn, dw, db = torch.ops.aten.native_layer_norm_backward(
        dout, x, [x.shape[-1]], mean, rstd, weight, bias, [True, True, True])
    weight.grad.add_(dw)
    bias.grad.add_(db)
    return dn


def rms_norm(x, w, eps, out, rstd_out) -> None:
    """RMSNorm over the last dimension, ``out = x * rsqrt(mean(x^2) + eps) * w``, with no
    temporary: rstd (in ``rstd_out``'s dtype) is formed from the row norms in place."""
    torch.linalg.vector_norm(x, 2, -1, dtype=rstd_out.dtype, out=rstd_out)
    rstd_out.square_().mul_(1.0 / x.shape[-1]).add_(eps).rsqrt_()
    torch.mul(x, rstd_out.unsqueeze(1), out=out)
    out.mul_(w)


def head_rms_norm(x: torch.Tensor, w: torch.Tensor, head: int, eps: float, out: torch.Tensor) -> None:
    """RMSNorm over each ``head``-wide head of ``x`` ``[rows, heads x head]`` into ``out``, one weight
    ``w`` ``[head]`` for every head (Qwen3's q_norm / k_norm); its rstd is a temporary of one value per
    row and head in the accumulation dtype."""
    xv = x.view(-1, head)
    rstd = torch.empty(xv.shape[0], dtype=acc_dtype(x.dtype), device=x.device)
    rms_norm(xv, w, eps, out.view(-1, head), rstd)


def head_rms_norm_backward(dout: torch.Tensor, x: torch.Tensor, w: torch.Tensor, head: int, eps: float) -> None:
    """Backward of `head_rms_norm`, in place: ``dout`` (the gradient of the normalised heads) becomes the gradient of
    ``x``; accumulates ``w.grad``. `rms_norm_backward` over the heads as rows, its rstd recomputed from x (one value
    per row and head); its temporaries: `qk_norm_temp_bytes`."""
    xv, gv = x.view(-1, head), dout.view(-1, head)
    r = torch.linalg.vector_norm(xv, 2, -1, dtype=acc_dtype(x.dtype))
    r.square_().mul_(1.0 / head).add_(eps).rsqrt_()
    gv.copy_(rms_norm_backward(gv, xv, r.unsqueeze(1), w, w.grad))


def rms_norm_backward(dout, x, rstd, weight, weight_grad):
    """RMSNorm backward (``rstd`` [T, 1] as `rms_norm` saved it): accumulates the weight gradient
    sum_t dout * xhat into ``weight_grad`` and returns dx = rstd * (dout*w - xhat * mean(dout*w*xhat)), xhat = x * rstd.
    Temporaries: two [T, h] in rstd's dtype (`RMS_BACKWARD_TEMPS`) beside the returned gradient."""
    xhat = torch.mul(x, rstd)
    prod = torch.mul(dout, xhat)
    weight_grad.add_(prod.sum(0))
    c = torch.mv(prod, weight.to(prod.dtype)).mul_(1.0 / x.shape[-1]).unsqueeze(1)
    del prod
    dn = torch.mul(dout, weight)
    dn.sub_(xhat.mul_(c)).mul_(rstd)
    return dn


def qk_norm_temp_bytes(model: ModelConfig, tokens: int, dtype: torch.dtype) -> int:
    """Bytes the QK norms' backward (`head_rms_norm_backward`) holds beside the attention's gradients: the
    queries' `rms_norm_backward` temporaries, two ``[tokens, q width]`` in the accumulation dtype and its result
    in the layer's (none without QK norms)."""
    if not model.qk_norm:
        return 0
    size = lambda d: torch.empty((), dtype=d, device="meta").element_size()  # noqa: E731
    return tokens * model.q_dim * (2 * size(acc_dtype(dtype)) + size(dtype))


def norm_backward_temp_bytes(model: ModelConfig, tokens: int, dtype: torch.dtype) -> int:
    """Bytes one norm backward of ``tokens`` rows holds beside the gradient it returns: none counted
    for LayerNorm (aten's kernel), two [tokens, h] in the accumulation dtype for `rms_norm_backward`
    (xhat and dout * xhat)."""
    if model.norm != "rmsnorm":
        return 0
    return 2 * tokens * model.hidden * torch.empty((), dtype=acc_dtype(dtype), device="meta").element_size()


def _linear_backward(dout, inp, weight, bias, ones, d_in):
    """Backward of y = inp @ weight.T + bias: accumulate weight/bias gradients, write d_in = dout @ weight."""
    weight.grad.addmm_(dout.t(), inp)
    if bias is not None:
        bias.grad.addmv_(dout.t(), ones)
    return torch.mm(dout, weight, out=d_in)
