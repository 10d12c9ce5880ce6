"""Ring context parallelism's attention on one rank, priced block by block as memo's executor runs it.

The decomposition is memo's executor's (`memo_exec.distributed.attention`), the zigzag layout of
ring-flash-attention (zhuzilin/ring-flash-attention, ``zigzag_ring_flash_attn``): the sequence
is cut into 2·cp chunks of c = s / (2·cp) tokens and rank r holds chunks r and 2·cp-1-r, so
every rank gets the same share of the causal triangle. Over the cp steps of the ring each rank
runs one attention kernel per pair (its query chunk, a key chunk it holds now) that is not fully
masked (`zigzag_blocks`): 2 causal diagonal c x c blocks (its own chunks) and 2·cp-1 full c x c
blocks, 2·cp+1 kernel calls per layer forward, exactly causal/cp score elements
(`block_counts`); the backward runs the same blocks. Each block is priced by
`memo_sim.cost.kernel_time` at the profile's curves for ring blocks of its shape
(`Efficiency.attention_curves` with ``block``): the block kernel's own where the profile
measured it, else the named kernel's. A small kernel reaches less of the peak than one over the
rank's whole share, and a kernel that tiles the keys computes more than the triangle of a small
causal block, so the sum of the blocks is not one causal kernel of the rank's FLOPs.

Other implementations cut the same work differently: TransformerEngine's CP (``cp_comm_type``
p2p) issues one kernel per ring step over both local chunks (2·c² score elements, a causal
kernel over 2c tokens at step 0), its all-gather CP (``all_gather``) one kernel per local chunk
over the keys before it. What is priced here is the executor's decomposition, or TransformerEngine's p2p kernels
where the framework runs them (``ring_merge`` te_p2p, `memo_sim.layout.ring_merge`: Megatron-LM's); the rank's FLOPs
(MFU) are the same either way.

**Transfers** (`ring_shift_bytes`, priced in `memo_sim.cost.layer_time`): the forward shifts the
K/V block cp-1 times, each shift beside the blocks of one step. The backward shifts K/V cp-1 times
and the dK/dV accumulators cp times: every accumulator arrives home after cp shifts, and the last
one is posted after the last step's blocks and waited for before the backward returns, so nothing
hides it (ring-flash-attention's zigzag backward at 0fc25b46: ``d_kv_comm.wait()`` after the loop;
memo's executor: the ``_wait`` after its loop). TransformerEngine's p2p CP shifts them cp - 1 times: its
backward's last step is the rank's own diagonal chunk (``if i == (cp_size - 1): dkv.add_(dkv_)``), whose
accumulator has arrived home, and nothing is sent after its loop (``RingMerge.dkv_home`` False). The accumulators
travel in the dtype the framework accumulates them in (`ring_shift_bytes`): the model's for TransformerEngine's
p2p CP (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py
AttnFuncWithCPAndKVP2P.backward outside FP8: ``p2p_comm_buffers = [torch.empty((2, *kv.shape), dtype=kv.dtype,
...)]`` and ``dkv = p2p_comm_buffers[(i + 1) % 2][1]``, the version the code search stores, no commit pinned);
fp32 for memo's own plans (memo_exec/distributed/attention.py RingAttention.backward: ``part``, ``acc_a``,
``acc_b`` of `memo_exec.device.acc_dtype`, or the model's dtype where a plan's ``Layout.ring_dkv_fp32`` is False;
True in the ``any`` framework's data) and
PyTorch's CP (``ring_merge`` torch_cp), twice the bytes of a bf16 model's (a review found memo's executor's
priced at the model dtype's); ring-flash-attention (``dk_buffer.to(torch.float32)``) too.

An implementation that exchanges K/V as one all-gather (``kv_allgather`` of `memo_sim.layout.ring_merge`:
PyTorch's experimental CP at its allgather rotate method) issues it at step 0 and waits for it at step 1:
the gather, cp - 1 shifts' bytes on the CP group's link (`memo_sim.cost.collectives.ring_allgather_time`),
runs beside step 0's blocks alone (`first_step_share`), in the forward and the backward, whose dK/dV still
go round one shift a step beside the later steps' blocks.

**Passes beside the kernels** (`ring_merge_cost`): an implementation that merges each step's partial
output and accumulates each step's gradients in separate passes over HBM (``Layout.ring_merge``,
`memo_sim.layout.ring_merge`: PyTorch's experimental CP) pays those bytes on the compute stream, one op
per layer pass; its K/V and dK/dV shifts carry the heads and the element size its ring sends
(`ring_shift_bytes`).

Sliding-window layers skip the key chunks outside the window, which this zigzag count does not
know (memo's executor does not run them under ring CP): their attention keeps the one-kernel
pricing of `memo_sim.cost.layer_time` (`applies`).
"""

from __future__ import annotations

from functools import lru_cache

from memo_sim.cost.activations import tokens_per_gpu
from memo_sim.cost.kernel_time import attention_bwd_time, attention_fwd_time, memory_bound_op_time
from memo_sim.cost.opcost import OpCost
from memo_sim.layout.parallel import Layout
from memo_sim.layout.ring_merge import ring_merge
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.profile.schema import HardwareProfile



def zigzag_chunks(cp: int, rank: int) -> tuple[int, int]:
    """The two chunks (of 2·cp) rank ``rank`` holds: its own and its mirror."""
    return rank, 2 * cp - 1 - rank


def zigzag_step_blocks(cp: int, rank: int, step: int) -> list[tuple[int, int, bool]]:
    """(query chunk, key chunk, causal) of the blocks rank ``rank`` runs at ring step ``step``, when it
    holds the K/V chunks of rank (rank - step) mod cp; a key chunk after the query chunk is fully
    masked and skipped, the equal one is the causal diagonal block."""
    src = (rank - step) % cp
    return [(qi, ki, ki == qi) for qi in zigzag_chunks(cp, rank) for ki in zigzag_chunks(cp, src) if ki <= qi]


def zigzag_blocks(cp: int, rank: int) -> list[tuple[int, int, bool]]:
    """Every block rank ``rank`` runs over the cp ring steps (`zigzag_step_blocks`)."""
    return [b for j in range(cp) for b in zigzag_step_blocks(cp, rank, j)]


@lru_cache(maxsize=64)
def block_counts(cp: int) -> tuple[int, int]:
    """(full, causal) c x c blocks one rank runs per layer pass: (2·cp-1, 2) on every rank."""
    blocks = zigzag_blocks(cp, 0)
    causal = sum(1 for _q, _k, c in blocks if c)
    return len(blocks) - causal, causal


def applies(model: ModelConfig, layout: Layout, seq: int) -> bool:
    """Whether a layer's attention runs as ring CP's blocks priced here (module docs)."""
    return layout.cp > 1 and layout.attention != "materialised" and model.attention_flop_fraction(seq) == 1.0


@lru_cache(maxsize=256)
def _ring_kernels(cp: int, step_kernels: bool, first_step: bool = False) -> tuple[tuple[float, str, int], ...]:
    """(FLOPs in c x c full blocks, mask, how many) of the kernels one rank runs per layer pass (``first_step``: at
    ring step 0 only): the zigzag blocks, a causal diagonal one half a full block (`zigzag_step_blocks`), or with
    ``step_kernels`` one kernel per ring step of 2·c² score elements, causal over the rank's 2c tokens at step 0.
    Kernels alike are counted once (a what-if prices thousands of CP layouts, up to 2·cp + 1 kernels each)."""
    if step_kernels:
        kernels = [(2.0, "causal")] + ([] if first_step else [(2.0, "full")] * (cp - 1))
    else:
        blocks = zigzag_step_blocks(cp, 0, 0) if first_step else zigzag_blocks(cp, 0)
        kernels = [(0.5, "causal") if causal else (1.0, "full") for _q, _k, causal in blocks]
    counts: dict[tuple[float, str], int] = {}
    for k in kernels:
        counts[k] = counts.get(k, 0) + 1
    return tuple((units, mask, n) for (units, mask), n in counts.items())


def _kernels_time(kernels: tuple[tuple[float, str, int], ...], f_full: float, profile: HardwareProfile, dtype: str,
                  head_dim: int | None, kernel: str, phase: str) -> float:
    price = attention_bwd_time if phase == "bwd" else attention_fwd_time
    return sum(n * price(units * f_full, profile, dtype, head_dim, kernel, mask) for units, mask, n in kernels)


def gathers_kv(model: ModelConfig, layout: Layout, seq: int) -> bool:
    """Whether a layer's ring gathers K/V at once (`memo_sim.layout.ring_merge` ``kv_allgather``) over
    blocks priced here (`applies`)."""
    return ring_merge(layout.ring_merge).kv_allgather and applies(model, layout, seq)


def ring_attention_time(flops: float, profile: HardwareProfile, dtype: str, head_dim: int | None, kernel: str,
                        cp: int, phase: str, step_kernels: bool = False) -> float:
    """Seconds of one rank's attention pass of ``flops`` (the rank's causal/cp share: forward FLOPs,
    or the backward kernel's own for ``phase`` "bwd") as its zigzag blocks: each full block holds
    c² of the rank's 2·cp·c² score elements' worth of FLOPs, a causal one half of that. ``step_kernels``
    (`memo_sim.layout.ring_merge.RingMerge`: TransformerEngine's p2p CP, PyTorch's CP): one kernel per ring step
    instead, a causal one over the rank's 2c tokens at step 0 and cp - 1 full ones of 2·c² score elements (its
    queries' two chunks over one key chunk, or its second query chunk over both key chunks), the same FLOPs in
    fewer, larger kernels (`_ring_kernels`)."""
    full, causal = block_counts(cp)
    return _kernels_time(_ring_kernels(cp, step_kernels), flops / (full + causal / 2), profile, dtype, head_dim,
                         kernel, phase)


def first_step_share(flops: float, profile: HardwareProfile, dtype: str, head_dim: int | None, kernel: str,
                     cp: int, phase: str, step_kernels: bool = False) -> float:
    """The share of `ring_attention_time` that ring step 0 takes: the kernels over the rank's own two chunks
    (`_ring_kernels` at step 0: both causal diagonal blocks and the full one of its mirror chunk over its own, or
    one causal kernel over both), the only compute an all-gather of K/V issued at step 0 runs beside."""
    full, causal = block_counts(cp)
    f_full = flops / (full + causal / 2)
    total = _kernels_time(_ring_kernels(cp, step_kernels), f_full, profile, dtype, head_dim, kernel, phase)
    if total <= 0:
        return 1.0 / cp
    return _kernels_time(_ring_kernels(cp, step_kernels, True), f_full, profile, dtype, head_dim, kernel,
                         phase) / total


def ring_kv_elements(model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    """Elements of a rank's K and V chunk as its ring holds them: under Ulysses the head-sharded K/V,
    each head repeated r times (`layout.kv_heads`); K/V repeated to the query heads where the ring
    implementation sees them so (`memo_sim.layout.ring_merge`: torchtitan's repeat_kv before SDPA)."""
    tokens = tokens_per_gpu(layout, batch, seq)
    if ring_merge(layout.ring_merge).kv_at_query_heads:
        return tokens * (model.q_dim + model.attn_dim) / layout.tp
    return tokens * (model.kv_dim + model.v_dim) / layout.tp * layout.kv_repeat(model.n_kv_heads, model.heads)


def ring_shift_bytes(model: ModelConfig, layout: Layout, batch: int, seq: int, grads: bool = False) -> float:
    """Bytes of one K/V shift of a rank (``grads``: of its dK/dV accumulators): `ring_kv_elements` in the
    model's dtype, the accumulators in the element size the ring sends them in where it says one
    (`memo_sim.layout.ring_merge`: fp32 for PyTorch's CP), else in fp32 where the framework accumulates them so
    (``layout.ring_dkv_fp32``, which memo's executor follows; module docs)."""
    size = DTYPE_BYTES[model.dtype]
    if grads:
        size = ring_merge(layout.ring_merge).dkv_element_bytes(size, layout.ring_dkv_fp32)
    return ring_kv_elements(model, layout, batch, seq) * size


def ring_merge_cost(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                    phase: str, fraction: float = 1.0) -> OpCost | None:
    """The ring implementation's merge, accumulation and packing passes of one layer pass (module docs),
    or None where it prices none (``ring_merge`` none, or no CP)."""
    merge = ring_merge(layout.ring_merge)
    if layout.cp <= 1 or merge.name == "none":
        return None
    tokens = tokens_per_gpu(layout, batch, seq) * fraction
    q = tokens * (model.q_dim if phase == "bwd" else model.attn_dim) / layout.tp
    nbytes = merge.bytes(layout.cp, q, ring_kv_elements(model, layout, batch, seq) * fraction, phase)
    return OpCost("cp_ring_merge", "elementwise", phase, "compute", memory_bound_op_time(nbytes, profile),
                  nbytes=nbytes)
