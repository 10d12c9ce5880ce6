"""FP8 GEMMs with a scale per row or per block (`memo_sim.model.gemm_formats` ``fp8-rowwise`` and ``fp8-blockwise``):
the layer's linear GEMMs as torchao's Float8Linear runs its ``rowwise`` recipe and as TransformerEngine's
Float8BlockScaling (Megatron-LM's ``--fp8-recipe blockwise``, DeepSeek-V3's recipe) runs its GEMMs.

Every operand is E4M3, the output gradients too (both recipes), with fp32 scales rounded to powers of two (torchao's
``round_scales_to_power_of_2``, TransformerEngine's default for block scaling), each from the amax of its own block of
the tensor along the GEMM's reduction:

- ``fp8-rowwise``: one scale per row of each operand (the whole reduction), the weight's too;
- ``fp8-blockwise``: one scale per 1 x 128 tile of an activation or output gradient and per 128 x 128 block of a
  weight.

So each GEMM casts its operands along its own reduction: the forward ``y = x W^T`` x by rows and W by rows (its
reduction is the input width), the data gradient ``dx = dy W`` dy by rows and W along its output width (the
transposed copy), the weight gradient ``dW = dy^T x`` dy and x along the tokens. A weight's two copies (row-major and
transposed, each with its scales) are cast once after the weight changes and kept, as for ``fp8-tensorwise``
(`memo_exec.gemm_formats`); a 128 x 128 block's scale is the same block's either way, so the blockwise transposed
copy is the first one transposed. A row's (a tile's) scale is its own: MEMO's token-wise recompute casts the rows it
rebuilds to what the forward cast them to without the forward's scales.

On CUDA the products run as ``torch._scaled_mm`` (cuBLASLt's outer-vector and VEC128 / BLK128x128 scale modes on
Hopper, CUDA 12.9 and newer); its block scales are passed outer-dim-major, the layout it takes (measured on an H200,
reports/gpu-h200-2026-12-04.md). On the CPU they run as fp32 products of the dequantised operands (each FP8 value
times a power of two is exact in fp32), which checks the casts' numerics, not the kernel.
"""

from __future__ import annotations

import math

import torch

from memo_exec.gemm_formats import AMAX_FLOOR, E4M3, GEMMS, Fp8TensorwiseGemm

BLOCK = 128  # TransformerEngine's block-scaling tile: 1 x 128 for activations and gradients, 128 x 128 for weights


def quantize_blocks(t: torch.Tensor, rows: int, cols: int, dtype: torch.dtype = E4M3) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
    """``t`` (2-D, any strides) in FP8 ``dtype``, row-major, with one fp32 scale per ``rows`` x ``cols`` block:
    (the FP8 tensor, the scales [ceil(m / rows), ceil(k / cols)], each the block's amax over the format's largest
    value rounded up to a power of two, the factor that takes the block back)."""
    m, k = t.shape
    top = torch.finfo(dtype).max
    x = t.detach().to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    pm, pk = -m % rows, -k % cols
    xp = torch.nn.functional.pad(x, (0, pk, 0, pm)) if pm or pk else x
    blocks = xp.view(xp.shape[0] // rows, rows, xp.shape[1] // cols, cols)
    amax = torch.maximum(blocks.amax(dim=(1, 3)), blocks.amin(dim=(1, 3)).neg_())  # no |x| temporary beside x
    # (the fp32 copy and the FP8 result: `memo_exec.gemm_formats.cast_temp_bytes`)
    scale = torch.exp2(torch.ceil(torch.log2(amax.clamp_min(AMAX_FLOOR) / top)))
    q = blocks.div_(scale[:, None, :, None]).view(xp.shape)[:m, :k]
    return q.clamp_(-top, top).to(dtype), scale


def expand_scales(scale: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Block scales ([p, q], as `quantize_blocks` writes them, or their transpose) spread over an operand of
    ``shape``: a dimension with one scale per element, one for the whole, or one per `BLOCK`."""
    out = scale
    for dim, (n, size) in enumerate(zip(scale.shape, shape)):
        block = 1 if n == size else size if n == 1 else BLOCK
        if n != math.ceil(size / block):
            raise ValueError(f"scales {tuple(scale.shape)} do not tile an operand of {tuple(shape)}")
        out = out.repeat_interleave(block, dim=dim).narrow(dim, 0, size)
    return out


def column_major(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` [r, c] laid out column-major with its leading dimension padded to 16 bytes (a multiple of 4 fp32):
    the strides (1, ceil(r / 4) * 4). cuBLASLt reads a 128 x 128 block grid at 16-byte aligned strides: on an H200,
    torch 2.11 took [3, 2] block scales at strides (1, 3) and read them as if padded, so every output column past the
    first block came out wrong (reports/gpu-h200-2026-12-04.md)."""
    r, c = scale.shape
    buf = scale.new_zeros(c, -(-r // 4) * 4)
    buf[:, :r] = scale.t()
    return buf[:, :r].t()


LAYOUTS = {"row-major": lambda s: s.contiguous(), "column-major": column_major}
_CUDA_LAYOUTS: dict[tuple[str, str], tuple] = {}


def _kind(scale: torch.Tensor, shape, red: int) -> str:
    """An operand's scaling along its reduction dimension ``red``: one scale for all of it (``row``), or one per 128
    (``tile`` where the other dimension has a scale per element, ``block`` where it has one per 128)."""
    if scale.shape[red] == 1:
        return "row"
    return "tile" if scale.shape[1 - red] == shape[1 - red] else "block"


def cuda_scale_layouts(kind_a: str, kind_b: str, device) -> tuple:
    """The memory layouts of the two scale tensors that CUDA's ``torch._scaled_mm`` takes and reads as meant for this
    pair of scalings, found once per process: each candidate pair of layouts is run on a small product of the same
    scalings and the first within bf16's rounding of the dequantised fp32 product is kept (on an H200 torch 2.11 took
    1 x 128 tiles of ``a`` column-major and of ``b`` row-major, and 128 x 128 blocks of ``b`` column-major, refused the
    other layouts, and misread an unpadded block grid: `column_major`; reports/gpu-h200-2026-12-04.md). None of them
    (another torch release): a one-line error naming the pair and the release."""
    key = (kind_a, kind_b)
    if key in _CUDA_LAYOUTS:
        return _CUDA_LAYOUTS[key]
    g = torch.Generator(device=device).manual_seed(0)
    m, k, n = 256, 384, 384  # 3 blocks along k and n: a grid whose column-major stride needs the padding
    x, w = torch.randn(m, k, device=device, generator=g), torch.randn(n, k, device=device, generator=g)
    cols = {"row": k, "tile": BLOCK, "block": BLOCK}
    xq, xs = quantize_blocks(x, BLOCK if kind_a == "block" else 1, cols[kind_a])
    wq, ws = quantize_blocks(w, BLOCK if kind_b == "block" else 1, cols[kind_b])
    ref = (xq.float() * expand_scales(xs, (m, k))) @ (wq.float() * expand_scales(ws, (n, k))).t()
    tried = []
    for la, fa in LAYOUTS.items():
        for lb, fb in LAYOUTS.items():
            try:
                got = torch._scaled_mm(xq, wq.t(), scale_a=fa(xs), scale_b=fb(ws.t()), out_dtype=torch.float32)
            except (RuntimeError, ValueError) as e:  # refused (newer torch raises ValueError)
                tried.append(f"{la}/{lb}: {str(e).splitlines()[0][:80]}")
                continue
            err = float((got - ref).norm() / ref.norm())
            if err < 1e-2:
                _CUDA_LAYOUTS[key] = (fa, fb)
                return fa, fb
            tried.append(f"{la}/{lb}: relative error {err:.2g}")
    from memo_exec.errors import ExecError  # noqa: PLC0415

    raise ExecError(f"torch {torch.__version__}'s _scaled_mm reads no layout of {kind_a} x {kind_b} FP8 scales as "
                    f"meant ({'; '.join(tried)}); plan another --precision to run on this GPU")


def block_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                    out_dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """(a · scale_a) @ (b · scale_b) of FP8 operands with per-row or per-block scales (``a`` [m, k] row-major with
    scales along k, ``b`` [k, n] column-major with scales along k), accumulated in fp32, in ``out_dtype`` (module
    docs: ``torch._scaled_mm`` on CUDA, the dequantised fp32 product on the CPU)."""
    if a.is_cuda:
        fa, fb = cuda_scale_layouts(_kind(scale_a, a.shape, 1), _kind(scale_b, b.shape, 0), a.device)
        return torch._scaled_mm(a, b, scale_a=fa(scale_a), scale_b=fb(scale_b), out_dtype=out_dtype, out=out)
    da = a.float() * expand_scales(scale_a, tuple(a.shape))
    db = b.float() * expand_scales(scale_b, tuple(b.shape))
    r = torch.mm(da, db)
    return r.to(out_dtype) if out is None else out.copy_(r)


class Fp8ScaledGemm(Fp8TensorwiseGemm):
    """The GEMMs of one row- or block-scaled FP8 format (module docs): ``block`` the activation tile's width along the
    reduction (None: the whole row), ``weight_block`` a weight block's rows and columns (None: one row, whole)."""

    name = ""
    recompute_needs_scales = False
    block: int | None = None
    weight_block: int | None = None

    def _tile(self, width: int) -> int:
        return width if self.block is None else self.block

    def _cast_rows(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_blocks(t, 1, self._tile(t.shape[1]))

    def _weight(self, w: torch.Tensor):
        """(row-major E4M3, its scales, the transposed copy, its scales), cached as `Fp8TensorwiseGemm._cached`."""
        return self._cached(w, self._cast_weight)

    def _cast_weight(self, w: torch.Tensor) -> tuple:
        if self.weight_block is None:  # each copy scaled along its own rows: the two reductions differ
            wq, ws = quantize_blocks(w, 1, w.shape[1])
            wt, wts = quantize_blocks(w.t(), 1, w.shape[0])
        else:  # a 128 x 128 block is one block either way round
            wq, ws = quantize_blocks(w, self.weight_block, self.weight_block)
            wt, wts = wq.t().contiguous(), ws.t().contiguous()
        return wq, ws, wt, wts

    def cast_input(self, x: torch.Tensor, scale: torch.Tensor | None = None):
        """A forward input cast once, by rows (``scale`` not needed: a rebuilt row casts as the forward cast it)."""
        return None if x.is_meta else self._cast_rows(x)

    def cast_wgrad_input(self, x: torch.Tensor):
        """A weight gradient's input cast once for several GEMMs: along the tokens (its transpose, row-major)."""
        return None if x.is_meta else self._cast_rows(x.t())

    def forward(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None,
                cast=None) -> None:
        if x.is_meta:
            return super().forward(x, w, out, bias)
        xq, xs = cast if cast is not None else self._cast_rows(x)
        wq, ws, _, _ = self._weight(w)
        block_scaled_mm(xq, wq.t(), xs, ws.t(), out.dtype, out=out)
        if bias is not None:
            out.add_(bias)

    def dgrad(self, dy: torch.Tensor, w: torch.Tensor, out: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
        if dy.is_meta:
            return super().dgrad(dy, w, out, accumulate)
        dq, ds = self._cast_rows(dy)
        _, _, wt, wts = self._weight(w)
        if not accumulate:
            return block_scaled_mm(dq, wt.t(), ds, wts.t(), out.dtype, out=out)
        return out.add_(block_scaled_mm(dq, wt.t(), ds, wts.t(), out.dtype))

    def wgrad(self, dy: torch.Tensor, x: torch.Tensor, grad: torch.Tensor, cast=None) -> None:
        if dy.is_meta:
            return super().wgrad(dy, x, grad)
        dq, ds = self._cast_rows(dy.t())
        xq, xs = cast if cast is not None else self._cast_rows(x.t())
        grad.add_(block_scaled_mm(dq, xq.t(), ds, xs.t(), grad.dtype))


class Fp8RowwiseGemm(Fp8ScaledGemm):
    name = "fp8-rowwise"
    words = ("torch._scaled_mm: E4M3 operands, gradients too, one power-of-two scale per row along each GEMM's "
             "reduction (torchao's rowwise recipe); the weights' FP8 copies kept between optimizer steps")


class Fp8BlockwiseGemm(Fp8ScaledGemm):
    name = "fp8-blockwise"
    words = ("torch._scaled_mm: E4M3 operands, gradients too, one power-of-two scale per 1 x 128 tile of an activation "
             "or gradient and per 128 x 128 block of a weight (TransformerEngine's Float8BlockScaling); the weights' "
             "FP8 copies kept between optimizer steps")
    block = BLOCK
    weight_block = BLOCK


GEMMS.update({Fp8RowwiseGemm.name: Fp8RowwiseGemm, Fp8BlockwiseGemm.name: Fp8BlockwiseGemm})
