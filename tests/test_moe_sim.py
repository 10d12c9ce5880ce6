"""[moe] Mixture-of-experts layouts and costs in the simulator: Megatron-Core's folding rule and
the other expert-parallel refusals, expert states sharded by EP, the dispatcher's collectives on
their links, the balance's busiest rank, MFU from the active parameters, the proved bound on MoE
candidates, and the what-if questions of the issue."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost.activations import routed_load, tensor_bytes
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.cost.memory import model_state_parts
from memo_sim.cost.param_split import model_gpu_params
from memo_sim.engine.schedules.single_stage import collective_link
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import PRESETS, ModelConfig
from memo_sim.model.flops import model_flops_per_iteration
from memo_sim.model.layer_graph import layer_tensors
from memo_sim.profile.loader import load_profile
from memo_sim.search.whatif import candidates_for

from bound_check import bounds_hold, sample

K = 1024
H100 = load_profile("h100-sxm5-80gb")
QWEN3 = PRESETS["qwen3-30b-a3b"]
# a small MoE for the simulator tests: 8 layers, 16 experts top-2 of width 1024, one shared expert
TOY = ModelConfig("toy-moe", layers=8, hidden=2048, heads=16, ffn=4096, vocab=32000, ffn_type="swiglu",
                  norm="rmsnorm", bias="none", tied_embeddings=False, experts=16, top_k=2, expert_ffn=1024,
                  shared_experts=1)


@pytest.mark.parametrize("layout,needle", [
    (Layout(dp=16, ep=3), "do not split evenly over ep 3"),
    (Layout(dp=16, ep=32), "must divide the 16 GPUs"),
    (Layout(tp=2, dp=8, ep=16, etp=2), "must divide the 16 GPUs"),
    (Layout(dp=16, ep=8, etp=5), "not divisible by etp 5"),
    (Layout(tp=2, sp=False, dp=8, ep=8), "sequence parallelism"),
    (Layout(tp=2, dp=8, ep=8, tp_mode="metp_ffn"), "METP"),
])
def test_expert_layouts_are_refused_in_one_line(layout, needle):
    why = check_layout(layout, QWEN3, 16, 8, 32 * K)
    assert why and needle in why and "\n" not in why, why


def test_a_dense_model_refuses_expert_degrees():
    why = check_layout(Layout(dp=8, ep=2), PRESETS["llama-3.1-8b"], 8, 8, 8 * K)
    assert "has none" in why
    assert check_layout(Layout(tp=2, dp=8, ep=8, etp=2), QWEN3, 16, 8, 32 * K) is None  # etp x ep = 16 ranks


def test_expert_states_are_sharded_by_ep_and_zero_by_the_stage():
    routed, total = QWEN3.routed_params(), QWEN3.params()
    for ep in (1, 2, 8, 16):
        g = model_gpu_params(QWEN3, Layout(dp=16, ep=ep, zero=1))
        assert g.local == pytest.approx(total - routed + routed / ep)
        assert g.sharded == pytest.approx(total / 16)  # etp x ep x expert-dp = the stage's 16 GPUs
    a, b = model_state_parts(QWEN3, Layout(dp=16, ep=1)), model_state_parts(QWEN3, Layout(dp=16, ep=8))
    assert a["weights"] - b["weights"] == pytest.approx(2 * routed * (1 - 1 / 8))  # bf16 weights
    # a dense model: as before (params / tp, sharded by the DP group)
    m = PRESETS["llama-3.1-8b"]
    g = model_gpu_params(m, Layout(tp=2, dp=4, zero=1))
    assert g.local == m.params() / 2 and g.sharded == pytest.approx(m.params() / 8)


def _named(costs):
    return {c.name: c for c in costs}


def test_expert_gemms_count_the_routed_tokens_and_the_dispatch_rides_its_group():
    lay = Layout(tp=2, dp=8, ep=8, moe_balance="forced")
    f = _named(forward_costs(QWEN3, lay, 1, 32 * K, H100))
    tokens = 32 * K / 2  # each rank routes its sequence-parallel shard
    assert f["expert_fc1"].flops == pytest.approx(2 * QWEN3.top_k * tokens * QWEN3.hidden * QWEN3.expert_fc1_width)
    assert f["expert_fc2"].flops == pytest.approx(2 * QWEN3.top_k * tokens * QWEN3.expert_width * QWEN3.hidden)
    a2a = f["moe_dispatch_alltoall_ep"]
    assert a2a.stream == "ep_comm" and a2a.nbytes == pytest.approx(QWEN3.top_k * tokens * QWEN3.hidden * 2)
    assert collective_link(a2a, lay, H100) == "nvlink"  # 8 EP ranks, one apart: one node
    wide = Layout(tp=2, dp=8, ep=16, moe_balance="forced")  # 16 EP ranks: two nodes
    g = _named(forward_costs(QWEN3, wide, 1, 32 * K, H100))["moe_dispatch_alltoall_ep"]
    assert collective_link(g, wide, H100) == "internode" and g.seconds > a2a.seconds
    b = _named(backward_costs(QWEN3, lay, 1, 32 * K, H100))
    assert b["moe_combine_alltoall_ep"].seconds == pytest.approx(a2a.seconds)  # the transpose, same bytes


def test_ulysses_routes_the_ranks_sequence_shard_as_ring_cp_does():
    """Ulysses and ring CP split the sequence outside TP alike for a MoE block: each rank routes its own shard, the
    expert groups fold over the stage's GPUs, Ulysses' among them (`memo_sim.layout.parallel.expert_layout_why_not`
    refused the pair before 2026-12-03; Megatron-LM runs its --cp-comm-type a2a beside expert parallelism). Only the
    attention's exchange differs: Ulysses' all-to-alls beside the block, the ring's shifts."""
    uly, cp = Layout(tp=2, ulysses=2, dp=4, ep=8, moe_balance="forced"), Layout(tp=2, cp=2, dp=4, ep=8,
                                                                                   moe_balance="forced")
    assert check_layout(uly, QWEN3, 16, 8, 32 * K) is None
    fu, fc = _named(forward_costs(QWEN3, uly, 1, 32 * K, H100)), _named(forward_costs(QWEN3, cp, 1, 32 * K, H100))
    tokens = 32 * K / (2 * 2)  # the rank's shard: the sequence over ulysses, then over TP (sequence parallelism)
    assert fu["expert_fc1"].flops == pytest.approx(2 * QWEN3.top_k * tokens * QWEN3.hidden * QWEN3.expert_fc1_width)
    for name in ("router", "expert_fc1", "expert_fc2", "moe_dispatch_alltoall_ep", "moe_combine_alltoall_ep"):
        assert fu[name].seconds == pytest.approx(fc[name].seconds), name
        assert fu[name].nbytes == pytest.approx(fc[name].nbytes), name
    assert {"alltoall_qkv", "alltoall_attn"} <= set(fu) and not {"alltoall_qkv", "alltoall_attn"} & set(fc)
    for name in ("moe_in", "efc1", "eact"):
        t = layer_tensors(QWEN3)[name]
        assert tensor_bytes(t, uly, 1, 32 * K) == pytest.approx(tensor_bytes(t, cp, 1, 32 * K)), name
    # EP 8 over tp 2 x ulysses 2 x dp 2 of the 16: one node each, as under CP
    assert collective_link(fu["moe_dispatch_alltoall_ep"], uly, H100) == "nvlink"


def test_expert_tensor_parallelism_gathers_the_etp_groups_tokens():
    lay = Layout(tp=2, dp=8, ep=8, etp=2, moe_balance="forced")
    f = _named(forward_costs(QWEN3, lay, 1, 32 * K, H100))
    assert "moe_dispatch_allgather_etp" in f and "moe_combine_reducescatter_etp" in f
    assert f["expert_fc1"].flops == pytest.approx(2 * QWEN3.top_k * (32 * K / 2) * QWEN3.hidden * QWEN3.expert_fc1_width)
    moe_in = layer_tensors(QWEN3)["moe_in"]
    assert tensor_bytes(moe_in, lay, 1, 32 * K) == pytest.approx(2 * tensor_bytes(moe_in, replace(lay, etp=1), 1, 32 * K))


def test_the_allgather_dispatcher_moves_every_token_of_the_group():
    lay = Layout(tp=2, dp=8, ep=4, moe_dispatcher="allgather", moe_balance="forced")
    f = _named(forward_costs(QWEN3, lay, 1, 32 * K, H100))
    assert f["moe_dispatch_allgather_etp_ep"].nbytes == pytest.approx(32 * K / 2 * 4 * QWEN3.hidden * 2)
    assert "moe_dispatch_alltoall_ep" not in f


def test_the_busiest_rank_sets_the_expert_time():
    base = Layout(tp=2, dp=8, ep=8)
    t = {b: _named(forward_costs(QWEN3, replace(base, moe_balance=b), 1, 32 * K, H100))["expert_fc1"].seconds
         for b in ("forced", "dropless", "capacity:1.5")}
    assert t["forced"] < t["dropless"] < t["capacity:1.5"]
    assert routed_load(replace(base, moe_balance="capacity:1.5"), 1, 32 * K, 8) == 1.5
    assert routed_load(replace(base, moe_balance="forced"), 1, 32 * K, 8) == 1.0
    assert routed_load(replace(base, ep=1), 1, 32 * K, 8) == 1.0  # one rank holds every expert


def test_small_experts_run_below_the_big_gemms_efficiency():
    """Many small experts (the same FLOPs split over more GEMMs) take longer: each expert's GEMM is
    priced at the efficiency of its own size."""
    few = replace(TOY, experts=8, expert_ffn=2048)
    many = replace(TOY, experts=64, top_k=16, expert_ffn=256)
    lay = Layout(dp=8, ep=8, moe_balance="forced")
    a = _named(forward_costs(few, lay, 1, 4 * K, H100))["expert_fc1"]
    b = _named(forward_costs(many, lay, 1, 4 * K, H100))["expert_fc1"]
    assert a.flops == pytest.approx(b.flops) and b.seconds > a.seconds


def test_mfu_counts_the_active_parameters():
    m = QWEN3
    dense_equivalent = model_flops_per_iteration(m, 1, 4096)
    assert dense_equivalent < 6 * 4096 * m.params()  # not every expert
    assert dense_equivalent > 6 * 4096 * m.active_params()


def test_mla_is_priced_op_by_op():
    m = PRESETS["deepseek-v3"]
    f = _named(forward_costs(m, Layout(tp=8, dp=4, ep=32), 1, 4 * K, H100))
    for name in ("q_down", "q_up", "kv_down", "kv_up", "router", "expert_fc1", "shared_fc1"):
        assert f[name].seconds > 0, name
    # the down projections are whole on every TP rank, the up projections split
    assert f["q_down"].flops == pytest.approx(2 * 4 * K * m.hidden * m.q_lora_rank)
    assert f["q_up"].flops == pytest.approx(2 * 4 * K * m.q_lora_rank * m.q_dim / 8)


def test_the_bound_holds_for_moe_candidates():
    """[search-speed] item 3: MoE candidates are priced by the cost functions the bound reads."""
    seen = set()
    for kw in (dict(policies=("store_all", "full_recompute", "memo")), dict(pp=2, batch=4)):
        r = candidates_for(TOY, 16 * K, 16, H100, **kw)
        ok = [c for c in r.candidates if c.memory.status == "OK" and c.layout.ep > 1]
        for c in bounds_hold(sample(ok)):
            seen.add(c.layout.pp > 1)
    assert seen == {False, True}


def _whatif(*args):
    r = CliRunner().invoke(cli, ["whatif", "--no-plan", "--json", "--jobs", "1", *args])
    assert r.exit_code in (0, 3), r.output
    return r.exit_code, json.loads(r.stdout)


def test_whatif_qwen3_ranks_expert_layouts(tmp_path):
    """Done when: Qwen3-30B-A3B on 16 H100s at 32K ranks EP layouts and answers."""
    # --simulate-top 1 (was 4): the EP layouts asserted are every ranked row's, the analytic tier's as much as the
    # simulated ones' (the same five degrees fit either way, 2026-12-02); the answer is simulated still
    rc, out = _whatif("--model", "tests/data/hf/qwen3-30b-a3b/config.json", "--gpus", "16", "--seq", "32K",
                      "--profile", "h100-sxm5-80gb", "--simulate-top", "1")
    assert rc == 0 and out["model"]["params"] == 30_532_122_624 and out["model"]["active_params"] == 3_353_032_704
    eps = {c["layout_degrees"].get("ep", 1) for c in out["candidates"] if c["status"] == "OK"}
    assert {1, 2, 4, 8, 16} <= eps
    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq", "32K", "--no-plan",
                                 "--jobs", "1", "--simulate-top", "1"])
    assert r.output.splitlines()[0].startswith("answer:") and "3.35B active, 128 experts top-8" in r.output


def test_whatif_mixtral_at_128k_on_8_gpus_offloads_with_memo():
    """Done when: Mixtral-8x7B on 8 GPUs at 128K with MEMO offload."""
    rc, out = _whatif("--model", "tests/data/hf/mixtral-8x7b/config.json", "--gpus", "8", "--seq", "128K",
                      "--profile", "h100-sxm5-80gb", "--simulate-top", "2", "--policy", "memo")
    assert rc == 0
    best = out["candidates"][0]
    assert best["status"] == "OK" and best["policy"] == "memo" and 0 < best["alpha"] <= 1


@pytest.mark.slow
def test_whatif_deepseek_v3_on_256_gpus_with_a_pipeline():
    """Done when: DeepSeek-V3 on 256 GPUs at 4K with PP (MLA priced, multi-token prediction named)."""
    rc, out = _whatif("--model", "tests/data/hf/deepseek-v3/config.json", "--gpus", "256", "--seq", "4K",
                      "--profile", "h100-sxm5-80gb", "--pp", "8", "--simulate-top", "2")
    assert rc == 0 and out["candidates"][0]["pp"] == 8
    assert any("multi-token prediction" in n for n in out["model"]["notes"])
    assert any("dense FFN" in n for n in out["model"]["notes"])


@pytest.mark.parametrize("args,needle", [
    (["--model", "qwen3-30b-a3b", "--ep", "3"], "--ep 3"),
    (["--model", "llama-3.1-8b", "--ep", "2"], "has none"),
    (["--model", "qwen3-30b-a3b", "--moe-balance", "capacity:0"], "--moe-balance"),
    (["--model", "qwen3-30b-a3b", "--framework", "megatron@2021"], "mixture of experts"),
    (["--model", "qwen3-30b-a3b", "--ep", "32"], "--ep 32 exceeds the 16 GPUs"),
    (["--model", "qwen3-30b-a3b", "--ep", "8", "--etp", "4"], "--ep 8 x --etp 4 = 32 exceeds"),
    (["--model", "qwen3-30b-a3b", "--tp", "32"], "--tp 32 exceeds the 16 GPUs"),
])
def test_bad_moe_options_are_one_line(args, needle):
    r = CliRunner().invoke(cli, ["whatif", "--gpus", "16", "--seq", "32K", "--no-plan", *args])
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1


def test_moe_split_covers_the_layer_and_draws(tmp_path):
    """Item 8: one MoE layer's time by part sums to the layer's ops, the memory by part to the states."""
    from memo_sim.report.moe_split import moe_split, moe_split_figure, moe_split_rows

    lay = Layout(tp=2, dp=8, ep=8)
    s = moe_split(QWEN3, lay, 1, 32 * K, H100)
    f = forward_costs(QWEN3, lay, 1, 32 * K, H100)
    assert sum(s.time_s["forward"].values()) == pytest.approx(sum(c.seconds for c in f))
    for part in ("attention", "router", "dispatch", "experts", "combine"):
        assert s.time_s["forward"][part] > 0 and s.time_s["backward"][part] > 0, part
    assert s.memory_bytes["dense states"] + s.memory_bytes["expert states"] == pytest.approx(
        sum(model_state_parts(QWEN3, lay).values()))
    assert s.memory_bytes["dispatch buffers"] > 0 and [r[0] for r in moe_split_rows(s)][0] == "attention"
    png = moe_split_figure(s, tmp_path / "moe_split.png")
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("zero", [1, 3])
def test_moe_split_counts_expert_states_from_their_own_shards(zero):
    """The expert states were the model states times the experts' share of the unsharded parameters, though
    the optimizer states (and, under ZeRO 3, the weights) shard the dense and the expert parameters alike:
    with ep 8 over dp 8 the experts' 1/8 each made the dense part look 2x what it is. Counted from the
    parameters instead: the dense states are the dense parameters' own bytes."""
    from memo_sim.report.moe_split import moe_split

    m = PRESETS["mixtral-8x7b"]
    lay = Layout(dp=8, ep=8, zero=zero)
    s = moe_split(m, lay, 1, 4 * K, H100)
    r, dense = m.recipe, m.params() - m.routed_params()  # every GPU holds the dense parameters whole (tp 1)
    shard = dense / 8
    want = (r.weight_bytes * (shard if zero >= 3 else dense) + r.grad_bytes * (shard if zero >= 2 else dense)
            + (r.master_bytes + r.optimizer_bytes) * shard)
    if zero >= 3:  # the two gathered layers' dense part, and the output head gathered for the classifier
        want += 2 * r.weight_bytes * (m.layer_params() - m.expert_layer_params()) + r.weight_bytes * m.vocab * m.hidden
    if zero >= 2:  # two layers' dense parts' and the head's whole gradients before their reduce-scatter (the
        # reductions beside the backward: `memo_sim.cost.memory.unsharded_grad_units`)
        want += r.grad_bytes * (2 * (m.layer_params() - m.expert_layer_params()) + m.vocab * m.hidden)
    assert s.memory_bytes["dense states"] == pytest.approx(want, rel=1e-6)
    assert s.memory_bytes["dense states"] + s.memory_bytes["expert states"] == pytest.approx(
        sum(model_state_parts(m, lay).values()))


def test_moe_split_of_a_pipeline_counts_its_fullest_stages_states():
    """explain's 'GPU memory by MoE part' of a pipeline plan gave the whole model's experts over EP (389 GiB a GPU
    for DeepSeek-V3 at pp 8, a review): a stage holds its own layers' states, the expert part of them apart."""
    from memo_sim.cost.sppo import stage_model_state_bytes
    from memo_sim.report.moe_split import moe_split

    m = PRESETS["mixtral-8x7b"]
    lay = Layout(tp=2, sp=True, pp=4, dp=2, ep=2, zero=1)
    s = moe_split(m, lay, 1, 4 * K, H100)
    stages = [stage_model_state_bytes(m, lay, k) for k in range(4)]
    assert s.memory_bytes["dense states"] + s.memory_bytes["expert states"] == pytest.approx(max(stages))
    assert s.memory_bytes["expert states"] < sum(model_state_parts(m, lay, experts_only=True).values()) / 3
    # the routed experts of the stage's 8 layers over ep 2 (etp 1), their optimizer sharded over the expert-data-
    # parallel group of tp x dp / ep = 2: weights, grads, master and moments
    r, n = m.recipe, 8 * m.expert_layer_params() / 2
    want = (r.weight_bytes + r.grad_bytes) * n + (r.master_bytes + r.optimizer_bytes) * n / 2
    assert s.memory_bytes["expert states"] == pytest.approx(want, rel=1e-9)
    assert f"stage {stages.index(max(stages))}, the fullest of 4" in s.label
    # and explain's table says so in its title (a review: the stage was only in the label, which explain never printed)
    assert s.states_of == f"stage {stages.index(max(stages))}, the fullest of 4"
    assert moe_split(m, Layout(tp=2, sp=True, dp=4, ep=2, zero=1), 1, 4 * K, H100).states_of == ""


def test_deepep_sends_each_token_across_nodes_once_per_node():
    """DeepEP (`memo_sim.layout.moe_dispatchers.deepep`): across nodes each token crosses the inter-node link once
    per destination node, not once per expert; inside a node it goes once to each rank holding one of its experts
    (DeepEP's is_token_in_rank), not once per expert: at EP 8 on one node a DeepSeek-V3 token (8 of 256 experts,
    router groups left out) reaches 8 x (1 - (7/8)^8) = 5.25 of the 8 ranks on average, so DeepEP moves 0.66 of
    the all-to-all's NVLink bytes."""
    from dataclasses import replace

    m = replace(PRESETS["deepseek-v3"], router_groups=0, router_group_topk=0)

    def a2a(ep, d):
        lay = Layout(dp=64, ep=ep, moe_dispatcher=d, moe_balance="forced")
        return next(c for c in forward_costs(m, lay, 1, 4 * K, H100) if c.name.startswith("moe_dispatch"))

    nv = H100.nvlink
    lat = 7 * float(nv.latency)
    ratio = 8 * (1 - (7 / 8) ** 8) / 8
    assert a2a(8, "deepep").seconds - lat == pytest.approx((a2a(8, "alltoall").seconds - lat) * ratio, rel=1e-9)
    for ep in (16, 32, 64):
        assert a2a(ep, "deepep").seconds < a2a(ep, "alltoall").seconds
        assert collective_link(a2a(ep, "deepep"), Layout(dp=64, ep=ep), H100) == "internode"
    from memo_sim.export import export_plan
    from memo_sim.plan.schema import Plan
    from memo_sim.policy import get_policy

    plan = Plan(model=m, batch=1, seq_tokens=4 * K, gpus=64, layout=Layout(dp=64, ep=32, zero=1, moe_dispatcher="deepep"),
                policy=get_policy("full_recompute", None), profile="h100-sxm5-80gb",
                predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.1}, layer_timings_s={"forward": 0.1, "backward": 0.2})
    sh = export_plan(plan, "megatron", price=False, nearest=True).files["megatron.sh"]
    assert "--moe-token-dispatcher-type flex" in sh and "--moe-flex-dispatcher-backend deepep" in sh


def test_megatron_recompute_modules_drop_and_rebuild_their_tensors():
    """Megatron-LM's --recompute-modules (`memo_sim.policy.recompute_modules`): store all's memory minus
    the group's tensors, and the group's ops (the MoE block's all-to-alls with recompute_moe) re-run."""
    from memo_sim.cost.activations import layer_tensor_bytes, skeletal_bytes
    from memo_sim.model.config import PRESETS
    from memo_sim.policy import get_policy

    lay = Layout(tp=2, dp=8, ep=8)
    sk = skeletal_bytes(QWEN3, lay, 1, 32 * K)
    store, na, moe = (get_policy(n) for n in ("store_all", "recompute_norm_act", "recompute_moe"))
    assert sk["norms"] > 0 and 0 < sk["moe_act"] < sk["moe_block"]
    assert store.resident_bytes(sk, 48) - na.resident_bytes(sk, 48) == pytest.approx(48 * (sk["norms"] + sk["moe_act"]))
    assert store.resident_bytes(sk, 48) - moe.resident_bytes(sk, 48) == pytest.approx(48 * (sk["norms"] + sk["moe_block"]))
    names = {c.name for c in moe.recompute_costs(QWEN3, lay, 1, 32 * K, H100)}
    assert {"ln2", "router", "expert_fc1", "expert_fc2", "moe_dispatch_alltoall_ep", "moe_combine_alltoall_ep"} <= names
    # Qwen3's input norm is fused into QKV in Megatron's TransformerEngine layer: kept, not re-run (`separate_norms`)
    assert "attention" not in names and "ln1" not in names
    assert {c.name for c in na.recompute_costs(QWEN3, lay, 1, 32 * K, H100)} == {"ln2", "expert_act"}
    ln2 = skeletal_bytes(QWEN3, lay, 1, 32 * K)["norms"]
    assert ln2 == pytest.approx(layer_tensor_bytes(QWEN3, lay, 1, 32 * K)["ln2"])
    dsv3 = PRESETS["deepseek-v3"]  # multi-latent attention: its input norm is a TENorm of its own, rebuilt too
    assert {c.name for c in na.recompute_costs(dsv3, lay, 1, 4 * K, H100)} == {"ln1", "ln2", "expert_act"}
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--no-plan",
                                 "--framework", "megatron", "--policy", "recompute_moe"])
    assert r.exit_code == 2 and "no experts" in r.output
    res = candidates_for(TOY, 16 * K, 16, H100, framework="megatron", policies=("recompute_moe", "recompute_norm_act"))
    ok = [c for c in res.candidates if c.memory.status == "OK"][:4]
    assert len(bounds_hold(ok)) == len(ok)


def test_a_shared_gate_keeps_the_shared_output_and_memo_rebuilds_it():
    """Qwen2-MoE's shared gate (sfc2 * sigmoid(ln2 @ w)) keeps sfc2 for the gate's gradient; DeepSeek's
    ungated shared experts do not; the experts' outputs (efc2) are never kept (the router weights are
    applied inside the activation, as Megatron-Core and memo-exec do). MEMO re-runs shared_fc2 for its
    dropped rows only where sfc2 is kept; recompute_moe drops it with the block."""
    from memo_sim.cost.activations import skeletal_bytes
    from memo_sim.model.layer_graph import recompute_ops

    gated, ungated = PRESETS["qwen2-moe-a2.7b"], PRESETS["deepseek-v2-lite"]
    assert gated.shared_gate and ungated.shared_experts and not ungated.shared_gate
    tg, tu = layer_tensors(gated), layer_tensors(ungated)
    assert tg["sfc2"].saved and tg["sfc2"].role == "other" and not tu["sfc2"].saved
    assert not tg["efc2"].saved and not tu["efc2"].saved
    assert "shared_fc2" in {op.name for op in recompute_ops(gated)}
    assert "shared_fc2" not in {op.name for op in recompute_ops(ungated)}
    lay = Layout(tp=2, sp=True, dp=4)
    sk = skeletal_bytes(gated, lay, 1, 8 * K)
    assert sk["moe_block"] >= tensor_bytes(tg["sfc2"], lay, 1, 8 * K) > 0
    assert tensor_bytes(tg["sfc2"], lay, 1, 8 * K) == pytest.approx(8 * K / 2 * gated.hidden * 2)  # SP rows, h, bf16


def test_review_fixes_expert_states_links_and_refusals():
    """FP8 copies of the experts split by EP; expert gradients reduced where the dense group has no
    replicas; the serial pipeline reduce splits experts too; the EP group's link follows where its
    ranks sit under pipelines; weights every TP rank holds whole are not divided by TP; DeepEP refuses
    ETP; SPPO refuses MoE; the all-gather dispatcher's group is read from its name."""
    from memo_sim.cost.grad_sync import grad_sync, params_reduce_time
    from memo_sim.cost.moe import moe_group_link, step_link
    from memo_sim.cost.sppo import stage_gpu_params
    from memo_sim.policy.sppo import Sppo

    fp8 = replace(QWEN3, gemm_format="fp8-blockwise")
    q1 = model_state_parts(fp8, Layout(dp=8, ep=1, zero=1))["quantised_weights"]
    q8 = model_state_parts(fp8, Layout(dp=8, ep=8, zero=1))["quantised_weights"]
    assert q8 < q1 / 5
    mix = PRESETS["mixtral-8x7b"]
    g = grad_sync(mix, Layout(tp=8, dp=1), H100)  # experts whole on every TP rank: 8 replicas
    assert g.layer_grad > 0 and g.all_grads > 0
    pipe1, pipe8 = Layout(dp=8, pp=2, zero=1), Layout(dp=8, pp=2, zero=1, ep=8)
    t1 = params_reduce_time(mix, pipe1, H100, stage_gpu_params(mix, pipe1, 0), stride=16)
    t8 = params_reduce_time(mix, pipe8, H100, stage_gpu_params(mix, pipe8, 0), stride=16)
    assert t8 < t1 / 2
    # data parallelism outermost: the stage's 8 GPUs are ranks 0, 2, ..., 14, two nodes; stages outermost, one
    lay = Layout(dp=8, pp=2, ep=8, rank_order="tp-cp-pp-dp")
    assert step_link("ep", Layout(dp=8, pp=2, ep=8), H100) is H100.nvlink
    assert step_link("ep", lay, H100) is H100.internode and step_link("ep", Layout(dp=8, ep=8), H100) is H100.nvlink
    ds = PRESETS["deepseek-v3"]
    g8 = model_gpu_params(ds, Layout(tp=8, dp=32, ep=32, zero=1))
    whole = ds.trained_replicated_params()  # its multi-token-prediction module's too (trained beside the model)
    assert whole > 1e9 and g8.local == pytest.approx(
        (ds.trained_params() - ds.trained_routed_params() - whole) / 8 + whole + ds.trained_routed_params() / 32)
    assert "etp 1" in check_layout(Layout(tp=2, dp=8, ep=8, etp=2, moe_dispatcher="deepep"), QWEN3, 16, 8, 32 * K)
    assert "dense layers" in Sppo(alpha=None).check(QWEN3, Layout(tp=2, pp=2, dp=4), 1, 32 * K)
    lay = Layout(tp=1, dp=16, ep=2, etp=8, moe_dispatcher="allgather")
    assert moe_group_link("moe_dispatch_allgather_etp_ep@m0", lay, H100) is step_link("etp_ep", lay, H100)


def test_torchtitan_ep_borrows_only_tp_cp_and_fsdp_ranks():
    from memo_sim.search.frameworks import get_framework

    fw = get_framework("torchtitan")
    assert "borrows" in fw.why_not(Layout(dp=8, ep=8))  # DDP replicas lend no EP ranks in torchtitan
    assert fw.why_not(Layout(tp=8, dp=2, ep=8)) is None


def test_a_pipeline_stage_holds_its_dense_layers_as_dense():
    """DeepSeek-V3's first 3 layers have a dense FFN and no experts: however the 61 layers are split over the
    ranks (first / last stage counts, even, each chunk its own) the stages' parameters add up to the model's,
    and a rank holds routed experts for its MoE layers only."""
    from memo_sim.cost.sppo import stage_dense_layer_count, stage_gpu_params, stage_params

    m = PRESETS["deepseek-v3"]
    for lay in (Layout(pp=8, dp=32, first_stage_layers=7, last_stage_layers=6, ep=32),
                Layout(pp=2, dp=4, ep=8, first_stage_layers=30, last_stage_layers=31),
                Layout(pp=4, vpp=2, dp=2, ep=8, chunk_layers=(1, 2, 9, 9, 10, 10, 10, 10))):
        assert sum(stage_dense_layer_count(m, lay, s) for s in range(lay.pp)) == 3
        # the model, its MTP module (last stage) and the embedding's copy that module reads there (Megatron builds the
        # embedding where pre_process or mtp_process)
        copy = m.vocab * m.hidden if lay.pp > 1 else 0
        assert sum(stage_params(m, lay, s) for s in range(lay.pp)) == m.trained_params() + copy, lay.label()
    lay = Layout(pp=8, dp=32, first_stage_layers=7, last_stage_layers=6, ep=32)
    first, second = stage_gpu_params(m, lay, 0), stage_gpu_params(m, lay, 1)
    assert first.expert_local == pytest.approx(4 * m.expert_layer_params() / 32)  # 7 layers, 3 of them dense
    assert second.expert_local == pytest.approx(8 * m.expert_layer_params() / 32)
    dense_model = PRESETS["llama-3.1-8b"]
    assert stage_dense_layer_count(dense_model, Layout(pp=4, dp=2), 0) == 0


def test_group_limited_routing_sends_a_token_to_fewer_nodes_under_deepep_only():
    """DeepSeek-V3's node-limited routing (8 groups, each token's experts from its best 4): with EP 64 over 8
    nodes each node holds one group, so a token reaches at most 4 nodes and DeepEP sends it across fewer of
    them; the plain all-to-all moves every routed copy either way, and groups that do not fall on whole nodes
    change nothing (a user's review, 2026-11-27: the groups were read nowhere)."""
    from dataclasses import replace
    from math import comb

    from memo_sim.cost.moe import nodes_hit

    assert nodes_hit(8, 8) == pytest.approx(1 - (7 / 8) ** 8)  # no groups: uniform over the nodes
    assert nodes_hit(8, 8, 8, 8) == pytest.approx(nodes_hit(8, 8))  # every group picked: no limit
    # one group a node, 4 of 8 picked: a node is picked with chance 1/2 and then hit 1 - (3/4)^8
    assert nodes_hit(8, 8, 8, 4) == pytest.approx(0.5 * (1 - (3 / 4) ** 8))
    assert 8 * nodes_hit(8, 8, 8, 4) <= 4  # at most 4 nodes a token
    # two groups a node (16 groups over 8 nodes), 4 picked: none of the node's 2 with chance 1001/1820, one 728/1820,
    # both 91/1820; missed when the k = 8 experts avoid the picked ones: 0.55 + 0.4 (3/4)^8 + 0.05 (1/2)^8
    assert nodes_hit(8, 8, 16, 4) == pytest.approx(1 - (0.55 + 0.4 * 0.75 ** 8 + 0.05 * 0.5 ** 8), rel=1e-12)
    assert comb(16, 4) == 1820
    assert nodes_hit(3, 8, 8, 4) == pytest.approx(nodes_hit(3, 8))  # 8 groups on 3 nodes: not whole groups

    v3 = PRESETS["deepseek-v3"]
    free = replace(v3, router_groups=0, router_group_topk=0)
    assert (v3.router_groups, v3.router_group_topk, v3.router_scaling) == (8, 4, 2.5)

    def a2a(m, d, ep=64):
        lay = Layout(dp=64, ep=ep, moe_dispatcher=d, moe_balance="forced")
        return next(c for c in forward_costs(m, lay, 1, 4 * K, H100) if c.name.startswith("moe_dispatch")).seconds

    assert a2a(v3, "deepep") < a2a(free, "deepep")  # 64 ranks on 8 nodes: one group a node
    assert a2a(v3, "alltoall") == pytest.approx(a2a(free, "alltoall"))
    # one node: NVLink only, one group a rank (32 of the 256 experts): a token reaches at most 4 ranks
    assert a2a(v3, "deepep", ep=8) < a2a(free, "deepep", ep=8)
    assert a2a(v3, "alltoall", ep=8) == pytest.approx(a2a(free, "alltoall", ep=8))


def test_moe_split_of_a_pipeline_is_the_layer_the_simulation_prices():
    """`memo-sim explain`'s MoE split (`memo_sim.report.moe_split`) of a pipelined layout prices the layer on the
    stage's shard, as the micro-batch pipeline does (`memo_sim.engine.schedules.microbatch.pipeline_costs`): with TP 2
    x PP 2 x DP 4 the full layout's rank order put EP 8 on two nodes, the shard on one (a review of the published
    runs' texts, 2026-11-29: their dispatch shares were the full layout's, not the simulated ones)."""
    from memo_sim.engine.schedules.microbatch import pipeline_costs
    from memo_sim.policy import get_policy
    from memo_sim.report.moe_split import moe_split, part_of

    m = PRESETS["mixtral-8x7b"]
    lay = Layout(tp=2, sp=True, pp=2, dp=4, ep=8, zero=1)
    pc = pipeline_costs(m, lay, 1, 4 * K, get_policy("store_all", None), H100)
    split = moe_split(m, lay, 1, 4 * K, H100)
    for phase, costs in (("forward", pc.forward), ("backward", pc.backward)):
        for part in ("dispatch", "combine", "experts", "attention"):
            want = sum(c.seconds for c in costs if part_of(c.name) == part)
            assert split.time_s[phase][part] == pytest.approx(want, rel=1e-12), (phase, part)


def test_a_collapsed_unit_keeps_the_token_dispatch_on_its_own_stream_and_link():
    """Past `FINE_OPS_LIMIT` a pipeline's units collapse to one compute op and their collectives; the MoE
    dispatcher's all-to-alls stay on ``ep_comm`` over the expert group's link (inter-node at EP 16), apart from
    TP's, with each stream's seconds kept (merged into one TP op, they rode TP's NVLink and `explain` called
    their wait tensor-parallel)."""
    from memo_sim.engine.schedules.stages import collapse_unit  # noqa: PLC0415

    wide = Layout(tp=2, dp=8, ep=16, moe_balance="forced")
    for costs, phase in ((forward_costs(QWEN3, wide, 1, 32 * K, H100), "fwd"),
                         (backward_costs(QWEN3, wide, 1, 32 * K, H100), "bwd")):
        out = collapse_unit(costs, phase, wide, H100)
        assert len(out) < len(costs)
        for stream in ("compute", "comm", "ep_comm"):
            before = sum(c.seconds for c in costs if c.stream == stream)
            assert before > 0
            assert sum(c.seconds for c in out if c.stream == stream) == pytest.approx(before)
        ep = [c for c in out if c.stream == "ep_comm"]
        assert ep and all(collective_link(c, wide, H100) == "internode" for c in ep)
        assert all(collective_link(c, wide, H100) == "nvlink" for c in out if c.stream == "comm")
