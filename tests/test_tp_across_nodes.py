"""A Megatron TP group over whole nodes (DeepSpeed4Science's 'TP size=32' over 4 DGX A100 nodes): valid where the
user fixes the degree, priced on NCCL's ring through the nodes' NICs, never tried by the search on its own; the
flavours that cannot span nodes say why; the A100 40GB node profile it ran on."""

import json

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost import collectives as coll
from memo_sim.cost.layer_time import forward_costs
from memo_sim.layout.parallel import Layout, check_layout, enumerate_layouts
from memo_sim.model.config import ModelConfig, get_model
from memo_sim.profile import load_profile

GPT30B = ModelConfig("gpt-30b-64h", 64, 6144, 64, 4 * 6144, vocab=53248, dtype="fp16")


def test_megatron_tp_over_whole_nodes_is_valid_other_degrees_past_a_node_are_not():
    model = get_model("gpt-175b")
    assert check_layout(Layout(tp=16, sp=True, dp=2), model, 32, 8, 32768) is None
    assert check_layout(Layout(tp=32, sp=True), GPT30B, 32, 8, 16384) is None
    why = check_layout(Layout(tp=12, sp=True, dp=2), model, 24, 8, 32768)
    assert why and "tp=12 must divide the 8 GPUs of a node" in why and "a multiple of 8" in why


def test_flavours_that_do_not_span_nodes_say_why():
    model = get_model("gpt-175b")
    why = check_layout(Layout(tp=16, sp=True, dp=2, tp_mode="async_tp"), model, 32, 8, 32768)
    assert why and why.startswith("tp=16 spans 2 nodes: memo prices async TP's decomposed collectives")
    metp = Layout(tp=16, sp=True, dp=2, tp_mode="metp_ffn")
    why = check_layout(metp, model, 32, 8, 32768)
    assert why and "--metp-across-nodes" in why
    assert check_layout(metp, model, 32, 8, 32768, metp_across_nodes=True) is None


def test_the_search_tries_tp_past_a_node_only_where_the_user_fixes_it():
    model = get_model("gpt-175b")
    valid, _ = enumerate_layouts(model, 32, 8, 32768)
    assert valid and max(lay.tp for lay in valid) == 8
    fixed, _ = enumerate_layouts(model, 32, 8, 32768, tp=16)
    assert fixed and {lay.tp for lay in fixed} == {16}


def test_tp_collectives_inside_a_node_keep_nvlinks_price_across_nodes_the_nodes_nics():
    prof = load_profile("a100-sxm4-40gb")
    inside = Layout(tp=8, sp=True, dp=4)
    assert coll.tp_params(prof, inside, "all_gather") == coll.link_params(prof.nvlink, "all_gather")
    across = Layout(tp=32, sp=True)
    bw, lat = coll.tp_params(prof, across, "all_gather")
    ib_bw, ib_lat = coll.link_params(prof.internode, "all_gather")
    # 8 of the group's ranks on each node: the ring leaves a node once, on the 8 GPUs' shares of its NICs, no faster
    # than its NVLink hops inside the node
    assert bw == pytest.approx(min(8 * ib_bw, coll.link_params(prof.nvlink, "all_gather")[0]))
    # of the ring's 31 steps, the 3 that leave a node ride the inter-node link's latency, 28 NVLink's
    nv_lat = coll.link_params(prof.nvlink, "all_gather")[1]
    assert 31 * lat == pytest.approx(28 * nv_lat + 3 * ib_lat)
    gather = [c for c in forward_costs(GPT30B, across, 1, 16384, prof) if c.name.startswith("allgather_")]
    size = 16384 * 6144 * 2  # the gathered [s, h] tensor (the ring formula takes the whole)
    assert gather and gather[0].seconds == pytest.approx(coll.ring_allgather_time(size, 32, bw, lat))


def test_the_a100_40gb_profile():
    prof = load_profile("a100-sxm4-40gb")
    assert prof.gpu.model == "NVIDIA A100-SXM4-40GB"
    assert prof.node_gpus == 8
    assert float(prof.gpu.memory_bytes) == pytest.approx(39.59 * 2 ** 30)
    assert float(prof.gpu.hbm_bandwidth) == pytest.approx(1555e9)
    assert float(prof.internode.bandwidth) == pytest.approx(25e9)
    # the same GPU's compute and kernel curves as the 80 GB part
    big = load_profile("a100-sxm4-80gb")
    assert prof.efficiency.gemm == big.efficiency.gemm
    assert prof.efficiency.attention_fwd == big.efficiency.attention_fwd


def test_whatif_prices_a_fixed_tp_over_four_nodes():
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-30b", "--heads", "64", "--hidden", "6144", "--layers", "4",
                                 "--vocab", "53248", "--dtype", "fp16", "--gpus", "32", "--seq", "16K", "--tp", "32",
                                 "--profile", "a100-sxm4-40gb", "--policy", "full_recompute", "--json", "--no-plan"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    best = out["candidates"][0]
    assert best["layout_degrees"]["tp"] == 32 and best["status"] == "OK"
