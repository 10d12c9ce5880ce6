"""The layer's linear GEMMs in the plan's GEMM format (`memo_sim.model.gemm_formats`), one class per format
registered by name.

A layer (`memo_exec.layer.LayerCompute`) asks its format for the three GEMMs of a linear ``y = x W^T``:
``forward`` (y = x W^T, into ``out``), ``dgrad`` (dx = dy W, into ``out``, or added to it) and ``wgrad``
(W.grad += dy^T x). ``bf16`` (the model dtype, the default) is ``torch.mm`` / ``addmm_`` as the layer always
ran them. ``fp8-tensorwise`` is what torchao's Float8Linear runs under its ``tensorwise`` recipe
(torchtitan's Float8, memo's ``fp8_saved_inputs`` off): every GEMM's operands are cast to FP8 with one scale
per tensor from the tensor's own amax ("current scaling") -- E4M3 for the activations and weights, E5M2 for
the output gradient in backward (the "hybrid" format) -- and multiplied by ``torch._scaled_mm``, which
accumulates in fp32 and writes the layer's dtype; the layer keeps its high-precision inputs for the backward
and casts them again there. Each weight's FP8 copies (row-major for the forward, transposed for the data
gradient: the layouts Hopper's FP8 tensor cores take, the operand pairs ``torch._scaled_mm`` accepts on CUDA)
are cast once after the weight changes (an optimizer step, a ZeRO-3 gather) and kept: the two quantised
copies the simulator counts in the model states (`memo_sim.cost.gemm_format.weight_cache_bytes`).
``fp8-rowwise`` and ``fp8-blockwise`` (a scale per row or per block, E4M3 throughout) are `memo_exec.gemm_scaled`'s.
"""

from __future__ import annotations

import importlib

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
AMAX_FLOOR = 1e-12  # an all-zero tensor casts with this amax (a scale that keeps it zero)
# which formats the executor runs, and the shapes CUDA's torch._scaled_mm takes: memo_sim.plan.executor_scope (the
# contract), whose gemm_why_not refuses the rest before a run
# bumped by every optimizer step (`weights_changed`): a weight's FP8 copies are cast again at their next use. A
# parameter's version counter does not tell: the fused AdamW writes an fp32 weight through a detached alias, and the
# distributed executor's parameters are views set on flat buffers that the optimizer and the all-gathers write
_EPOCH = [0]


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """(a · scale_a) @ (b · scale_b) of FP8 operands, accumulated in fp32, written in ``out_dtype``: on CUDA
    ``torch._scaled_mm``; on CPU the same math as fp32 GEMMs of the FP8 values (each exact in fp32), scaled after:
    torch's CPU ``_scaled_mm`` dispatches to oneDNN on CPUs with AMX / AVX512-FP16 (Sapphire Rapids), where a
    512 x 256 x 768 product took 6 s on 2026-12-01 (this project's CI VM) and no fp64 output is written
    ("itensor_view_from_dense expects float/bfloat16/half/int8/fp8 tensor input"); the CPU runs check the casts'
    numerics, not the kernel's speed."""
    if a.is_cuda:
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, out=out)
    r = torch.mm(a.float(), b.float()).mul_(scale_a * scale_b)
    return r.to(out_dtype) if out is None else out.copy_(r)


def weights_changed() -> None:
    """The weights were updated (an optimizer step): every FP8 weight copy is stale."""
    _EPOCH[0] += 1


def weight_epoch() -> int:
    """How many times the weights were updated (`weights_changed`): part of a cached FP8 weight copy's stamp."""
    return _EPOCH[0]


def quantize(t: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None = None) -> tuple[torch.Tensor,
                                                                                           torch.Tensor]:
    """``t`` in FP8 ``dtype`` with one scale from its amax: (the FP8 tensor, the fp32 factor that takes it back,
    amax / the format's largest value); ``scale``: that factor given (a recompute casting rows of a tensor the
    forward cast whole: the forward's, so the rows come out as the forward's did)."""
    if t.is_cuda and _COMPILED[0] is not False:
        return _compiled_quantize(t, dtype, scale)
    return _quantize(t, dtype, scale)


def _quantize(t: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    top = torch.finfo(dtype).max
    if scale is None:  # the amax without an |t| temporary
        acc = torch.float64 if t.dtype == torch.float64 else torch.float32
        amax = torch.linalg.vector_norm(t.detach(), float("inf"), dtype=acc).float()
        scale = (amax.clamp_min(AMAX_FLOOR) / top).reshape(())
    # one fp32 temporary (`cast_temp_bytes`), row-major whatever ``t``'s strides (a transposed view is cast and laid
    # out in the one pass), beside the FP8 result
    q = t.detach().to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    return q.div_(scale).clamp_(-top, top).to(dtype), scale


# On CUDA the cast runs as one compiled kernel (the amax, the scaling and the FP8 write, a transposed input read in
# place), as TransformerEngine's and compiled torchao's casts run: measured on an H200 (reports/gpu-h200-2026-11-28-
# fp8-qwen3.md) the eager cast's passes made FP8 slower than bf16. None: not tried yet; False: compiling failed here
# (no Triton), the eager cast then.
_COMPILED: list = [None]


def _compiled_quantize(t, dtype, scale):
    if _COMPILED[0] is None:
        try:
            _COMPILED[0] = torch.compile(_quantize, dynamic=True)
            return _COMPILED[0](t, dtype, scale)
        except Exception:  # noqa: BLE001 - no Triton or another compile failure: the eager cast, same numbers
            _COMPILED[0] = False
            return _quantize(t, dtype, scale)
    return _COMPILED[0](t, dtype, scale)


def cast_temp_bytes(elements: int, element_bytes: int) -> int:
    """Bytes a cast of ``elements`` holds at its peak beside its input: the fp32 temporary and the FP8 result (the
    input's dtype, ``element_bytes``, not counted: a transposed input is read in place)."""
    return elements * (4 + 1)


class ModelDtypeGemm:
    """The GEMMs in the layer's own dtype (the ``bf16`` format: the model dtype). ``cast_input`` /
    ``cast_wgrad_input`` give what ``forward`` / ``wgrad`` take as ``cast``: an input cast once (for several GEMMs,
    or with the forward's scale in a recompute); here nothing."""

    name = "bf16"
    words = "torch.mm in the model's dtype"
    # a recompute's cast of rebuilt rows needs the forward's scale (one per tensor: the rows' own amax gives another)
    recompute_needs_scales = False

    @staticmethod
    def cast_input(x: torch.Tensor, scale=None) -> None:
        return None

    @staticmethod
    def cast_wgrad_input(x: torch.Tensor) -> None:
        return None

    @staticmethod
    def forward(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None,
                cast=None) -> None:
        if bias is None:
            torch.mm(x, w.t(), out=out)
        else:
            torch.addmm(bias, x, w.t(), out=out)

    @staticmethod
    def dgrad(dy: torch.Tensor, w: torch.Tensor, out: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
        if accumulate:
            return out.addmm_(dy, w)
        return torch.mm(dy, w, out=out)

    @staticmethod
    def wgrad(dy: torch.Tensor, x: torch.Tensor, grad: torch.Tensor, cast=None) -> None:
        grad.addmm_(dy.t(), x)

    def forget(self) -> None:
        return None


class Fp8TensorwiseGemm:
    """FP8 GEMMs with one scale per tensor (module docs); a layer compute holds one, with its weights' FP8
    copies. A weight is a parameter or a row block of one (``wqkv``'s q, k and v rows: one scale each, as
    separate linears have)."""

    name = "fp8-tensorwise"
    words = ("torch._scaled_mm: E4M3 activations and weights, E5M2 output gradients, one scale per tensor; the weights' "
             "FP8 copies kept between optimizer steps")
    recompute_needs_scales = True

    def __init__(self) -> None:
        # (id of the parameter or the buffer it views, storage offset, shape) -> ((version, data pointer), (row-major
        # E4M3, transposed E4M3, the scale back))
        self._cache: dict[tuple, tuple] = {}

    def forget(self) -> None:
        """Drop every weight's FP8 copies (the layer compute's end)."""
        self._cache.clear()

    def _cached(self, w: torch.Tensor, cast) -> tuple:
        """``w``'s FP8 copies: ``cast(w)``'s, made at the first use after the weight changed and kept until then."""
        base = w._base if w._base is not None else w
        key = (id(base), w.storage_offset(), tuple(w.shape))
        stamp = (w._version, w.data_ptr(), weight_epoch())  # a write through the tensor, a new buffer, an optimizer step
        hit = self._cache.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        copies = cast(w)
        self._cache[key] = (stamp, copies)
        return copies

    def _weight(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(row-major E4M3, its transpose, the scale back), one scale for the tensor."""
        def cast(w):
            q, s = quantize(w, E4M3)
            return q, q.t().contiguous(), s
        return self._cached(w, cast)

    @staticmethod
    def cast_input(x: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A forward input cast once (E4M3, row-major): for several GEMMs (the fused QKV projection's three), or
        with a given ``scale`` (`quantize`)."""
        return None if x.is_meta else quantize(x, E4M3, scale)

    @staticmethod
    def cast_wgrad_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A weight gradient's input cast once for several GEMMs (E4M3, its transpose row-major)."""
        return None if x.is_meta else quantize(x.t(), E4M3)

    def forward(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None,
                cast=None) -> None:
        """out = x W^T (+ bias): x cast to E4M3 (row-major; ``cast``: `cast_input`'s), W's row-major copy read as its
        transpose (column-major)."""
        if x.is_meta:  # a dry run records the layer's scratch requests on the meta device: shapes only
            return ModelDtypeGemm.forward(x, w, out, bias)
        xq, xs = cast if cast is not None else quantize(x, E4M3)
        wq, _, ws = self._weight(w)
        scaled_mm(xq, wq.t(), xs, ws, out.dtype, out=out)
        if bias is not None:
            out.add_(bias)

    def dgrad(self, dy: torch.Tensor, w: torch.Tensor, out: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
        """out (+)= dy W: dy cast to E5M2 (row-major), W's transposed copy read as its transpose."""
        if dy.is_meta:
            return ModelDtypeGemm.dgrad(dy, w, out, accumulate)
        dq, ds = quantize(dy, E5M2)
        _, wt, ws = self._weight(w)
        if not accumulate:
            return scaled_mm(dq, wt.t(), ds, ws, out.dtype, out=out)
        return out.add_(scaled_mm(dq, wt.t(), ds, ws, out.dtype))

    def wgrad(self, dy: torch.Tensor, x: torch.Tensor, grad: torch.Tensor, cast=None) -> None:
        """W.grad += dy^T x: dy^T cast to E5M2 (its transposed copy, row-major), x cast again to E4M3 (the layer
        keeps the high-precision input; ``cast``: `cast_wgrad_input`'s) and read column-major; accumulated in the
        gradient's dtype."""
        if dy.is_meta:
            return ModelDtypeGemm.wgrad(dy, x, grad)
        dq, ds = quantize(dy.t(), E5M2)  # cast row-major from the transposed view in one pass
        xq, xs = cast if cast is not None else quantize(x.t(), E4M3)
        grad.add_(scaled_mm(dq, xq.t(), ds, xs, grad.dtype))


GEMMS = {ModelDtypeGemm.name: ModelDtypeGemm, Fp8TensorwiseGemm.name: Fp8TensorwiseGemm}
# the row- and block-scaled FP8 formats: a module of their own, which registers them in GEMMS (it uses this module's
# names above; imported as a module so that either module may be imported first)
importlib.import_module("memo_exec.gemm_scaled")


def layer_gemm(fmt: str):
    """The GEMMs of format ``fmt`` (`memo_exec.runner.run_model` refuses the formats not here first)."""
    return GEMMS[fmt]()


