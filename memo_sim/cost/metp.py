"""METP, memory-efficient tensor parallelism (papers/metp.txt sections 3-4): closed forms and the
per-step op costs of its rings.

METP computes O = f(A·B)·C with A and C split by rows and B by columns over p ranks: rank i holds
A_i (its 1/p of the tokens), B_i, C_i and computes O_i = sum_j f(A_i·B_j)·C_j while the B and C
blocks travel a ring by send/recv, double-buffered so that step j+1's blocks arrive while step j
computes. The FFN is one such product (A = ln2, B = W_in, C = W_out, f = GeLU / SwiGLU). The MHA
is two-level: an outer loop over p head groups, whose W_qkv_j and W_proj_j blocks are broadcast
from rank j (prefetched one step ahead), and an inner METP ring of that group's K/V blocks with
online softmax (Algorithms 3-6).

Closed forms (``*_table``, element counts as the paper writes them; b batch, s sequence, h
hidden, p degree, n heads; multiply by the dtype's bytes for memory and traffic):

FFN (Table 1), Memory (after forward) / Peak (during forward) / Communication volume:

- Megatron TP+SP: 32h²/p + 5bsh/p / 32h²/p + 4bsh/p + bsh / 5·(p-1)/p·bsh
- RSA: 32h² + 5bsh/p / same / 0
- FSDP/ZeRO + Ulysses: 32h²/p + 5bsh/p / 4h² + (28h² + 5bsh)/p / 24·(p-1)/p·h²
- METP: 32h²/p + bsh/p / 32h²/p + bsh/p + 4bsh/p² / 24·(p-1)/p·h²

MHA (Table 2; k = 0 with FlashAttention, 1 without):

- Megatron TP+SP: 16h²/p + 5bsh/p / 16h²/p + 4bsh/p + k·bns²/p + bsh / 5·(p-1)/p·bsh
- RSA: 16h² + 5bsh/p / 16h² + 5bsh/p + bns²/p / 8·(p-1)/p·bsh
- FSDP/ZeRO + Ulysses: 16h²/p + 5bsh/p / 3h² + 13h²/p + k·bns²/p + 5bsh/p /
  12·(p-1)/p·h² + 8·(p-1)/p²·bsh
- METP: 16h²/p + 2bsh/p / 16h²/p + 3bsh/p² + k·bns²/p³ + 2bsh/p / 12·log2(p)·h² + 6·(p-1)/p·bsh

Peak intermediates, METP over Megatron TP+SP: FFN (bsh/p + 4bsh/p²)/(4bsh/p + bsh) = 1/p;
MHA (3bsh/p² + 2bsh/p)/(4bsh/p + bsh) = (3 + 2p)/(p(4 + p)) (eq. 10; 7/12 at p = 2).

Overlap (eq. 4-5): a forward ring step computes 2·m·(k1·k2 + k2·n)/p² FLOPs while it moves
2·(k1·k2 + k2·n)/p bytes (16-bit), an arithmetic intensity of m/p FLOP/byte; the transfer hides
when m/p > peak FLOP/s / link bytes/s (312 TFLOP/s / 300 GB/s = 1040 on an A100, so
s > 8320 at p = 8, b = 1). `overlap_threshold_seq` computes it from a profile. The simulator's
own ring (`ffn_costs`) also pays the GEMM efficiency of the smaller block GEMMs and the link
latency per send, so its crossover sits near, not at, the paper's bound.

Op costs for the simulator (`ffn_costs`, `mha_costs`, `mha_prologue`, `proj_recompute_costs`),
per rank with r = m/p token rows, d the dtype's bytes, f1 the fc1 width (2f for SwiGLU):

- FFN forward: p steps; step j is one compute block (T_ij = A_i·B_j: 2·r·h·f1/p FLOPs, the
  activation, O_i += D_ij·C_j: 2·r·f·h/p FLOPs, each GEMM at its own size's efficiency) and,
  for j < p-1, one send/recv of the next B, C blocks (d·h·(f1 + f)/p bytes) on the ``tp_p2p``
  stream beside it. Backward (Algorithm 2): step j recomputes T_ij and D_ij and runs the four
  gradient GEMMs; the next B, C blocks travel beside it and, after it, the partial dB_j, dC_j
  travel to the next rank beside step j+1 (p-1 transfers each: traffic 3·(p-1)/p·h·(f1 + f)·d in
  all, 24·(p-1)/p·h²·d for a GPT FFN, as Table 1; the paper's count leaves out the one extra hop
  that returns each finished gradient block to its owner, and so do we).
- MHA forward, outer step j (Algorithm 5): the broadcast of step j+1's W_qkv, W_proj blocks
  (d·h·(2h + 2kv)/p bytes, log2 p tree rounds) on ``tp_bcast`` beside the whole step (step 0's
  beside the norm before the MHA, `mha_prologue`); the Q/K/V block GEMM; the inner ring's first
  attention step on the local K/V; the inner ring's p-1 K/V transfers (d·r·2kv/p bytes each) as
  one op beside one op of the other p-1 attention steps (an approximation of the inner loop's
  2p-1 ops by two that keeps its time, t_c + (p-1)·max(t_c, t_x) for equal steps t_c, t_x); the
  projection block GEMM into the output accumulator. Causal work is balanced over the ring
  (zigzag chunks, as ring CP), so each inner step runs 1/p² of the rank's attention FLOPs, each
  at its own size's FlashAttention efficiency.
- MHA backward, outer step j (Algorithm 6): broadcast of step j+1's blocks beside the step;
  dW_proj, dA and the Q/K/V recompute GEMMs; the inner backward ring (K, V, dK, dV travel:
  2·d·r·2kv/p bytes per transfer); the dX and dW_qkv GEMMs; the tree reduce of dW_qkv_j,
  dW_proj_j to rank j on ``tp_bcast`` beside the next step.
- MEMO's token-wise recompute under ``metp`` rebuilds h1 = x + attn·W_proj for the dropped tokens:
  p projection block GEMMs beside a ring of the W_proj blocks (one aggregated transfer op).

Memory saving against Megatron TP+SP, the paper's tables against memo's footprint
(`table_layer_saving`, `tests/test_metp_closed_forms.py`): summing the Memory columns of Tables 1
and 2 over L layers, TP+SP keeps 48h²/p + 10bsh/p elements per layer and METP 48h²/p + 3bsh/p
(GPT-175B, s = 512K, p = 8: a saving of 62.9%, near the 64% its authors report). memo's
footprint of the same runs (8 layers, store all, a100-sxm4-80gb) saves 56.7%. The terms the
tables count differently, each moving the saving by (in order):

- skeletal activations: the tables keep per layer, for TP+SP, the MHA input, Q, K, V, the
  attention output, the FFN input and one 4h-wide FFN intermediate (10 units of bsh/p), for METP
  the MHA input, the attention output and the FFN input (3); they leave out the layer input x and
  the residual h1 (which the two LayerNorms' backward read) and, for TP+SP, the second 4h-wide
  tensor (the GeLU output, which fc2's weight gradient reads beside the GeLU input its backward
  reads). memo keeps 16 and 5 units: +1.3 points (64.2%);
- model states: the tables count 4 elements per parameter (weight, gradient and two Adam moments
  in one element size, sec. 3.1: 8 bytes in 16-bit); memo counts Megatron-LM's
  bf16 recipe, 18 bytes (bf16 weight, fp32 main gradient, fp32 master and two fp32 moments,
  `memo_sim.model.precision`), plus the embedding: -5.2 points (59.0%);
- what the tables leave out of a device's peak: the layer's transients during backward, the
  fp32 log-sum-exp and the chunked classifier's logits (memo: max(transients + boundary,
  classifier)): -2.3 points (56.7%).

No term of memo's is wrong against the paper: the paper's tables count fewer activations and
smaller model states than a Megatron-LM bf16 run keeps; the gap is those two choices and the
peak terms the tables leave out.

Per-rank FLOPs equal Megatron TP's (the same GEMMs and attention split p ways), plus the
backward's recompute of each block (T_ij, D_ij in the FFN, Q/K/V in the MHA), which Algorithms
2 and 6 need because the blocks were not kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memo_sim.cost import collectives as coll
from memo_sim.cost.activations import tokens_per_gpu
from memo_sim.model.flops import ATTN_BWD_FACTOR, causal_attention_flops
from memo_sim.cost.kernel_time import attention_bwd_time, attention_fwd_time, gemm_time, memory_bound_time
from memo_sim.cost.opcost import OpCost
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.profile.schema import HardwareProfile, Link

P2P_STREAM = "tp_p2p"  # METP's ring send/recv (FFN weight blocks, the inner K/V ring)
BCAST_STREAM = "tp_bcast"  # METP MHA's broadcasts and reduces of weight blocks
ELEMENTWISE_BWD_UNITS = 3  # act backward reads T and dD, writes dT (forward: reads T, writes D)
FP32 = 4


# ---------------------------------------------------------------- closed forms of the paper
@dataclass(frozen=True)
class TableRow:
    """One method's row of Table 1 or 2, in elements per device."""

    memory: float  # after the forward
    peak: float  # during the forward
    comm: float  # communication volume of forward and backward


def ffn_table(b: float, s: float, h: float, p: int) -> dict[str, TableRow]:
    """Table 1: the FFN (k1 = h, k2 = 4h) under each method, in elements."""
    bsh = b * s * h
    return {
        "megatron_tp_sp": TableRow(32 * h * h / p + 5 * bsh / p, 32 * h * h / p + 4 * bsh / p + bsh,
                                   5 * (p - 1) / p * bsh),
        "rsa": TableRow(32 * h * h + 5 * bsh / p, 32 * h * h + 5 * bsh / p, 0.0),
        "fsdp_ulysses": TableRow(32 * h * h / p + 5 * bsh / p, 4 * h * h + (28 * h * h + 5 * bsh) / p,
                                 24 * (p - 1) / p * h * h),
        "metp": TableRow(32 * h * h / p + bsh / p, 32 * h * h / p + bsh / p + 4 * bsh / p ** 2,
                         24 * (p - 1) / p * h * h),
    }


def mha_table(b: float, s: float, h: float, p: int, n: int, flash: bool = True) -> dict[str, TableRow]:
    """Table 2: an MHA layer under each method, in elements (``flash``: k = 0, else k = 1)."""
    bsh, k = b * s * h, 0.0 if flash else 1.0
    scores = b * n * s * s
    return {
        "megatron_tp_sp": TableRow(16 * h * h / p + 5 * bsh / p, 16 * h * h / p + 4 * bsh / p + k * scores / p + bsh,
                                   5 * (p - 1) / p * bsh),
        "rsa": TableRow(16 * h * h + 5 * bsh / p, 16 * h * h + 5 * bsh / p + scores / p, 8 * (p - 1) / p * bsh),
        "fsdp_ulysses": TableRow(16 * h * h / p + 5 * bsh / p, 3 * h * h + 13 * h * h / p + k * scores / p + 5 * bsh / p,
                                 12 * (p - 1) / p * h * h + 8 * (p - 1) / p ** 2 * bsh),
        "metp": TableRow(16 * h * h / p + 2 * bsh / p,
                         16 * h * h / p + 3 * bsh / p ** 2 + k * scores / p ** 3 + 2 * bsh / p,
                         12 * math.log2(p) * h * h + 6 * (p - 1) / p * bsh),
    }


def table_layer_saving(b: float, s: float, h: float, p: int, act_units: tuple[float, float] = (10, 3),
                       state_elements: float = 48) -> float:
    """1 - METP / Megatron TP+SP of one layer's memory after the forward, Tables 1 and 2 summed:
    (state_elements·h²/p + u_metp·bsh/p) / (state_elements·h²/p + u_tp·bsh/p) with the tables'
    (u_tp, u_metp) = (10, 3) units of bsh/p and 48 = 4 elements x 12h² parameters per layer.
    ``act_units`` and ``state_elements`` let a caller put memo's counts in (16, 5; 108 = 18
    bytes / 2 per element x 12) to see each term's share of the gap (module docs)."""
    states, bsh = state_elements * h * h / p, b * s * h / p
    return 1 - (states + act_units[1] * bsh) / (states + act_units[0] * bsh)


def metp_general_memory(m: float, k1: float, k2: float, n: float, p: int, trainable: bool = False) -> float:
    """Section 3.1: (m·k1 + k1·k2 + k2·n + m·n)/p + m·k2/p²; with B and C trained (gradient and
    two Adam moments beside each): (m·k1 + 4·k1·k2 + 4·k2·n + m·n)/p + m·k2/p²."""
    w = 4 if trainable else 1
    return (m * k1 + w * k1 * k2 + w * k2 * n + m * n) / p + m * k2 / p ** 2


def metp_general_comm(k1: float, k2: float, n: float, p: int) -> float:
    """Section 3.2.1: 3·(p-1)/p·(k1·k2 + k2·n) (forward once, backward weights and gradients)."""
    return 3 * (p - 1) / p * (k1 * k2 + k2 * n)


def megatron_general_comm(m: float, k1: float, n: float, p: int) -> float:
    """Section 3.2.2: (p-1)/p·(3·m·k1 + 2·m·n)."""
    return (p - 1) / p * (3 * m * k1 + 2 * m * n)


def ffn_peak_ratio(p: int) -> float:
    """METP's peak FFN intermediates over Megatron TP+SP's: (1/p + 4/p²)/(4/p + 1) (= 1/p)."""
    return (1 / p + 4 / p ** 2) / (4 / p + 1)


def mha_peak_ratio(p: int) -> float:
    """Eq. 10: (3/p² + 2/p)/(4/p + 1) = (3 + 2p)/(p(4 + p))."""
    return (3 + 2 * p) / (p * (4 + p))


def mha_layers_ratio(p: int, layers: int) -> float:
    """Eq. 11: r/L + (2/5)·(L-1)/L over L layers."""
    return mha_peak_ratio(p) / layers + 0.4 * (layers - 1) / layers


def ffn_intensity(m: float, k1: float, k2: float, n: float, p: int, dtype_bytes: int = 2) -> float:
    """Eq. 4-5: FLOPs of one forward ring step over its bytes moved, m/p for 16-bit."""
    flops = 2 * m * k1 * k2 / p ** 2 + 2 * m * k2 * n / p ** 2
    return flops / (dtype_bytes / p * (k1 * k2 + k2 * n))


def ffn_backward_intensity(m: float, k1: float, k2: float, n: float, p: int) -> float:
    """Eq. 6 as the paper writes it: (5·m·k1·k2/p² + 4·m·k2·n/p²) / (4·(k1·k2 + k2·n)/p) > m/p."""
    return (5 * m * k1 * k2 / p ** 2 + 4 * m * k2 * n / p ** 2) / (4 * (k1 * k2 + k2 * n) / p)


def mha_outer_intensity(b: float, s: float, h: float, p: int) -> float:
    """Eq. 12: (8bsh² + 4bs²h) / (8·log2(p)·h² + 4·(p-1)/p·bsh)."""
    return (8 * b * s * h * h + 4 * b * s * s * h) / (8 * math.log2(p) * h * h + 4 * (p - 1) / p * b * s * h)


def mha_outer_step_intensity(b: float, s: float, h: float, p: int) -> float:
    """One outer step's forward FLOPs per rank over that step's bytes moved (16-bit), the same
    quantities eq. 12 names but both per step: (8bsh² + 4bs²h)/p² FLOPs over
    2·(4·log2(p)·h²/p + 2·(p-1)/p²·bsh) bytes. Eq. 12 as printed divides the rank's FLOPs of all
    p outer steps by one step's traffic, p times this; the simulator's broadcast per step is
    this quantity's denominator."""
    flops = (8 * b * s * h * h + 4 * b * s * s * h) / p ** 2
    return flops / (2 * (4 * math.log2(p) * h * h / p + 2 * (p - 1) / p ** 2 * b * s * h))


def compute_to_comm_bound(profile: HardwareProfile, dtype: str = "bf16", link: Link | None = None) -> float:
    """Peak FLOP/s over the P2P link's bytes/s: FLOP per byte a ring step must reach to hide its
    transfer (1040 for 312 TFLOP/s over 300 GB/s)."""
    lk = link or profile.nvlink
    return profile.peak(dtype) / float(lk.bandwidth)


def overlap_threshold_seq(profile: HardwareProfile, p: int, batch: int = 1, dtype: str = "bf16",
                          link: Link | None = None) -> float:
    """Sequence length above which the FFN ring's transfers hide under its compute at peak FLOP/s
    (m/p > bound with m = b·s): s > p·bound/b (8320 on an A100 at p = 8, b = 1)."""
    return p * compute_to_comm_bound(profile, dtype, link) / batch


# ---------------------------------------------------------------- per-GPU block sizes
def block_sizes(model: ModelConfig, layout: Layout, batch: int, seq: int) -> dict[str, float]:
    """Bytes of METP's per-step blocks on one GPU (p = tp, r = the rank's token rows):

    ``rows`` r; ``ffn_w_block`` one B plus one C block, d·h·(f1 + f)/p; ``fc1_block`` T_ij,
    d·r·f1/p; ``act_block`` D_ij, d·r·f/p; ``mha_w_block`` one W_qkv plus one W_proj block,
    d·h·(2h + 2kv)/p; ``wproj_block`` d·h·h/p; ``qkv_block`` Q_ij, K_ij, V_ij, d·r·(h + 2kv)/p;
    ``kv_block`` K_ij and V_ij, d·r·2kv/p; ``attn_block`` A_ij, d·r·h/p; ``lse_block`` fp32
    r·(n/p); ``out`` an output accumulator O_i, d·r·h.
    """
    p, d = layout.tp, DTYPE_BYTES[model.dtype]
    h, kv, f, f1 = model.hidden, model.kv_dim, model.ffn, model.fc1_width
    r = tokens_per_gpu(layout, batch, seq) / p
    return {
        "rows": r,
        "ffn_w_block": d * h * (f1 + f) / p,
        "fc1_block": d * r * f1 / p,
        "act_block": d * r * f / p,
        "mha_w_block": d * h * (2 * h + 2 * kv) / p,
        "wproj_block": d * h * h / p,
        "qkv_block": d * r * (h + 2 * kv) / p,
        "kv_block": d * r * 2 * kv / p,
        "attn_block": d * r * h / p,
        "lse_block": FP32 * r * model.heads / p,
        "out": d * r * h,
    }


def _link(profile: HardwareProfile, layout: Layout) -> tuple[float, float]:
    lk = coll.layout_group_link(profile, layout, layout.tp, 1)
    return float(lk.bandwidth), float(lk.latency)


def _attention_flops_per_rank(model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    """The rank's forward attention FLOPs over the whole layer (causal, balanced): Megatron's share."""
    return causal_attention_flops(batch, seq, model.hidden) / (layout.tp * layout.seq_split)


# ---------------------------------------------------------------- the rings as op costs
def ffn_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
              phase: str) -> list[OpCost]:
    """The FFN ring of one layer (forward, or the backward of Algorithm 2; ``recompute`` = forward)."""
    p, d = layout.tp, DTYPE_BYTES[model.dtype]
    h, f, f1 = model.hidden, model.ffn, model.fc1_width
    bs = block_sizes(model, layout, batch, seq)
    r = bs["rows"]
    bw, lat = _link(profile, layout)
    fc1 = 2 * r * h * f1 / p  # T_ij = A_i B_j
    fc2 = 2 * r * f * h / p  # D_ij C_j (forward); each backward GEMM of fc2 has these FLOPs too
    act_bytes = d * r * (f1 + f) / p
    dt, pr = model.dtype, profile
    w = bs["ffn_w_block"]
    xfer = coll.sendrecv_time(w, bw, lat)
    out: list[OpCost] = []
    if phase != "bwd":
        step_s = gemm_time(fc1, pr, dt) + memory_bound_time(act_bytes, pr) + gemm_time(fc2, pr, dt)
        for j in range(p):
            if j < p - 1:
                out.append(OpCost(f"p2p_ffn_w{j}", "collective", phase, P2P_STREAM, xfer, nbytes=w, overlaps=1))
            out.append(OpCost(f"ffn_block{j}", "gemm", phase, "compute", step_s, flops=fc1 + fc2, nbytes=act_bytes))
        return out
    # backward: recompute T and D, dD = dO C^T, dC += D^T dO, dT = f'(T) dD, dA += dT B^T, dB += A^T dT
    step_s = (3 * gemm_time(fc1, pr, dt) + 2 * gemm_time(fc2, pr, dt)
              + memory_bound_time((1 + ELEMENTWISE_BWD_UNITS) * act_bytes, pr))
    for j in range(p):
        if j < p - 1:
            out.append(OpCost(f"p2p_ffn_w{j}", "collective", phase, P2P_STREAM, xfer, nbytes=w, overlaps=1))
        out.append(OpCost(f"ffn_block{j}", "gemm", phase, "compute", step_s, flops=3 * fc1 + 2 * fc2,
                          nbytes=(1 + ELEMENTWISE_BWD_UNITS) * act_bytes))
        if j < p - 1:  # the partial dB_j, dC_j go on to the next rank, beside step j+1
            out.append(OpCost(f"p2p_ffn_dw{j}", "collective", phase, P2P_STREAM, xfer, nbytes=w, overlaps=1))
    return out


def mha_prologue(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                 phase: str) -> OpCost:
    """The broadcast of outer step 0's W_qkv, W_proj blocks, issued beside the op before the MHA."""
    bw, lat = _link(profile, layout)
    w = block_sizes(model, layout, batch, seq)["mha_w_block"]
    steps = coll.tree_steps(layout.tp)
    return OpCost("bcast_w0", "collective", phase, BCAST_STREAM, coll.broadcast_time(w, layout.tp, bw, lat),
                  nbytes=w * steps, overlaps=1)


def mha_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
              phase: str) -> list[OpCost]:
    """The two-level METP MHA of one layer (Algorithms 5, 6; ``recompute`` = forward), without
    step 0's broadcast (`mha_prologue`)."""
    p = layout.tp
    h, kv = model.hidden, model.kv_dim
    bs = block_sizes(model, layout, batch, seq)
    r = bs["rows"]
    bw, lat = _link(profile, layout)
    wb = bs["mha_w_block"]
    tree = coll.tree_steps(p)
    bcast = coll.broadcast_time(wb, p, bw, lat)
    qkv = 2 * r * h * (h + 2 * kv) / p
    proj = 2 * r * h * h / p
    inner = _attention_flops_per_rank(model, layout, batch, seq) / p ** 2  # one inner step, forward
    out: list[OpCost] = []
    for j in range(p):
        if j < p - 1:
            out.append(OpCost(f"bcast_w{j + 1}", "collective", phase, BCAST_STREAM, bcast, nbytes=wb * tree,
                              overlaps=4))
        if phase != "bwd":
            t_in = attention_fwd_time(inner, profile, model.dtype, model.qk_head_dim, layout.block_kernel)
            kvx = bs["kv_block"]
            out += [OpCost(f"mha_qkv{j}", "gemm", phase, "compute", gemm_time(qkv, profile, model.dtype), flops=qkv),
                    OpCost(f"mha_attn{j}.0", "attention", phase, "compute", t_in, flops=inner),
                    OpCost(f"p2p_kv{j}", "collective", phase, P2P_STREAM,
                           (p - 1) * coll.sendrecv_time(kvx, bw, lat), nbytes=(p - 1) * kvx, overlaps=1),
                    OpCost(f"mha_attn{j}.rest", "attention", phase, "compute", (p - 1) * t_in, flops=(p - 1) * inner),
                    OpCost(f"mha_proj{j}", "gemm", phase, "compute", gemm_time(proj, profile, model.dtype),
                           flops=proj)]
            continue
        fb = ATTN_BWD_FACTOR * inner
        t_in = attention_bwd_time(fb, profile, model.dtype, model.qk_head_dim, layout.block_kernel)
        kvx = 2 * bs["kv_block"]  # K, V and dK, dV
        first = gemm_time(proj, profile, model.dtype) * 2 + gemm_time(qkv, profile, model.dtype)
        out += [OpCost(f"mha_bwd_proj{j}", "gemm", phase, "compute", first, flops=2 * proj + qkv),
                OpCost(f"mha_attn_bwd{j}.0", "attention", phase, "compute", t_in, flops=fb),
                OpCost(f"p2p_kv_dkv{j}", "collective", phase, P2P_STREAM,
                       (p - 1) * coll.sendrecv_time(kvx, bw, lat), nbytes=(p - 1) * kvx, overlaps=1),
                OpCost(f"mha_attn_bwd{j}.rest", "attention", phase, "compute", (p - 1) * t_in, flops=(p - 1) * fb),
                OpCost(f"mha_bwd_qkv{j}", "gemm", phase, "compute", 2 * gemm_time(qkv, profile, model.dtype),
                       flops=2 * qkv),
                OpCost(f"reduce_dw{j}", "collective", phase, BCAST_STREAM, coll.reduce_time(wb, p, bw, lat),
                       nbytes=wb * tree, overlaps=4)]
    return out


def proj_recompute_costs(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                         fraction: float) -> list[OpCost]:
    """MEMO's recompute of h1 for the dropped ``fraction`` of the tokens under ``metp``: the
    attention output times W_proj, p block GEMMs beside a ring of the W_proj blocks."""
    p, h = layout.tp, model.hidden
    bs = block_sizes(model, layout, batch, seq)
    bw, lat = _link(profile, layout)
    blk = 2 * fraction * bs["rows"] * h * h / p
    return [OpCost("p2p_wproj", "collective", "recompute", P2P_STREAM,
                   (p - 1) * coll.sendrecv_time(bs["wproj_block"], bw, lat), nbytes=(p - 1) * bs["wproj_block"],
                   overlaps=1),
            OpCost("mha_proj_recompute", "gemm", "recompute", "compute", p * gemm_time(blk, profile, model.dtype),
                   flops=p * blk)]


def ring_bytes(costs: list[OpCost]) -> float:
    """Bytes this GPU sends on METP's streams in a list of op costs (the paper's volume)."""
    return sum(c.nbytes for c in costs if c.stream in (P2P_STREAM, BCAST_STREAM))
