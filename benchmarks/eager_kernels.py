"""The kernels eager PyTorch runs for a layer's composite memory-bound ops, and the bytes they move.

An uncompiled Hugging Face or torchtitan layer builds RMSNorm and SwiGLU from separate tensor ops (RMSNorm over an
fp32 upcast: ``x.float()``, ``pow``, ``mean``, ``add``, ``rsqrt``, ``mul``, the cast back, the weight's ``mul``;
SwiGLU: ``silu`` then ``mul``), each one kernel on a GPU, and autograd runs the backward of each. This script runs
them forward and backward on the CPU under a ``TorchDispatchMode`` that records every ATen op the dispatcher runs
(the same ops on any device: the decomposition and the autograd formulas sit above the backend) with the bytes it
reads and writes (a broadcast input counted at its storage's size, views and aliases not counted: they launch no
kernel), and prints, per element of the op's output, the bytes and the kernels of the forward and of the backward,
and the bytes autograd saves for the backward beyond the op's inputs, weight and output
(``torch.autograd.graph.saved_tensors_hooks``, each storage once).
`memo_sim.model.eager_kernels` holds the numbers it printed (memo_sim runs without torch); `tests/test_eager_kernels.py`
runs the same count (`count_eager_kernels`) and checks them.

    python benchmarks/eager_kernels.py [--tokens 4096] [--hidden 1024]

No GPU and no timing: what is measured is what the dispatcher runs, which is what a GPU would launch.
"""

from __future__ import annotations

import argparse
import datetime
import platform
from dataclasses import dataclass

DTYPES = ("bf16", "fp32")
OPS = ("rmsnorm", "swiglu", "layernorm", "gelu", "rope_hf", "rope_complex")
HEAD_DIM = 128  # a rotary op's head width (the width argument is heads x HEAD_DIM)


@dataclass(frozen=True)
class EagerCount:
    fwd_bytes: float  # bytes the forward's kernels read and write, per element of the op's output
    fwd_kernels: int
    bwd_bytes: float
    bwd_kernels: int
    saved_bytes: float  # bytes autograd keeps for the backward but the op's inputs, weight and output, per element


def _ops(name: str):
    """The op as the eager layer writes it: (function of (inputs, weight), its inputs, has weight). RMSNorm:
    Hugging Face's LlamaRMSNorm and torchtitan's RMSNorm (9dec370 torchtitan/models/norms.py), the same ops in the
    same order; SwiGLU: silu(gate) * up over the gate and up projections' separate outputs (LlamaMLP, torchtitan's
    FeedForward); LayerNorm and GELU: torch's own single ops."""
    import torch
    import torch.nn.functional as F

    def rmsnorm(xs, w):
        (x,) = xs
        dtype = x.dtype
        a = x.float()
        a = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * a.to(dtype)

    def swiglu(xs, _w):
        gate, up = xs
        return F.silu(gate) * up

    def layernorm(xs, w):
        (x,) = xs
        return F.layer_norm(x, x.shape[-1:], w)

    def gelu(xs, _w):
        (x,) = xs
        return F.gelu(x)

    def rope_hf(xs, tables):
        # transformers' apply_rotary_pos_emb on one of its inputs (query or key states), as XTuner's llama_attn_forward
        # calls it at 7575f2c91: the projection's output viewed (batch, seq, heads, head_dim) and transposed to
        # (batch, heads, seq, head_dim), cos / sin (batch, seq, head_dim) unsqueezed at dim 1; rotate_half is
        # cat((-x2, x1)) of the two halves of the head
        (x,) = xs
        cos, sin = tables
        t = x.view(1, x.shape[0], -1, HEAD_DIM).transpose(1, 2)
        half = HEAD_DIM // 2
        rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
        return (t * cos.unsqueeze(1)) + (rotated * sin.unsqueeze(1))

    def rope_complex(xs, tables):
        # torchtitan's apply_rotary_emb (torchtitan/models/llama/model.py, 2024-12) on one of xq / xk: the
        # (batch, seq, heads, head_dim) view upcast to fp32 pairs, a complex multiply by freqs_cis (seq, head_dim / 2)
        # broadcast over the heads, back to real and cast to the input's dtype (type_as)
        (x,) = xs
        (freqs,) = tables
        t = x.view(1, x.shape[0], -1, HEAD_DIM)
        c = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
        out = torch.view_as_real(c * freqs.view(1, t.shape[1], 1, -1)).flatten(3)
        return out.type_as(t)

    return {"rmsnorm": (rmsnorm, 1, True), "swiglu": (swiglu, 2, False), "layernorm": (layernorm, 1, True),
            "gelu": (gelu, 1, False), "rope_hf": (rope_hf, 1, False), "rope_complex": (rope_complex, 1, False)}[name]


def _rope_tables(name: str, tokens: int, dtype):
    """A rotary op's position tables, built before the count (once a step or a layer: not the op's kernels): cos and
    sin (batch, seq, head_dim) in the model dtype as transformers' LlamaRotaryEmbedding returns them; torchtitan's
    complex64 freqs_cis (seq, head_dim / 2)."""
    import torch
    inv = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    freqs = torch.outer(torch.arange(tokens).float(), inv)
    if name == "rope_complex":
        return (torch.polar(torch.ones_like(freqs), freqs),)
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def count_eager_kernels(name: str, dtype: str, tokens: int, width: int) -> EagerCount:
    """Run op ``name`` forward and backward on the CPU in ``dtype`` over ``tokens`` x ``width`` outputs and count
    the ATen ops the dispatcher runs (each a kernel on a GPU) and the bytes they move, per output element."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    def nbytes(t: torch.Tensor) -> int:  # a broadcast (expanded) input is read at its storage's size
        return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.kernels, self.bytes = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            stores = {t.untyped_storage().data_ptr() for t in ins}
            if outs and all(o.untyped_storage().data_ptr() in stores for o in outs):
                return out  # a view or an alias: no kernel
            self.kernels += 1
            self.bytes += sum(nbytes(t) for t in ins) + sum(nbytes(t) for t in outs)
            return out

    tdtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    fn, inputs, has_weight = _ops(name)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(tokens, width, generator=gen).to(tdtype).requires_grad_() for _ in range(inputs)]
    w = torch.ones(width, dtype=tdtype, requires_grad=True) if has_weight else None
    if name.startswith("rope"):  # the position tables take the weight's place: not the op's own bytes
        w = _rope_tables(name, tokens, tdtype)
    fwd = Record()
    saved: dict[int, int] = {}  # storage -> bytes autograd saves for the backward

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with fwd, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(xs, w)
    weights = list(w) if isinstance(w, tuple) else [w] if w is not None else []
    own = {t.untyped_storage().data_ptr() for t in [*xs, y, *weights]}
    dy = torch.randn(y.shape, generator=gen).to(tdtype)
    bwd = Record()
    with bwd:
        y.backward(dy)
    n = tokens * width
    return EagerCount(fwd.bytes / n, fwd.kernels, bwd.bytes / n, bwd.kernels,
                      sum(b for ptr, b in saved.items() if ptr not in own) / n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096, help="rows of the op's input (tokens)")
    ap.add_argument("--hidden", type=int, default=1024, help="the op's width (hidden, or the FFN width)")
    args = ap.parse_args()
    import torch
    print(f"# eager kernels: torch {torch.__version__}, {platform.machine()}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"tokens {args.tokens}, width {args.hidden}")
    print("| op | dtype | forward bytes / element | forward kernels | backward bytes / element | backward kernels | "
          "saved bytes / element |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in OPS:
        for dtype in DTYPES:
            c = count_eager_kernels(name, dtype, args.tokens, args.hidden)
            print(f"| {name} | {dtype} | {c.fwd_bytes:.2f} | {c.fwd_kernels} | {c.bwd_bytes:.2f} | {c.bwd_kernels} | "
                  f"{c.saved_bytes:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
