"""The level-1 trace blocks of METP's ring groups (`memo_sim.tp.RING_GROUPS`), written once per
group for every flavour that runs it (`memo_sim.memplan.trace_gen` calls them at the group's first
op; the buffers are described there).

A builder is called as ``fn(b, bs, p, tb, d)``: ``b`` the trace builder (``alloc(name, bytes)``,
``free(name)``, ``tick()``), ``bs`` the block sizes of `memo_sim.cost.metp.block_sizes`, ``p`` the
ring's degree (tp), ``tb`` the layer tensors' bytes on one GPU, ``d`` the model dtype's bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from memo_sim.model.layer_graph import FP32_BYTES as FP32
from memo_sim.model.layer_graph import attention_bwd_workspace_bytes


def _metp_ffn_forward(b, bs: dict[str, float], p: int, tb: dict[str, float], d: int) -> None:
    b.alloc("metp_ffn_w_double_buffer", 2 * bs["ffn_w_block"])
    b.alloc("fc2", tb["fc2"])  # the output accumulator O_i, freed by the residual add
    b.tick()
    for j in range(p):
        b.alloc(f"metp_fc1_block{j}", bs["fc1_block"])  # T_ij = A_i B_j, then D_ij = f(T_ij) in place
        b.tick()  # O_i += D_ij C_j
        b.free(f"metp_fc1_block{j}")
        b.tick()
    b.free("metp_ffn_w_double_buffer")


def _metp_mha_forward(b, bs: dict[str, float], p: int, tb: dict[str, float], d: int) -> None:
    b.alloc("metp_mha_w_double_buffer", 2 * bs["mha_w_block"])
    b.alloc("proj", tb["proj"])  # the output accumulator O_i, freed by the residual add
    b.tick()
    for j in range(p):
        b.alloc(f"metp_qkv_block{j}", bs["qkv_block"])  # Q_ij, K_ij, V_ij = X_i W_qkv_j
        b.tick()
        ring = [(f"metp_kv_double_buffer{j}", 2 * bs["kv_block"]),
                (f"metp_attn_accumulator_fp32_{j}", bs["attn_block"] * FP32 / d),
                (f"attention_workspace{j}", bs["lse_block"])]
        for name, nbytes in ring:
            b.alloc(name, nbytes)
        b.tick()  # the inner ring; A_ij goes into the kept attention output
        for name, _ in ring:
            b.free(name)
        b.free(f"metp_qkv_block{j}")
        b.tick()  # O_i += A_ij W_proj_j
    b.free("metp_mha_w_double_buffer")


def _metp_ffn_backward(b, bs: dict[str, float], p: int, tb: dict[str, float], d: int) -> None:
    b.alloc("metp_ffn_w_double_buffer", 2 * bs["ffn_w_block"])
    b.alloc("metp_ffn_dw_double_buffer", 2 * bs["ffn_w_block"])  # dB, dC: accumulated, in flight
    b.alloc("d_ln2", tb["ln2"])  # dA_i, accumulated over the ring; freed by ln2's backward
    b.tick()
    for j in range(p):
        b.alloc(f"metp_fc1_block{j}", bs["fc1_block"])  # recompute T_ij
        b.tick()
        b.alloc(f"metp_act_block{j}", bs["act_block"])  # recompute D_ij
        b.alloc(f"metp_d_act_block{j}", bs["act_block"])  # dD_ij = dO C_j^T; dC_j += D_ij^T dO
        b.tick()
        b.free(f"metp_act_block{j}")
        b.alloc(f"metp_d_fc1_block{j}", bs["fc1_block"])  # dT_ij = f'(T_ij) dD_ij
        b.tick()
        b.free(f"metp_fc1_block{j}")
        b.free(f"metp_d_act_block{j}")
        b.tick()  # dA_i += dT_ij B_j^T; dB_j += A_i^T dT_ij
        b.free(f"metp_d_fc1_block{j}")
    b.free("metp_ffn_w_double_buffer")
    b.free("metp_ffn_dw_double_buffer")


def _metp_mha_backward(b, bs: dict[str, float], p: int, tb: dict[str, float], d: int) -> None:
    b.alloc("metp_mha_w_double_buffer", 2 * bs["mha_w_block"])
    b.alloc("metp_mha_dw_reduce_buffers", 2 * bs["mha_w_block"])  # dW_qkv_j, dW_proj_j: computed, reduced
    b.alloc("d_ln1", tb["ln1"])  # dX_i, accumulated over the outer loop; freed by ln1's backward
    b.tick()
    for j in range(p):
        b.alloc(f"metp_d_attn_block{j}", bs["attn_block"])  # dA_ij = dO W_proj_j^T
        b.alloc(f"metp_qkv_block{j}", bs["qkv_block"])  # recompute Q_ij, K_ij, V_ij
        b.tick()
        ring = [(f"metp_kv_double_buffer{j}", 2 * bs["kv_block"]),
                (f"metp_dkv_in_flight{j}", 2 * bs["kv_block"]),
                (f"attention_bwd_workspace{j}", attention_bwd_workspace_bytes(bs["lse_block"], bs["attn_block"], d))]
        for name, nbytes in ring:
            b.alloc(name, nbytes)
        b.alloc(f"metp_d_qkv_block{j}", bs["qkv_block"])
        b.tick()  # the inner backward ring
        for name, _ in ring:
            b.free(name)
        b.free(f"metp_d_attn_block{j}")
        b.tick()  # dX_i += dQKV W_qkv_j^T; dW_qkv_j = X_i^T dQKV
        b.free(f"metp_qkv_block{j}")
        b.free(f"metp_d_qkv_block{j}")
    b.free("metp_mha_w_double_buffer")
    b.free("metp_mha_dw_reduce_buffers")


class RingTrace(NamedTuple):
    forward: Callable
    backward: Callable


RING_TRACES = {"ffn": RingTrace(_metp_ffn_forward, _metp_ffn_backward),
               "mha": RingTrace(_metp_mha_forward, _metp_mha_backward)}
