"""Ring-CP implementations' passes over HBM beside their attention kernels (``Layout.ring_merge``,
framework data): merging each ring step's partial output into the running one, accumulating each
step's gradients, and packing what the ring sends; and how the implementation exchanges K/V (a shift
beside each step, or one all-gather). Priced in `memo_sim.cost.ring_attention` and
`memo_sim.cost.layer_time`, its buffers in `memo_sim.memplan.trace_gen`.

- ``none``: nothing priced beside the kernels and the shifts: memo's executor and the frameworks
  whose ring corrections were not counted from their sources (ring-flash-attention's).
- ``torch_cp``: PyTorch's experimental context parallelism as torchtitan called it in 2024-12
  (pytorch/pytorch torch/distributed/tensor/experimental/_attention.py: ``_templated_ring_attention``,
  ``_templated_ring_attention_backward``, ``_SDPAMerger``, ``_partial_update``; ``convert_to_f32`` and
  the round-robin load balance on, its defaults), its passes eager ops (the ring is dispatched through
  DTensor's SDPA handler; that torch.compile of that time left them unfused is assumed, not checked).
  Bytes counted from that code, per element of the rank's attention output (Q: tokens x query heads
  x head size) and of its K and V together as SDPA sees them (KV; torchtitan's Llama repeats K/V to
  the query heads before SDPA, ``repeat_kv``, so KV = 2 Q there):

  forward: step 0's output cast to fp32 (2 read + 4 written) and the merged result cast back at the
  end (4 + 2): 12 B/Q; each of the cp - 1 later steps: the block output cast to fp32 (6), ``out -
  block_out`` (12), ``sigmoid(block_lse - lse) * (...)`` (8), ``out - (...)`` (12): 38 B/Q on the
  rank that merges whole outputs every step (the last rank: the others merge half their queries at
  some steps, and each step waits for the ring); and before each of the cp - 1 sends the K and V
  flattened and concatenated (2 read + 2 written: 4 B/KV).
  backward: fp32 accumulators zeroed (4 B/Q, 4 B/KV) and cast back at the end (6 B/Q, 6 B/KV); each
  of the cp steps dq += the step's bf16 gradient (4 + 2 read, 4 written: 10 B/Q); dK, dV += at step 0
  (10 B/KV) and at each later step ``_partial_update`` of their first half (10 B on half) and the
  torch.cat of the halves (8): 13 B/KV; every step the fp32 dK, dV concatenated for the send
  (8 B/KV); the K/V packed for each of the cp - 1 sends (4 B/KV). dK/dV travel in fp32.

  Its K/V exchange is one all-gather (``kv_allgather``): the rotate method torchtitan's
  ``--experimental.context_parallel_rotate_method`` defaults to (allgather), ``_AllGatherRotater``:
  ``exchange_buffers`` at ring step 0 issues one ``all_gather_tensor`` of the packed K/V over the CP
  group (later calls only count the step), and ``next_buffer`` at step 1 waits for it and hands out
  each step's chunk of it. So the whole exchange, cp - 1 shifts' bytes, runs beside step 0's kernel
  alone, in the forward and again in the backward (``_templated_ring_attention_backward`` makes its
  K/V rotater the same way), and the gathered K/V, cp chunks, are held through the pass. The
  backward's dK/dV go round the ring one step at a time (its dK/dV rotater is ``_RotateMethod.ALL_TO_ALL``,
  a ``permute_tensor`` to the next rank, waited for at the next step), as memo prices every ring's.

  Its buffers while a layer's attention runs (`RingMerge.buffers`, counted from the same code; one chunk
  is the rank's K and V as the ring holds them): the cp gathered chunks, the packed one it sends, and the
  contiguous copy of K and V it makes first (``key.contiguous()``: torchtitan hands SDPA K and V transposed,
  so the copy is real; it lives until step 1), cp + 2 chunks at step 0, in both passes (the backward
  packs its sends without freeing the last, so cp + 2 again at its later steps); in backward also three
  fp32 dK/dV chunks while a step's kernel runs (the one received, the one packed for the send, still
  referenced until the next wait, and the permute's output), the previous step's dK/dV kernel outputs
  (model dtype, released when the next kernel returns), and the fp32 dQ accumulated over the steps.

- ``te_p2p``: TransformerEngine's p2p context parallelism, Megatron-LM's default ``--cp-comm-type`` (transformer_engine/
  pytorch/attention/dot_product_attention/context_parallel.py ``AttnFuncWithCPAndKVP2P``, the version the code search
  stores, no commit pinned), in the case Megatron-LM runs: causal self-attention, two load-balanced chunks a rank,
  ``qkv_format`` sbhd (megatron/core/extensions/transformer_engine.py ``TEDotProductAttention``: ``self.qkv_format:
  str = 'sbhd'``), bf16 without FP8, the fused or flash-attn backend. One kernel per ring step over the rank's two
  chunks (``step_kernels``). Its passes are torch.compile'd functions (``@jit_fuser``, transformer_engine/pytorch/
  jit.py: ``lazy_compile``, torch.compile, unless ``NVTE_TORCH_COMPILE=0``), counted as one fused pass each; bytes
  per element of the rank's attention output (Q) and of its K and V at their own heads (KV: GQA's K/V are not
  repeated, ``kv_at_query_heads`` False), on the last rank of the CP group, the one whose every step covers its
  whole output:

  forward: ``p2p_comm_buffers[0] = torch.cat((k.view(-1), v.view(-1)))`` before the ring, the K/V packed once
  into the first send buffer (2 read + 2 written: 4 B/KV; later sends go from the receive buffers as they are, no
  packing). Each ring step beside its kernel: ``flash_attn_fwd_softmax_lse_correction`` (or its second-half
  variant) on the fp32 softmax LSE, per token and head: 12 B a token-head, 12/head_size B/Q (0.09 at head size
  128, 1.5% of a step's output correction below), not counted. After the ring ("fwd output correction") one pass
  per step over the outputs every step kept: ``flash_attn_fwd_out_correction_init`` at step 0 (reads the step's
  output, writes ``out``: 4 B/Q) and ``flash_attn_fwd_out_correction`` (``out.add_(out_per_step * exp(lse_step -
  lse))``: reads both, writes ``out``: 6 B/Q) for each of the cp - 1 later steps, on their whole output on the
  last rank (other ranks: ``flash_attn_fwd_second_half_out_correction`` on half of it, 3 B/Q, for their steps
  after their own rank). The accumulator is the model's dtype, not fp32, outside FP8: the init correction returns
  ``out_corrected.to(out_init_step.dtype)`` and the step outputs are bf16 (only under FP8 are they dequantized to
  fp32 first), so ``out_f16 = out.to(fwd_nominal_dtype)`` casts nothing (the code's comment "out in
  torch.float32" holds for FP8). 4 + 6 (cp - 1) B/Q, 4 B/KV.
  backward: ``p2p_comm_buffers[0][0].copy_(kv)``, the saved K/V copied into the first of its two [K/V, dK/dV]
  send buffers (4 B/KV); ``dq_buffer = torch.empty_like(q)`` and the dK/dV buffers are not zeroed, and they are
  what it returns, in the model dtype: no cast. dQ each step (last rank: every step's kernel covers its whole
  queries): ``dq.copy_(dq_)`` at step 0 (4 B/Q), ``dq.add_(dq_)`` at the cp - 1 later ones (6 B/Q). dK/dV into
  the received accumulator, in the model dtype, and sent on in it (its send buffer is ``torch.empty((2,
  *kv.shape), dtype=kv.dtype)``): on the last rank ``dk[0].copy_(dk_)`` at step 0 and ``dk[0].add_(dk_)`` at
  steps 1 .. cp - 2 on the first half (the step's kernel covers the first key chunk only: 2 and 3 B/KV), and
  ``dk.add_(dk_)`` on all of it at the last, diagonal step (6 B/KV), dV alike. 4 + 6 (cp - 1) B/Q and 4 + 2 +
  3 (cp - 2) + 6 = 9 + 3 (cp - 1) B/KV. The sends need no packing: K/V and dK/dV travel in one buffer, K/V
  alone at step 0 and dK/dV alone at the last step. (Rank 0 swaps the roles: forward 4 + 3 (cp - 1) B/Q; backward
  3 cp + 1 B/Q and 4 + 6 cp - 3 B/KV; with K/V no larger than Q, GQA's, its backward moves fewer bytes than the
  last rank's; with MHA's KV = 2 Q more, by 3 cp - 7 B/Q.) No ``contiguous()`` copy: in sbhd a half chunk
  (``k_part[0]``, ``q_part[1]``) is contiguous (bshd with a batch over 1 would copy it in the fused backend).

  Its buffers while a layer's attention runs (`RingMerge.buffers`): the forward keeps every K/V chunk of the ring
  (``p2p_comm_buffers[i + 1] = torch.empty_like(p2p_comm_buffers[i])`` each step, none released before the
  forward returns: cp chunks, its packed own and the cp - 1 received, ``fwd_kv_held``) and every step's output
  (``out_per_step[i]``, the model dtype, until the output correction after the ring: cp outputs on the last rank,
  ``fwd_step_outputs``; rank 0 keeps one whole and cp - 1 half ones) in place of an fp32 accumulator; the per-step
  fp32 LSEs beside them (cp of 4/head_size B a Q element, 1.6% of the outputs at head size 128) are not counted.
  Each chunk and each output is its own allocation, as TransformerEngine makes them (held as one block, the
  caching allocator's replay kept a 1 GiB segment a layer apart: Llama 3.1 8B at 128K tokens on CP 8 reserved
  11 GiB more).
  The backward: its two [K/V, dK/dV] buffers in the model dtype, the K/V double buffer and two dK/dV chunks
  (``dkv_chunks`` 2 at the model dtype's ``dkv_element_bytes``), no fp32 dQ (``dq_fp32`` False); the previous
  step's kernel outputs are dropped (``dq_, dk_, dv_ = None``) before the next kernel runs (``dkv_outputs`` 0).
  The step kernel's own dQ output beside ``dq_buffer`` (one Q in the model dtype) is not counted.

Checked on an H200 with torch's own ``_SDPAMerger`` and ``_partial_update`` (torch 2.11,
benchmarks/gpu/probe_ring_merge.py, reports/data/gpu-h200-2026-11-26-ring-merge.json; 32K tokens x 32
heads x 128): a whole-output merge step 1.54 ms, a half-output one 1.42 ms, a gradient += 0.48 ms, a
``_partial_update`` add 0.86 ms, the fp32 dK/dV concatenation 0.56 ms: the bytes counted here over
those times are 2.0-3.8 TB/s, 0.46-0.88 of the GPU's 4.35 TB/s copy bandwidth, never above it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RingMerge:
    """Bytes per element (module docs) of a ring implementation's passes; ``*_first`` once per layer
    pass, ``*_step`` per ring step after the first, ``*_send`` per send (cp - 1 of them); ``kv_at_query_heads``: the
    ring's K/V (and their gradients) are repeated to the query heads; ``dkv_bytes``: the element size
    dK/dV travel in (0: the model dtype's); ``kv_allgather``: the K/V exchange is one all-gather issued
    at ring step 0 and waited for at step 1 (module docs), not a shift beside every step; the buffers
    (`buffers`): ``kv_copies`` K/V chunks copied before the ring starts, ``dkv_chunks`` dK/dV chunks live
    while a backward step's kernel runs (in `dkv_element_bytes`: fp32 for torch_cp's), ``dkv_outputs`` earlier
    steps' dK/dV kernel outputs still held, ``dq_fp32`` an fp32 dQ accumulator over the steps, ``fwd_kv_held`` the
    forward keeps every K/V chunk of the ring until it returns (cp chunks, not the double buffer: TransformerEngine's),
    ``fwd_step_outputs`` the forward keeps every step's output, in the model dtype, until it merges them after the
    ring (cp outputs), into a model-dtype output, no fp32 accumulator (TransformerEngine's); ``step_kernels``: the ring
    runs one attention kernel per ring step over both of the rank's chunks (`memo_sim.cost.ring_attention`
    ``ring_attention_time``) rather than one per pair of chunks (the zigzag blocks of memo's executor);
    ``dkv_home``: the backward sends the dK/dV accumulators home once more after its last step, a shift nothing
    hides (memo's executor, ring-flash-attention: `memo_sim.cost.layer_time` ``cp_ring_dkv_home``), where False
    its last step is the rank's own diagonal chunk, whose accumulator has arrived home (TransformerEngine's p2p CP:
    ``if i == (cp_size - 1): dkv.add_(dkv_)`` on the whole chunk and no send after the loop; the cp - 1 dK/dV
    shifts beside the steps are the same)."""

    name: str
    fwd_q_first: float = 0.0
    fwd_q_step: float = 0.0
    fwd_kv_first: float = 0.0
    fwd_kv_send: float = 0.0
    bwd_q_first: float = 0.0
    bwd_q_step: float = 0.0
    bwd_kv_first: float = 0.0
    bwd_kv_step: float = 0.0
    bwd_kv_send: float = 0.0
    kv_at_query_heads: bool = False
    dkv_bytes: int = 0
    kv_allgather: bool = False
    kv_copies: int = 0
    dkv_chunks: int = 2
    dkv_outputs: int = 0
    dq_fp32: bool = False
    fwd_kv_held: bool = False
    fwd_step_outputs: bool = False
    step_kernels: bool = False
    dkv_home: bool = True

    def bytes(self, cp: int, q_elems: float, kv_elems: float, phase: str) -> float:
        """HBM bytes of one layer pass (``phase`` "fwd" or "bwd"; a recompute is a forward) on a CP
        group of ``cp`` ranks: ``q_elems`` the rank's output elements, ``kv_elems`` its K and V ones."""
        if cp <= 1:
            return 0.0
        later = cp - 1
        if phase == "bwd":
            return (q_elems * (self.bwd_q_first + self.bwd_q_step * later)
                    + kv_elems * (self.bwd_kv_first + (self.bwd_kv_step + self.bwd_kv_send) * later))
        return (q_elems * (self.fwd_q_first + self.fwd_q_step * later)
                + kv_elems * (self.fwd_kv_first + self.fwd_kv_send * later))

    def dkv_element_bytes(self, d: int, fp32_accumulators: bool) -> int:
        """The element size the ring's dK/dV travel and are held in: the implementation's own where it says
        one (``dkv_bytes``), else fp32 where the framework accumulates them so (``Layout.ring_dkv_fp32``:
        memo's executor), else the model dtype's ``d`` (TransformerEngine's p2p CP;
        `memo_sim.cost.ring_attention` module docs)."""
        return self.dkv_bytes or (max(d, 4) if fp32_accumulators else d)

    def buffers(self, cp: int, kv: float, q: float, d: int, phase: str,
                dkv_d: int | None = None, fp32_accumulators: bool = False,
                attn: float | None = None) -> list[tuple[str, float]]:
        """(name, bytes) of the ring's K/V, output and gradient buffers live while a layer's attention runs on a
        rank of a CP group of ``cp`` (module docs): ``kv`` the bytes of one K/V chunk as the ring holds it, ``q``
        of the rank's queries, ``attn`` of its attention output (None: ``q``), ``d`` the model dtype's bytes an
        element, ``dkv_d`` those of a dK/dV element (`dkv_element_bytes`; None: fp32). A ring of shifts holds a K/V
        double buffer (the chunk in use and the one arriving), or every chunk it received where its forward keeps
        them (``fwd_kv_held``), and, in backward, its dK/dV in use and in flight. The forward merges the steps'
        outputs into an fp32 accumulator (memo's executor, PyTorch's CP), or keeps every step's output until it
        merges them after the ring (``fwd_step_outputs``: TransformerEngine's p2p CP). The fp32 dQ accumulator over the
        steps: the implementation's own (``dq_fp32``), or where the framework accumulates the ring's gradients in
        fp32 (``fp32_accumulators``, ``Layout.ring_dkv_fp32``: memo's executor keeps dQ beside the layer's dq,
        memo_exec/distributed/attention.py ``RingAttention.backward``); a ring that accumulates them in the model's
        dtype adds each step's dQ into the layer's dq itself (TransformerEngine's p2p CP: ``dq_buffer =
        torch.empty_like(q)``, the dq it returns; transformer_engine/pytorch/attention/dot_product_attention/
        context_parallel.py ``AttnFuncWithCPAndKVP2P.backward`` at d0067d0da)."""
        attn = q if attn is None else attn
        if self.kv_allgather:  # the gathered chunks, the packed one sent, the copies made first
            out = [("cp_kv_allgather", (cp + 1 + self.kv_copies) * kv)]
        elif self.fwd_kv_held and phase != "bwd":  # every chunk the ring brought, its own packed one first: each its
            out = [(f"cp_kv_chunk_held_{i}", kv) for i in range(cp + self.kv_copies)]  # own allocation
        else:
            out = [("cp_kv_double_buffer", (2 + self.kv_copies) * kv)]
        if phase != "bwd":
            if self.fwd_step_outputs:  # one allocation a step, as the kernels return them
                return out + [(f"cp_step_output_{i}", attn) for i in range(cp)]
            return out + [("cp_out_accumulator_fp32", attn * 4 / d)]
        out.append(("cp_dkv_in_flight", self.dkv_chunks * kv * (dkv_d or 4) / d))
        if self.dkv_outputs:
            out.append(("cp_step_dkv_outputs", self.dkv_outputs * kv))
        if self.dq_fp32 or fp32_accumulators:
            out.append(("cp_dq_accumulator_fp32", q * 4 / d))
        return out


RING_MERGES: dict[str, RingMerge] = {
    "none": RingMerge("none"),
    # one SDPA call per ring step, forward and backward (torch/distributed/tensor/experimental/_attention.py
    # _templated_ring_attention / _templated_ring_attention_backward: the whole local q, k, v at step 0, the first
    # K/V chunk or the second query chunk after it); its passes:
    # forward 12 + 38 per later step (Q), 4 per send (KV); backward Q: 4 zeroed + 6 cast back + 10 at step 0 = 20
    # once, 10 per later step; KV: 4 zeroed + 10 at step 0 + 8 its send packing + 6 cast back = 28 once, 13 + 8 per
    # later step, 4 per K/V send
    "torch_cp": RingMerge("torch_cp", fwd_q_first=12, fwd_q_step=38, fwd_kv_send=4,
                          bwd_q_first=20, bwd_q_step=10, bwd_kv_first=28, bwd_kv_step=21, bwd_kv_send=4,
                          kv_at_query_heads=True, dkv_bytes=4, kv_allgather=True, kv_copies=1, dkv_chunks=3,
                          dkv_outputs=1, dq_fp32=True, step_kernels=True),
    # TransformerEngine's p2p CP (AttnFuncWithCPAndKVP2P, Megatron-LM's default --cp-comm-type): one kernel per ring
    # step over the rank's two chunks ("diagonal", "lower-triangle", "upper-triangle" sections); its passes on the
    # last rank (module docs): forward Q: the init output correction 4 once, 6 per later step's; KV: the torch.cat
    # packing the first send 4 once; backward Q: dq.copy_ 4 at step 0, dq.add_ 6 per later step; KV: the saved K/V
    # copied into the send buffer 4 + the half-chunk dk/dv copy_ 2 at step 0 + the whole add_ at the last step 6
    # less the 3 a later step counts = 9 once, the half-chunk add_ 3 per later step; all in the model dtype
    "te_p2p": RingMerge("te_p2p", fwd_q_first=4, fwd_q_step=6, fwd_kv_first=4,
                        bwd_q_first=4, bwd_q_step=6, bwd_kv_first=9, bwd_kv_step=3,
                        fwd_kv_held=True, fwd_step_outputs=True, step_kernels=True, dkv_home=False),
}
RING_MERGE_NAMES: tuple[str, ...] = tuple(RING_MERGES)


def ring_merge(name: str) -> RingMerge:
    return RING_MERGES[name]


def whole_sequence_only(name: str, model, seq: int) -> bool:
    """Whether ring ``name`` cannot run ``model`` at ``seq`` tokens under CP: a ring that gathers every K/V chunk
    (PyTorch's experimental CP) runs causal attention over the whole sequence, not sliding-window or chunked
    layers (the one rule `memo_sim.layout.parallel.check_layout` and the what-if's search both ask)."""
    return ring_merge(name).kv_allgather and model.attention_flop_fraction(seq) < 1.0
