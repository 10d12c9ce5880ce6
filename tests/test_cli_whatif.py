"""memo-sim whatif / profiles / models through the CLI."""

import json
import re

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from tests.cli_run import text_and_json as shared_text_and_json


def run(args, **kw):
    return CliRunner().invoke(cli, args, catch_exceptions=False, **kw)


def text_and_json(args):
    """`tests.cli_run.text_and_json`, exceptions raised as `run` does."""
    return shared_text_and_json(args, catch_exceptions=False)


def test_default_whatif_writes_plan(tmp_path):
    r = run(["whatif", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "best:" in r.output and (tmp_path / "plan.json").exists()
    from memo_sim.plan import read_plan
    assert read_plan(tmp_path / "plan.json").seq_tokens == 256 * 1024


def test_7b_1m_json_statuses(tmp_path):
    r = run(["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "1M", "--profile", "a800-80gb", "--json",
             "--no-plan"])  # the plan file is not read here
    assert r.exit_code == 0
    obj = json.loads(r.stdout)
    cands = obj["candidates"]
    by_policy = {}
    for c in cands:
        by_policy.setdefault(c["policy"], []).append(c)
    assert all(c["status"] in ("OOM", "OOHM") for c in by_policy["store_all"])
    for c in by_policy["full_recompute"] + by_policy["store_all"]:
        if c["status"] == "OOM":
            assert c["peak_gpu_bytes"] > c["gpu_capacity_bytes"]
    assert any(c["status"] == "OK" for c in by_policy["memo"])
    assert cands[0]["status"] == "OK" and cands[0]["policy"] == "memo"
    # every number carries its unit in the key name
    units = ("_s", "_bytes", "_mfu", "_per_gpu_s", "_per_node")
    for k, v in cands[0].items():
        if isinstance(v, float) and k != "alpha":
            assert k.endswith(units) or "_bytes" in k, k


def test_4k_ranks_no_offload_first(tmp_path):
    r = run(["whatif", "--seq", "4K", "--json", "--no-plan"])  # the plan file is not read here
    top = json.loads(r.stdout)["candidates"][0]
    assert top["policy"] in ("store_all", "full_recompute")


def test_toy_model_flags_and_fixed_layout(tmp_path):
    r = run(["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1000",
             "--seq", "2K", "--gpus", "2", "--tp", "2", "--policy", "memo", "--alpha", "0.3", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "tp2" in r.output and "0.300" in r.output


def test_bad_input_is_one_line_exit_2(tmp_path):
    for args in (["whatif", "--seq", "lots"], ["whatif", "--profile", "nope"], ["whatif", "--model", "gpt-1t"],
                 ["whatif", "--gpus", "8", "--tp", "3"], ["whatif", "--hidden", "1000", "--heads", "7"]):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2, (args, r.output)
        assert "Traceback" not in r.output


QWEN3 = "tests/data/hf/qwen3-30b-a3b/config.json"


@pytest.mark.parametrize("args,needle", [
    (["--model", "llama-3.1-8b", "--pp", "4", "--vpp", "3"], "32 layers do not split evenly into pp x vpp = 12"),
    (["--model", "llama-3.1-8b", "--pp", "4", "--micro-batch", "3", "--batch", "8"],
     "--micro-batch 3 does not divide --batch 8: give a --micro-batch that divides it (1, 2, 4, 8)"),
    # a review: these were answered with whichever layout rule refused last (METP's QKV bias, ZeRO stage 2)
    (["--model", "llama-3.1-8b", "--micro-batch", "3", "--batch", "4"], "--micro-batch 3 does not divide --batch 4"),
    (["--model", "llama-3.1-8b", "--micro-batch", "5", "--global-batch", "8"],
     "--micro-batch 5 does not divide --global-batch 8"),
    (["--model", "llama-3.1-8b", "--pp", "1", "--vpp", "2"], "--vpp 2 interleaves model chunks"),
    (["--model", "llama-3.1-8b", "--pp", "64", "--gpus", "64"], "--pp 64 exceeds the model's 32 layers"),
    (["--model", "llama-3.1-8b", "--tp", "3"], "--tp 3 does not divide the 16 GPUs"),
    (["--model", "gpt-7b", "--moe-dispatcher", "deepep"], "model gpt-7b has none (dense)"),
    (["--model", "gpt-7b", "--moe-balance", "capacity:1.5"], "model gpt-7b has none (dense)"),
    (["--model", QWEN3, "--framework", "torchtitan", "--etp", "2"], "--etp 2: torchtitan runs no expert tensor"),
    (["--model", QWEN3, "--framework", "deepspeed", "--moe-dispatcher", "allgather"],
     "--moe-dispatcher allgather: deepspeed runs alltoall"),
    (["--model", QWEN3, "--etp", "3"], "--etp 3 does not divide the 16 GPUs"),
    (["--model", QWEN3, "--ep", "256"], "--ep 256 exceeds the 16 GPUs"),
])
def test_a_fixed_degree_that_cannot_run_is_named_in_one_line(args, needle):
    """The reason names the flag the user set (review of 2026-11-26: the first layout the search refused
    was named instead, e.g. ZeRO beside stages for a --vpp the layers cannot split into)."""
    r = CliRunner().invoke(cli, ["whatif", "--gpus", "16", "--seq", "32K", "--no-plan", "--jobs", "1", *args])
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1, r.output


def test_check_plan_bad_file(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text('{"schema": "memo-plan/0"}')
    r = CliRunner().invoke(cli, ["check-plan", str(f)])
    assert r.exit_code == 2 and "schema" in r.output


def test_profiles_and_models_list():
    assert "a800-80gb" in run(["profiles"]).output
    out = run(["models"]).output
    assert "gpt-65b" in out and "llama-70b" in out
    row = next(ln.split() for ln in out.splitlines() if ln.startswith("qwen3-235b-a22b "))
    assert row[-3:] == ["128", "top-8", "235.09B", "22.19B"][-3:] and row[-4] == "128"  # experts, params, active


# -- #19 item 6 and #16: tiers apart, duplicates folded, the binding constraint, exit 3, --jobs ---------
def test_simulated_and_analytic_rows_apart(tmp_path):
    # one search, its text (--details) and --json
    r, js = text_and_json(["whatif", "--seq", "256K", "--simulate-top", "2", "--policy", "memo", "--policy",
                           "full_recompute", "--no-plan", "--jobs", "1", "--details"])
    assert r.exit_code == 0, r.output
    sim_at, ana_at = r.output.index("Simulated (tier 2"), r.output.index("Analytic only (tier 1")
    assert sim_at < ana_at
    sim_part = r.output[sim_at:ana_at]
    obj = json.loads(js.output)
    extra = obj["tier2"]["for_verdicts"]  # the verdict lines' sides the top 2 left analytic (METP, Megatron TP)
    assert obj["tier2"]["simulated"] == 2 + extra
    assert sum(bool(re.match(r"\s*\d+\s", line)) for line in sim_part.splitlines()) == 2 + extra  # rows, numbered
    assert "iter (sim)" not in r.output[ana_at:].splitlines()[1]
    tiers = [c["tier"] for c in obj["candidates"]]
    assert tiers[:2 + extra] == ["simulated"] * (2 + extra) and set(tiers[2 + extra:]) == {"analytic"}


def test_memo_alpha_1_folded_into_full_offload_on_one_allocator(tmp_path):
    """MEMO at alpha 1 moves full offload's bytes on its static memory plan: one row beside full offload on a plan
    (--allocator plan; an audit, 2026-12-02: --allocator both listed the pair twice, identical), its own row beside
    full offload on the caching allocator, whose reserved peak and fragmentation differ."""
    import re

    args = ["whatif", "--seq", "128K", "--tp", "8", "--tp-mode", "megatron", "--policy", "memo", "--policy",
            "full_offload", "--alpha", "1", "--no-plan", "--jobs", "1"]
    for allocator, rows_per_layout in (("plan", 1), ("caching", 2), ("both", 2)):
        r = run(args + ["--allocator", allocator])
        assert r.exit_code == 0, r.output
        rows = [ln for ln in r.output.splitlines() if re.match(r"^\s*\d+\s+tp", ln)]
        assert len(rows) == 2 * rows_per_layout, (allocator, rows)  # tp8+sp and tp8
        on_plan = sum("sim/mem plan" in ln for ln in rows)
        assert on_plan == 2, (allocator, rows)  # one row per layout on a static plan: memo's, never a copy of it
        assert ("moves and rebuilds the same bytes as" in r.output) == (allocator != "caching"), allocator
    obj = json.loads(run(args + ["--allocator", "plan", "--json"]).output)
    assert obj["folded_duplicates"] == len(obj["candidates"]) and all(c.get("folded") for c in obj["candidates"])


def test_nothing_fits_exit_3_and_advice(tmp_path):
    assert "3 when" in run(["whatif", "--help"]).output
    r = CliRunner().invoke(cli, ["whatif", "--seq", "4M", "--gpus", "8", "--tp", "8", "--policy", "store_all",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 3, r.output
    assert not (tmp_path / "plan.json").exists()
    assert "closest:" in r.output and "GPU memory: peak" in r.output
    advice = r.output[r.output.index("not searched:"):]
    for named in ("full_recompute", "memo", "--tp 8", "--gpus"):
        assert named in advice
    assert "--policy store_all" not in advice  # never suggests what was searched
    j = CliRunner().invoke(cli, ["whatif", "--seq", "4M", "--gpus", "8", "--tp", "8", "--policy", "store_all",
                                 "--json", "--no-plan"])
    assert j.exit_code == 3 and json.loads(j.output)["nothing_fits"] is True


def test_binding_words_name_the_pinned_rounding():
    from memo_sim.layout.parallel import Layout
    from memo_sim.model.config import get_model
    from memo_sim.policy.full_offload import FullOffload
    from memo_sim.profile import load_profile
    from memo_sim.search.whatif import Candidate, binding_words, host_memory_words
    from memo_sim.search.estimate import estimate_iteration
    from memo_sim.memplan.footprint import memory_breakdown

    # plain pinned tensors: PyTorch's power-of-two rounding
    model, prof, seq = get_model("gpt-7b"), load_profile("a800-80gb"), 768 * 1024
    lay = Layout(tp=8, host_pool="caching_host_allocator")
    pol = FullOffload()
    c = Candidate(model, lay, pol, 1, seq, prof, estimate_iteration(model, lay, 1, seq, pol, prof),
                  memory_breakdown(model, lay, 1, seq, pol, prof))
    words = host_memory_words(c)
    assert "power_of_two rounding" in words and "1.33x" in words, words
    assert c.status == "OOHM" and binding_words(c).startswith("pinned host memory: 30 offloaded layers x 8 GPUs")


def test_an_out_of_memory_candidate_names_terms_that_add_up_to_its_peak():
    """At 1M tokens the classifier and loss bind; the words listed the model states, activations, buffers and
    a layer's transients, half the peak they named (a user's review): now the term that binds, whichever."""
    import re

    from memo_sim.layout.parallel import Layout
    from memo_sim.memplan.footprint import memory_breakdown
    from memo_sim.model.config import get_model
    from memo_sim.policy import get_policy
    from memo_sim.profile import load_profile
    from memo_sim.search.estimate import estimate_iteration
    from memo_sim.search.whatif import Candidate, binding_words

    model, prof = get_model("llama-3.1-8b"), load_profile("h100-sxm5-80gb")
    for seq, lay, classifier in ((1 << 20, Layout(tp=4, sp=True, cp=2, cross_entropy="vocab_parallel"), True),
                                 (1 << 20, Layout(tp=8, sp=True, cross_entropy="chunked"), False)):
        pol = get_policy("store_all")
        m = memory_breakdown(model, lay, 1, seq, pol, prof)
        c = Candidate(model, lay, pol, 1, seq, prof, estimate_iteration(model, lay, 1, seq, pol, prof), m)
        words = binding_words(c)
        assert c.status == "OOM" and ("classifier and loss" in words) == classifier, words
        unit = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 2**20, "B": 1 / 2**30}
        sizes = [float(x) * unit[u] for x, u in re.findall(r"([0-9.]+) (GiB|MiB|KiB|B)\b",
                                                            words.split("usable (", 1)[1].split(" (above")[0])]
        assert sum(sizes) == pytest.approx(m.peak_gpu_bytes / 2**30, abs=0.02 * len(sizes)), words


def test_memos_own_plan_on_hopper_is_priced_on_the_faster_attention_kernel_memo_exec_runs(tmp_path):
    """memo's own plans priced FlashAttention-2 on every profile and the answer said in a trailing line that
    cuDNN's fused attention, which the Hopper profiles price on their own measured curves, made the same plan 1.6x
    faster (Llama-3.1-70B, 1M, 128 H100s): the default answer was not the fastest plan, and --framework megatron
    beat it (a user's review). memo-exec runs the kernel a plan is priced on first, so framework any prices
    cuDNN's where the profile does (flash elsewhere), and the answer names the kernel."""
    from dataclasses import replace

    from memo_sim.engine import simulate
    from memo_sim.plan import read_plan as load_plan
    from memo_sim.profile import load_profile

    base = ["whatif", "--model", "gpt-7b", "--layers", "4", "--gpus", "8", "--seq", "32K", "--jobs", "1",
            "--simulate-top", "1"]
    hopper = CliRunner().invoke(cli, base + ["--profile", "h100-sxm5-80gb", "--out", str(tmp_path / "h")])
    assert hopper.exit_code == 0, hopper.output
    assert ("attention priced on cuDNN's fused attention (h100-sxm5-80gb's curves), the kernel memo-exec runs such "
            "attention on" in hopper.output)
    # ring CP rows among the ranked ones lose to their block kernel, not their layout: said (a review)
    assert "ring CP's blocks are priced on FlashAttention-2, the kernel memo-exec runs them on" in hopper.output
    plan = load_plan(str(tmp_path / "h" / "plan.json"))
    assert plan.layout.attention == "cudnn" and plan.priced_attention_kernel() == "cudnn"
    ampere = CliRunner().invoke(cli, base + ["--profile", "a100-sxm4-80gb", "--out", str(tmp_path / "a")])
    assert ampere.exit_code == 0 and "attention priced on FlashAttention-2" in ampere.output, ampere.output
    assert load_plan(str(tmp_path / "a" / "plan.json")).priced_attention_kernel() == "flash"
    # a ring CP plan: memo-exec runs its blocks on FlashAttention-2, so it is priced, named and noted so
    ring = CliRunner().invoke(cli, base + ["--profile", "h100-sxm5-80gb", "--cp", "2", "--out", str(tmp_path / "r")])
    assert ring.exit_code == 0 and "FlashAttention-2 (h100-sxm5-80gb's curves, as ring blocks)" in ring.output
    ring_plan = load_plan(str(tmp_path / "r" / "plan.json"))
    assert ring_plan.layout.cp == 2 and ring_plan.priced_attention_kernel() == "flash"
    titan = CliRunner().invoke(cli, base + ["--profile", "h100-sxm5-80gb", "--framework", "torchtitan", "--no-plan"])
    assert titan.exit_code == 0 and "attention priced on" not in titan.output  # a framework's own kernel: its label
    # the same plan on FlashAttention-2 is slower on Hopper: the kernel is what moved the default answer
    h100 = load_profile("h100-sxm5-80gb")
    runs = [simulate(plan.model, replace(plan.layout, attention=k), plan.batch, plan.seq_tokens, plan.policy, h100,
                     keep_timeline=False) for k in ("cudnn", "flash")]
    assert runs[0].iteration_s < runs[1].iteration_s


def test_memo_alpha_binding_in_words(tmp_path):
    r = run(["whatif", "--seq", "1M", "--tp", "8", "--tp-mode", "megatron", "--policy", "memo", "--no-plan",
             "--jobs", "1"])
    assert r.exit_code == 0, r.output
    line = r.output.splitlines()[r.output.splitlines().index(next(ln for ln in r.output.splitlines()
                                                                     if ln.startswith("best:"))) + 1]
    assert line.strip().startswith("alpha 0.") and ("host memory full --" in line or "hides under" in line), line


def test_jobs_output_identical_to_serial(tmp_path):
    """--jobs 2 prints what --jobs 1 prints, byte for byte, less the wall-clock seconds."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    outs = {}
    for jobs in ("1", "2"):
        for fmt in ((), ("--json",)):
            p = subprocess.run([sys.executable, "-m", "memo_sim.cli", "whatif", "--seq", "128K", "--simulate-top", "8",
                                "--policy", "memo", "--policy", "full_recompute", "--policy", "full_offload",
                                "--no-plan", "--jobs", jobs, *fmt], capture_output=True, text=True, timeout=240,
                               env=env, cwd=tmp_path)
            assert p.returncode == 0, p.stderr[-2000:]
            text = re.sub(r'"(elapsed_s|simulated_sim_wall_s)": [0-9.e+-]+', r'"\1": 0', p.stdout)
            outs[(jobs, fmt)] = re.sub(r"; [0-9.]+ s\n", "; T s\n", text)
    assert outs[("1", ())] == outs[("2", ())]
    assert outs[("1", ("--json",))] == outs[("2", ("--json",))]
    obj = json.loads(outs[("2", ("--json",))])
    assert obj["simulated_candidates"] == 8 + obj["tier2"]["for_verdicts"]  # the top 8 and the verdicts' sides


def test_progress_only_after_a_second_and_never_when_quiet(monkeypatch):
    import contextlib

    from memo_sim.cli import whatif as w

    opened = []

    @contextlib.contextmanager
    def fake_bar(label, total, quiet=False, force=None):
        steps = []
        opened.append((label, total, steps))
        yield lambda: steps.append(1)

    monkeypatch.setattr(w, "progress_bar", fake_bar)
    with w.delayed_progress("simulating", quiet=False) as p:  # a short run: no bar
        for k in range(3):
            p(k + 1, 3)
    assert opened == []
    monkeypatch.setattr(w, "PROGRESS_AFTER_S", 0.0)
    with w.delayed_progress("simulating", quiet=True) as p:
        p(1, 3)
    assert opened == []
    with w.delayed_progress("simulating", quiet=False) as p:
        for k in range(5):
            p(k + 1, 5)
    assert len(opened) == 1 and opened[0][:2] == ("simulating", 5) and len(opened[0][2]) == 5


def test_a_memo_alpha_that_offloads_no_layer_says_so():
    """A MEMO plan of 2 layers keeps both on the GPU (the rounding buffers' last 2): its alpha line says that
    nothing is offloaded rather than which limit fixed an alpha that moves no byte."""
    shape = ["--hidden", "4096", "--heads", "32", "--ffn", "16384", "--vocab", "32000", "--seq", "64K", "--gpus", "1",
             "--policy", "memo", "--no-plan"]
    two = run(["whatif", "--layers", "2", *shape])
    assert two.exit_code == 0 and "offloads nothing here: all 2 layers stay on the GPU" in two.output
    three = run(["whatif", "--layers", "3", *shape])
    assert three.exit_code == 0 and "offloads nothing" not in three.output and "alpha 0." in three.output


def test_heads_over_a_gqa_preset_name_the_kv_heads_that_have_no_flag():
    """'--heads 4' on Llama-3.1-8B (8 K/V heads) read '(top): heads (4) must be divisible by kv_heads (8)', an
    internal label and a field no flag sets (a user's review)."""
    r = run(["whatif", "--model", "llama-3.1-8b", "--heads", "4", "--layers", "2", "--hidden", "256", "--no-plan"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "(top)" not in r.output, r.output
    assert "--heads 4: llama-3.1-8b has 8 K/V heads" in r.output and "a multiple of 8" in r.output
    ok = run(["whatif", "--model", "llama-3.1-8b", "--heads", "16", "--layers", "2", "--hidden", "256", "--no-plan",
              "--gpus", "1", "--seq", "2K", "--jobs", "1"])
    assert ok.exit_code == 0, ok.output
    bad = run(["whatif", "--model", "qwen3-8b", "--heads", "8", "--kv-heads", "3", "--layers", "2", "--hidden", "256",
               "--no-plan"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1
    assert "--kv-heads 3: the K/V heads must divide" in bad.output
    assert "or --kv-heads" in r.output  # the K/V heads have a flag now, and so has the head size (a user's review)
    from memo_sim.cli.common import build_model

    m = build_model("qwen3-32b", 2, 256, 8, None, 1024, kv_heads=2, head_dim=32)
    assert (m.heads, m.n_kv_heads, m.qk_head_dim, m.q_dim) == (8, 2, 32, 256)
    ok = run(["whatif", "--model", "llama-3.1-8b", "--heads", "4", "--kv-heads", "2", "--layers", "2", "--hidden",
              "256", "--no-plan", "--gpus", "1", "--seq", "2K", "--jobs", "1"])
    assert ok.exit_code == 0, ok.output


def test_hidden_override_scales_the_ffn_unless_ffn_is_given():
    from memo_sim.cli.common import build_model
    from memo_sim.errors import MemoError

    m = build_model("gpt-7b", None, 2048, None, None, None)
    assert m.hidden == 2048 and m.ffn == 4 * 2048  # GPT's 4h, not the preset's 16384
    assert build_model("gpt-7b", None, 2048, None, 1000, None).ffn == 1000
    moe = build_model("mixtral-8x7b", None, 2048, None, None, None)
    assert moe.expert_width == 14336 // 2
    qwen = build_model("qwen2-moe-a2.7b", None, 64, None, None, None)  # the experts' widths follow --hidden
    assert qwen.expert_ffn == round(1408 * 64 / 2048) and qwen.shared_ffn == round(5632 * 64 / 2048)
    with pytest.raises(MemoError, match="--ffn 256: every layer of qwen2-moe-a2.7b is a MoE layer"):
        build_model("qwen2-moe-a2.7b", None, 64, None, 256, None)  # no dense FFN for --ffn to set


@pytest.mark.parametrize("flags, says", [
    (["--tp", "4", "--cp", "4"], "--tp 4 x --cp 4 = 16 GPUs, which does not divide the 8 GPUs of --gpus"),
    (["--tp", "2", "--ulysses", "8"], "--tp 2 x --ulysses 8 = 16 GPUs"),
    (["--cp", "8", "--seq", "1000"], "sequence length 1000 not divisible into 16 equal chunks (2 x cp 8); --seq 1008 "
                                     "(or 992) divides"),  # not SPPO's rule; the fix named (a review)
    (["--dp-mode", "fsdp", "--zero", "1"], "--zero 1: --dp-mode fsdp shards weights, gradients and optimizer states"),
    (["--framework", "torchtitan", "--zero", "1"], "--zero 1: torchtitan (its data-parallel flavours: fsdp)"),
    # a TP flavour another framework runs: that one named (a user's review)
    (["--framework", "megatron", "--tp-mode", "metp"],
     "--tp-mode metp: megatron runs TP as megatron; any runs metp (--framework any)"),
    (["--tp-mode", "async_tp"],
     "any runs TP as megatron, metp_ffn, metp; torchtitan and torchtitan@2024-12 run async_tp"),
    (["--top", "0"], "--top"),
])
def test_impossible_fixed_degrees_name_their_flags(flags, says, tmp_path):
    """Degrees that cannot run together are refused in one line naming them (exit 2), not as SPPO's 'TP+SP only'
    rule or a silent plan of another data-parallel flavour; nothing is written."""
    # a flag given twice takes its last value (--seq 1000 over 32K)
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "32K", *flags,
                                 "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert says in r.output and "sppo stages split" not in r.output
    assert len(r.output.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["whatif", "maxseq"])
def test_sppo_asked_for_a_moe_model_says_why_in_one_line(command, tmp_path):
    """--policy sppo alone on a mixture of experts: SPPO is not searched for one, and that is the answer (it
    read 'no factorisation of the GPU count matches the fixed degrees' with no degree fixed; a user's review,
    2026-11-27); one line, exit 2, nothing written."""
    extra = ["--seq", "32K", "--out", str(tmp_path)] if command == "whatif" else []
    r = CliRunner().invoke(cli, [command, "--model", "qwen3-30b-a3b", "--gpus", "16", "--policy", "sppo", *extra])
    assert r.exit_code == 2, r.output
    assert "not searched for mixture-of-experts models" in r.output and "factorisation" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_fit_fixes_name_only_policies_the_framework_offers():
    """Nothing fits: the 'it would fit with' variants never name a --policy the framework refuses (the default
    framework suggested recompute_norm_act, Megatron's, which the next what-if refused; a user's review,
    2026-11-27)."""
    from memo_sim.search.frameworks import get_framework

    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--gpus", "16", "--profile", "h100-sxm5-80gb",
                                 "--seq", "256K", "--policy", "store_all", "--no-plan", "--json"])
    assert r.exit_code == 3, r.output  # nothing fits
    fixes = json.loads(r.stdout)["not_fitting_fixes"]
    named = {m for f in fixes for m in re.findall(r"--policy (\S+)", f)}
    assert named and named <= set(get_framework("any").policies), (named, fixes)


def test_gpus_that_do_not_fill_whole_nodes_are_said_so():
    """12 GPUs on 8-GPU nodes: the answer (and maxseq's) says how memo places them, the JSON too;
    whole nodes and a single partial node say nothing (it was accepted without a word)."""
    args = ["--model", "gpt-7b", "--layers", "2", "--seq", "4K", "--profile", "h100-sxm5-80gb"]
    # one search, its text and --json
    r, js = text_and_json(["whatif", *args, "--gpus", "12", "--no-plan", "--simulate-top", "1", "--jobs", "1"])
    assert r.exit_code == 0, r.output
    words = "12 GPUs on nodes of 8: 2 nodes, the last with 4 GPUs"
    assert f"nodes: {words}" in r.output
    obj = json.loads(js.output)
    assert obj["partial_node"].startswith(words)
    # the node words depend on the profile and the GPU count alone: one policy and --tp 1 search less to say them
    for gpus in ("16", "4"):
        obj = json.loads(run(["whatif", *args, "--gpus", gpus, "--no-plan", "--simulate-top", "1", "--jobs", "1",
                              "--policy", "store_all", "--tp", "1", "--json"]).output)
        assert obj["partial_node"] is None
    r = run(["maxseq", "--model", "gpt-7b", "--layers", "2", "--gpus", "12", "--profile", "h100-sxm5-80gb",
             "--policy", "full_recompute", "--tp", "1", "--step", "64K"])
    assert f"nodes: {words}" in r.output, r.output


def test_sppo_runs_the_global_batch_or_says_why_not():
    """--global-batch 8 over dp 2: SPPO's rows run 4 sequences a replica as every other row does (they ran
    1, and the 'SPPO vs MEMO' line compared the two); without --dp its search (one batch per replica over
    its layouts) is not run and the answer says so; --global-batch 7 over --dp 2 is refused for SPPO too."""
    from memo_sim.model.config import PRESETS
    from memo_sim.profile.loader import load_profile
    from memo_sim.search.whatif import candidates_for
    import dataclasses

    m = dataclasses.replace(PRESETS["gpt-7b"], layers=4)
    h100 = load_profile("h100-sxm5-80gb")
    r = candidates_for(m, 65536, 8, h100, global_batch=8, dp=2, policies=("sppo", "memo"))
    sppo = [c for c in r.candidates if c.policy.name == "sppo"]
    assert sppo and all(c.batch == 4 for c in r.candidates)
    args = ["whatif", "--model", "gpt-7b", "--layers", "4", "--seq", "64K", "--gpus", "8", "--profile", "h100-sxm5-80gb",
            "--global-batch", "8", "--no-plan", "--jobs", "1", "--simulate-top", "1"]
    out = run(args).output
    assert "sppo not searched with --global-batch unless --dp is fixed" in out, out
    r = CliRunner().invoke(cli, args + ["--policy", "sppo"])
    assert r.exit_code == 2 and "also fix --dp" in r.output
    bad = [a if a != "8" or i != args.index("--global-batch") + 1 else "7" for i, a in enumerate(args)]
    r = CliRunner().invoke(cli, bad + ["--dp", "2", "--policy", "sppo"])
    assert r.exit_code == 2 and "--global-batch 7 does not split over --dp 2" in r.output, r.output


FP8_ARGS = ["whatif", "--model", "llama-3.1-70b", "--layers", "2", "--gpus", "8", "--seq", "8K", "--profile",
            "h100-sxm5-80gb", "--no-plan", "--jobs", "1", "--simulate-top", "1"]


@pytest.fixture(scope="module")
def fp8_answer():
    """The FP8 what-if's (table answer, --json answer), one search run once for the two tests below that read it."""
    return text_and_json(FP8_ARGS + ["--precision", "fp8-tensorwise"])


def test_fp8_mfu_names_its_peak_and_sweep_seq_refuses_a_repeated_length(tmp_path, fp8_answer):
    """An FP8 plan's MFU counts against the model dtype's peak: the answer says so (only the README did);
    sweep-seq --seqs 32K,64K,32K simulated 32K twice; now one line, exit 2, nothing written."""
    r = fp8_answer[0]
    # and against the GEMMs' own peak beside it (an audit, 2026-12-02: "72.5%" read as a bf16 MFU alone)
    head = r.output.splitlines()[0]
    m = re.search(r"MFU ([\d.]+)% \(of the bf16 peak; ([\d.]+)% of the fp8 peak\), ", head)
    assert r.exit_code == 0 and m, r.output
    assert abs(float(m.group(2)) - float(m.group(1)) / 2) <= 0.06  # the H100's fp8 peak is twice its bf16 one
    r = run(["whatif", "--model", "llama-3.1-70b", "--layers", "2", "--gpus", "8", "--seq", "8K", "--profile",
             "h100-sxm5-80gb", "--out", str(tmp_path), "--jobs", "1", "--simulate-top", "1"])
    assert r.exit_code == 0 and "peak)" not in r.output.splitlines()[0]
    out = tmp_path / "sweep"
    r = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "plan.json"), "--seqs", "8K,16K,8K", "--out", str(out)])
    assert r.exit_code == 2 and "--seqs: 8K is given twice" in r.output and not out.exists(), r.output


def test_a_plan_records_its_framework_and_sweep_seq_sweeps_what_it_offers(tmp_path):
    """plan.json did not say which framework the what-if searched for, so sweep-seq swept every policy
    memo has (MEMO, offloading) beside a torchtitan plan; the plan now records it (`Plan.framework`,
    "any" in older plans), sweep-seq sweeps the framework's policies, an unknown one is one line."""
    import json

    from memo_sim.plan import read_plan

    r = run(["whatif", "--layers", "2", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024",
             "--seq", "2K", "--gpus", "1", "--framework", "torchtitan", "--out", str(tmp_path), "--jobs", "1"])
    assert r.exit_code == 0, r.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["framework"] == "torchtitan" and read_plan(tmp_path / "plan.json").framework == "torchtitan"
    assert "searched for the framework torchtitan" in CliRunner().invoke(cli, ["check-plan",
                                                                         str(tmp_path / "plan.json")]).output
    r = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "plan.json"), "--seqs", "2K", "--out",
                                 str(tmp_path / "sw"), "--json"])
    assert r.exit_code == 0, r.output
    swept = {row["policy"]["policy"] for row in json.loads(r.stdout)}
    assert swept == {"store_all", "full_recompute", "op_sac"}, swept  # torchtitan's (memo has 10 policies)
    older = {k: v for k, v in plan.items() if k != "framework"}  # a plan written before the field: any
    (tmp_path / "old.json").write_text(json.dumps(older))
    assert read_plan(tmp_path / "old.json").framework == "any"
    (tmp_path / "bad.json").write_text(json.dumps({**plan, "framework": "no-such"}))
    r = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "bad.json"), "--seqs", "2K", "--out",
                                 str(tmp_path / "sw2")])
    assert r.exit_code == 2 and "plan.framework: 'no-such'" in r.output and "\n" not in r.output.strip(), r.output


def test_an_fp8_answer_says_what_the_same_search_gives_without_fp8(fp8_answer):
    """An FP8 what-if answered with FP8's plan alone, so what FP8 buys was a second command away: the answer (and
    --json's bf16_best) gives the same search's best with the GEMMs in the model's dtype, and the ratio."""
    args = FP8_ARGS
    fp8, fp8_json = fp8_answer
    line = [ln for ln in fp8.output.splitlines() if ln.startswith("without fp8-tensorwise GEMMs (all in bf16)")]
    assert fp8.exit_code == 0 and len(line) == 1, fp8.output
    bf16 = json.loads(run(args + ["--json"]).output)
    got = json.loads(fp8_json.output)  # args + --precision fp8-tensorwise --json
    assert got["bf16_searched"] and not bf16["bf16_searched"] and bf16["bf16_best"] is None
    assert got["bf16_best"]["layout"] == bf16["candidates"][0]["layout"]  # the bf16 what-if's own best
    ratio = got["candidates"][0]["simulated_tgs_tokens_per_gpu_s"] / got["bf16_best"]["simulated_tgs_tokens_per_gpu_s"]
    assert f"fp8-tensorwise gives {ratio:.2f}x its throughput" in line[0]


def test_an_fp8_answer_slower_than_bf16_says_so():
    """Small GEMMs (a MoE's experts, a small model): FP8's casts outweigh its faster GEMMs and the answer headlined the
    slower plan with 'gives 0.99x its throughput' (a review): it says the format is slower here and how to drop it;
    a ratio that prints as 1.00x is not called slower."""
    args = ["whatif", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128", "--layers", "2", "--seq",
            "256", "--gpus", "1", "--profile", "h100-sxm5-80gb", "--policy", "store_all", "--no-plan", "--jobs", "1",
            "--precision", "fp8-rowwise"]
    got = json.loads(run(args + ["--json"]).output)
    ratio = got["candidates"][0]["simulated_tgs_tokens_per_gpu_s"] / got["bf16_best"]["simulated_tgs_tokens_per_gpu_s"]
    line = [ln for ln in run(args).output.splitlines() if ln.startswith("without fp8-rowwise GEMMs")]
    assert len(line) == 1 and round(ratio, 2) < 1, (ratio, line)
    assert f"fp8-rowwise is SLOWER here: {ratio:.2f}x that plan's throughput" in line[0]
    assert "drop fp8-rowwise from --precision to train it" in line[0]


def test_rows_of_different_global_batches_say_so():
    """One sequence per replica (the default) gives a layout with more replicas more sequences per step, and the
    table ranked such rows side by side with no word of it (a user's review): a GBS column says each row's
    sequences per iteration where they differ, and the JSON gives ``global_batch``; a fixed --global-batch
    leaves every row the same, and no column."""
    base = ["whatif", "--model", "gpt-7b", "--layers", "4", "--gpus", "8", "--seq", "32K", "--no-plan", "--jobs", "1",
            "--simulate-top", "1"]
    r, js = text_and_json(base + ["--top", "40"])  # one search, its text and --json (--top shapes the text alone)
    assert r.exit_code == 0, r.output
    head = next(ln for ln in r.output.splitlines() if ln.startswith("#  "))
    assert " GBS " in head
    d = json.loads(js.output)
    rows = d["candidates"]
    assert all(c["global_batch"] == c["batch"] * c["layout_degrees"].get("dp", 1) for c in rows)
    assert len({c["global_batch"] for c in rows}) > 1
    fixed = CliRunner().invoke(cli, base + ["--global-batch", "8"])
    assert fixed.exit_code == 0 and " GBS " not in next(ln for ln in fixed.output.splitlines() if ln.startswith("#  "))


def test_an_answer_memo_exec_refuses_says_so():
    """GPT-OSS's answer was a MEMO plan memo-exec refused (attention sinks, which it runs now), and no framework
    runs MEMO: the what-if gave no word of it (a user's review). An answer memo-exec refuses (DeepSeek-V2-Lite's
    latent attention) says so, with memo-exec's own line (`memo_sim.plan.executor_scope`), and where to go; a plan
    memo-exec runs (GPT-OSS's now, its clamped SwiGLU too, a dense one) has no such line."""
    # --pp 1: each answer the full search's (tp1-dp8-z3 store_all for DeepSeek-V2-Lite, with and without megatron,
    # and for GPT-OSS-20B, 2026-12-02) in a third of the time; what is refused is the answer's model
    base = ["whatif", "--gpus", "8", "--seq", "8K", "--no-plan", "--jobs", "1", "--simulate-top", "1",
            "--profile", "h100-sxm5-80gb", "--pp", "1"]
    # (memo-exec runs latent attention on one TP rank since 2026-12-03: a TP 2 plan is what it refuses)
    mla, mla_json = text_and_json(base + ["--model", "deepseek-v2-lite", "--tp", "2"])  # one search, text and --json
    assert mla.exit_code == 0, mla.output
    assert "memo-exec refuses this plan (plan model deepseek-v2-lite: kv_lora_rank = 512 (latent attention) with tp 2" \
        in mla.output
    # under a framework too, pointing at its exporter (a review: a framework's plan said nothing of it)
    meg = CliRunner().invoke(cli, base + ["--model", "deepseek-v2-lite", "--framework", "megatron", "--tp", "2"])
    assert meg.exit_code == 0, meg.output
    assert "memo-exec refuses this plan (plan model deepseek-v2-lite: kv_lora_rank = 512 (latent attention) with tp 2" \
        in meg.output
    assert "`memo-sim export --to megatron` of its plan file writes it for megatron (the version" in meg.output
    d = json.loads(mla_json.output)
    assert "latent attention" in d["executor_refuses"] and "plan with tp, cp and ulysses 1" in d["executor_refuses"]
    # the one-rank plan memo-exec runs: no such line
    assert json.loads(CliRunner().invoke(cli, base + ["--model", "deepseek-v2-lite", "--layers", "2", "--tp", "1",
                                                      "--json"]).output)["executor_refuses"] is None
    oss = json.loads(CliRunner().invoke(cli, base + ["--model", "gpt-oss-20b", "--json"]).output)
    assert oss["executor_refuses"] is None
    dense = json.loads(CliRunner().invoke(cli, base + ["--model", "llama-3.1-8b", "--layers", "2", "--json"]).output)
    assert dense["executor_refuses"] is None


def test_fewer_layers_keep_the_share_of_sliding_and_dense_layers():
    """`--layers 2` on GPT-OSS-20B (12 of its 24 layers slide) stopped with 'sliding_layers (12) exceeds the 2
    layers' (met planning a small test run): the layer-count fields keep their share of the layers."""
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-oss-20b", "--layers", "2", "--gpus", "8", "--seq", "8K",
                                 "--no-plan", "--jobs", "1", "--simulate-top", "1", "--json"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["model"]
    assert (m["layers"], m["sliding_layers"]) == (2, 1)
    from memo_sim.model.config import get_model, with_overrides

    v3 = with_overrides(get_model("deepseek-v3"), layers=30)  # 3 of 61 dense: 1 of 30, the rest MoE
    assert (v3.dense_layers, v3.moe_layers) == (1, 29)
    # at least one of each kind the model has (a review: --layers 4 left DeepSeek-V3 no dense layer, unsaid)
    assert (with_overrides(get_model("deepseek-v3"), layers=4).dense_layers,
            with_overrides(get_model("deepseek-v3"), layers=1).dense_layers) == (1, 0)


def test_ffn_on_a_model_whose_every_layer_is_moe_is_refused_in_one_line():
    """A review (2026-11-30): `--ffn 1536` on Qwen3-30B-A3B (every layer MoE, experts 768 wide) left the model as it
    was and said nothing. A Mixtral-style model's experts take their width from the FFN, and a model with dense
    layers has them for --ffn to set: both stay accepted."""
    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--ffn", "1536", "--layers", "2", "--gpus", "8",
                                 "--seq", "8K", "--no-plan"])
    assert r.exit_code == 2 and "--ffn 1536: every layer of qwen3-30b-a3b is a MoE layer" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    from memo_sim.model.config import get_model, with_overrides

    assert with_overrides(get_model("mixtral-8x7b"), ffn=7168).expert_width == 7168
    assert with_overrides(get_model("deepseek-v3"), layers=4, ffn=9216).ffn == 9216


def test_a_capacity_factor_below_one_says_its_dropped_copies_count_in_mfu():
    """A review (2026-11-30): MFU rose from 40.7% to 49.3% as --moe-balance capacity:F fell from dropless to 0.25 on
    one layout, with no word that the dropped copies' expert work is counted but not done."""
    args = ["whatif", "--model", "qwen3-30b-a3b", "--layers", "2", "--gpus", "8", "--seq", "8K", "--ep", "8",
            "--profile", "h100-sxm5-80gb", "--no-plan", "--jobs", "1", "--simulate-top", "1", "--moe-balance"]
    low, high = (CliRunner().invoke(cli, args + [b]) for b in ("capacity:0.5", "capacity:1.25"))
    assert low.exit_code == 0 and high.exit_code == 0, (low.output, high.output)
    assert "at least 50% of the routed copies are dropped and not computed, while MFU counts" in low.output, low.output
    assert "dropped and not computed" not in high.output


def test_a_toy_whose_vocabulary_dominates_writes_its_plan_and_says_why_mfu_passes_100(tmp_path):
    """A 2-layer Qwen3-30B-A3B toy (h=256, its 151,936-word vocabulary most of the parameters) on a profile calibrated
    on this VM with one thread (tests/data/profiles/cpu-quick-vm-1thread.yaml: `memo-exec calibrate --device cpu
    --quick --threads 1`, 2026-11-28) stopped with 'predicted: mfu: Input should be less than or equal to 1' (a
    user's review): MISSION's model FLOPs count 6·s over every parameter, the input embedding's lookup too. The plan
    is written, and the answer says why MFU reads above 100%."""
    r = CliRunner().invoke(cli, ["whatif", "--profile", "tests/data/profiles/cpu-quick-vm-1thread.yaml", "--model",
                                 "qwen3-30b-a3b", "--layers", "2", "--hidden", "256", "--seq", "1K", "--gpus", "2",
                                 "--dtype", "fp32", "--jobs", "1", "--simulate-top", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "MFU above 100%: the model FLOPs" in r.output and "input embedding" in r.output
    assert (tmp_path / "plan.json").exists()


def test_the_answer_line_names_host_memory_and_the_step_and_a_thin_margin():
    """The answer line gave the GPU peak alone, while the plan pinned its node's whole host memory and trained twice
    the runner-up's sequences a step; a best plan 98% full was not called thin (a user's review). The line now gives
    the pinned host bytes and the sequences a step, and a margin line names a GPU peak within 5% of the memory."""
    from dataclasses import replace

    from memo_sim.model.config import get_model
    from memo_sim.profile import load_profile
    from memo_sim.report.whatif_answer import WhatIfView, margin_line, verdict
    from memo_sim.search.whatif import candidates_for

    prof = load_profile("a800-80gb")
    c = next(c for c in candidates_for(get_model("gpt-7b"), 1 << 20, 8, prof, policies=("memo",)).candidates
             if c.status == "OK" and c.memory.host_bytes_per_node > 0)
    view = WhatIfView(model=c.model, seq=c.seq, gpus=8, profile=prof, result=None, shown=[c], best=c, batch_words="",
                      elapsed_s=0.0)
    line = verdict(view)
    assert ", pinned host " in line and " per node, " in line and f"{c.global_batch} sequence" in line
    edge = replace(c, memory=replace(c.memory, peak_gpu_bytes=0.99 * c.memory.gpu_capacity_bytes), simulated=None)
    words = margin_line(replace(view, best=edge))
    assert words.startswith("on the edge: the predicted GPU peak is 99.0% of the usable memory; a peak 1.0% higher")
    roomy = replace(c, memory=replace(c.memory, peak_gpu_bytes=0.9 * c.memory.gpu_capacity_bytes), simulated=None)
    assert margin_line(replace(view, best=roomy)) == ""
    # a caching-allocator plan's margin is set beside the error memo-exec measured on its reserved peaks (a review)
    assert "1.3-17.7%" not in words  # MEMO's static plan: not that error
    fr = next(x for x in candidates_for(get_model("gpt-7b"), 1 << 15, 8, prof, policies=("full_recompute",)).candidates
              if x.status == "OK")
    fr_edge = replace(fr, memory=replace(fr.memory, peak_gpu_bytes=0.99 * fr.memory.gpu_capacity_bytes), simulated=None)
    assert "reserved peak 1.3-17.7% above the replay's" in margin_line(replace(view, best=fr_edge))


def test_a_frameworks_gap_to_memos_best_is_split_into_mechanisms_and_layout_and_policy():
    """`--framework torchtitan` said memo's best ran 1.70x faster and nothing of why (a user's review): memo's best is
    simulated with the framework's mechanisms too, and the line splits the ratio into what memo's layout and policy
    give (that plan against the framework's best) and what its own mechanisms give (against itself); the two
    multiply to the ratio shown. Where those mechanisms do not hold memo's plan, the line says where it fails."""
    # --zero 3: since the SMs ZeRO 3's hidden gathers hold are priced (2026-12-03) memo's own best is ZeRO 2, which
    # megatron does not offer (a gap of layout and mechanisms together, the other test's case)
    base = ["whatif", "--model", "gpt-7b", "--layers", "4", "--gpus", "8", "--seq", "32K", "--no-plan", "--jobs", "1",
            "--simulate-top", "1", "--profile", "h100-sxm5-80gb", "--framework", "megatron", "--zero", "3"]
    r, js = text_and_json(base)  # one search, its text and --json
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if "the gap split: memo's best with megatron's mechanisms" in ln)
    ratio = float(re.search(r"\(([0-9.]+)x\)$", next(ln for ln in r.output.splitlines()
                                                     if ln.startswith("megatron's best:"))).group(1))
    a, b = (float(x) for x in re.findall(r"([0-9.]+)x ", line + " ")[:2])
    assert a * b == pytest.approx(ratio, abs=0.02)
    d = json.loads(js.output)
    on = d["memo_best_on_framework"]
    assert on["status"] == "OK" and "vocab_parallel" in on["layout_label"]
    # each mechanism the framework runs otherwise is named (a review: "1.57x from memo's own mechanisms" named none)
    assert "cross_entropy chunked -> vocab_parallel" in on["mechanisms"]
    assert "(memo's -> megatron's: " in line and "cross_entropy chunked -> vocab_parallel" in line


def test_the_gap_split_names_mechanisms_where_memos_plan_does_not_fit_and_a_gap_of_layout_alone():
    """A review: where the framework's mechanisms do not hold memo's plan the line said 'memo's mechanisms are what
    makes its plan fit' without naming them, and where memo's best already runs the framework's mechanisms (nothing
    to re-simulate) no split line came at all though memo's side was 2.34x."""
    from types import SimpleNamespace as NS

    from memo_sim.layout.parallel import Layout
    from memo_sim.policy import get_policy
    from memo_sim.report.whatif_answer import gap_line

    best = NS(tgs=100.0, model=NS(mtp_layers=0))
    memo = NS(tgs=234.0, model=NS(mtp_layers=0), layout=Layout(dp=8, zero=3), policy=get_policy("full_recompute"))
    failed = {"status": "OOM", "failure": {"op": "classifier"}, "layout_label": "tp1-dp8-z3-x",
              "mechanisms": ["cross_entropy chunked -> torch_fused"]}
    line = gap_line("torchtitan", best, memo, failed)
    assert "does not fit (OOM at classifier)" in line and "(memo's -> torchtitan's: cross_entropy chunked -> " \
        "torch_fused) are what makes its plan fit" in line, line
    same = gap_line("torchtitan", best, memo, {"same_mechanisms": True, "layout_label": "tp1-dp8-z3"})
    assert same.startswith("the gap split: memo's best runs torchtitan's mechanisms as it is, so the whole 2.34x is "
                           "its layout and policy (tp1-dp8-z3 full_recompute"), same
    assert gap_line("torchtitan", best, NS(**{**vars(memo), "tgs": 90.0}),
                    {"same_mechanisms": True}) == ""  # memo's side no faster: nothing to split
    assert gap_line("torchtitan", best, memo, None) == ""  # not simulated (an error): no line


def test_a_framework_faster_than_memos_own_stack_is_said_so():
    """Megatron's best at 396 tokens/GPU/s beside 'memo's best' at 337 (0.85x) read as if memo's plan were the one to
    train (a review): the line says memo's own stack is the slower one there."""
    from types import SimpleNamespace as NS

    from memo_sim.layout.parallel import Layout
    from memo_sim.policy import get_policy
    from memo_sim.report.whatif_answer import framework_line

    def cand(tgs):
        return NS(tgs=tgs, layout=Layout(tp=8, sp=True, cp=2), policy=get_policy("full_recompute"),
                  model=NS(recipe=NS(name="megatron", summary=""), mtp_layers=0))

    line = framework_line("megatron", cand(396.0), cand(337.0))
    assert "(0.85x); memo's own stack (its executor's kernels and mechanisms) is the slower one here: train " \
           "megatron's plan" in line, line
    assert "slower" not in framework_line("megatron", cand(396.0), cand(500.0))


def test_rows_memory_numbers_come_from_their_own_tier():
    """A simulated row's host/node cell showed the analytic pinned host memory (295.48 GiB) beside the answer's
    simulated 281.63 GiB, and the JSON rows' unprefixed peak_gpu_bytes / host_bytes_per_node were analytic while
    the row's "peak" and the Python Candidate's peak_gpu_bytes were simulated (a review): each row's numbers are
    its own tier's, the analytic ones under analytic_* keys."""
    args = ["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "32K", "--pp", "4", "--batch", "8", "--policy",
            "memo", "--no-plan", "--jobs", "1"]
    text, js = text_and_json(args)  # one search, its text and --json
    rows = json.loads(js.output)["candidates"]
    sim = [r for r in rows if r["tier"] == "simulated"]
    assert sim and any(r["analytic_host_bytes_per_node"] != r["simulated_peak_host_bytes_per_node"] for r in sim)
    for r in rows:
        assert r["peak_gpu_bytes"] == r["peak"]["bytes"]
        want = r["simulated_peak_host_bytes_per_node"] if r["tier"] == "simulated" else r[
            "analytic_host_bytes_per_node"]
        assert r["host_bytes_per_node"] == want
    from memo_sim.units import fmt_bytes

    text = text.output
    first = next(ln for ln in text.splitlines() if ln.startswith(" 1  "))
    assert fmt_bytes(sim[0]["simulated_peak_host_bytes_per_node"]) in first
    assert fmt_bytes(sim[0]["analytic_host_bytes_per_node"]) not in first
    # the schedule column's "interleaved_1f1b 8x1" is said in the legend (a review read "2x2" as unexplained)
    assert "schedule: its name, then micro-batches x sequences per micro-batch" in text


def test_memo_best_beside_a_framework_is_the_plain_what_ifs_best():
    """Beside --framework, memo's best was searched with one simulated plan (the analytic tier's first) and named a
    plan the plain what-if ranks below its answer (DeepSeek-V3 on 256 B200s: 1,972 against 2,044 tokens/GPU/s, a
    review): it is searched as the what-if searches. Qwen3-30B-A3B on 16 H100s at 32K: the analytic tier's first
    simulates to 6,780 tokens/GPU/s, the what-if's answer (EP 2) to 6,889."""
    # --pp 1: the case whole without the pipelines (2026-12-02: the answer tp1-ep2-dp16-z3 memo at 6,906, the
    # analytic tier's first tp1-dp16-z3 memo at 6,778, 24 plans simulated, as in the full search) in 2/5 of the time
    base = ["whatif", "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq", "32K", "--profile", "h100-sxm5-80gb",
            "--precision", "megatron", "--no-plan", "--jobs", "1", "--json", "--pp", "1"]
    plain = json.loads(run(base).output)["candidates"][0]
    beside = json.loads(run(base + ["--framework", "megatron"]).output)["memo_best"]
    assert (beside["layout"], beside["policy"]) == (plain["layout"], plain["policy"])
    assert beside["simulated_tgs_tokens_per_gpu_s"] == plain["simulated_tgs_tokens_per_gpu_s"]


def test_bad_flag_values_name_the_fix():
    """`--framework megatorn` was listed the eleven choices without the near one (`--profile b200` gets one), and
    `--global-batch 4M` was told only 'not a valid integer range' (a review)."""
    r = CliRunner().invoke(cli, ["whatif", "--framework", "megatorn", "--no-plan"])
    assert r.exit_code == 2 and "did you mean 'megatron'" in r.output and r.output.count("\n") == 1, r.output
    r = CliRunner().invoke(cli, ["whatif", "--global-batch", "4M", "--no-plan"])
    assert r.exit_code == 2 and "--global-batch counts sequences, not tokens" in r.output, r.output
    r = CliRunner().invoke(cli, ["whatif", "--framework", "xyz", "--no-plan"])
    assert r.exit_code == 2 and "did you mean" not in r.output


def test_a_programs_bad_request_is_one_memo_error_naming_the_field():
    """memo_sim.api's WhatifRequest(seq=0) raised 'math domain error' from the SPPO grid, seq="128K" a TypeError
    and a profile's name an AttributeError (a review): each is a MemoError naming the field and the fix; a profile
    name and a sequence as the command writes it are read as the command reads them."""
    import pytest

    from memo_sim.api import WhatifRequest, get_model
    from memo_sim.errors import MemoError

    m = get_model("gpt-7b")
    for over, field in ((dict(seq=0), "seq"), (dict(seq=-4096), "seq"), (dict(gpus=0), "gpus"), (dict(tp=0), "tp"),
                        (dict(zero=4), "zero"), (dict(alpha=1.5), "alpha"), (dict(profile=3), "profile"),
                        (dict(model=3), "model")):
        with pytest.raises(MemoError, match=rf"^WhatifRequest\.{field} = "):
            WhatifRequest(**{**dict(model=m, seq=4096, gpus=8, profile="a800-80gb"), **over})
    req = WhatifRequest(model=m, seq="128K", gpus=8, profile="a800-80gb")
    assert req.seq == 131072 and req.profile.name == "a800-80gb"


def test_a_truncated_json_file_is_read_in_one_clear_line(tmp_path):
    """'not valid JSON (Unterminated string starting at at line 23)' (a review): the decoder's words, then where."""
    from memo_sim.errors import MemoError
    from memo_sim.fileio import read_json

    f = tmp_path / "plan.json"
    f.write_text('{"model": {"name": "x')
    import pytest

    with pytest.raises(MemoError) as e:
        read_json(f)
    assert "not valid JSON (Unterminated string starting at: line 1, column 20); fix the file" in str(e.value), \
        str(e.value)


def test_small_answers_a_review_found_misleading(tmp_path):
    """`--format csv --json` quietly printed JSON; `--seqs 64K,,1M` swept two lengths; maxseq of a model whose
    states alone overflow every layout said a smaller --step looks below 4K; a nothing-fits answer's advice told
    to 'add --policy' policies the framework does not offer (a review)."""
    from memo_sim.search.whatif import not_searched

    r = CliRunner().invoke(cli, ["whatif", "--format", "csv", "--json", "--no-plan"])
    assert r.exit_code == 2 and "--json and --format csv ask for two formats" in r.output, r.output
    toy = ["--layers", "2", "--hidden", "256", "--heads", "4", "--ffn", "512", "--vocab", "512"]
    r = CliRunner().invoke(cli, ["whatif", *toy, "--seq", "2K", "--gpus", "1", "--policy", "store_all", "--jobs", "1",
                                 "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "p" / "plan.json"), "--seqs", "64K,,1M", "--out",
                                 str(tmp_path / "s")])
    assert r.exit_code == 2 and "an empty item between commas" in r.output, r.output
    r = CliRunner().invoke(cli, ["maxseq", "--model", "gpt-175b", "--gpus", "1", "--step", "4K"])
    assert r.exit_code == 3 and "model states alone exceed the GPU memory" in r.output, r.output
    assert "smaller --step" not in r.output and "1 GPUs" not in r.output
    advice = not_searched(8, ("memo",), "any", {})
    assert not any("selective_recompute" in a and "add --policy" in a for a in advice), advice
    assert any("selective_recompute" in a and "any does not offer" in a for a in advice), advice


def test_a_caching_allocator_answer_says_the_reserved_peak_pytorch_reports():
    """A full-recompute plan at 512K read 'peak GPU 48.91 GiB ... 63% full' while the caching allocator's replay
    of the same iteration reserves 57.70 GiB, what torch.cuda.max_memory_reserved() shows and what decides the
    fit (a review): the answer names that reserved peak beside the simulator's own."""
    from memo_sim.units import fmt_bytes

    args = ["whatif", "--model", "llama-3.1-8b", "--profile", "h100-sxm5-80gb", "--gpus", "8", "--seq", "512K",
            "--policy", "full_recompute", "--tp", "1", "--ulysses", "8", "--zero", "3", "--jobs", "1", "--no-plan"]
    best = json.loads(run(args + ["--json"]).output)["candidates"][0]
    reserved = best["simulated_allocator"]["peak_reserved_bytes"]
    assert reserved > best["peak_gpu_bytes"]
    answer = run(args).output.splitlines()[0]
    assert f"(PyTorch's reserved peak {fmt_bytes(reserved)} (simulated, caching allocator replay)," in answer, answer


def test_nothing_fits_on_reserved_memory_names_expandable_segments():
    """Full recompute at 1.375M on 8 H100s misses by 0.2 GiB of the caching allocator's reserved memory, and the
    advice named other policies and more GPUs but not PyTorch's one-flag fix, which maxseq showed fits (a
    review): a caching-allocator plan's fixes try expandable segments. (1.3125M since ZeRO 3's whole gradients of a
    layer and of the head before their reduce-scatter are counted: at 1.375M nothing is that close; 1360K since full
    recompute keeps one rebuilt lse, not every layer's, and the replay requests the loss's tensors apart, 2026-12-01:
    1.3125M fits; 1344K since the H100's memory is the 79.18 GiB PyTorch reports, not 80 GiB: 1328K fits.)"""
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--profile", "h100-sxm5-80gb", "--gpus", "8",
                                 "--seq", "1344K", "--policy", "full_recompute", "--jobs", "1", "--no-plan"])
    assert r.exit_code == 3, r.output
    fixes = next(ln for ln in r.output.splitlines() if "would fit with:" in ln)
    assert "--alloc-conf expandable_segments:True (" in fixes, fixes


def test_a_vpp_that_leaves_no_pipeline_says_so():
    """A review: --vpp 2 beside --tp 8 on 8 GPUs answered "no factorisation of the GPU count matches the fixed
    degrees", naming neither --vpp nor the pipeline it needs."""
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--vpp", "2",
                                 "--tp", "8", "--no-plan"])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "--vpp 2 needs a pipeline of at least 2 stages beside --tp 8 on 8 GPUs" in r.output
