"""Review fixes of 2026-12-01 (FSDP and framework data): plain FSDP offered beside ZeRO-3 by ``--dp-mode all``;
DeepSpeed's ZeRO-1/2 weight all-gather at the end of its optimizer step (``param_gather: after_step``); torchtitan's
ZeRO 0 as FSDP2 over a shard group of one (``replicate_fsdp``) and torchtitan@2024-12's DDP refused; a tied
embedding one FSDP2 unit with the norm and the head, gathered once; torchtitan@2024-12's FP8 GEMM inputs saved as
their FP8 copies (torchao eab345c)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost import collectives as coll
from memo_sim.cost.gemm_format import saved_weight_bytes
from memo_sim.cost.grad_sync import grad_sync
from memo_sim.cost.param_split import model_gpu_params
from memo_sim.errors import MemoError
from memo_sim.frameworks import load_frameworks
from memo_sim.layout.parallel import Layout, enumerate_layouts
from memo_sim.model.config import PRESETS, ModelConfig
from memo_sim.profile.loader import load_profile

H100 = load_profile("h100-sxm5-80gb")
M = PRESETS["llama-3.1-8b"]
# Qwen2.5-0.5B's shapes (the README's config example): a tied embedding
QWEN = ModelConfig("qwen2.5-0.5b", layers=24, hidden=896, heads=14, kv_heads=2, ffn=4864, vocab=151936,
                   ffn_type="swiglu", norm="rmsnorm", bias="qkv", tied_embeddings=True)


def _fw(name: str):
    return load_frameworks()[name]


def _json(args: list[str]) -> dict:
    r = CliRunner().invoke(cli, args + ["--json", "--no-plan"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


# ---- 1. --dp-mode all offers plain FSDP -------------------------------------------------------------------------

def test_dp_mode_all_offers_plain_fsdp_beside_zero3():
    """FSDP over the whole group with resharding is not ZeRO-3's twin (16 B/param to 18, the head gathered once), so
    ``--dp-mode all`` offers it (a review: only ZeRO-3 and FSDP without resharding were ranked)."""
    valid, _ = enumerate_layouts(M, 8, 8, 8192, tp=1, dp=8, zero=3, dp_modes=("zero", "fsdp"))
    assert Layout(dp=8, zero=3, dp_mode="fsdp") in valid
    assert Layout(dp=8, zero=3) in valid and Layout(dp=8, zero=3, dp_mode="fsdp", reshard_after_forward=False) in valid


def test_dp_mode_all_ranks_plain_fsdp_first_on_the_review_run():
    d = _json(["whatif", "--model", "llama-3.1-8b", "--layers", "2", "--gpus", "8", "--seq", "8K", "--profile",
               "h100-sxm5-80gb", "--tp", "1", "--dp", "8", "--zero", "3", "--dp-mode", "all", "--policy",
               "full_recompute"])
    rows = {c["layout"]: c for c in d["candidates"]}
    assert "tp1-dp8-z3-cudnn-fsdp" in rows, sorted(rows)  # cuDNN's attention: the profile's curves
    # the same collectives as FSDP without resharding's where the gathers hide, in less memory
    assert rows["tp1-dp8-z3-cudnn-fsdp"]["peak_gpu_bytes"] < rows["tp1-dp8-z3-cudnn-fsdp-keep"]["peak_gpu_bytes"]


# ---- 2. DeepSpeed's ZeRO-1/2 weight gather after the optimizer step --------------------------------------------

def test_frameworks_say_where_zero12_gathers_the_weights():
    assert dict(_fw("deepspeed").mechanisms)["param_gather"] == "after_step"
    assert dict(_fw("xtuner").mechanisms)["param_gather"] == "after_step"
    assert dict(_fw("megatron").mechanisms)["param_gather"] == "overlap"
    assert _fw("deepspeed").adapt(Layout(dp=16, zero=2)).param_gather == "after_step"
    assert _fw("deepspeed").adapt(Layout(dp=16, zero=3)).param_gather == "overlap"  # set only where it acts
    assert "param_gather" not in _fw("deepspeed").adapt(Layout(dp=16, zero=0)).to_dict()


@pytest.mark.parametrize("zero", [1, 2])
def test_deepspeed_gathers_every_weight_in_one_collective_after_the_step(zero):
    """deepspeed/runtime/zero/stage_1_and_2.py step() calls all_gather_dp_groups after the optimizer step: the
    weights are gathered once, wholly exposed, and no unit is gathered beside the forward."""
    lay = _fw("deepspeed").adapt(Layout(dp=16, zero=zero))
    s = grad_sync(M, lay, H100)
    assert s.layer_gather == s.embedding_gather == s.head_gather == s.mtp_gather == 0.0
    every = model_gpu_params(M, lay)
    link = coll.group_link(H100, 16, 1, 16)
    assert link is H100.internode and coll.group_node_ranks(lay, 16, 1, H100) == 8
    assert s.step_gather == pytest.approx(coll.ring_allgather_time(M.recipe.weight_bytes * every.local, 16,
                                                                   *coll.ring_params(H100, link, "all_gather", 8, 16)))
    # by hand: Llama-3.1-8B's 16 GB of bf16 weights over two nodes, the ring's node hop on the 8 GPUs' shares of
    # the node's NICs (8 x 50 GB/s; `coll.ring_params`): 15/16 x 16 GB / 400 GB/s, about 0.04 s exposed
    assert 0.03 < s.step_gather < 0.05
    mega = grad_sync(M, dataclasses.replace(lay, param_gather="overlap"), H100)
    assert mega.step_gather == 0.0 and mega.layer_gather > 0 and mega.embedding_gather > 0


def test_param_gather_is_read_and_validated_in_a_plan():
    lay = Layout.from_dict({"dp": 16, "zero": 2, "param_gather": "after_step"})
    assert lay.param_gather == "after_step" and Layout.from_dict(lay.to_dict()) == lay
    with pytest.raises(MemoError, match="param_gather"):
        Layout.from_dict({"dp": 16, "zero": 2, "param_gather": "later"})


def test_param_gather_after_the_step_is_refused_beside_pipeline_stages():
    """Only the single-stage schedule issues the gather after the step (DeepSpeed and XTuner run one stage)."""
    from memo_sim.layout.parallel import check_layout

    why = check_layout(Layout(dp=4, pp=2, zero=1, param_gather="after_step"), M, 8, 8, 8192)
    assert why and "param_gather after_step" in why and "\n" not in why
    assert check_layout(Layout(dp=4, pp=2, zero=1), M, 8, 8, 8192) is None


def test_deepspeed_zero2_simulates_the_gather_after_the_step(tmp_path):
    """The engine's single stage issues ``step_gather`` after the optimizer step (the report's patch)."""
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--layers", "2", "--gpus", "16", "--seq",
                                 "8K", "--profile", "h100-sxm5-80gb", "--framework", "deepspeed", "--dp", "16",
                                 "--zero", "2", "--policy", "full_recompute", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["simulate", str(tmp_path / "plan.json"), "--out", str(tmp_path / "sim")])
    assert r.exit_code == 0, r.output
    events = json.loads((tmp_path / "sim" / "timeline.json").read_text())["events"]
    opt = [e for e in events if e["op"] == "optimizer"]
    after = [e for e in events if e["op"] == "allgather_params"]
    assert len(after) == 1 and after[0]["start"] >= opt[0]["end"] - 1e-12
    assert not [e for e in events if e["op"] in ("allgather_weights", "allgather_embedding", "allgather_head")]


# ---- 3. torchtitan's ZeRO 0 ---------------------------------------------------------------------------------------

def test_torchtitan_2024_12_refuses_ddp_in_one_line():
    """At 9dec370 DDP ran on a one-dimensional mesh only and in fp32 (FSDP's MixedPrecisionPolicy only took effect
    with data_parallel_shard_degree > 1): memo does not price it as that version's run."""
    why = _fw("torchtitan@2024-12").why_not(Layout(tp=2, dp=4, zero=0))
    assert why and "ZeRO 0 over 4 data-parallel replicas" in why and "\n" not in why
    assert _fw("torchtitan@2024-12").why_not(Layout(tp=8, zero=0)) is None  # no replicas: nothing to refuse
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--layers", "2", "--gpus", "8", "--seq", "8K",
                                 "--profile", "h100-sxm5-80gb", "--framework", "torchtitan@2024-12", "--tp", "2",
                                 "--dp", "4", "--zero", "0", "--policy", "full_recompute", "--no-plan"])
    assert r.exit_code == 2 and "ZeRO 0 over 4 data-parallel replicas" in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_torchtitan_runs_zero0_as_fsdp_over_a_shard_group_of_one():
    tt = _fw("torchtitan")
    assert tt.adapt(Layout(tp=2, dp=4, zero=0)).replicate_fsdp
    assert not tt.adapt(Layout(tp=2, dp=4, zero=3, dp_mode="fsdp")).replicate_fsdp  # set only where it acts
    assert "DDP" not in tt.summary or "no DDP" in tt.summary
    assert not _fw("megatron").adapt(Layout(tp=2, dp=4, zero=0)).replicate_fsdp


def test_torchtitan_zero0_keeps_fsdp_states_of_16_bytes_a_parameter():
    """FSDP2 over a shard group of one: fp32 parameters (the master), fp32 gradients and Adam, 16 B/param, no bf16
    copy kept beside them (`memo_sim.cost.memory.model_state_parts`, the report's patch)."""
    from memo_sim.cost.memory import model_state_parts

    lay = _fw("torchtitan").adapt(Layout(tp=2, dp=4, zero=0))
    parts = model_state_parts(M, lay)
    p = model_gpu_params(M, lay).local
    assert parts["weights"] == 0.0
    assert parts["grads"] + parts["master_and_optimizer"] == pytest.approx(16 * p)
    assert parts["gathered_layers"] > 0  # each unit's bf16 copy, made as a resharding shard group's gathers are


# ---- 4. a tied embedding under FSDP2: one unit, gathered once -----------------------------------------------------

def test_fsdp_gathers_a_tied_embedding_once_with_the_norm_and_the_head():
    """torchtitan's apply_fsdp_to_decoder puts [tok_embeddings, norm, lm_head] in one unit when tied, not resharded
    after the forward: gathered before the embedding, kept to the embedding's backward (a review: the head gathered
    it again and the embedding's backward a third time)."""
    lay = _fw("torchtitan").adapt(Layout(dp=8, zero=3, dp_mode="fsdp"))
    s = grad_sync(QWEN, lay, H100)
    w = QWEN.recipe.weight_bytes
    link = coll.group_link(H100, 8, 1, 8)
    unit = QWEN.vocab * QWEN.hidden + QWEN.norm_params
    assert s.embedding_gather == pytest.approx(coll.ring_allgather_time(w * unit, 8,
                                                                        *coll.link_params(link, "all_gather")))
    assert s.head_gather == 0.0 and s.embedding_kept and s.head_grad == 0.0
    # DeepSpeed's ZeRO-3 releases the embedding after its forward: gathered again for the head, as before
    z3 = grad_sync(QWEN, Layout(dp=8, zero=3), H100)
    assert not z3.embedding_kept and z3.head_gather > z3.embedding_gather > 0


def test_fsdp_simulates_one_gather_of_a_tied_embedding(tmp_path):
    cfg = tmp_path / "qwen.json"
    cfg.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
                               "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
                               "vocab_size": 151936, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}))
    r = CliRunner().invoke(cli, ["whatif", "--model", str(cfg), "--layers", "2", "--gpus", "8", "--seq", "8K",
                                 "--profile", "h100-sxm5-80gb", "--tp", "1", "--dp", "8", "--zero", "3",
                                 "--framework", "torchtitan", "--policy", "full_recompute", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["simulate", str(tmp_path / "plan.json"), "--out", str(tmp_path / "sim")])
    assert r.exit_code == 0, r.output
    events = json.loads((tmp_path / "sim" / "timeline.json").read_text())["events"]
    vocab = [e["op"] for e in events if e["op"] in ("allgather_embedding", "allgather_head")]
    assert vocab == ["allgather_embedding"]


# ---- 5. torchtitan@2024-12's FP8: the GEMM inputs saved as FP8 copies ---------------------------------------------

def test_torchtitan_2024_12_saves_the_fp8_gemm_inputs():
    """torchao eab345c: manual_float8_matmul_with_args_in_float8.forward saves (input_fp8, weight_fp8_t)."""
    fw = _fw("torchtitan@2024-12")
    assert fw.fp8_saved_inputs and not fw.fp8_weights_per_use
    fp8 = fw.for_model(dataclasses.replace(M, gemm_format="fp8-tensorwise"))
    assert fp8.fp8_saved_inputs
    rows = {}
    for prec in ("fp8-tensorwise", "bf16"):
        d = _json(["whatif", "--model", "llama-3.1-8b", "--layers", "2", "--gpus", "8", "--seq", "8K", "--profile",
                   "h100-sxm5-80gb", "--framework", "torchtitan@2024-12", "--precision", prec, "--policy",
                   "store_all", "--tp", "1"])
        rows[prec] = d["candidates"][0]["skeletal_resident_bytes"]
    # the saved tensors of the two layers but their FP8 weights (the weight_fp8_t each layer saves too, 1 B an
    # element: tests/test_review_fixes_memory_dec2b.py)
    weights = 2 * saved_weight_bytes(fp8, Layout(dp=8))
    assert weights > 0
    assert rows["fp8-tensorwise"] - weights < rows["bf16"]  # the review: the same 34.00 GiB kept as bf16
