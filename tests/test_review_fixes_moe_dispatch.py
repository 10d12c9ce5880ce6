"""Review fixes of the MoE dispatch: the all-gather dispatcher's buffers hold its whole ETP x EP group's tokens (the
trace's layer transients and the priced bytes agree), and the dispatch is priced by the worst expert group of the
layout, not the first (a group across a node boundary elsewhere rides the inter-node link)."""

from __future__ import annotations

import time

import pytest

from memo_sim.cost import collectives as coll
from memo_sim.cost.activations import tensor_bytes
from memo_sim.cost.layer_time import forward_costs
from memo_sim.cost.moe import ep_alltoall_dedup_time, ep_alltoall_time, step_link
from memo_sim.layout.parallel import Layout, group_spans_nodes, stage_rank
from memo_sim.layout.rank_order import pp_stride
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace
from memo_sim.model.config import PRESETS
from memo_sim.model.layer_graph import DTYPE_BYTES, layer_tensors
from memo_sim.profile.loader import load_profile

K = 1024
H100 = load_profile("h100-sxm5-80gb")  # nodes of 8
NVL72 = load_profile("gb200-nvl72")  # racks of 72
QWEN3 = PRESETS["qwen3-30b-a3b"]


def _buffers(trace) -> dict[str, int]:
    return {b.name: b.size for b in trace.buffers}


def test_allgather_dispatcher_buffers_hold_the_whole_groups_tokens():
    """Megatron-Core's MoEAllGatherTokenDispatcher gathers [(S/TP) B x TP x EP, H] over its tp_ep group and
    reduce-scatters from an unpermuted buffer of that size: EP 64 over 16K-token shards gathers 64 x 16384 x 2048
    x 2 B (4 GiB), not the rank's top-k routed copies (the all-to-all's buffer, unchanged)."""
    seq = 16 * K
    d = DTYPE_BYTES[QWEN3.dtype]
    ag = Layout(dp=64, ep=64, zero=1, moe_dispatcher="allgather")
    a2a = Layout(dp=64, ep=64, zero=1)
    group_tokens = 64 * seq * QWEN3.hidden * d
    fwd, bwd = _buffers(layer_forward_trace(QWEN3, ag, 1, seq)), _buffers(layer_backward_trace(QWEN3, ag, 1, seq))
    for name, size in (("dispatch_recv", fwd), ("combine_recv", fwd), ("dispatch_grad_recv", bwd),
                       ("combine_grad_recv", bwd)):
        assert size[name] == pytest.approx(group_tokens, rel=1e-6), name
    tens = layer_tensors(QWEN3)
    copies = tensor_bytes(tens["moe_in"], a2a, 1, seq)  # the all-to-all's: top-k copies of the busiest rank
    assert copies < group_tokens / 4
    fwd2, bwd2 = _buffers(layer_forward_trace(QWEN3, a2a, 1, seq)), _buffers(layer_backward_trace(QWEN3, a2a, 1, seq))
    assert fwd2["dispatch_recv"] == pytest.approx(copies, rel=1e-6)
    assert bwd2["combine_grad_recv"] == pytest.approx(tensor_bytes(tens["efc2"], a2a, 1, seq), rel=1e-6)
    # the layer's transients move with the dispatcher, as its time does
    peak_ag = layer_forward_trace(QWEN3, ag, 1, seq).max_live_bytes()
    peak_a2a = layer_forward_trace(QWEN3, a2a, 1, seq).max_live_bytes()
    assert peak_ag >= group_tokens > peak_a2a


def test_dispatch_buffer_and_its_priced_bytes_agree():
    """The buffer each dispatcher names is the one its collective is priced on: the all-gather's priced bytes are
    the trace's receive buffer (with ETP: the ETP x EP group's tokens; the all-to-all's: the ETP-gathered copies)."""
    from memo_sim.cost.moe import dispatcher_buffer_bytes

    seq = 8 * K
    for lay in (Layout(dp=16, ep=8, etp=2, moe_dispatcher="allgather"), Layout(dp=16, ep=8, moe_dispatcher="allgather"),
                Layout(dp=16, ep=8, etp=2), Layout(dp=16, ep=16, moe_dispatcher="deepep")):
        fwd = _buffers(layer_forward_trace(QWEN3, lay, 1, seq))
        for op in ("dispatch", "combine"):
            want = dispatcher_buffer_bytes(op, QWEN3, lay, 1, seq)
            assert fwd[f"{op}_recv"] == pytest.approx(want, rel=1e-6), (lay.label(), op)
        priced = [c for c in forward_costs(QWEN3, lay, 1, seq, H100) if c.name.startswith("moe_dispatch")]
        assert max(c.nbytes for c in priced) == pytest.approx(dispatcher_buffer_bytes("dispatch", QWEN3, lay, 1, seq))
    g = Layout(dp=16, ep=8, etp=2, moe_dispatcher="allgather")
    assert dispatcher_buffer_bytes("dispatch", QWEN3, g, 1, seq) == pytest.approx(16 * seq * QWEN3.hidden * 2)


def _alltoall_rank(size: float, g: int, local: int, profile) -> float:
    """An EP rank's all-to-all with ``local`` of its group's ``g`` ranks on its node (the cost model's docs)."""
    nv_bw, nv_lat = coll.link_params(profile.nvlink, "all_to_all")
    ib_bw, ib_lat = coll.link_params(profile.internode, "all_to_all")
    return max((local - 1) * (nv_lat + size / (g * nv_bw)), (g - local) * ib_lat + size * (g - local) / (g * ib_bw))


def test_ep_alltoall_waits_for_the_group_across_a_node_boundary():
    """EP 6 on 24 GPUs of 8-GPU nodes: groups [0-5], [6-11], [12-17], [18-23]; rank 6 has one EP peer on its node
    (rank 7) and sends 4/6 of its bytes over the inter-node link. The first group alone (inside node 0) priced the
    layer as NVLink's; 144 GPUs of NVL72 racks with EP 16: group [64-79] spans two racks."""
    size = 268e6
    lay = Layout(dp=24, ep=6, zero=1)
    assert step_link("ep", lay, H100) is H100.internode
    assert ep_alltoall_time(size, lay, H100) == pytest.approx(_alltoall_rank(size, 6, 2, H100))
    one_node = ep_alltoall_time(size, Layout(dp=6, ep=6), H100)
    assert ep_alltoall_time(size, lay, H100) > 5 * one_node
    rack = Layout(dp=144, ep=16, zero=1)
    assert step_link("ep", rack, NVL72) is NVL72.internode
    assert ep_alltoall_time(size, rack, NVL72) == pytest.approx(_alltoall_rank(size, 16, 8, NVL72))
    assert step_link("ep", Layout(dp=64, ep=16), NVL72) is NVL72.nvlink  # 64 GPUs of one rack: every group inside
    # the layer's priced dispatch (qwen2-moe-a2.7b, the review's case A): at least the inter-node share's time
    qwen2 = PRESETS["qwen2-moe-a2.7b"]
    costs = [c for c in forward_costs(qwen2, lay, 1, 16 * K, H100) if c.name.startswith("moe_dispatch")]
    ib_bw, _ = coll.link_params(H100.internode, "all_to_all")
    assert costs and all(c.seconds >= c.nbytes * 4 / 6 / ib_bw for c in costs)


def test_deepep_and_pipeline_stages_are_priced_by_their_worst_group():
    """DeepEP's deduplicated all-to-all over the straddling groups costs more than over groups inside a node (the
    first group's price, which the whole layout got); a pipeline whose second stage straddles a node (EP 6 per
    6-GPU stage: stage 1 is ranks 6-11) rides the inter-node link though stage 0's group is inside node 0."""
    tokens, width = 16 * K, QWEN3.hidden * 2
    straddle = ep_alltoall_dedup_time(tokens, 8, width, Layout(dp=24, ep=6, moe_dispatcher="deepep"), H100)
    inside = ep_alltoall_dedup_time(tokens, 8, width, Layout(dp=6, ep=6, moe_dispatcher="deepep"), H100)
    assert straddle > 2 * inside
    pipe = Layout(dp=6, pp=2, ep=6)
    assert step_link("ep", pipe, H100) is H100.internode
    assert ep_alltoall_time(1e8, pipe, H100) == pytest.approx(_alltoall_rank(1e8, 6, 2, H100))


def test_group_spans_nodes_sees_every_group_of_the_job():
    """Blocks of 6 on nodes of 8 over 24 GPUs: ranks 6-11 cross; over 6 GPUs nothing does; 16 on NVL72 racks over
    144 GPUs: ranks 64-79 cross, over 64 nothing does. Without the job's size the first block alone (as before)."""
    assert group_spans_nodes(6, 1, 8, 24) and group_spans_nodes(3, 2, 8, 24)
    assert not group_spans_nodes(6, 1, 8, 6) and not group_spans_nodes(8, 1, 8, 64)
    assert group_spans_nodes(16, 1, 72, 144) and not group_spans_nodes(16, 1, 72, 64)
    assert group_spans_nodes(16, 1, 8) and not group_spans_nodes(6, 1, 8) and not group_spans_nodes(1, 64, 8, 512)


@pytest.mark.parametrize("lay,node", [
    (Layout(dp=24, ep=6), 8), (Layout(dp=144, ep=16), 72), (Layout(dp=48, pp=3, ep=12, etp=2), 8),
    (Layout(dp=64, pp=3, ep=8, rank_order="tp-cp-pp-dp"), 72), (Layout(tp=2, dp=36, pp=2, ep=24, etp=3), 8),
    (Layout(dp=4096, ep=64), 72)])
def test_group_placements_match_every_group_enumerated(lay, node):
    """The placements found from one period of the groups are those of every group of every stage."""
    from memo_sim.layout.parallel import expert_group_placements

    stage_gpus = lay.stage_stride * lay.dp
    for size, stride in ((lay.ep, lay.etp), (lay.etp, 1), (lay.ep * lay.etp, 1), (lay.expert_dp, lay.ep * lay.etp)):
        block = size * stride
        want = set()
        for s in range(lay.pp):
            for first in range(0, stage_gpus, block):
                for o in range(stride):
                    counts: dict[int, int] = {}
                    for k in range(size):
                        n = (s * pp_stride(lay) + stage_rank(lay, first + o + k * stride)) // node
                        counts[n] = counts.get(n, 0) + 1
                    want.add(tuple(sorted(counts.values(), reverse=True)))
        assert set(expert_group_placements(lay, size, stride, node)) == want, (lay.label(), size, stride)


def test_group_placements_stay_cheap_at_a_million_gpus():
    from memo_sim.layout.parallel import expert_group_placements

    lay = Layout(dp=1 << 20, ep=256)
    t = time.perf_counter()
    assert expert_group_placements(lay, 256, 1, 72)
    assert time.perf_counter() - t < 2.0


def test_moe_split_dispatch_buffers_follow_the_dispatcher():
    """explain's memory split named the all-to-all's buffers for the all-gather dispatcher too (1.01 GiB both)."""
    from memo_sim.report.moe_split import moe_split

    seq = 16 * K
    ag = moe_split(QWEN3, Layout(dp=64, ep=64, zero=1, moe_dispatcher="allgather"), 1, seq, H100)
    a2a = moe_split(QWEN3, Layout(dp=64, ep=64, zero=1), 1, seq, H100)
    group_tokens = 64 * seq * QWEN3.hidden * DTYPE_BYTES[QWEN3.dtype]
    assert ag.memory_bytes["dispatch buffers"] == pytest.approx(2 * group_tokens)  # the dispatch's and the combine's
    assert a2a.memory_bytes["dispatch buffers"] < ag.memory_bytes["dispatch buffers"] / 4


def test_data_parallel_links_see_every_stages_groups():
    """Stage 1's data group of tp1-pp2-dp6 (ranks 6-11) and its expert data groups cross the 8-GPU node boundary;
    only stage 0's first group was looked at (NVLink)."""
    from memo_sim.cost.grad_sync import grad_sync
    from memo_sim.model.config import get_model

    assert grad_sync(get_model("gpt-7b"), Layout(dp=6, pp=2, zero=1), H100).link == "internode"
    assert grad_sync(get_model("gpt-7b"), Layout(dp=8, pp=2, zero=1), H100).link == "nvlink"
    assert grad_sync(get_model("gpt-7b"), Layout(dp=6, zero=1), H100).link == "nvlink"
    assert grad_sync(QWEN3, Layout(dp=6, pp=2, ep=3, zero=1), H100).link == "internode"
