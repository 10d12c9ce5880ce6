"""Megatron-LM's fine-grained activation offloading (`memo_sim.policy.offload_modules`): the module sets
``core_attn attn_proj`` (offload_attn) and ``core_attn attn_proj expert_fc1`` (offload_attn_experts) keep store all's
tensors but those the modules' offload groups save, which go to host through two buffers; the policies are offered by
the latest megatron framework data (offload_attn by memo's own, `any`, too), written by `memo-sim export --to megatron`;
memo-exec runs offload_attn (tests/test_exec_grads.py, test_exec_mutations.py, test_exec_every_plan_kind.py,
test_pipeline_exec_dist.py) and refuses offload_attn_experts in one line."""

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from memo_sim.api import Layout, get_model, get_policy, load_profile, memory_breakdown, simulate
from memo_sim.cli import cli
from memo_sim.cost.activations import layer_tensor_bytes, skeletal_bytes
from memo_sim.policy.rounding_buffers import N_BUFFERS

K = 1024
MOE_ARGS = ("--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "16K", "--tp", "2", "--ep", "4", "--pp", "1")


def _exported(folder, *whatif_args):
    """(plan.json, megatron.sh) of a Megatron plan the what-if writes with ``whatif_args`` and `memo-sim export`."""
    r = CliRunner().invoke(cli, ["whatif", "--framework", "megatron", *whatif_args, "--out", str(folder / "p")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["export", str(folder / "p" / "plan.json"), "--to", "megatron", "--no-price", "--out",
                                 str(folder / "ex")])
    assert r.exit_code == 0, r.output
    return folder / "p" / "plan.json", (folder / "ex" / "megatron.sh").read_text()


def test_offload_attn_offloads_the_attention_kernels_inputs_and_output_by_hand():
    """gpt-7b (h 4096, no QK norm) at 8K tokens, one GPU: q, k, v and the attention output, 8192 x 4096 bf16 each."""
    m, lay = get_model("gpt-7b"), Layout()
    sk = skeletal_bytes(m, lay, 1, 8 * K)
    one = 8 * K * 4096 * 2
    assert sk["offload_core_attn"] == 3 * one and sk["offload_attn_proj"] == one
    p = get_policy("offload_attn")
    assert p.offloaded(sk) == 4 * one
    assert p.offload_bytes(m, lay, 1, 8 * K) == 4 * one  # the copies move the groups' bytes
    assert p.resident_bytes(sk, 32) == 32 * (sk["total"] - 4 * one)
    assert p.buffer_bytes(sk) == N_BUFFERS * 4 * one
    assert p.forward_kept(sk)[0] == ("skeletal", sk["total"] - 4 * one + sk["lse"])  # the lse stays on the GPU


def test_core_attn_group_holds_the_qk_norms_outputs_where_the_layer_keeps_them():
    m = replace(get_model("qwen3-30b-a3b"), qk_norm_kept=True)  # as the megatron framework data keeps them
    assert m.qk_norm
    lay = Layout(tp=2, sp=True, ep=2)
    t = layer_tensor_bytes(m, lay, 1, 4 * K)
    sk = skeletal_bytes(m, lay, 1, 4 * K)
    assert sk["offload_core_attn"] == pytest.approx(t["q_normed"] + t["k_normed"] + t["v"])
    assert sk["offload_expert_fc1"] == pytest.approx(t["moe_in"])  # the dispatched tokens, the busiest rank's load


def test_offload_attn_experts_adds_the_dispatched_tokens_and_needs_experts():
    m, lay = get_model("qwen3-30b-a3b"), Layout(ep=2)
    sk = skeletal_bytes(m, lay, 1, 4 * K)
    a, e = get_policy("offload_attn"), get_policy("offload_attn_experts")
    assert e.offloaded(sk) == pytest.approx(a.offloaded(sk) + sk["offload_expert_fc1"]) and sk["offload_expert_fc1"] > 0
    assert e.offload_bytes(m, lay, 1, 4 * K) == pytest.approx(e.offloaded(sk))
    assert e.needs_experts and not a.needs_experts
    # each set is its own row of the what-if, and neither folds into full offload
    behaviours = {get_policy(n).behaviour(8) for n in ("offload_attn", "offload_attn_experts", "full_offload",
                                                        "store_all")}
    assert len(behaviours) == 4


def test_peak_falls_by_the_offloaded_bytes_of_all_but_two_layers_and_the_copies_are_simulated():
    m, lay, prof = get_model("gpt-7b"), Layout(tp=8, sp=True), load_profile("h100-sxm5-80gb")
    seq = 64 * K
    sk = skeletal_bytes(m, lay, 1, seq)
    off = get_policy("offload_attn").offloaded(sk)
    keep = memory_breakdown(m, lay, 1, seq, get_policy("store_all"), prof)
    fg = memory_breakdown(m, lay, 1, seq, get_policy("offload_attn"), prof)
    saved = (keep.skeletal_resident_bytes + keep.rounding_buffer_bytes) - (fg.skeletal_resident_bytes
                                                                            + fg.rounding_buffer_bytes)
    assert saved == pytest.approx((m.layers - N_BUFFERS) * off)
    assert fg.host_bytes_per_gpu >= (m.layers - 2) * off  # every offloaded layer's groups on the host
    r_keep = simulate(m, lay, 1, seq, get_policy("store_all"), prof, keep_timeline=False)
    r_fg = simulate(m, lay, 1, seq, get_policy("offload_attn"), prof, keep_timeline=False)
    assert r_fg.status == r_keep.status == "OK"
    assert r_fg.peak_gpu_bytes < r_keep.peak_gpu_bytes
    assert r_fg.layer_timings["offload"] > 0 and r_fg.layer_timings["prefetch"] > 0
    assert r_fg.iteration_s >= r_keep.iteration_s * (1 - 1e-9)  # the same compute, the copies beside it


def test_refused_in_one_line_where_megatron_has_no_such_module():
    p = get_policy("offload_attn")
    assert "tp_mode megatron" in p.layout_why_not(Layout(tp=2, tp_mode="metp"))
    assert "fused attention kernel" in p.layout_why_not(Layout(attention="materialised"))
    assert p.layout_why_not(Layout(tp=2, sp=True)) is None
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "4K", "--no-plan",
                                 "--framework", "megatron", "--policy", "offload_attn_experts"])
    assert r.exit_code == 2 and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4K", "--no-plan",
                                 "--policy", "offload_attn_experts"])  # memo's own stack (any) does not run it
    assert r.exit_code == 2 and "any does not offer it" in r.output, r.output


def test_megatron_offers_it_and_exports_it_and_memo_exec_refuses_it(tmp_path, monkeypatch):
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "64K", "--framework",
                                 "megatron", "--tp", "2", "--cp", "4", "--pp", "1", "--zero", "1", "--json",
                                 "--no-plan"])
    assert r.exit_code == 0, r.output
    pols = {c["policy"] for c in json.loads(r.stdout)["candidates"]}
    assert "offload_attn" in pols and "offload_attn_experts" not in pols  # a dense model
    _plan, script = _exported(tmp_path / "dense", "--model", "gpt-7b", "--gpus", "8", "--seq", "64K", "--tp", "2",
                              "--cp", "4", "--pp", "1", "--zero", "1", "--policy", "offload_attn")
    assert "--fine-grained-activation-offloading" in script and "--offload-modules core_attn attn_proj" in script
    assert "--recompute-granularity" not in script
    # Megatron's validate_args asserts it beside the offload on TransformerEngine >= 2.10 (a review)
    assert "export NVTE_CPU_OFFLOAD_V1=1" in script.splitlines()
    # the MoE set: Megatron writes it, memo-exec refuses it in one line (its MoE block keeps the dispatched tokens)
    # (--cp 1: a ring would be refused first, memo-exec not running TransformerEngine's per-step kernels)
    plan, script = _exported(tmp_path / "moe", *MOE_ARGS, "--cp", "1", "--policy", "offload_attn_experts")
    assert "--offload-modules core_attn attn_proj expert_fc1" in script
    import memo_exec.distributed.launch as launch  # noqa: PLC0415
    from memo_exec.cli import cli as exec_cli  # noqa: PLC0415

    # refused by --nproc's launcher before any rank starts (the 8 ranks took 18 s to say it, 2026-12-05)
    monkeypatch.setattr(launch, "launch_nproc", lambda *a, **k: pytest.fail("the ranks started for a refused policy"))
    r = CliRunner().invoke(exec_cli, ["run", str(plan), "--nproc", "8"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "offload_attn_experts" in lines[0], r.output


def test_the_documented_moe_pair_offloads_and_rebuilds_disjoint_tensors(tmp_path):
    """``--recompute-modules layernorm moe_act`` beside ``--offload-modules core_attn attn_proj expert_fc1``: the
    norms' and the experts' activation outputs rebuilt, the attention's and the dispatched tokens offloaded; memory
    store all's less both, time recompute_norm_act's re-run with the copies beside it; the export writes both."""
    m, lay, prof = get_model("qwen3-30b-a3b"), Layout(ep=2), load_profile("h100-sxm5-80gb")
    sk = skeletal_bytes(m, lay, 1, 4 * K)
    both, off, rec = (get_policy(n) for n in ("offload_attn_experts_recompute", "offload_attn_experts",
                                               "recompute_norm_act"))
    assert both.offloaded(sk) == off.offloaded(sk) and both.dropped(sk) == rec.dropped(sk) and rec.dropped(sk) > 0
    assert both.resident_bytes(sk, 48) == pytest.approx(48 * (sk["total"] - off.offloaded(sk) - rec.dropped(sk)))
    assert both.buffer_bytes(sk) == pytest.approx(off.buffer_bytes(sk) + rec.buffer_bytes(sk))
    assert [c.name for c in both.recompute_costs(m, lay, 1, 4 * K, prof)] == [
        c.name for c in rec.recompute_costs(m, lay, 1, 4 * K, prof)]
    assert both.offload_bytes(m, lay, 1, 4 * K) == pytest.approx(off.offload_bytes(m, lay, 1, 4 * K))
    assert len({p.behaviour(8) for p in (both, off, rec)}) == 3
    _plan, script = _exported(tmp_path, *MOE_ARGS, "--policy", "offload_attn_experts_recompute")
    assert "--recompute-modules layernorm moe_act" in script and "--recompute-granularity selective" in script
    assert "--offload-modules core_attn attn_proj expert_fc1" in script


def test_megatron_copies_the_attention_output_once_per_group_that_saves_it():
    """Megatron's offload dedups within one group only: the attention output, saved by the kernel (core_attn) and by
    the output projection (attn_proj), goes out and comes back twice while its GPU bytes are freed once (a review);
    memo's executor (`any`) moves it once; under a keeping Ulysses the kernel's head-sharded output is a tensor of its
    own, already counted."""
    from memo_sim.search.frameworks import get_framework

    base, lay = get_model("llama-3.1-8b"), Layout(tp=8, sp=True)
    meg, own = get_framework("megatron").for_model(base), get_framework("any").for_model(base)
    assert meg.offload_copies_per_group and not own.offload_copies_per_group
    p, seq = get_policy("offload_attn"), 96 * K
    attn = layer_tensor_bytes(meg, lay, 1, seq)["attn"]
    sk_m, sk_o = skeletal_bytes(meg, lay, 1, seq), skeletal_bytes(own, lay, 1, seq)
    assert p.offloaded(sk_m) == p.offloaded(sk_o)  # the GPU frees the same tensors
    assert p.copied(sk_m) == pytest.approx(p.offloaded(sk_m) + attn) and p.copied(sk_o) == p.offloaded(sk_o)
    assert p.offload_bytes(meg, lay, 1, seq) == pytest.approx(p.copied(sk_m))  # 336 MiB a layer, not 240
    assert p.offload_bytes(meg, lay, 1, seq) == pytest.approx(336 * 2**20)
    assert p.buffer_bytes(sk_m) == pytest.approx(N_BUFFERS * p.copied(sk_m))
    uly = Layout(ulysses=8, ulysses_kv="whole")
    assert skeletal_bytes(meg, uly, 1, seq)["offload_shared_copy"] == 0  # two tensors there, both counted


def test_llama4_offloads_the_weighted_copy_alone():
    """Llama 4 weights the dispatched tokens before expert_fc1's group opens: the group holds the weighted copy, the
    unweighted tokens stay on the GPU (a review)."""
    m, lay = get_model("llama-4-scout"), Layout(ep=2)
    assert m.moe_router.weights_input
    t = layer_tensor_bytes(m, lay, 1, 4 * K)
    sk = skeletal_bytes(m, lay, 1, 4 * K)
    assert sk["offload_expert_fc1"] == pytest.approx(t["moe_in_w"]) and t["moe_in"] > 0


def test_the_moe_pairs_pipeline_rank_holds_its_recompute_buffer():
    """A pipeline rank under offload_attn_experts_recompute holds its offload buffers and its recompute buffer (a
    review found the analytic stage peak without the latter, below the event simulator's)."""
    m, lay = get_model("qwen3-30b-a3b"), Layout(ep=2)
    sk = skeletal_bytes(m, lay, 1, 4 * K)
    p = get_policy("offload_attn_experts_recompute")
    blocks = dict(p.pipeline_rank_blocks(sk))
    assert blocks["recompute_buffer"] == pytest.approx(p.dropped(sk)) and p.dropped(sk) > 0
    assert sum(blocks.values()) == pytest.approx(2 * N_BUFFERS * p.copied(sk) + p.dropped(sk))
    assert p.static_gpu(sk) == [("offload_buffers", N_BUFFERS * p.copied(sk))]  # a unit's slot: the copies alone
