"""[fidelity] --framework restricts the search to what a framework offers; maxseq finds the
longest length that fits (the same answer as a linear scan) and says what binds next."""

import json

import pytest
from click.testing import CliRunner

from memo_sim.api import get_model, load_profile
from memo_sim.cli import cli
from memo_sim.errors import MemoError
from memo_sim.search.maxseq import _fits, _ranked, _replay_oom, max_seq
from memo_sim.search.whatif import candidates_for

K = 1024
A800 = load_profile("a800-80gb")
M7 = get_model("gpt-7b")


def test_megatron_offers_tp_sp_cp_dp_with_distributed_optimizer_or_megatron_fsdp_and_no_token_wise_offload():
    res = candidates_for(M7, 256 * K, 16, A800, framework="megatron")
    assert res.candidates
    for c in res.candidates:
        lay = c.layout
        assert lay.zero in (0, 1, 3) and lay.dp_mode == "zero"  # TP with or without SP: dense models run both
        # its recomputes and its fine-grained offload of the attention's tensors (a dense model), not MEMO's
        assert c.policy.name in ("store_all", "full_recompute", "selective_recompute", "recompute_mlp", "offload_attn")
        assert lay.ulysses == 1 or lay.ulysses_kv == "whole"  # TransformerEngine's all-to-all CP: whole K/V heads
    assert {c.layout.zero for c in res.candidates} >= {1, 3}  # the distributed optimizer and Megatron-FSDP
    assert any(c.layout.ulysses > 1 for c in res.candidates)  # --cp-comm-type a2a / a2a+p2p
    assert any("megatron does not offer" in why for _, why in res.rejected_layouts)
    old = candidates_for(M7, 256 * K, 16, A800, framework="megatron@2023")  # before Megatron-FSDP and all-to-all CP
    assert old.candidates and all(c.layout.zero <= 1 and c.layout.ulysses == 1 for c in old.candidates)
    # a GQA model's K/V heads split whole over TP x Ulysses, never repeated (TransformerEngine asserts it)
    gqa = candidates_for(get_model("llama-3.1-8b"), 256 * K, 16, A800, framework="megatron")
    assert all(8 % (c.layout.tp * c.layout.ulysses) == 0 for c in gqa.candidates if c.layout.ulysses > 1)
    assert any(c.layout.ulysses > 1 for c in gqa.candidates)


def test_deepspeed_offers_ulysses_with_zero_and_no_tp():
    res = candidates_for(M7, 256 * K, 8, A800, framework="deepspeed")
    assert res.candidates and all(c.layout.tp == 1 and c.layout.cp == 1 for c in res.candidates)
    assert any(c.layout.ulysses > 1 and c.layout.zero == 3 for c in res.candidates)


def test_policy_the_framework_lacks_is_a_clear_error():
    with pytest.raises(MemoError, match="megatron does not offer"):
        candidates_for(M7, 256 * K, 8, A800, framework="megatron", policies=("memo",))
    r = CliRunner().invoke(cli, ["whatif", "--framework", "megatron", "--policy", "memo", "--no-plan"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "error:" in r.output


def test_whatif_compares_the_framework_with_memo(tmp_path):
    # --pp 1: the full search's two bests (tp1-uly8-z3 full_recompute; memo's tp1-uly8-z3 memo) have no pipeline
    r = CliRunner().invoke(cli, ["whatif", "--seq", "512K", "--framework", "megatron", "--simulate-top", "1",
                                 "--pp", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "megatron's best:" in r.output and "memo's best:" in r.output
    r = CliRunner().invoke(cli, ["whatif", "--seq", "512K", "--framework", "megatron", "--simulate-top", "1",
                                 "--pp", "1", "--json", "--no-plan"])
    obj = json.loads(r.stdout)
    assert obj["framework"] == "megatron" and obj["memo_best"]["policy"] == "memo"


@pytest.mark.parametrize("policy", ["full_recompute", "memo"])
def test_maxseq_equals_a_linear_scan(policy):
    step = 256 * K
    # single-stage layouts (pp 1): the same answers and binding lines as the whole search's, at a fifth of the cost
    ans = max_seq(M7, 8, A800, policy, step=step, simulate=False, fixed={"pp": 1})
    k = 1
    while _fits(_ranked(M7, k * step, 8, A800, policy, "any", fixed={"pp": 1})):
        k += 1
    assert ans.max_seq == (k - 1) * step and ans.next_seq == k * step
    # a memory plan's replay names the fragmentation of what memo-exec leaves to the caching allocator (h1 review)
    assert ans.binding.startswith(("GPU memory", "pinned host memory", "reserved memory (caching allocator",
                                   "reserved memory (caching-allocator fragmentation"))
    if ans.binding.startswith("GPU memory") and "largest:" in ans.binding:  # the what-if's names for the terms
        named = ans.binding.split("largest: ", 1)[1]
        assert named.startswith(("model states", "kept activations", "attention lse", "buffers", "transients",
                                  "classifier")), named


def test_maxseq_command(tmp_path):
    r = CliRunner().invoke(cli, ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--policy", "memo", "--json",
                                 "--pp", "1"])  # the full search's answer (2.625M, tp8+metp) has no pipeline
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.stdout)["answers"]
    assert a["max_seq_tokens"] >= 1024 * K and 0 < a["mfu"] < 1 and a["binding"]
    r = CliRunner().invoke(cli, ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--step", "0"])
    assert r.exit_code == 2


def test_maxseq_with_a_framework_on_a_dense_model_tries_the_policies_that_price_it():
    """Megatron's policies include MoE-only ones (recompute_norm_act, recompute_moe): maxseq on a dense
    model tried them and stopped with 'rebuilds MoE tensors' though no --policy was given (a user's review)."""
    r = CliRunner().invoke(cli, ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--framework", "megatron",
                                 "--step", "64K", "--json", "--pp", "1"])  # each policy's answer as without --pp 1
    assert r.exit_code == 0, r.output
    pols = {a["policy"] for a in json.loads(r.stdout)["answers"]}
    assert pols and not pols & {"recompute_norm_act", "recompute_moe"}, pols


def test_maxseq_with_the_layout_fixed_answers_for_that_layout_and_a_linear_scan():
    """--tp/--ulysses/--zero fix the layout (a published run's): every length probed is priced for
    that layout only, the answer is a linear scan's, and fixing a degree only ever shortens it."""
    step = 64 * K
    fixed = dict(tp=8, sp=True, tp_mode="megatron", optimizer_offload=False)
    ans = max_seq(M7, 8, A800, "full_recompute", step=step, simulate=False, fixed=fixed)
    k = 1
    while _fits(_ranked(M7, k * step, 8, A800, "full_recompute", "any", fixed=fixed)):
        k += 1
    assert ans.max_seq == (k - 1) * step and "tp8+sp" in ans.binding
    free = max_seq(M7, 8, A800, "full_recompute", step=step, simulate=False)
    assert free.max_seq >= ans.max_seq
    for c in _ranked(M7, ans.max_seq, 8, A800, "full_recompute", "any", fixed=fixed):
        assert (c.layout.tp, c.layout.sp, c.layout.optimizer_offload) == (8, True, False)
    with pytest.raises(MemoError, match="argument of its own"):
        max_seq(M7, 8, A800, "full_recompute", step=step, fixed={"framework": "megatron"})


def test_maxseq_command_with_fixed_degrees():
    args = ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--policy", "full_recompute", "--step", "64K"]
    r = CliRunner().invoke(cli, args + ["--tp", "8", "--no-optimizer-offload", "--json"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["fixed"] == {"tp": 8, "optimizer_offload": False, "tp_mode": "megatron"}
    (a,) = obj["answers"]
    assert a["best"]["layout"].startswith("tp8") and a["max_seq_tokens"]
    # the best plan reads as a what-if row reads: its tier and its one peak (a review: maxseq's JSON had no peak)
    assert a["best"]["tier"] == "simulated" and a["best"]["peak"]["bytes"] == a["best"]["peak_gpu_bytes"]
    r = CliRunner().invoke(cli, args + ["--tp", "8"])
    assert r.exit_code == 0 and "fixed: tp 8, tp-mode megatron" in r.output
    r = CliRunner().invoke(cli, args + ["--zero", "5"])
    assert r.exit_code == 2 and "--zero" in r.output
    for bad, words in ((["--tp", "3"], "--tp 3 does not divide the 8 GPUs"), (["--framework", "deepspeed", "--tp", "2"], "tensor"),
                       (["--framework", "deepspeed", "--policy", "memo"], "deepspeed does not offer")):
        r = CliRunner().invoke(cli, args + bad)  # no layout at all: refused in one line, not answered "none"
        assert r.exit_code == 2 and r.output.count("\n") == 1 and words in r.output, r.output


def test_maxseq_fixes_a_mixture_of_experts_layout_and_its_balance():
    """--ep, --etp, --moe-dispatcher and --moe-balance as in the what-if: the answer is for that expert
    layout and router (maxseq had none of them); a dense model with --ep is refused in one line."""
    args = ["maxseq", "--model", "qwen3-30b-a3b", "--layers", "2", "--gpus", "16", "--profile", "h100-sxm5-80gb",
            "--policy", "full_recompute", "--step", "256K"]
    r = CliRunner().invoke(cli, args + ["--ep", "8", "--moe-balance", "capacity:1.25", "--json"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["fixed"] == {"ep": 8, "moe_balance": "capacity:1.25", "tp_mode": "all"}
    (a,) = obj["answers"]
    assert "-ep8-" in a["best"]["layout"] and a["best"]["layout"].endswith("capacity1.25") and a["max_seq_tokens"]
    r = CliRunner().invoke(cli, args + ["--ep", "8", "--moe-dispatcher", "deepep"])
    assert r.exit_code == 0 and "fixed: ep 8, moe-dispatcher deepep" in r.output, r.output
    r = CliRunner().invoke(cli, ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--policy", "full_recompute",
                                 "--ep", "2"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "has none (dense)" in r.output, r.output


def test_a_simulated_failure_ranks_after_every_fit_without_a_throughput():
    """The event simulator can fail a candidate the analytic tier passed (e.g. the caching
    allocator's fragmentation): it has no throughput and must sort after the fits, not crash."""
    res = candidates_for(M7, 256 * K, 8, A800, policies=("full_recompute",))
    first = res.candidates[0]
    first.simulated = {"status": "OOM", "iteration_s": None, "mfu": None, "tgs_tokens_per_gpu_s": None}
    ranked = sorted(res.candidates, key=lambda c: c.sort_key())
    ok = [c for c in ranked if c.status == "OK"]
    assert ranked[:len(ok)] == ok and first in ranked[len(ok):]


def test_maxseq_of_a_caching_allocator_baseline_is_decided_by_reserved_memory():
    """[allocator] Full recompute as the MEMO paper's baselines ran it (memo-paper: PyTorch's caching
    allocator, no expandable segments, Megatron-LM's loss over every token): the longest sequence on the caching
    allocator is shorter than on a static memory plan, and what stops it is reserved memory: at the first
    failing length a candidate that fits on paper runs out of reserved memory in the allocator's replay."""
    step = 32 * K
    cache = max_seq(M7, 8, A800, "full_recompute", step=step, framework="memo-paper", simulate=False)
    plan = max_seq(M7, 8, A800, "full_recompute", step=step, framework="memo-paper", simulate=False,
                   allocator="plan")
    assert (cache.allocator, plan.allocator) == ("caching", "plan")
    # the plan's longest layouts split the layer (tp, cp): the replay puts their layer transients in the plan's arena
    # and the rest through the fragmenting caching allocator (memo_sim/memplan/iteration_replay.py); memo-exec follows
    # a Megatron TP rank's level 1 (memo_exec/distributed/runner.py ``rank_layer_arena``), not yet a cp split's
    assert cache.max_seq <= plan.max_seq
    assert cache.binding.startswith("reserved memory (caching allocator)") and "fits on paper" in cache.binding
    assert plan.binding.startswith(("GPU memory", "reserved memory (caching-allocator fragmentation of every scratch"))
    ok = [c for c in _ranked(M7, cache.next_seq, 8, A800, "full_recompute", "memo-paper") if c.status == "OK"]
    assert ok and all(_replay_oom(c) is not None for c in ok)  # each fits on paper; the replay runs out
    c = min(ok, key=lambda c: c.memory.peak_gpu_bytes)
    e = _replay_oom(c)  # the cache's fragmentation: the request and every allocated byte would fit the device
    assert e.allocated_bytes + e.requested_bytes <= c.memory.gpu_capacity_bytes < e.reserved_bytes + e.requested_bytes
    with pytest.raises(MemoError, match="--allocator"):
        max_seq(M7, 8, A800, "full_recompute", step=step, allocator="both")


def test_maxseq_allocator_both_answers_side_by_side():
    # --zero 1: the three answers' layout of the whole search (tp4+sp-cp2-z1), with the same lengths
    r = CliRunner().invoke(cli, ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--policy", "full_recompute",
                                 "--policy", "memo", "--framework", "memo-paper", "--step", "64K",
                                 "--allocator", "both", "--zero", "1", "--json"])
    assert r.exit_code == 0, r.output
    got = [(a["policy"], a["allocator"]) for a in json.loads(r.stdout)["answers"]]
    assert got == [("full_recompute", "caching"), ("full_recompute", "plan"), ("memo", "caching")]
    text = CliRunner().invoke(cli, ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--policy", "full_recompute",
                                    "--framework", "memo-paper", "--step", "64K", "--allocator", "both",
                                    "--zero", "1"]).output
    assert "full_recompute (caching allocator)" in text and "full_recompute (memory plan)" in text
    bad = CliRunner().invoke(cli, ["maxseq", "--allocator", "arena"])
    assert bad.exit_code == 2 and "--allocator" in bad.output


def test_maxseq_tries_the_optimizer_on_the_host_where_the_allocator_replay_refuses_every_plan():
    """Llama-2-70B, DeepSpeed Ulysses 16 on 32 GPUs (review of 2026-11-26): at 320K every plan fits on paper
    but runs out of reserved memory in the allocator's replay; with the optimizer on the host it fits, so the
    answer goes past what the GPU-resident optimizer reaches, and its best plan is that offloaded one."""
    step, fixed = 64 * K, {"ulysses": 16}
    m70 = get_model("llama-2-70b")
    on_gpu = max_seq(m70, 32, A800, "full_recompute", step=step, framework="deepspeed", simulate=False,
                     fixed={**fixed, "optimizer_offload": False})
    ans = max_seq(m70, 32, A800, "full_recompute", step=step, framework="deepspeed", fixed=fixed)
    assert ans.max_seq > on_gpu.max_seq, (ans.max_seq, on_gpu.max_seq)
    assert ans.best is not None and ans.best.layout.optimizer_offload and ans.best.layout.ulysses == 16


def test_maxseq_quotes_a_length_whose_best_plan_the_simulator_runs():
    """The allocator's replay fits a plan the event simulator runs out of memory with (Qwen3-30B-A3B on 8 H100s,
    full recompute, 32K steps: its analytic best at 1.15625M, tp1-ep8-cp8 with the optimizer on the host, is OOM
    in the simulator): maxseq's longest length comes with a simulated best plan and its MFU, never a plan the
    what-if at that length would answer 'nothing fits' for."""
    h100 = load_profile("h100-sxm5-80gb")
    # single stage (pp 1): the answer, its simulated best plan and what binds are the full search's
    ans = max_seq(get_model("qwen3-30b-a3b"), 8, h100, "full_recompute", step=32 * K, fixed={"pp": 1})
    assert ans.max_seq is not None and ans.best is not None
    assert ans.best.simulated and ans.best.simulated["status"] == "OK" and ans.best.simulated["mfu"] > 0
    assert ans.next_seq == ans.max_seq + 32 * K


def test_memo_side_beside_a_framework_names_the_framework_recipe():
    """memo's best beside --framework deepspeed keeps DeepSpeed's 16-bit gradients (not memo's fp32 main ones),
    so its number is not the plain what-if's: the line says so; beside megatron (the same recipe) it says nothing."""
    # store_all without pipelines: both sides' bests of the full search (tp1-uly4-dp2-z3 store_all), found cheaply
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "32K", "--framework",
                                 "deepspeed", "--simulate-top", "1", "--no-plan", "--policy", "store_all", "--pp", "1"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("deepspeed's best:"))
    assert "memo's best (with deepspeed's model states, ZeRO paper" in line and "memo prices megatron's" in line
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "32K", "--framework",
                                 "megatron", "--simulate-top", "1", "--no-plan", "--policy", "store_all", "--pp", "1"])
    line = next(x for x in r.output.splitlines() if x.startswith("megatron's best:"))
    assert "memo's best: " in line and "model states" not in line


@pytest.mark.parametrize("runs_up_to, refused_odd", [(6, False), (6, True), (1, False), (0, False), (10, False)])
def test_maxseq_steps_down_to_the_longest_length_the_simulator_runs(monkeypatch, runs_up_to, refused_odd):
    """The replay fits up to 10 steps; the event simulator runs up to ``runs_up_to`` (odd lengths refused by the
    what-if with ``refused_odd``, as a fixed --cp refuses a length its 2cp chunks do not divide): maxseq answers
    the longest length it runs, with the first failing one above it and its failure as what binds (the refusal's
    line where that length is refused), in O(log) rankings; none: no length."""
    import memo_sim.search.maxseq as ms

    monkeypatch.setattr(ms, "_ranked", lambda model, seq, *a, **k: [seq])
    monkeypatch.setattr(ms, "_fits", lambda cands: cands[0] <= 10 * K)
    monkeypatch.setattr(ms, "binding_constraint", lambda cands: "replay")
    asked = []

    def simulated(model, seq, *a):
        asked.append(seq // K)
        if refused_odd and (seq // K) % 2:
            return None, f"refused at {seq // K}"
        return (f"plan {seq // K}", None) if seq <= runs_up_to * K else (None, f"simulated OOM at {seq // K}")

    monkeypatch.setattr(ms, "_simulated_best", simulated)
    ans = max_seq(M7, 8, A800, "full_recompute", step=K)
    if runs_up_to == 0:
        assert ans.max_seq is None and ans.best is None and ans.binding == "simulated OOM at 1"
    elif runs_up_to >= 10:
        assert (ans.max_seq, ans.best, ans.next_seq, ans.binding) == (10 * K, "plan 10", 11 * K, "replay")
    else:
        assert (ans.max_seq, ans.best, ans.next_seq) == (runs_up_to * K, f"plan {runs_up_to}", (runs_up_to + 1) * K)
        assert ans.binding == (f"refused at {runs_up_to + 1}" if refused_odd else f"simulated OOM at {runs_up_to + 1}")
    assert len(asked) <= 8 and len(set(asked)) == len(asked)


def test_nothing_at_the_first_step_points_to_a_smaller_step():
    """maxseq's lengths are multiples of --step: where the first one fits nowhere, the answer says that no
    shorter length was tried and which --step looks there (a user's review, 2026-11-27: DeepSpeed's
    Qwen3-30B-A3B on 16 H100s answered 'no policy trains 128K tokens'; with --step 8K, 64K). Since Ulysses is priced
    beside expert parallelism (2026-12-03) DeepSpeed's Ulysses 16 trains 1.125M there, so the case fixes --ulysses 1."""
    from click.testing import CliRunner

    from memo_sim.cli import cli

    r = CliRunner().invoke(cli, ["maxseq", "--model", "qwen3-30b-a3b", "--gpus", "16", "--profile", "h100-sxm5-80gb",
                                 "--framework", "deepspeed", "--ulysses", "1"])
    assert r.exit_code == 3, r.output  # nothing trains: the what-if's exit status for nothing fits (it was 0)
    lines = r.output.splitlines()
    assert lines[0].startswith("answer: no policy trains 128K tokens"), r.output
    assert lines[1] == "no length under 128K was tried: a smaller --step (e.g. 8K) looks there", r.output


def _without_walls(obj):
    """An answer's JSON without the wall times, which differ run to run."""
    if isinstance(obj, dict):
        return {k: _without_walls(v) for k, v in obj.items() if not k.endswith("wall_s") and k != "elapsed_s"}
    if isinstance(obj, list):
        return [_without_walls(v) for v in obj]
    return obj


@pytest.mark.slow  # one of the default selection's slowest, moved to balance .ci/run's two halves
def test_maxseq_jobs_answers_the_policies_in_processes_as_the_serial_run_does():
    from memo_sim.search.maxseq import max_seq_runs

    runs = [("full_recompute", "caching"), ("store_all", "caching"), ("full_recompute", "plan")]
    ticks = []
    serial = max_seq_runs(M7, 8, A800, runs, step=64 * K, jobs=1)
    pooled = max_seq_runs(M7, 8, A800, runs, step=64 * K, jobs=3, done=lambda: ticks.append(1))
    assert len(ticks) == len(runs)
    assert [a.policy for a in pooled] == [p for p, _ in runs]  # in the runs' order, not as they finished
    assert [_without_walls(a.to_json()) for a in pooled] == [_without_walls(a.to_json()) for a in serial]
    assert all(a.max_seq for a in serial)
    with pytest.raises(MemoError, match="megatron does not offer"):  # a worker's refusal, raised here
        max_seq_runs(M7, 8, A800, [("memo", "caching"), ("full_recompute", "caching")], step=64 * K,
                     framework="megatron", jobs=2)
    # two refused runs: the first in order is raised, as serially, whichever worker refused first
    two = [("full_recompute", "caching"), ("full_offload", "caching"), ("memo", "caching")]
    for jobs in (1, 3):
        with pytest.raises(MemoError, match="--policy full_offload"):
            max_seq_runs(M7, 8, A800, two, step=64 * K, framework="megatron", jobs=jobs)
    r = CliRunner().invoke(cli, ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--jobs", "0"])
    assert r.exit_code == 2 and "--jobs" in r.output


def test_the_binding_line_names_the_host_where_pinned_memory_is_over_too():
    """Llama-3.1-8B on 8 H100s, full offload at the next 32K step: the least-over candidate is out of GPU memory and
    far over the host's pinned memory, and a layout over the host was said to 'fit, as on a static memory plan' on
    allocated bytes (a user's review); every line at the next step names the host where it is over."""
    r = CliRunner().invoke(cli, ["maxseq", "--model", "llama-3.1-8b", "--gpus", "8", "--profile", "h100-sxm5-80gb",
                                 "--allocator", "both", "--step", "32K", "--jobs", "1", "--policy", "full_offload",
                                 "--pp", "1"])  # the answer, the least over and the review's layout: single stage
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "as on a static memory plan" not in text, text
    caching = text.split("(caching allocator) at")[1].split("(memory plan) at")[0]
    # the least over is the layout 2% over the host (its GPU fits), not one 1% over the GPU and 235% over the host
    assert caching.split(": ", 1)[1].startswith("pinned host memory: 1.67 TiB per node of 1.64 TiB"), caching


def test_maxseq_takes_the_caching_allocators_settings():
    """`--alloc-conf expandable_segments:True` reaches maxseq's search as the what-if's does (maxseq had no such
    option: 'the longest length with expandable segments' had no answer but --framework torchtitan's)."""
    # --pp 1 --zero 3: both answers' layouts of the full search (1.28125M, tp4+metp_ffn-cp2-z3; 1.34375M,
    # tp4+metp_ffn-uly2-z3-expandable), found in a narrower one
    args = ["maxseq", "--model", "llama-3.1-8b", "--gpus", "8", "--profile", "h100-sxm5-80gb", "--step", "32K",
            "--jobs", "1", "--pp", "1", "--zero", "3", "--policy", "full_recompute", "--json"]
    plain = json.loads(CliRunner().invoke(cli, args).output)
    r = CliRunner().invoke(cli, [*args, "--alloc-conf", "expandable_segments:True"])
    exp = json.loads(r.stdout)
    assert exp["fixed"]["alloc_conf"] == "expandable_segments:True"
    assert "expandable" in exp["answers"][0]["best"]["layout"] and exp["answers"][0]["max_seq_tokens"] > \
        plain["answers"][0]["max_seq_tokens"]
    bad = CliRunner().invoke(cli, [*args[:-1], "--alloc-conf", "bogus:1"])
    assert bad.exit_code == 2 and "--alloc-conf: unknown key 'bogus'" in bad.output


def test_a_failure_of_the_allocator_replay_gives_no_time():
    """A review (2026-11-30): the caching-allocator replay's out-of-memory was said to happen 'at 0.0 us' (layer 77's
    forward at the start of the iteration): the replay orders the requests and keeps no clock, so it gives none."""
    from memo_sim.engine.simulate import simulate
    from memo_sim.layout.parallel import Layout
    from memo_sim.policy import get_policy
    from memo_sim.search.frameworks import get_framework

    lay = get_framework("memo-paper").adapt(Layout(tp=8, sp=True), A800)
    # 704K: at the review's 512K the replay fits since the loss's logits and their fp32 copy are requested apart and
    # full recompute keeps one rebuilt lse, not every layer's (2026-12-01); here the replay still fails, the analytic
    # peak fits
    r = simulate(M7, lay, 1, 704 * K, get_policy("full_recompute"), A800, keep_timeline=False)
    assert r.status == "OOM" and r.failure.time_s is None, r.failure
    assert r.failure.message().startswith("OOM in the caching-allocator replay: L"), r.failure.message()
    assert "at 0.0" not in r.failure.message()
