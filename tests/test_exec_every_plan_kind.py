"""[exec-complete]: every plan kind the what-if writes, `memo-exec` runs (or refuses in one line).

The what-if writes a plan for each kind on a tiny model (schedules x layouts x policies, the
frameworks that offer them); a one-device plan runs one step through `memo-exec run`, a
multi-device one runs one step on gloo ranks after the same checks `memo-exec run` makes before a
launch (`memo_exec.plan_check.check_plan_contract`, `check_plan_for_world`), every rank with the
same loss. The kinds the executor does not run are listed with the one line it refuses them with.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from memo_exec.cli import cli as exec_cli  # noqa: E402
from memo_sim.cli import cli as sim_cli  # noqa: E402
from tests.dist_harness import spawn  # noqa: E402
from tests.exec_helpers import time_limit  # noqa: E402

DENSE = ["--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128"]
TAIL = ["--dtype", "fp32", "--seq", "512", "--jobs", "1"]
MEMO = ["--policy", "memo", "--alpha", "0.5"]


def _moe_config(tmp: Path) -> str:
    """A tiny Mixtral-style Hugging Face config (4 experts, top 2)."""
    root = Path(__file__).resolve().parent
    d = json.loads((root / "data" / "hf" / "mixtral-8x7b" / "config.json").read_text())
    d.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
             num_hidden_layers=4, vocab_size=128, num_local_experts=4)
    p = tmp / "moe.json"
    p.write_text(json.dumps(d))
    return str(p)


def _gpt_oss_config(tmp: Path) -> str:
    """A tiny GPT-OSS Hugging Face config (attention sinks, sliding windows on the even layers, 4 experts, top 2)."""
    root = Path(__file__).resolve().parent
    d = json.loads((root / "data" / "hf" / "gpt-oss-20b" / "config.json").read_text())
    d.update(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             num_hidden_layers=4, vocab_size=128, num_local_experts=4, sliding_window=64,
             layer_types=["sliding_attention", "full_attention"] * 2)
    p = tmp / "gpt-oss.json"
    p.write_text(json.dumps(d))
    return str(p)


# name: (GPUs, what-if flags); "MOE" is replaced by the tiny MoE config's path, "OSS" by the tiny GPT-OSS one
KINDS = {
    "store_all": (1, ["--layers", "4", "--policy", "store_all"]),
    "full_recompute": (1, ["--layers", "4", "--policy", "full_recompute"]),
    "full_offload": (1, ["--layers", "4", "--policy", "full_offload"]),
    "checkpoint-offload": (1, ["--layers", "4", "--policy", "checkpoint_offload", "--framework", "deepspeed"]),
    # XTuner's framework data: its plans carry HF's loss kernel (torch_fused), which the executor runs as its own
    "xtuner": (1, ["--layers", "4", "--policy", "full_recompute", "--framework", "xtuner"]),
    "memo": (1, ["--layers", "4", *MEMO]),
    "sppo-pp1": (1, ["--layers", "4", "--policy", "sppo", "--subseqs", "2"]),
    "selective-megatron": (1, ["--layers", "4", "--policy", "selective_recompute", "--framework", "megatron"]),
    # the caching allocator's settings and the framework's recordStream are the runtime's, carried in the layout
    "memo-paper-record-stream": (1, ["--layers", "4", "--policy", "full_recompute", "--framework", "memo-paper"]),
    "alloc-conf": (1, ["--layers", "4", "--policy", "full_recompute", "--alloc-conf",
                       "max_split_size_mb:512,roundup_power2_divisions:4"]),
    "tp2-sp-memo": (2, ["--layers", "4", "--tp", "2", *MEMO]),
    "tp2-nosp": (2, ["--layers", "4", "--tp", "2", "--no-sp", "--policy", "store_all"]),
    "metp_ffn-memo": (2, ["--layers", "4", "--tp", "2", "--tp-mode", "metp_ffn", *MEMO]),
    "metp": (2, ["--layers", "4", "--tp", "2", "--tp-mode", "metp", "--policy", "full_recompute"]),
    "cp2-memo": (2, ["--layers", "4", "--cp", "2", *MEMO]),
    "ulysses2": (2, ["--layers", "4", "--ulysses", "2", "--policy", "full_recompute"]),
    "ulysses2-checkpoint-offload": (2, ["--layers", "4", "--ulysses", "2", "--zero", "3", "--policy",
                                        "checkpoint_offload", "--framework", "deepspeed"]),
    "dp2-z0": (2, ["--layers", "4", "--dp", "2", "--zero", "0", "--policy", "store_all"]),
    "dp2-z3-memo": (2, ["--layers", "4", "--dp", "2", "--zero", "3", *MEMO]),
    "fsdp": (2, ["--layers", "4", "--dp", "2", "--dp-mode", "fsdp", "--policy", "store_all"]),
    "optimizer-offload": (2, ["--layers", "4", "--dp", "2", "--zero", "1", "--optimizer-offload",
                              "--policy", "store_all"]),
    # one state shard (TP 2, no replicas): the optimizer on the host with ZeRO 0, the distributed optimizer over one rank
    "optimizer-offload-tp2": (2, ["--layers", "4", "--tp", "2", "--optimizer-offload", "--policy", "store_all"]),
    "pp2-1f1b-memo": (2, ["--layers", "6", "--pp", "2", "--schedule", "1f1b", *MEMO]),
    "pp2-interleaved-memo": (2, ["--layers", "6", "--pp", "2", "--schedule", "interleaved_1f1b", *MEMO]),
    "pp2-uneven": (2, ["--layers", "5", "--pp", "2", "--decoder-first-pipeline-num-layers", "2",
                       "--schedule", "1f1b", "--policy", "store_all"]),
    "sppo-pp2": (2, ["--layers", "4", "--pp", "2", "--policy", "sppo", "--subseqs", "2"]),
    "moe-ep2-recompute_moe": (2, ["--model", "MOE", "--ep", "2", "--policy", "recompute_moe",
                                  "--framework", "megatron"]),
    "moe-ep2-store_all": (2, ["--model", "MOE", "--ep", "2", "--policy", "store_all", "--framework", "megatron"]),
    # Megatron's --recompute-modules layernorm moe_act (`memo_exec.activations.recompute_norm_act`)
    "moe-recompute_norm_act": (1, ["--model", "MOE", "--policy", "recompute_norm_act", "--framework", "megatron"]),
    # expert tensor parallelism over the TP pair (`memo_exec.moe.etp`)
    "moe-etp2": (2, ["--model", "MOE", "--tp", "2", "--ep", "1", "--etp", "2", "--policy", "recompute_moe",
                     "--framework", "megatron"]),
    # ZeRO 2 over 2 micro-batches a replica: each micro-batch's reduce-scattered gradient added into the shard
    "dp2-z2-micro-batches": (2, ["--layers", "4", "--dp", "2", "--zero", "2", "--micro-batch", "1", "--global-batch",
                                 "4", "--policy", "store_all"]),
    "pp2-cp2-memo": (4, ["--layers", "6", "--pp", "2", "--cp", "2", "--schedule", "1f1b", *MEMO]),
    "pp2-ulysses2": (4, ["--layers", "4", "--pp", "2", "--ulysses", "2", "--schedule", "1f1b",
                         "--policy", "full_recompute"]),
    "pp2-tp2": (4, ["--layers", "4", "--pp", "2", "--tp", "2", "--schedule", "interleaved_1f1b",
                    "--policy", "store_all"]),
    "pp2-dp2": (4, ["--layers", "4", "--pp", "2", "--dp", "2", "--batch", "2", "--schedule", "1f1b",
                    "--policy", "full_recompute"]),
    "pp2-metp_ffn-memo": (4, ["--layers", "6", "--pp", "2", "--tp", "2", "--tp-mode", "metp_ffn", "--schedule", "1f1b",
                              *MEMO]),
    # torch's TP as torchtitan runs it: the gathered inputs of the column-parallel GEMMs kept (`sp_input_kept`)
    "torchtitan-tp2": (2, ["--layers", "4", "--tp", "2", "--policy", "full_recompute", "--framework", "torchtitan"]),
    "hsdp": (4, ["--layers", "4", "--dp", "4", "--dp-mode", "fsdp", "--policy", "store_all",
                 "--framework", "torchtitan"]),
    # FSDP with experts as torchtitan runs them: the routed experts sharded over their expert-data-parallel ranks
    "moe-fsdp": (4, ["--model", "MOE", "--dp", "4", "--ep", "2", "--zero", "3", "--policy", "store_all",
                     "--framework", "torchtitan"]),
    # GPT-OSS: attention sinks and sliding windows (`memo_exec.attention_sinks`) under TP, beside EP, and its clamped
    # SwiGLU in the experts (the config's swiglu_limit, `memo_exec.moe.experts`)
    "gpt-oss-tp2-ep2": (4, ["--model", "OSS", "--tp", "2", "--ep", "2", "--dp", "2", *MEMO]),
    # FSDP beside pipeline stages as torchtitan runs it: gathered once a step, each chunk reduced after its last
    # backward (`memo_exec.distributed.zero`); dense interleaved, and MoE with the experts sharded over expert-DP
    "pp2-fsdp": (4, ["--layers", "4", "--pp", "2", "--dp", "2", "--batch", "2", "--schedule", "interleaved_1f1b",
                     "--zero", "3", "--policy", "full_recompute", "--framework", "torchtitan"]),
    "moe-pp2-fsdp": (4, ["--model", "MOE", "--pp", "2", "--dp", "2", "--ep", "2", "--batch", "2", "--schedule", "1f1b",
                         "--zero", "3", "--policy", "store_all", "--framework", "torchtitan"]),
    # Megatron's --fine-grained-activation-offloading --offload-modules core_attn attn_proj
    # (`memo_exec.activations.offload_modules`): alone, under TP with SP, on a MoE model and on a pipeline rank
    "offload_attn": (1, ["--layers", "4", "--policy", "offload_attn", "--framework", "megatron"]),
    "offload_attn-tp2": (2, ["--layers", "4", "--tp", "2", "--policy", "offload_attn", "--framework", "megatron"]),
    "moe-offload_attn": (1, ["--model", "MOE", "--policy", "offload_attn", "--framework", "megatron"]),
    "cp2-offload_attn": (2, ["--layers", "4", "--cp", "2", "--policy", "offload_attn"]),
    "ulysses2-offload_attn": (2, ["--layers", "4", "--ulysses", "2", "--policy", "offload_attn"]),
    "pp2-interleaved-offload_attn": (2, ["--layers", "6", "--pp", "2", "--schedule", "interleaved_1f1b", "--policy",
                                         "offload_attn", "--framework", "megatron"]),
    # Megatron's --recompute-modules mlp (`memo_exec.activations.recompute_mlp`), alone and under TP with SP
    "recompute_mlp": (1, ["--layers", "4", "--policy", "recompute_mlp", "--framework", "megatron"]),
    "recompute_mlp-tp2": (2, ["--layers", "4", "--tp", "2", "--policy", "recompute_mlp", "--framework", "megatron"]),
    # Qwen3's attention: heads of 32 over a 64-wide model (the --head-dim override), QK norms
    "qwen3-memo": (1, ["--model", "qwen3-8b", *DENSE, "--layers", "4", "--kv-heads", "2", "--head-dim", "32", *MEMO]),
    "qwen3-tp2": (2, ["--model", "qwen3-8b", *DENSE, "--layers", "4", "--kv-heads", "2", "--head-dim", "32", "--tp", "2",
                      "--policy", "full_recompute"]),
    # FP8 GEMMs as torchao's Float8Linear runs them (`memo_exec.gemm_formats`)
    "fp8-tensorwise": (1, ["--layers", "4", *MEMO, "--profile", "h100-sxm5-80gb", "--precision", "fp8-tensorwise"]),
    "fp8-two-gpus": (2, ["--layers", "4", "--dp", "2", "--policy", "store_all", "--profile", "h100-sxm5-80gb",
                         "--precision", "fp8-tensorwise"]),
    # row- and block-scaled FP8 (`memo_exec.gemm_scaled`): block scaling's reductions whole 128-element tiles
    "fp8-rowwise": (1, ["--layers", "4", *MEMO, "--profile", "h100-sxm5-80gb", "--precision", "fp8-rowwise"]),
    "fp8-blockwise-tp2": (2, ["--hidden", "256", "--heads", "4", "--layers", "4", "--tp", "2", "--policy",
                              "full_recompute", "--profile", "h100-sxm5-80gb", "--precision", "fp8-blockwise"]),
    # multi-token-prediction modules after the last layer (`memo_exec.mtp`): a MoE module, and two under TP with SP;
    # on a pipeline's last stage (`memo_exec.pipeline.schedules`), 1F1B and interleaved
    "moe-mtp": (1, ["--model", "MOE", "--policy", "store_all", "--mtp-layers", "1"]),
    "tp2-mtp-memo": (2, ["--layers", "4", "--tp", "2", *MEMO, "--mtp-layers", "2"]),
    "mtp-pp2": (2, ["--layers", "4", "--pp", "2", "--schedule", "1f1b", "--policy", "store_all", "--mtp-layers", "1"]),
    "mtp-pp2-interleaved-memo": (2, ["--layers", "4", "--pp", "2", "--schedule", "interleaved_1f1b", *MEMO,
                                     "--mtp-layers", "2"]),
}
# what the executor does not run: (GPUs, what-if flags, the words of its one-line refusal)
REFUSED = {
    # TransformerEngine's FP8 keeps the quantised GEMM inputs; the executor keeps the high-precision ones
    "fp8-megatron": (1, ["--layers", "4", "--policy", "store_all", "--profile", "h100-sxm5-80gb",
                         "--precision", "fp8-tensorwise", "--framework", "megatron"], "fp8_saved_inputs"),
    "memplan-full_recompute": (1, ["--layers", "4", "--policy", "full_recompute", "--allocator", "plan"],
                               "priced by the simulator only"),
    "compiled": (1, ["--layers", "4", "--policy", "store_all", "--framework", "torchtitan@2024-12"],
                 "kernel_fusion compiled"),
    "op_sac": (1, ["--layers", "4", "--policy", "op_sac", "--framework", "torchtitan"], "policy 'op_sac'"),
    "fp8-blockwise-small": (1, ["--layers", "4", "--policy", "store_all", "--profile", "h100-sxm5-80gb", "--precision",
                                "fp8-blockwise"], "hidden 64"),
    # multi-token-prediction modules: the executor builds them with Megatron TP only (SPPO with modules: the what-if
    # itself refuses to plan it)
    "mtp-metp_ffn": (2, ["--layers", "4", "--tp", "2", "--tp-mode", "metp_ffn", *MEMO, "--mtp-layers", "1"],
                     "mtp_layers = 1 with tp_mode metp_ffn", ["--nproc", "2"]),
    # multi-device plans refused before any process starts (`memo-exec run --nproc N`)
    # sinks and windows need a rank's heads over the whole sequence: not under ring CP
    "gpt-oss-cp2": (2, ["--model", "OSS", "--cp", "2", "--policy", "store_all"], "attention_sinks and sliding_window "
                    "with cp 2", ["--nproc", "2"]),
    # FP8 on two GPUs in a part that runs no FP8: the FP8 refusal, not 'run it with --nproc 2' (which would refuse it)
    "fp8-moe-two-gpus": (2, ["--model", "MOE", "--ep", "2", "--policy", "store_all", "--profile", "h100-sxm5-80gb",
                             "--precision", "fp8-tensorwise"], "not in MoE experts"),
    # torch TP's kept gathered inputs in dense layers only (a MoE block reads the norm's shard)
    "torchtitan-moe-tp2": (2, ["--model", "MOE", "--tp", "2", "--policy", "store_all", "--framework", "torchtitan"],
                           "sp_input_kept with experts", ["--nproc", "2"]),
    "async-tp": (4, ["--layers", "4", "--tp", "2", "--dp", "2", "--zero", "3", "--tp-mode", "async_tp",
                     "--policy", "full_recompute", "--framework", "torchtitan@2024-12"], "tp_mode 'async_tp'",
                 ["--nproc", "4"]),
}


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, tuple[int, Path]]:
    tmp = tmp_path_factory.mktemp("kinds")
    models = {"MOE": _moe_config(tmp), "OSS": _gpt_oss_config(tmp)}
    out = {}
    for name, (gpus, flags, *_) in {**KINDS, **REFUSED}.items():
        flags = [models.get(f, f) for f in flags]
        if "--model" not in flags:
            flags = DENSE + flags
        d = tmp / name
        with time_limit(120):
            r = CliRunner().invoke(sim_cli, ["whatif", *flags, *TAIL, "--gpus", str(gpus), "--out", str(d)])
        assert r.exit_code == 0 and (d / "plan.json").exists(), (name, r.output[-800:])
        out[name] = (gpus, d / "plan.json")
    return out


def test_the_kinds_cover_every_schedule_policy_and_sequence_layout(plans):
    seen_sched, seen_pol, seen_lay = set(), set(), set()
    for name in KINDS:
        d = json.loads(plans[name][1].read_text())
        seen_sched.add(d["schedule"])
        seen_pol.add(d["policy"]["policy"])
        lay = d["layout"]
        seen_lay |= {k for k in ("tp", "cp", "ulysses", "dp", "pp", "ep") if lay.get(k, 1) > 1}
        seen_lay |= {lay.get("tp_mode", "megatron"), lay.get("dp_mode", "zero")}
        seen_lay |= {k for k in ("optimizer_offload", "sp_input_kept") if lay.get(k)}
    assert seen_sched == {"single_stage", "1f1b", "interleaved_1f1b", "sppo"}
    assert {"store_all", "full_recompute", "full_offload", "memo", "sppo", "selective_recompute",
            "recompute_moe", "recompute_norm_act", "recompute_mlp", "checkpoint_offload", "offload_attn"} <= seen_pol
    assert {"tp", "cp", "ulysses", "dp", "pp", "ep", "metp", "metp_ffn", "megatron", "fsdp",
            "optimizer_offload", "sp_input_kept"} <= seen_lay


@pytest.mark.parametrize("name", [n for n, (g, _) in KINDS.items() if g == 1])
def test_one_device_kinds_run(plans, name, tmp_path):
    with time_limit(120):
        r = CliRunner().invoke(exec_cli, ["run", str(plans[name][1]), "--device", "cpu", "--steps", "1", "--out",
                                          str(tmp_path / "run"), "--json"])
    assert r.exit_code == 0, (name, r.output[-1500:])


def rank_kinds(rank: int, world: int, files: list[str]) -> list[float]:
    """One step of each plan on this rank, after `memo-exec run`'s checks."""
    import torch

    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor, check_plan_for_world
    from memo_exec.plan_check import check_plan_contract
    from memo_exec.runner import RunOptions
    from memo_sim.plan.schema import read_plan

    out = []
    for f in files:
        plan = read_plan(f)
        opts = RunOptions(device="cpu", steps=1)
        check_plan_contract(plan, f, True, "cpu")
        check_plan_for_world(plan, world, opts)
        ctx = build_context(plan.layout, torch.device("cpu"))
        ex = DistExecutor(plan, opts, ctx, DeviceSpec("cpu"))
        try:
            ex.allocate()
            out.append(float(ex.step(0).loss))
        finally:
            ex.close()
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_multi_device_kinds_run_on_gloo_ranks(plans, world):
    names = [n for n, (g, _) in KINDS.items() if g == world]
    results = spawn(rank_kinds, world, [str(plans[n][1]) for n in names], timeout=400)
    for i, n in enumerate(names):
        losses = [r[i] for r in results]
        assert all(math.isfinite(x) for x in losses) and max(losses) - min(losses) < 1e-9, (n, losses)


@pytest.mark.parametrize("name", list(REFUSED))
def test_kinds_the_executor_does_not_run_are_refused_in_one_line(plans, name, tmp_path):
    r = CliRunner().invoke(exec_cli, ["run", str(plans[name][1]), "--device", "cpu", "--steps", "1", "--out",
                                      str(tmp_path / "run"), *(REFUSED[name][3:] or [[]])[0]])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (name, r.output)
    assert REFUSED[name][2] in lines[0], lines[0]
