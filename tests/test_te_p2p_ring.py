"""TransformerEngine's p2p context parallelism (Megatron-LM's default --cp-comm-type) runs one attention kernel per
ring step over the rank's two chunks (`memo_sim.layout.ring_merge` te_p2p, ``step_kernels``), where memo's executor
runs one per pair of zigzag chunks: the same FLOPs in cp kernels of 2·c² score elements, priced at each kernel's own
size; its passes beside them (the output corrections after the ring, the per-step dQ/dK/dV accumulation, the K/V
packing) and its buffers (every K/V chunk and every step's output kept through the forward) counted from
AttnFuncWithCPAndKVP2P (`memo_sim.layout.ring_merge` module docs). memo-exec, which runs its own blocks, refuses such
a plan in one line."""

from __future__ import annotations

import pytest

from dataclasses import replace

from memo_sim.cost.activations import tokens_per_gpu
from memo_sim.cost.kernel_time import attention_bwd_time, attention_fwd_time, memory_bound_op_time
from memo_sim.cost.layer_time import backward_costs, forward_costs, full_recompute_costs
from memo_sim.cost.opcost import critical_time
from memo_sim.cost.ring_attention import block_counts, ring_attention_time
from memo_sim.frameworks import load_frameworks, mechanism_changes
from memo_sim.layout.parallel import Layout
from memo_sim.layout.ring_merge import ring_merge
from memo_sim.memplan.trace_gen import attention_buffers
from memo_sim.model.config import PRESETS
from memo_sim.plan.executor_scope import ring_merge_why_not
from memo_sim.profile.loader import load_profile

H100 = load_profile("h100-sxm5-80gb")


def test_megatron_runs_transformer_engines_ring_and_says_so_on_export():
    fws = load_frameworks()
    lay = fws["megatron"].adapt(Layout(tp=2, cp=4))
    assert lay.ring_merge == "te_p2p" and ring_merge("te_p2p").step_kernels
    assert not ring_merge("none").step_kernels  # memo's executor: one kernel per pair of zigzag chunks
    assert ring_merge("torch_cp").step_kernels  # PyTorch's CP: one SDPA call per ring step too
    assert "ring_merge none -> te_p2p" in mechanism_changes(fws["any"].adapt(Layout(tp=2, cp=4)), lay, H100)


@pytest.mark.parametrize("cp", [2, 4, 16])
@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_one_kernel_per_step_of_the_same_flops(cp, phase):
    flops = 3e14
    full, causal = block_counts(cp)
    f_full = flops / (full + causal / 2)  # one c x c block's FLOPs; the rank's share is 2·cp of them
    price = attention_bwd_time if phase == "bwd" else attention_fwd_time
    # step 0: causal over the rank's 2c tokens (half of (2c)^2); steps 1..cp-1: 2c x c or c x 2c, full
    want = (price(2 * f_full, H100, "bf16", 128, "cudnn", "causal")
            + (cp - 1) * price(2 * f_full, H100, "bf16", 128, "cudnn", "full"))
    assert 2 * f_full + (cp - 1) * 2 * f_full == pytest.approx(flops)
    got = ring_attention_time(flops, H100, "bf16", 128, "cudnn", cp, phase, step_kernels=True)
    assert got == pytest.approx(want)
    assert got != pytest.approx(ring_attention_time(flops, H100, "bf16", 128, "cudnn", cp, phase))


def test_a_megatron_layer_prices_its_ring_as_te_kernels():
    model = PRESETS["llama-3.1-8b"]
    blocks = Layout(cp=8, attention="cudnn")
    te = Layout(cp=8, attention="cudnn", ring_merge="te_p2p")

    def attn(costs):
        return sum(c.seconds for c in costs if c.kind == "attention")

    for costs in (forward_costs, backward_costs):
        a, b = attn(costs(model, blocks, 1, 131072, H100)), attn(costs(model, te, 1, 131072, H100))
        assert a > 0 and b > 0 and b != pytest.approx(a)


def test_the_executor_refuses_a_te_ring_in_one_line():
    why = ring_merge_why_not(Layout(cp=4, ring_merge="te_p2p"))
    assert why and "\n" not in why and "ring_merge te_p2p" in why and "--framework any" in why
    assert ring_merge_why_not(Layout(cp=1, ring_merge="te_p2p")) is None


def test_the_te_p2p_bytes_are_those_counted_from_its_code():
    # cp = 4, on the last rank (every step covers its whole queries), Q = 1000 output elements, KV = 500 (GQA):
    # forward: out_correction_init 4 + 3 later out_corrections x 6 (Q); the torch.cat packing the first send 4 (KV)
    # backward: dq.copy_ 4 + 3 dq.add_ x 6 (Q); kv copied into the send buffer 4, dk/dv[0].copy_ on half 2,
    # 2 dk/dv[0].add_ on half x 3, the diagonal step's whole add_ 6 (KV)
    m, q, kv = ring_merge("te_p2p"), 1000.0, 500.0
    assert m.bytes(4, q, kv, "fwd") == pytest.approx((4 + 3 * 6) * q + 4 * kv) == pytest.approx(24000)
    assert m.bytes(4, q, kv, "bwd") == pytest.approx((4 + 3 * 6) * q + (4 + 2 + 2 * 3 + 6) * kv) == 31000
    # cp = 2: no half-chunk add (step 0 the half copy, step 1 the diagonal)
    assert m.bytes(2, q, kv, "bwd") == pytest.approx((4 + 6) * q + (4 + 2 + 6) * kv)
    assert m.bytes(1, q, kv, "fwd") == m.bytes(1, q, kv, "bwd") == 0.0
    # no fp32 anywhere: its dK/dV travel in the model dtype, no fp32 dQ accumulator
    assert m.dkv_element_bytes(2, False) == 2 and not m.dq_fp32 and not m.kv_at_query_heads


def _merge(costs):
    (merge,) = [c for c in costs if c.name == "cp_ring_merge"]
    return merge


def test_a_megatron_layer_pays_exactly_the_te_passes_on_the_compute_stream():
    model, seq = PRESETS["llama-3.1-8b"], 131072
    lay = load_frameworks()["megatron"].adapt(Layout(cp=4))
    assert lay.ring_merge == "te_p2p" and not lay.ring_dkv_fp32
    tokens = tokens_per_gpu(lay, 1, seq)
    kv = tokens * (model.kv_dim + model.v_dim)  # K and V at their 8 heads
    want = {"fwd": (4 + 3 * 6) * tokens * model.attn_dim + 4 * kv,
            "bwd": (4 + 3 * 6) * tokens * model.q_dim + (4 + 2 + 2 * 3 + 6) * kv}
    for costs, phase in ((forward_costs, "fwd"), (backward_costs, "bwd"), (full_recompute_costs, "fwd")):
        got = costs(model, lay, 1, seq, H100)
        merge = _merge(got)
        assert merge.nbytes == pytest.approx(want[phase])
        assert merge.stream == "compute" and merge.overlaps == 0
        assert merge.seconds == pytest.approx(memory_bound_op_time(want[phase], H100)) and merge.seconds > 0
        # the layer phase is longer than without the passes by exactly their bytes over the bandwidth (+ one launch)
        without = [c for c in got if c.name != "cp_ring_merge"]
        assert critical_time(got) == pytest.approx(critical_time(without) + memory_bound_op_time(want[phase], H100))
    # memo's executor's ring (ring_merge none) prices no passes
    assert not [c for c in forward_costs(model, replace(lay, ring_merge="none"), 1, seq, H100)
                if c.name == "cp_ring_merge"]


def test_te_p2p_keeps_every_kv_chunk_and_every_step_output_through_the_forward():
    # AttnFuncWithCPAndKVP2P.forward: p2p_comm_buffers holds the packed own K/V and each received chunk until it
    # returns (cp chunks), out_per_step every step's bf16 output until the correction after the ring (cp outputs
    # on the last rank), which merges into a bf16 out: no fp32 accumulator. Backward: two [K/V, dK/dV] buffers in the
    # model dtype, no fp32 dQ.
    model, seq = PRESETS["llama-3.1-8b"], 131072
    lay = Layout(cp=4, ring_merge="te_p2p")
    tb = {"q": 8.0, "k": 2.0, "v": 2.0, "attn": 8.0, "lse": 0.25}
    fwd = dict(attention_buffers(model, lay, tb, "fwd", 1, seq))
    bwd = dict(attention_buffers(model, lay, tb, "bwd", 1, seq))
    # one allocation each, as TransformerEngine makes them (torch.empty_like a step, the kernel's output a step)
    assert [fwd[f"cp_kv_chunk_held_{i}"] for i in range(4)] == [4.0] * 4
    assert [fwd[f"cp_step_output_{i}"] for i in range(4)] == [8.0] * 4
    assert not {"cp_kv_double_buffer", "cp_out_accumulator_fp32", "cp_kv_chunk_held_4"} & set(fwd)
    assert bwd["cp_kv_double_buffer"] == pytest.approx(2 * 4) and bwd["cp_dkv_in_flight"] == pytest.approx(2 * 4)
    assert not {"cp_kv_chunk_held_0", "cp_step_output_0", "cp_dq_accumulator_fp32", "cp_step_dkv_outputs"} & set(bwd)
    # memo's executor's ring: the double buffer and the fp32 output accumulator (attn x 4 / 2 bytes)
    plain = dict(attention_buffers(model, replace(lay, ring_merge="none"), tb, "fwd", 1, seq))
    assert plain["cp_kv_double_buffer"] == pytest.approx(2 * 4) and plain["cp_out_accumulator_fp32"] == 16


def test_te_p2p_sends_dkv_home_with_its_last_step_not_after_it():
    """TransformerEngine's backward ends on the rank's own diagonal chunk (``if i == (cp_size - 1):
    dkv.add_(dkv_)``): its dK/dV accumulators travel cp - 1 times, beside the steps, and no shift waits after the
    loop (``RingMerge.dkv_home`` False); memo's executor sends them home once more after its last step."""
    model = PRESETS["llama-3.1-8b"]
    te = Layout(cp=4, attention="cudnn", ring_merge="te_p2p")
    mine = replace(te, ring_merge="none")
    te_names = [c.name for c in backward_costs(model, te, 1, 32768, H100)]
    mine_costs = backward_costs(model, mine, 1, 32768, H100)
    assert "cp_ring_dkv_home" not in te_names and "cp_ring_kv" in te_names
    assert "cp_ring_dkv_home" in [c.name for c in mine_costs]
    assert not ring_merge("te_p2p").dkv_home and ring_merge("none").dkv_home and ring_merge("torch_cp").dkv_home
    # the ring's shifts beside the steps carry the same bytes either way: K/V and dK/dV cp - 1 times
    ring_te = next(c for c in backward_costs(model, te, 1, 32768, H100) if c.name == "cp_ring_kv")
    ring_mine = next(c for c in mine_costs if c.name == "cp_ring_kv")
    assert ring_te.nbytes == pytest.approx(ring_mine.nbytes)
