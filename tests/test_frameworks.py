"""Frameworks as data (`memo_sim.frameworks`): each version's file loads, selects what it says, and
each switchable mechanism moves the prediction the way it should."""

from dataclasses import replace

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.engine.simulate import simulate
from memo_sim.errors import MemoError
from memo_sim.frameworks import DATA, MECHANISMS, _read, load_frameworks
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.estimate import estimate_iteration
from memo_sim.search.frameworks import get_framework
from memo_sim.search.whatif import candidates_for

NAMES = ("any", "megatron@2021", "megatron@2022", "megatron@2023", "megatron", "deepspeed", "torchtitan",
         "memo-paper", "sppo-paper", "xtuner")


def test_every_named_framework_is_a_file_with_sources():
    fws = load_frameworks()
    assert set(NAMES) <= set(fws)
    for name in NAMES:
        fw = get_framework(name)
        assert fw.path == str(DATA / f"{name}.yaml") and fw.sources
        assert set(dict(fw.mechanisms)) == set(MECHANISMS)


def test_megatron_2021_and_memo_paper_select_their_files():
    old = get_framework("megatron@2021")
    assert old.mechanism("attention") == "materialised" and old.mechanism("grad_overlap") is False
    assert not old.allows(Layout(tp=8, sp=True)) and old.allows(Layout(tp=8, sp=False))
    assert not old.allows(Layout(tp=4, cp=2, sp=False)) and not old.allows(Layout(tp=1, dp=8, zero=1))
    memo = get_framework("memo-paper")
    assert "memo" in memo.policies and memo.allows(Layout(tp=4, cp=2))
    res = candidates_for(get_model("gpt-7b"), 4096, 8, load_profile("a100-sxm4-80gb"), framework="megatron@2021")
    assert res.candidates and all(c.layout.attention == "materialised" and not c.layout.grad_overlap
                                  and (c.layout.tp == 1 or not c.layout.sp) for c in res.candidates)


# (mechanism, the value that makes the prediction worse, the value that makes it better, what it moves)
EXPECTED = {"attention": ("materialised", "flash", "time"), "grad_overlap": (False, True, "time"),
            "cross_entropy": ("vocab_parallel", "chunked", "time"),
            "host_pool": ("caching_host_allocator", "registered_pool", "host memory"),
            "expandable_segments": (False, True, "gpu memory"),
            # blocks at or above max_split_size are never split, so the cache reserves more for the same requests
            "alloc_conf": ("max_split_size_mb:20", "", "gpu memory"),
            # collective buffers held until a synchronisation: the cache fills and the allocator retries
            "nccl_record_stream": (True, False, "allocator retries"),
            # a compiled block reads the residual add's output once (it fuses the add into the next norm)
            "kernel_fusion": ("fused", "compiled", "time"),
            # transformers' eager rotary formula (5 kernels, 20.5 bytes an element) against one fused kernel (4)
            "rope": ("hf", "fused", "time"),
            # SP's backward re-gather beside the data-gradient GEMM instead of before it (a TP + SP layout)
            "sp_regather_overlap": (False, True, "time"),
            # torch's ColwiseParallel keeps SP's gathered GEMM inputs: no backward re-gather (a TP + SP layout; the
            # full-length tensors kept move memory the other way: tests/test_sp_input_kept.py)
            "sp_input_kept": (False, True, "time"),
            # PyTorch's CP merges and accumulates each ring step in separate fp32 passes and gathers K/V at once
            # beside step 0 alone (a CP layout; its buffers move memory too)
            "ring_merge": ("torch_cp", "none", "time"),
            # XTuner 2024's Ulysses sends every K/V head repeated to the query heads (a GQA model under Ulysses)
            "ulysses_kv": ("query_heads", "minimal", "time"),
            # ring CP's blocks on FlashAttention-2 (memo-exec's) beside a layer kernel of cuDNN's (a Hopper profile)
            "block_attention": ("flash", "", "time"),
            # memo-exec's Ulysses backward sends q, k, v and out again besides the gradients (a Ulysses layout)
            "ulysses_bwd_resend": (True, False, "time"),
            # memo-exec's ring sends its dK/dV accumulators in fp32, twice a bf16 model's bytes (a CP layout)
            "ring_dkv_fp32": (True, False, "time"),
            # memo-exec keeps the embedding's, the untied head's and the final norm's gradients whole together under
            # ZeRO 2 / 3, where buckets hold one vocabulary matrix at a time (an untied model)
            "head_grads_unit": (True, False, "model states"),
            # DeepSpeed gathers ZeRO-1/2's updated weights at the end of its step, wholly exposed (a ZeRO-1 layout)
            "param_gather": ("after_step", "overlap", "time"),
            # torchtitan runs ZeRO 0 as FSDP2 over a shard group of one: no bf16 copy beside the fp32 parameter
            "replicate_fsdp": (False, True, "model states"),
            # a bucket stated smaller than a layer (XTuner's DeepSpeed reduce_bucket_size): ZeRO 2's two buckets of
            # whole gradients under overlapped reductions hold less than two layers' (gpt-7b: 201M a layer)
            "reduce_bucket": (0, 50_000_000, "model states"),
            # FSDP2 copies each layer's weights out of its all-gather and its gradients into its reduce-scatter on the
            # compute stream (an FSDP layout)
            "fsdp_copies": (True, False, "time"),
            # torchtitan 9dec370's AdamW as torch.optim's foreach kernels: a pass of HBM per tensor op of the update
            "optimizer_impl": ("foreach", "fused", "time")}


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_each_mechanism_moves_the_prediction_the_expected_way(mechanism):
    from memo_sim.memplan.footprint import memory_breakdown

    assert set(EXPECTED) == set(MECHANISMS)  # a new switch needs its expected direction here
    worse_v, better_v, what = EXPECTED[mechanism]
    model = get_model("llama-3.1-8b" if mechanism in ("ulysses_kv", "head_grads_unit") else "gpt-7b")
    prof = load_profile("h100-sxm5-80gb" if mechanism == "block_attention" else "a100-sxm4-80gb")
    base = {"ring_merge": Layout(tp=4, cp=2), "ulysses_kv": Layout(ulysses=4, dp=2, zero=3),
            "ulysses_bwd_resend": Layout(ulysses=4, dp=2, zero=3), "ring_dkv_fp32": Layout(tp=4, cp=2),
            "block_attention": Layout(tp=4, cp=2, attention="cudnn"), "param_gather": Layout(tp=2, dp=4, zero=1),
            "fsdp_copies": Layout(dp=8, zero=3, dp_mode="fsdp")}.get(
        mechanism, Layout(tp=2, sp=mechanism in ("sp_regather_overlap", "sp_input_kept"), dp=4))
    worse, better = (replace(base, **{MECHANISMS[mechanism]: v}) for v in (worse_v, better_v))
    if what == "time":
        pol = get_policy("full_recompute")
        # ring CP's blocks at 16K, where their attention takes a share of the step the kernel's speed shows in (at 4K,
        # with NVLink at 370 GB/s since 2026-12-04, the estimate put the two 0.03% apart, the other way round)
        seq = 16384 if mechanism == "block_attention" else 4096
        for predict in (lambda lay: estimate_iteration(model, lay, 1, seq, pol, prof).iteration_s,
                        lambda lay: simulate(model, lay, 1, seq, pol, prof, keep_timeline=False).iteration_s):
            assert predict(worse) > predict(better)
    elif what == "host memory":  # pinned host bytes of an offloading plan (MEMO at alpha 0.37: rows that round up)
        pol = get_policy("memo", 0.37)
        assert (memory_breakdown(model, worse, 1, 65536, pol, prof).host_bytes_per_node
                > memory_breakdown(model, better, 1, 65536, pol, prof).host_bytes_per_node)
    elif what == "model states":  # ZeRO 2's whole gradients beside the shards
        from memo_sim.cost.memory import model_state_bytes

        states = Layout(dp=8, zero=0 if mechanism == "replicate_fsdp" else 2)  # ZeRO 0's replicas: replicate_fsdp
        worse, better = (replace(states, **{MECHANISMS[mechanism]: v}) for v in (worse_v, better_v))
        assert model_state_bytes(model, worse) > model_state_bytes(model, better)
    elif what == "allocator retries":  # an unplanned policy's iteration under the caching allocator
        from memo_sim.memplan.iteration_replay import replay_iteration

        pol, lay = get_policy("full_recompute"), Layout(tp=4, cp=2, zero=1)
        worse, better = (replace(lay, **{MECHANISMS[mechanism]: v}) for v in (worse_v, better_v))
        r_worse, r_better = (replay_iteration(model, x, 1, 262144, pol, prof) for x in (worse, better))
        assert r_worse.reorganizations > r_better.reorganizations == 0
        assert (simulate(model, worse, 1, 262144, pol, prof, keep_timeline=False).iteration_s
                > simulate(model, better, 1, 262144, pol, prof, keep_timeline=False).iteration_s)
    else:  # the caching allocator's reserved transients of an unplanned policy
        pol, lay = get_policy("full_recompute"), Layout(tp=8)
        worse, better = (replace(lay, **{MECHANISMS[mechanism]: v}) for v in (worse_v, better_v))
        assert (memory_breakdown(model, worse, 1, 131072, pol, prof).peak_gpu_bytes
                > memory_breakdown(model, better, 1, 131072, pol, prof).peak_gpu_bytes)


def test_bad_framework_file_is_one_line(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text((DATA / "megatron.yaml").read_text().replace("name: megatron", "name: mine")
                 .replace("attention: cudnn", "attention: sdpa"))
    with pytest.raises(MemoError, match=r"mine.yaml.*attention"):
        _read(p)
    p.write_text((DATA / "megatron@2021.yaml").read_text().replace("name: megatron@2021", "name: mine")
                 .replace("context_parallel: false", "context_parallel: true"))
    with pytest.raises(MemoError, match="ring CP"):
        _read(p)


def test_cli_framework_names():
    r = CliRunner().invoke(cli, ["whatif", "--framework", "megatron@2021", "--seq", "4K", "--no-plan", "--json",
                                  "--simulate-top", "0"])
    assert r.exit_code == 0, r.output
    assert "materialised" in r.output
    r = CliRunner().invoke(cli, ["whatif", "--framework", "megatron@1999", "--no-plan"])
    assert r.exit_code == 2


def test_selective_recompute_policy_sits_between_store_all_and_full_recompute():
    from memo_sim.memplan.footprint import memory_breakdown

    model, prof = get_model("gpt-7b"), load_profile("a100-sxm4-80gb")
    for lay in (Layout(tp=8, sp=True), Layout(tp=8, sp=False, attention="materialised"), Layout(tp=4, cp=2)):
        t = {p: estimate_iteration(model, lay, 1, 8192, get_policy(p), prof).iteration_s
             for p in ("store_all", "selective_recompute", "full_recompute")}
        assert t["store_all"] < t["selective_recompute"] < t["full_recompute"]
        sim = {p: simulate(model, lay, 1, 8192, get_policy(p), prof, keep_timeline=False).iteration_s
               for p in ("store_all", "selective_recompute")}
        assert sim["store_all"] < sim["selective_recompute"]
        mem = {p: memory_breakdown(model, lay, 1, 8192, get_policy(p), prof).skeletal_resident_bytes
               for p in ("store_all", "selective_recompute")}
        # store all also keeps the materialised attention's score-sized tensors, selective recompute
        # rebuilds them: n_b·s²·(2d + 1) per layer (none with FlashAttention)
        scores = (1 * 32 / lay.tp) * 8192 ** 2 * 5 if lay.attention == "materialised" else 0.0
        assert mem["store_all"] - mem["selective_recompute"] == pytest.approx(model.layers * scores)
    assert "selective_recompute" in get_framework("megatron").policies
    # memo's executor runs it, but with FlashAttention it saves only store all's lse: memo's own search leaves it out
    assert "selective_recompute" not in get_framework("any").policies


def test_any_searches_every_policy_memo_exec_runs_but_selective_recompute():
    """memo's own search (framework any) offers the policies its executor runs: Megatron's recompute_moe and
    DeepSpeed's checkpoint_offload too (a framework's answer must not win with a policy memo-exec runs and memo's
    search never priced); selective_recompute alone is left out (dominated by store all with FlashAttention)."""
    pytest.importorskip("torch")
    from memo_exec.activations import registered  # noqa: PLC0415

    # SPPO runs as the executor's schedule (memo_exec/sppo, which registers it where it is imported)
    offered, runs = set(get_framework("any").policies) - {"sppo"}, set(registered()) - {"sppo"}
    assert offered <= runs and runs - offered == {"selective_recompute"}


def test_adapted_layouts_round_trip_through_the_plan_format():
    for fw in load_frameworks().values():
        lay = fw.adapt(Layout(tp=2, sp=False, dp=4))
        assert Layout.from_dict(lay.to_dict()) == lay
    assert set(Layout(tp=2).to_dict()) == {"tp", "sp", "cp", "ulysses", "dp", "zero", "tp_mode"}  # defaults: old shape


def test_frameworks_command_lists_every_file():
    r = CliRunner().invoke(cli, ["frameworks"])
    assert r.exit_code == 0 and all(n in r.output for n in NAMES)
    import json

    j = json.loads(CliRunner().invoke(cli, ["frameworks", "--json"]).output)
    assert j["megatron@2021"]["mechanisms"]["attention"] == "materialised" and j["megatron@2021"]["sources"]


def test_frameworks_list_fits_a_terminal():
    """The list was one table row per framework, its 'not modelled' cell thousands of columns wide (a review,
    2026-12-02): now each framework's summary, policies, precision, the mechanisms it runs unlike any's and how
    many things memo does not model of it, wrapped to 120 columns; `frameworks NAME` keeps the full text."""
    from memo_sim.frameworks import load_frameworks

    out = CliRunner().invoke(cli, ["frameworks"]).stdout
    assert max(len(line) for line in out.splitlines()) <= 120
    fws = load_frameworks()
    names = list(fws)
    for i, (name, f) in enumerate(fws.items()):
        block = ("\n" + out).split(f"\n{name}: ")[1]
        block = block.split(f"\n{names[i + 1]}: ")[0] if i + 1 < len(names) else block
        n = len(f.not_modelled)
        assert (f"not modelled: {n} thing" if n else "not modelled: nothing named") in block, name
    block = out.split("\nmegatron@2021: ")[1].split("\nmegatron@2022: ")[0]
    assert "attention=materialised" in block and "grad_overlap=False" in block and "kernel_fusion" not in block
    assert out.rstrip().endswith("--json: every field")


def test_frameworks_name_shows_one_in_full():
    """`memo-sim frameworks NAME` (a user's review, 2026-11-27: the help named `--framework NAME`, which the
    command refused): one version with its layouts and sources; an unknown name is one line, exit 2."""
    r = CliRunner().invoke(cli, ["frameworks", "megatron"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert out.startswith("megatron: ") and "megatron@2021" not in out
    assert "ZeRO 0, 1, 3 (zero)" in out and "optimizer offload beside ZeRO 1" in out and "  sources:" in out
    assert "custom_fsdp" in out and "file: " in out
    import json

    j = json.loads(CliRunner().invoke(cli, ["frameworks", "torchtitan", "--json"]).output)
    assert list(j) == ["torchtitan"] and j["torchtitan"]["layouts"]["dp_modes"] == ["fsdp"]  # every field, layouts too
    bad = CliRunner().invoke(cli, ["frameworks", "megatron@2099"])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and "megatron@2023" in bad.output


def test_the_policy_help_says_which_policies_need_a_framework():
    """`--policy selective_recompute` on the default framework is refused (any does not offer it) while --help listed
    it as a plain choice (a user's review): the help names the framework for each policy any leaves out."""
    from memo_sim.search.frameworks import policy_frameworks_words

    words = policy_frameworks_words()
    assert "selective_recompute (--framework megatron" in words and "op_sac (--framework torchtitan)" in words
    assert "memo (" not in words and "@" not in words
    r = CliRunner().invoke(cli, ["whatif", "--help"])
    assert "the default framework (any) offers all but" in " ".join(r.output.split())


def test_nothing_fits_names_memos_reason_about_a_layout_the_framework_runs():
    """DeepSpeed runs Ulysses and expert parallelism: asked for a MoE at 32K on 8 GPUs it answered that DeepSpeed lacks
    ring CP (a layout memo built, no degree given) where memo did not model the two together (a review); memo prices
    them together since 2026-12-03 (each rank routes its Ulysses shard, as under ring CP), so DeepSpeed's answer is a
    Ulysses x EP plan. A framework refusal is named only when every layout was one it refuses (torchtitan asked for
    Ulysses); `default_reason` keeps memo's reason first otherwise (tests/test_review_fixes_maxseq_rack.py)."""
    args = ["whatif", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "32K", "--profile", "h100-sxm5-80gb",
            "--global-batch", "4", "--no-plan"]
    r = CliRunner().invoke(cli, args + ["--framework", "deepspeed"])
    assert r.exit_code == 0, r.output
    answer = r.output.splitlines()[0]
    assert answer.startswith("answer: ") and "-uly" in answer and "-ep" in answer, answer
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "32K", "--profile",
                                 "h100-sxm5-80gb", "--framework", "torchtitan", "--ulysses", "2", "--no-plan"])
    assert r.exit_code == 2 and "torchtitan does not offer Ulysses (--ulysses 2)" in r.output, r.output


def test_deepspeeds_moe_layers_run_beside_zero_1_and_2_only():
    """DeepSpeed's engine (deepspeed/runtime/engine.py at edaa7221) stops a model with native MoE layers under ZeRO
    stage 3 ('Native DeepSpeed MoE is not supported with ZeRO Stage 3'): memo's deepspeed data ranked such plans for a
    mixture of experts (a review found its EP plans exported as a dense model). A dense model keeps stage 3."""
    fw = get_framework("deepspeed")
    moe, dense = get_model("qwen3-30b-a3b"), get_model("llama-3.1-8b")
    lay = Layout(ulysses=1, dp=16, ep=8, zero=3)
    assert fw.experts.zero == (0, 1, 2) and fw.for_layouts_of(dense) is fw and fw.why_not(lay) is None
    why = fw.for_layouts_of(moe).why_not(lay)
    assert why and "ZeRO stage 3 beside MoE layers (it runs them beside stages 0, 1, 2)" in why
    assert fw.for_layouts_of(moe).why_not(replace(lay, zero=2)) is None
    args = ["whatif", "--model", "qwen3-30b-a3b", "--layers", "2", "--gpus", "16", "--seq", "8K", "--profile",
            "h100-sxm5-80gb", "--framework", "deepspeed", "--no-plan", "--jobs", "1", "--simulate-top", "1"]
    r = CliRunner().invoke(cli, args + ["--zero", "3"])
    assert r.exit_code == 2 and "--zero 3: deepspeed runs MoE layers beside ZeRO stages 0, 1, 2" in r.output, r.output
    import json

    rows = json.loads(CliRunner().invoke(cli, args + ["--json"]).output)["candidates"]
    assert rows and all(c["layout_degrees"]["zero"] < 3 for c in rows), {c["layout"] for c in rows}
