"""What torchtitan's per-op selective activation checkpointing saves of one layer, and which of its ops the recompute
runs again: the one place its save list's rules live (`memo_sim.cost.activations` prices the bytes they keep,
`memo_sim.policy.op_sac` the time of what they re-run).

The rules, read in torchtitan 9dec370's ``torchtitan/parallelisms/parallelize_llama.py`` (``_save_list``,
``_custom_policy``) and b5bcd76c's ``torchtitan/distributed/activation_checkpoint.py`` (``_get_default_save_ops``,
``SelectiveAC._wrap_block``), each block's forward running under a fresh policy (its GEMM count starts at 0):

- every ``nn.Linear``'s GEMM (``aten.mm``, or ``aten.linear`` where a backend keeps it whole) is counted in the
  block's forward order and its output saved where the count is odd, re-run where it is even: a Llama block's wq, wk,
  wv, wo, w1, w3, w2 save wq, wv, w1 and w2; latent attention's wq_a, wq_b, wkv_a, wkv_b, wo
  (torchtitan/models/deepseek_v3/model.py) save wq_a, wkv_a and wo, and the shared experts after them (w1, w3, w2 in
  torchtitan/models/common/feed_forward.py) are counted on from there;
- the MoE router's gate is re-run and not counted (b5bcd76c ``force_recompute_mm_shapes_by_fqns`` defaults to
  ``["moe.router.gate"]``); the routed experts' grouped GEMMs (``torch._grouped_mm``,
  torchtitan/models/common/moe.py ``GroupedExperts``) are on no list and are neither counted nor saved;
- the attention kernels' outputs are saved (SDPA's flash, efficient and cuDNN kernels, flex_attention), and the
  reduce-scatters' (``_c10d_functional.reduce_scatter_tensor``: a sequence-parallel row-parallel linear's), the
  all-to-alls' (``all_to_all_single``: the all-to-all token dispatcher's exchanges,
  torchtitan/models/common/token_dispatcher.py) and ``aten.topk``'s (b5bcd76c); all-gathers and all-reduces are on
  neither list and run again;
- everything else runs again: norms, the rotary embedding, residual adds, activations, the routing scores, the
  permutes and the combine's weighting.

Whatever the policy saves is stored by the checkpoint's caching mode in eager PyTorch whether or not the backward
reads it; in a compiled block AOTAutograd's partitioner keeps a tagged output only where the backward graph reads it
(`backward_reads`). Recomputation stops early (PyTorch's non-reentrant checkpoint, as at 9dec370), so the block's
last residual add does not run again (b5bcd76c passes early_stop=False: one elementwise op, not priced).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import forward_ops

# GEMMs the save list neither counts nor saves: the router's gate (forced re-run) and the grouped expert GEMMs
_UNCOUNTED_SCOPES = ("shard", "expert")
# ops the early-stopping recompute does not reach (module docs)
NOT_RERUN = ("add2",)
# TP collectives that run again with their op (neither on the save list); a reduce-scatter's output is saved
RERUN_COLLECTIVES = ("allgather_", "allreduce_")


@dataclass(frozen=True)
class LinearPart:
    """One ``nn.Linear`` of the block, in torchtitan's order: the memo GEMM op it is part of, its share of that
    op's output width, the layer tensors it writes whole (none where it writes half of a gated fc1), and whether the
    save list keeps its output (its place in the count is odd)."""

    op: str
    share: float
    tensors: tuple[str, ...]
    saved: bool


def _parts_of(op, model: ModelConfig) -> list[tuple[float, tuple[str, ...]]]:
    """(share, whole tensors written) of each nn.Linear a memo GEMM op stands for, in the order they run."""
    if op.name == "qkv":  # wq, wk, wv, fused in memo's op
        total = model.q_dim + model.kv_dim + model.v_dim
        return [(model.q_dim / total, ("q",)), (model.kv_dim / total, ("k",)), (model.v_dim / total, ("v",))]
    if op.name in ("fc1", "shared_fc1") and model.ffn_type == "swiglu":  # w1 (the gate half), then w3
        return [(0.5, ()), (0.5, ())]
    return [(1.0, tuple(op.outputs))]


@lru_cache(maxsize=256)
def linear_parts(model: ModelConfig) -> tuple[LinearPart, ...]:
    """The block's ``nn.Linear`` GEMMs as the save list counts them (module docs)."""
    out, count = [], 0
    for op in forward_ops(model):
        if op.kind != "gemm" or op.scope in _UNCOUNTED_SCOPES:
            continue
        for share, tensors in _parts_of(op, model):
            count += 1
            out.append(LinearPart(op.name, share, tensors, count % 2 == 1))
    return tuple(out)


@lru_cache(maxsize=256)
def gemm_kept_shares(model: ModelConfig) -> dict[str, float]:
    """Each GEMM op's share of its output the save list keeps (0 for the router and the experts: re-run whole)."""
    shares = {op.name: 0.0 for op in forward_ops(model) if op.kind == "gemm"}
    for p in linear_parts(model):
        if p.saved:
            shares[p.op] += p.share
    return shares


def kept_tensors(model: ModelConfig, all_to_all: bool) -> tuple[str, ...]:
    """The skeletal tensors the checkpoint keeps whole beside the saved linears' outputs (`linear_parts`): the
    block's input, the attention kernel's output and, where the tokens travel by all-to-all (``all_to_all``: expert
    parallelism with the all-to-all dispatcher), the dispatched tokens (the exchange's output; the experts' permuted
    copy of it is made again)."""
    return ("x", "attn", "moe_in") if model.moe and all_to_all else ("x", "attn")


def in_skeleton(part: LinearPart, skeletal: frozenset[str]) -> bool:
    """Whether a saved linear's output is (part of) a skeletal tensor: then it is kept in place of that one; else
    (w2's output, the output projection's, the shared experts' w2 without a gate) it is kept beside store-all's
    tensors in eager PyTorch."""
    if part.op in ("fc1", "shared_fc1") and not part.tensors:
        return ("fc1" if part.op == "fc1" else "sfc1") in skeletal
    return bool(set(part.tensors) & skeletal)


def backward_reads(name: str) -> bool:
    """Whether the backward graph reads a saved tensor outside the skeleton (what a compiled block keeps of it):
    neither a row-parallel linear's output nor its reduce-scatter's (they feed the residual add alone), nor the
    casts' abs outputs; the combine's all-to-all output yes (the routing weights' gradient reads it) and topk's
    expert indices (the gather's and scatter's backward)."""
    return name in ("moe_combined", "topk_indices")
