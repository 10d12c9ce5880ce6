"""The what-if folds two policies into one row only where they move and rebuild the same bytes
(`Policy.behaviour`): memo at alpha = 1 is full offload, but selective recompute, Megatron's
--recompute-modules sets and torchtitan's per-op checkpointing each drop and re-run their own
tensors (a user's review, 2026-11-27: `whatif --framework megatron` on Qwen3-30B-A3B folded
recompute_moe and selective_recompute into recompute_norm_act, hiding the 52 GiB plan behind the
63 GiB one)."""

import itertools
import json

from click.testing import CliRunner

from memo_sim.api import get_policy
from memo_sim.cli import cli

RECOMPUTING = ("selective_recompute", "recompute_norm_act", "recompute_moe", "recompute_mlp", "op_sac",
               "full_recompute", "checkpoint_offload")


def test_policies_that_rebuild_different_tensors_behave_differently():
    for a, b in itertools.combinations(RECOMPUTING + ("store_all",), 2):
        assert get_policy(a).behaviour(8) != get_policy(b).behaviour(8), (a, b)
    assert get_policy("memo", 1.0).behaviour(8) == get_policy("full_offload").behaviour(8)  # still one plan


def test_whatif_keeps_each_recompute_module_set_as_its_own_row():
    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq", "32K", "--profile",
                                 "h100-sxm5-80gb", "--framework", "megatron", "--tp", "4", "--cp", "2", "--ep", "8",
                                 "--pp", "1", "--zero", "1", "--no-plan", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["candidates"]
    fitting = {c["policy"]: c for c in rows if c["status"] == "OK"}
    assert {"recompute_norm_act", "recompute_moe", "selective_recompute"} <= set(fitting), sorted(fitting)
    peaks = {p: fitting[p]["peak_gpu_bytes"] for p in ("recompute_norm_act", "recompute_moe")}
    assert peaks["recompute_moe"] < peaks["recompute_norm_act"], peaks  # the memory the fold hid


def test_recompute_mlp_drops_the_mlps_tensors_and_reruns_the_mlp_with_its_sp_collectives():
    """Megatron's --recompute-modules mlp on a dense model (a review: its dense recompute modules were missing, the
    MoE sets refused): the pre-MLP norm's output (fused into fc1 under TransformerEngine), fc1's and the activation's
    are dropped and the MLP re-run, fc1's all-gather and fc2's reduce-scatter with it under sequence parallelism."""
    from memo_sim.api import Layout, get_model, load_profile
    from memo_sim.cost.activations import skeletal_bytes

    m, lay, prof = get_model("llama-3.1-8b"), Layout(tp=2, sp=True), load_profile("h100-sxm5-80gb")
    sk = skeletal_bytes(m, lay, 1, 8192)
    p = get_policy("recompute_mlp")
    assert sk["mlp"] > 0 and p.resident_bytes(sk, 1) == sk["total"] - sk["mlp"]
    assert sk["mlp"] < sk["total"] - sk["input"]  # the attention's tensors stay
    names = [c.name for c in p.recompute_costs(m, lay, 1, 8192, prof)]
    assert names == ["ln2", "allgather_ln2", "fc1", "act", "fc2", "reducescatter_fc2"], names
    assert get_policy("recompute_mlp").model_why_not(get_model("qwen3-30b-a3b"))  # a mixture of experts: refused
    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4K", "--no-plan",
                                 "--framework", "megatron", "--policy", "recompute_mlp"])
    assert r.exit_code == 2 and "recompute_mlp is priced for dense models" in r.output, r.output
