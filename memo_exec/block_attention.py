"""One attention block kernel and the log-sum-exp merge: what ring CP
(`memo_exec.distributed.attention`), METP's two-level MHA (`memo_exec.metp.ring_attention`) and
SPPO's prefix attention (`memo_exec.sppo.attention`) build their attention from.

A *block* is queries ``q`` ``[B, H, n, d]`` against keys and values ``k``, ``v`` ``[B, Hk, m, d]``
(GQA: ``Hk`` divides ``H``, query head h reads kv head ``h // (H / Hk)``), either full or causal.
Causal means the diagonal block of a causal sequence: square (``n == m``), key j visible to query
i iff ``j <= i``. Every caller splits its attention into such blocks (a fully masked block is
skipped by the caller, never passed here).

- `block_forward` -> ``(o, lse)``: the block's output ``[B, H, n, d]`` in q's dtype and the
  log-sum-exp of its scores ``[B, H, n]`` in the accumulation dtype (`memo_exec.device.acc_dtype`).
- `merge_` folds a block's ``(o, lse)`` into the running ``(acc_o, acc_lse)`` of the same rows
  (the online-softmax / ring-attention recurrence), in place, in the accumulators' dtype.
- `block_backward` -> ``(dq, dk, dv)`` of one block, given the rows' *final* output and lse (after
  every block was merged): P = exp(S - lse) and D = rowsum(dO * O) are then the whole
  attention's, so the blocks' gradients sum to the exact gradient. dk, dv are summed over each
  GQA group (``[B, Hk, m, d]``); all three in q's dtype.

The kernel (`kernel_for`):

- ``flash_cpu``: aten's CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu`` and its
  backward), every float dtype;
- ``flash``: aten's CUDA flash kernel (``_scaled_dot_product_flash_attention`` and its backward),
  fp16/bf16, head dim <= 256;
- ``efficient``: aten's CUDA memory-efficient kernel (``_scaled_dot_product_efficient_attention``
  with ``compute_log_sumexp=True`` and its backward), fp32 and the 16-bit cases flash refuses;
- ``math``: plain PyTorch in the accumulation dtype, query-chunked so one chunk's scores and
  probabilities stay under ``budget`` bytes: fp64 on CUDA, any other device, or a block a fused
  kernel refuses (the reason is kept in `FALLBACKS` and warned once per kind of block).

No kernel materialises a block's score matrix beyond the math path's chunk, so a block is as long
as the caller's chunk (a ring CP or METP block at 128K tokens holds only its q, k, v, o).

The fused kernels are called with dropout 0: their backward ignores the random-number state, but
the ops take it, so the state one forward returned is kept per device (`_rng_state`) and passed.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import torch

from memo_exec.attention import expand_kv_heads, reduce_kv_heads
from memo_exec.device import acc_dtype

KERNELS = ("flash_cpu", "flash", "efficient", "math")
MATH_BUDGET_BYTES = 64 * 2**20  # one query chunk's scores and probabilities (math kernel)
EFFICIENT_LSE_ALIGN = 32  # the efficient kernel pads its lse rows to a multiple of 32 (CUDA)
FLASH_MAX_HEAD_DIM = 256

FALLBACKS: dict[tuple, str] = {}  # (kernel, device type, dtype, head dim) -> why it fell back to math
_override: list[str] = []  # `use_kernel` (tests and comparisons)
_RNG: dict[tuple, tuple] = {}  # (kernel, device) -> the rng-state tensors a forward returned


def kernel_for(device_type: str, dtype: torch.dtype, head_dim: int) -> str:
    """The kernel a block of this device, dtype and head dim runs on (module docs)."""
    if _override:
        return _override[-1]
    if device_type == "cpu":
        return "flash_cpu"
    if device_type == "cuda":
        if dtype in (torch.float16, torch.bfloat16) and head_dim <= FLASH_MAX_HEAD_DIM:
            return "flash"
        if dtype in (torch.float16, torch.bfloat16, torch.float32):
            return "efficient"
    return "math"


@contextlib.contextmanager
def use_kernel(name: str):
    """Run every block inside on ``name`` (one of `KERNELS`)."""
    if name not in KERNELS:
        raise ValueError(f"block attention kernel must be one of {', '.join(KERNELS)}, got {name!r}")
    _override.append(name)
    try:
        yield
    finally:
        _override.pop()


def _check(q, k, v, causal: bool) -> None:
    if q.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"block attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"block attention: {q.shape[1]} query heads over {k.shape[1]} kv heads")
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"block attention: a causal block is square, got {q.shape[2]} queries x {k.shape[2]} keys")


def _lse_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _fell_back(kernel: str, q: torch.Tensor, err: Exception) -> None:
    key = (kernel, q.device.type, q.dtype, q.shape[-1])
    if key not in FALLBACKS:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        FALLBACKS[key] = first
        warnings.warn(f"block attention: the {kernel} kernel refused a {q.dtype} block of head dim {q.shape[-1]} "
                      f"on {q.device.type} ({first}); using the math kernel", RuntimeWarning, stacklevel=3)


def _fused(kernel: str, fn, q: torch.Tensor):
    """Run a fused kernel; a refusal (not an out-of-memory error) falls back to math (None)."""
    if kernel == "math" or FALLBACKS.get((kernel, q.device.type, q.dtype, q.shape[-1])) is not None:
        return None
    try:
        return fn()
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, NotImplementedError) as e:
        _fell_back(kernel, q, e)
        return None


# ---------------------------------------------------------------------------------------- forward
def block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None,
                  budget: int = MATH_BUDGET_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` of one block (module docs)."""
    _check(q, k, v, causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    kernel = kernel_for(q.device.type, q.dtype, q.shape[-1])
    acc = acc_dtype(q.dtype)
    if kernel != "math":
        qc = q.contiguous()
        kc, vc = expand_kv_heads(k, group).contiguous(), expand_kv_heads(v, group).contiguous()
        r = _fused(kernel, lambda: _FORWARD[kernel](qc, kc, vc, causal, scale), q)
        if r is not None:
            return r[0], r[1].to(acc)
    return _math_forward(q, k, v, causal, scale, group, budget)


def _flash_cpu_fwd(q, k, v, causal, scale):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def _flash_fwd(q, k, v, causal, scale):
    r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    _RNG.setdefault(("flash", q.device), (r[6], r[7]))
    return r[0], r[1]


def _efficient_fwd(q, k, v, causal, scale):
    o, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal,
                                                                                   scale=scale)
    _RNG.setdefault(("efficient", q.device), (seed, offset))
    return o, lse[..., :q.shape[2]]


_FORWARD = {"flash_cpu": _flash_cpu_fwd, "flash": _flash_fwd, "efficient": _efficient_fwd}


def _chunk_rows(batch: int, heads: int, keys: int, acc: torch.dtype, budget: int) -> int:
    per_row = 2 * batch * heads * max(1, keys) * torch.empty((), dtype=acc, device="meta").element_size()
    return max(1, budget // per_row)


def _causal_mask(r0: int, r1: int, keys: int, device) -> torch.Tensor:
    """True where key j lies after query i, for query rows [r0, r1)."""
    return torch.arange(keys, device=device).unsqueeze(0) > torch.arange(r0, r1, device=device).unsqueeze(1)


def _math_scores(q, k, r0, r1, causal, scale, acc):
    e = r1 if causal else k.shape[2]  # causal: the keys after the chunk's last query are all masked
    s = torch.matmul(q[:, :, r0:r1].to(acc), k[:, :, :e].to(acc).transpose(-1, -2)).mul_(scale)
    if causal:
        s.masked_fill_(_causal_mask(r0, r1, e, q.device), float("-inf"))
    return s, e


def _math_forward(q, k, v, causal, scale, group, budget):
    acc = acc_dtype(q.dtype)
    b, H, n, d = q.shape
    kk, vv = expand_kv_heads(k, group), expand_kv_heads(v, group)
    o = torch.empty(b, H, n, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, H, n, dtype=acc, device=q.device)
    rows = _chunk_rows(b, H, kk.shape[2], acc, budget)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        s, e = _math_scores(q, kk, r0, r1, causal, scale, acc)
        m = torch.logsumexp(s, dim=-1)
        lse[:, :, r0:r1] = m
        o[:, :, r0:r1] = torch.matmul(s.sub_(m.unsqueeze(-1)).exp_(), vv[:, :, :e].to(acc)).to(q.dtype)
    return o, lse


# ---------------------------------------------------------------------------------------- merge
def merge_(acc_o: torch.Tensor, acc_lse: torch.Tensor, o: torch.Tensor, lse: torch.Tensor) -> None:
    """``acc`` <- the softmax-weighted combination of ``acc`` and the block ``(o, lse)`` of the same
    rows (in place; ``acc_lse`` starts at -inf, ``acc_o`` at 0). Rows no block has reached yet
    stay at (0, -inf)."""
    new = torch.logaddexp(acc_lse, lse.to(acc_lse.dtype))
    ref = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
    acc_o.mul_((acc_lse - ref).exp_().unsqueeze(-1))
    acc_o.add_(o.to(acc_o.dtype) * (lse.to(acc_lse.dtype) - ref).exp_().unsqueeze(-1))
    acc_lse.copy_(new)


# ---------------------------------------------------------------------------------------- backward
def block_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, causal: bool, scale: float | None = None, budget: int = MATH_BUDGET_BYTES
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of one block given the rows' final ``o`` and ``lse`` (module docs)."""
    _check(q, k, v, causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    kernel = kernel_for(q.device.type, q.dtype, q.shape[-1])
    if kernel != "math":
        args = (do.to(q.dtype).contiguous(), q.contiguous(), expand_kv_heads(k, group).contiguous(),
                expand_kv_heads(v, group).contiguous(), o.to(q.dtype).contiguous(),
                lse.to(_lse_dtype(q)).contiguous())
        r = _fused(kernel, lambda: _BACKWARD[kernel](*args, causal, scale), q)
        if r is not None:
            gq, gk, gv = r[:3]
            return gq, reduce_kv_heads(gk, group), reduce_kv_heads(gv, group)
    return _math_backward(do, q, k, v, o, lse, causal, scale, group, budget)


def _rng_state(kernel: str, q: torch.Tensor) -> tuple:
    """The rng-state tensors a forward of ``kernel`` returned on q's device (a tiny forward if none
    ran yet in this process): dropout is 0, so the backward does not read them."""
    key = (kernel, q.device)
    if key not in _RNG:
        t = torch.zeros(1, 1, 8, q.shape[-1], dtype=q.dtype, device=q.device)
        _FORWARD[kernel](t, t, t, False, 1.0)
    return _RNG[key]


def _flash_cpu_bwd(do, q, k, v, o, lse, causal, scale):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, causal,
                                                                               scale=scale)


def _flash_bwd(do, q, k, v, o, lse, causal, scale):
    seed, offset = _rng_state("flash", q)
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        do, q, k, v, o, lse, None, None, q.shape[2], k.shape[2], 0.0, causal, seed, offset, scale=scale)


def _efficient_bwd(do, q, k, v, o, lse, causal, scale):
    seed, offset = _rng_state("efficient", q)
    n = q.shape[2]
    padded = -(-n // EFFICIENT_LSE_ALIGN) * EFFICIENT_LSE_ALIGN
    if padded != n:  # the layout the forward returned (rows past n are never read)
        lse = torch.cat([lse, lse.new_zeros(lse.shape[0], lse.shape[1], padded - n)], dim=-1)
    # the output in the layout the forward returns it ([b, n, H, d] memory): in bf16 the kernel
    # reads a [b, H, n, d]-contiguous one wrongly (dq and dk off by 50-85% on an H100, torch 2.11;
    # benchmarks/gpu/probe_executor.py), in fp32 either layout is right
    o = o.transpose(1, 2).contiguous().transpose(1, 2)
    return torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        do, q, k, v, None, o, lse, seed, offset, 0.0, [True, True, True, False], causal, scale=scale)


_BACKWARD = {"flash_cpu": _flash_cpu_bwd, "flash": _flash_bwd, "efficient": _efficient_bwd}


def _math_backward(do, q, k, v, o, lse, causal, scale, group, budget):
    acc = acc_dtype(q.dtype)
    b, H, n, d = q.shape
    kk, vv = expand_kv_heads(k, group), expand_kv_heads(v, group)
    m = kk.shape[2]
    dq = torch.empty_like(q)
    dk = torch.zeros(b, H, m, d, dtype=acc, device=q.device)
    dv = torch.zeros(b, H, m, d, dtype=acc, device=q.device)
    rows = _chunk_rows(b, H, m, acc, budget)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        s, e = _math_scores(q, kk, r0, r1, causal, scale, acc)
        dob = do[:, :, r0:r1].to(acc)
        p = s.sub_(lse[:, :, r0:r1].to(acc).unsqueeze(-1)).exp_()  # P = exp(S - lse)
        dv[:, :, :e] += torch.matmul(p.transpose(-1, -2), dob)
        dp = torch.matmul(dob, vv[:, :, :e].to(acc).transpose(-1, -2))
        delta = (dob * o[:, :, r0:r1].to(acc)).sum(-1, keepdim=True)  # D = rowsum(dO * O)
        ds = p.mul_(dp.sub_(delta)).mul_(scale)
        dq[:, :, r0:r1] = torch.matmul(ds, kk[:, :, :e].to(acc)).to(q.dtype)
        dk[:, :, :e] += torch.matmul(ds.transpose(-1, -2), q[:, :, r0:r1].to(acc))
    return dq, reduce_kv_heads(dk, group).to(q.dtype), reduce_kv_heads(dv, group).to(q.dtype)
