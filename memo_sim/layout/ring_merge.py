"""Ring-CP implementations' passes over HBM beside their attention kernels (``Layout.ring_merge``,
framework data): merging each ring step's partial output into the running one, accumulating each
step's gradients, and packing what the ring sends; and how the implementation exchanges K/V (a shift
beside each step, or one all-gather). Priced in `memo_sim.cost.ring_attention` and
`memo_sim.cost.layer_time`, its buffers in `memo_sim.memplan.trace_gen`.

- ``none``: nothing priced beside the kernels and the shifts: memo's executor and the frameworks
  whose ring corrections were not counted from their sources (TransformerEngine's, ring-flash-attention's).
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
    pass, ``*_step`` per ring step after the first, ``*_send`` per send; ``kv_at_query_heads``: the
    ring's K/V (and their gradients) are repeated to the query heads; ``dkv_bytes``: the element size
    dK/dV travel in (0: the model dtype's); ``kv_allgather``: the K/V exchange is one all-gather issued
    at ring step 0 and waited for at step 1 (module docs), not a shift beside every step; the buffers
    (`buffers`): ``kv_copies`` K/V chunks copied before the ring starts, ``dkv_chunks`` dK/dV chunks live
    while a backward step's kernel runs (in `dkv_element_bytes`: fp32 for torch_cp's), ``dkv_outputs`` earlier
    steps' dK/dV kernel outputs still held, ``dq_fp32`` an fp32 dQ accumulator over the steps; ``step_kernels``: the
    ring runs one attention kernel per ring step over both of the rank's chunks (`memo_sim.cost.ring_attention`
    ``ring_attention_time``) rather than one per pair of chunks (the zigzag blocks of memo's executor)."""

    name: str
    fwd_q_first: float = 0.0
    fwd_q_step: float = 0.0
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
    step_kernels: bool = False

    def bytes(self, cp: int, q_elems: float, kv_elems: float, phase: str) -> float:
        """HBM bytes of one layer pass (``phase`` "fwd" or "bwd"; a recompute is a forward) on a CP
        group of ``cp`` ranks: ``q_elems`` the rank's output elements, ``kv_elems`` its K and V ones."""
        if cp <= 1:
            return 0.0
        later = cp - 1
        if phase == "bwd":
            return (q_elems * (self.bwd_q_first + self.bwd_q_step * cp)
                    + kv_elems * (self.bwd_kv_first + (self.bwd_kv_step + self.bwd_kv_send) * later))
        return q_elems * (self.fwd_q_first + self.fwd_q_step * later) + kv_elems * self.fwd_kv_send * later

    def dkv_element_bytes(self, d: int, fp32_accumulators: bool) -> int:
        """The element size the ring's dK/dV travel and are held in: the implementation's own where it says
        one (``dkv_bytes``), else fp32 where the framework accumulates them so (``Layout.ring_dkv_fp32``:
        memo's executor), else the model dtype's ``d`` (TransformerEngine's p2p CP;
        `memo_sim.cost.ring_attention` module docs)."""
        return self.dkv_bytes or (max(d, 4) if fp32_accumulators else d)

    def buffers(self, cp: int, kv: float, q: float, d: int, phase: str,
                dkv_d: int | None = None, fp32_accumulators: bool = False) -> list[tuple[str, float]]:
        """(name, bytes) of the ring's K/V and gradient buffers live while a layer's attention runs on a rank
        of a CP group of ``cp`` (module docs): ``kv`` the bytes of one K/V chunk as the ring holds it, ``q``
        of the rank's queries, ``d`` the model dtype's bytes an element, ``dkv_d`` those of a dK/dV element
        (`dkv_element_bytes`; None: fp32). A ring of shifts holds a K/V double buffer (the chunk in use and
        the one arriving) and, in backward, its dK/dV in use and in flight. The fp32 dQ accumulator over the
        steps: the implementation's own (``dq_fp32``), or where the framework accumulates the ring's gradients in
        fp32 (``fp32_accumulators``, ``Layout.ring_dkv_fp32``: memo's executor keeps dQ beside the layer's dq,
        memo_exec/distributed/attention.py ``RingAttention.backward``); a ring that accumulates them in the model's
        dtype adds each step's dQ into the layer's dq itself (TransformerEngine's p2p CP: ``dq_buffer =
        torch.empty_like(q)``, the dq it returns; transformer_engine/pytorch/attention/dot_product_attention/
        context_parallel.py ``AttnFuncWithCPAndKVP2P.backward`` at d0067d0da)."""
        if self.kv_allgather:  # the gathered chunks, the packed one sent, the copies made first
            out = [("cp_kv_allgather", (cp + 1 + self.kv_copies) * kv)]
        else:
            out = [("cp_kv_double_buffer", (2 + self.kv_copies) * kv)]
        if phase != "bwd":
            return out
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
    # forward 12 + 38 per later step (Q), 4 per send (KV); backward Q: 4 zeroed + 6 cast back + 10 per step;
    # KV: 4 zeroed + 10 at step 0 + 8 its send packing + 6 cast back = 28 once, 13 + 8 per later step, 4 per K/V send
    "torch_cp": RingMerge("torch_cp", fwd_q_first=12, fwd_q_step=38, fwd_kv_send=4,
                          bwd_q_first=10, bwd_q_step=10, bwd_kv_first=28, bwd_kv_step=21, bwd_kv_send=4,
                          kv_at_query_heads=True, dkv_bytes=4, kv_allgather=True, kv_copies=1, dkv_chunks=3,
                          dkv_outputs=1, dq_fp32=True, step_kernels=True),
    # TransformerEngine's p2p CP (AttnFuncWithCPAndKVP2P, Megatron-LM's default --cp-comm-type): one kernel per ring
    # step over the rank's two chunks ("diagonal", "lower-triangle", "upper-triangle" sections); its per-step
    # softmax-lse and output corrections are not counted here (the megatron framework data's not_modelled)
    "te_p2p": RingMerge("te_p2p", step_kernels=True),
}
RING_MERGE_NAMES: tuple[str, ...] = tuple(RING_MERGES)


def ring_merge(name: str) -> RingMerge:
    return RING_MERGES[name]


def whole_sequence_only(name: str, model, seq: int) -> bool:
    """Whether ring ``name`` cannot run ``model`` at ``seq`` tokens under CP: a ring that gathers every K/V chunk
    (PyTorch's experimental CP) runs causal attention over the whole sequence, not sliding-window or chunked
    layers (the one rule `memo_sim.layout.parallel.check_layout` and the what-if's search both ask)."""
    return ring_merge(name).kv_allgather and model.attention_flop_fraction(seq) < 1.0
