"""A long-context review of the what-if's and maxseq's answers: the METP verdict's Megatron side (never SPPO, and its
best plan simulated under --simulate-top N), the terms of a peak (one list for both commands), a need over its
capacity never printed as equal to it, the sequence split a length limits (a 72-GPU rack), and the tier/allocator
cell of a row the caching allocator never replayed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from memo_sim.layout.parallel import Layout
from memo_sim.policy import get_policy
from tests.test_whatif_verdicts import Cand, Est  # the verdict tests' candidates

GiB = 2**30
K = 1024


def _sim(peak):
    return {"peak_gpu_bytes": peak}


# 1. METP vs Megatron TP

def test_metp_verdict_never_takes_an_sppo_plan_for_megatron_tp():
    """[review 1] With --simulate-top 2 the simulated rows were METP and an SPPO pipeline tp8+sp-pp2 at half METP's
    throughput; the verdict took the SPPO plan for Megatron TP. Its Megatron side is a Megatron TP plan."""
    from memo_sim.report.whatif_answer import metp_verdict

    cands = [Cand(Layout(tp=2, ulysses=4, dp=2, tp_mode="metp_ffn"), get_policy("memo", 1.0), 528.0, 38 * GiB,
                  simulated=_sim(38 * GiB)),
             Cand(Layout(tp=8, pp=2), get_policy("sppo"), 262.0, 76 * GiB, sppo={"N": 8}, simulated=_sim(76 * GiB)),
             Cand(Layout(tp=2, ulysses=4, dp=2), get_policy("memo", 0.332), 527.0, 60 * GiB,
                  simulated=_sim(60 * GiB))]
    line = metp_verdict(cands)
    assert "against tp2+sp-uly4-dp2 memo(a=0.332)" in line, line
    assert "sppo" not in line and line.startswith("METP vs Megatron TP: METP 1.00x")


def test_a_sides_faster_analytic_plan_is_simulated_under_simulate_top():
    """[review 1] A side's slow simulated plan stood for the side while a faster plan of it was left analytic (the
    sides were bounded only by the proved-bound search): under --simulate-top N the side's plan whose analytic
    throughput beats its simulated best is simulated too."""
    from memo_sim.search.verdicts import verdict_sides_to_simulate

    metp = Cand(Layout(tp=2, tp_mode="metp_ffn", dp=4), get_policy("memo", 1.0), 528.0, 38 * GiB,
                simulated=_sim(38 * GiB))
    slow = Cand(Layout(tp=8), get_policy("full_recompute"), 300.0, 40 * GiB, simulated=_sim(40 * GiB))
    fast = Cand(Layout(tp=2, dp=4), get_policy("memo", 0.3), 520.0, 50 * GiB, estimate=Est(tgs=520.0))
    worse = Cand(Layout(tp=4, dp=2), get_policy("memo", 0.3), 250.0, 50 * GiB, estimate=Est(tgs=250.0))
    need = verdict_sides_to_simulate([metp, slow, fast, worse], bounded=False)
    assert any(c is fast for c in need) and not any(c is worse for c in need)


# ~35 s on the CI VM (the review's 1M-token search): slow; the default selection checks the same fix on the review's
# candidates (test_metp_verdict_never_takes_an_sppo_plan_for_megatron_tp)
@pytest.mark.slow
def test_metp_line_compares_like_with_like_end_to_end():
    """[review 1] The reviewer's what-if (llama-3.1-8b, 16 H100s, 1M tokens, sppo and memo, --simulate-top 2): the
    line compares METP with the best Megatron TP plan, simulated, not with tp8+sp-pp2 sppo at 0.49x."""
    from memo_sim.cli import cli

    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "16", "--seq", "1M", "--profile",
                                 "h100-sxm5-80gb", "--policy", "sppo", "--policy", "memo", "--jobs", "1",
                                 "--simulate-top", "2", "--no-plan"], catch_exceptions=False)
    line = next(x for x in r.output.splitlines() if x.startswith("METP vs Megatron TP"))
    assert "sppo" not in line and "METP 1.00x" in line and "different tiers" not in line, line


# 2. the terms of a peak

def _breakdown(classifier: float):
    from memo_sim.memplan.footprint import MemoryBreakdown

    return MemoryBreakdown(model_states_bytes=7 * GiB, skeletal_resident_bytes=1 * GiB,
                           rounding_buffer_bytes=13.5 * GiB,
                           lse_bytes=0.0, transient_peak_bytes=10 * GiB, transient_planned_bytes=10 * GiB,
                           transient_caching_allocator=10 * GiB, layer_boundary_bytes=1 * GiB,
                           classifier_peak_bytes=classifier, peak_gpu_bytes=0.0, gpu_capacity_bytes=78 * GiB,
                           host_bytes_per_gpu=0.0, host_bytes_per_node=0.0, host_capacity_bytes=0.0,
                           backward_buffer_bytes=12 * GiB)


def test_memory_terms_are_the_terms_of_the_peak():
    """[review 2] maxseq named 'classifier 71.95 GiB, buffers 13.50 GiB' above an 80.74 GiB peak: the recompute buffer
    (12 GiB of the 13.5) is live beside a layer's backward, not at a classifier peak. The terms sum to the peak."""
    from memo_sim.search.candidate import memory_term_words

    cls = _breakdown(classifier=60 * GiB)
    t = memory_term_words(cls)
    assert t["buffers"] == 1.5 * GiB and "transients" not in t and "recompute buffer" not in t
    assert sum(t.values()) == cls.peak_with()
    layer = _breakdown(classifier=1 * GiB)
    t = memory_term_words(layer)
    assert "classifier" not in t and t["recompute buffer"] == 12 * GiB and sum(t.values()) == layer.peak_with()


def test_maxseq_and_whatif_name_the_same_buffers():
    """[review 2] The reviewer's maxseq (llama-3.1-8b, DeepSpeed Ulysses 8, ZeRO 3, checkpoint_offload): its binding
    names no term the peak does not hold, as the what-if names them."""
    from memo_sim.model import get_model
    from memo_sim.profile import load_profile
    from memo_sim.search.maxseq import max_seq

    a = max_seq(get_model("llama-3.1-8b"), 8, load_profile("h100-sxm5-80gb"), "checkpoint_offload", step=64 * K,
                framework="deepspeed", fixed={"ulysses": 8, "zero": 3})
    # (with DeepSpeed's Ulysses sending GQA K/V repeated to the query heads, the replay's reserved memory binds)
    assert "buffers 13.50 GiB" not in a.binding and ("classifier" in a.binding or "reserved memory" in a.binding), \
        a.binding


# 3. a need over its capacity

def test_a_need_over_capacity_is_never_printed_equal():
    """[review 3] 1680 GiB of pinned host memory against 1676.4 GiB usable read '1.64 TiB of 1.64 TiB'."""
    from memo_sim.search.candidate import need_of_capacity

    words = need_of_capacity(1680 * GiB, 1676.4 * GiB, "usable per node")
    need, cap = words.split(" of ", 1)
    assert need != cap.split(" usable")[0], words
    assert "usable per node" in words and "3.60 GiB over" in words
    assert need_of_capacity(60 * GiB, 78 * GiB) == "60.00 GiB of 78.00 GiB"  # apart at two decimals: as before


def test_whatif_host_overrun_shows_the_excess():
    """[review 3] The reviewer's what-if: llama-3.1-8b, 8 H200s, memo at 3.5M tokens: pinned host memory over."""
    from memo_sim.cli import cli

    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--profile", "h200-141gb",
                                 "--policy", "memo", "--seq", "3.5M", "--jobs", "1", "--no-plan"])
    first = r.output.splitlines()[0]
    assert "1.64 TiB of 1.64 TiB" not in first and "over" in first, first


# 4. the sequence split a length limits

def test_split_factor_and_what_splits():
    """[review 4] 1M tokens over 72 GPUs: the factor 9 stays out of every split; 64 GPUs and 1008K split whole."""
    from memo_sim.search.split_lengths import fewer_gpus, split_factor, split_lengths

    assert split_factor(1 << 20, 72) == 9 and split_factor(1 << 20, 64) == 1
    assert fewer_gpus(1 << 20, 72) == 64
    assert split_lengths(1 << 20, 72)[0] == 1008 * K


def test_whatif_on_a_rack_says_the_length_limits_the_split():
    """[review 4] llama-3.1-70b on a full GB200 NVL72 rack at 1M tokens (Megatron, pp 1): nothing fits, and the answer
    names the split the length limits and the changes the search fits: --gpus 64 and --seq 1008K."""
    from memo_sim.cli import cli

    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-70b", "--gpus", "72", "--seq", "1M", "--profile",
                                 "gb200-nvl72", "--framework", "megatron", "--pp", "1", "--jobs", "1",
                                 "--simulate-top", "2", "--no-plan"])
    first = r.output.splitlines()[0]
    assert "the length limits the sequence split" in first and "factor 9" in first, first
    assert "--gpus 64 (" in first and "--seq 1008K (" in first


def test_maxseq_on_a_rack_says_the_length_limits_the_split():
    """[review 4] maxseq's binding at 256K (recompute_mlp, 72 GPUs): the split limit and a checked fix."""
    from memo_sim.model import get_model
    from memo_sim.profile import load_profile
    from memo_sim.search.maxseq import MaxSeqAnswer, split_binding

    ans = MaxSeqAnswer("recompute_mlp", 128 * K, 128 * K, None, 256 * K, "GPU memory: ...")
    # --pp 1 --zero 3 (the stage and depth of every plan the fixes name searched whole): each length's search ~3x
    # cheaper, the binding word for word the same (--gpus 64 at 256K: tp1-cp16-dp4-z3; --step 72K: 1512K, tp2+sp-cp36)
    out = split_binding(ans, get_model("llama-3.1-70b"), 72, load_profile("gb200-nvl72"), "megatron",
                        {"pp": 1, "zero": 3})
    assert "the length limits the sequence split" in out.binding and "--gpus 64 (256K fits there" in out.binding
    assert split_binding(replace_seq(ans, 512 * K), get_model("llama-3.1-70b"), 64, load_profile("gb200-nvl72"),
                         "megatron", {}).binding == "GPU memory: ..."  # 64 GPUs split 512K whole: nothing added


def replace_seq(ans, seq):
    from dataclasses import replace

    return replace(ans, next_seq=seq)


# the tier/allocator cell

def test_a_row_never_replayed_is_not_labelled_allocator():
    """[review] A pipeline row read 'sim/allocator' though the caching allocator never replayed it (explain's
    allocator_memory_stats None): its peak is the allocated one."""
    from memo_sim.report.peaks import candidate_peak

    c = SimpleNamespace(policy=get_policy("full_recompute"), layout=Layout(tp=8, pp=4, vpp=2),
                        memory=SimpleNamespace(peak_gpu_bytes=77 * GiB),
                        simulated={"peak_gpu_bytes": 77.3 * GiB,
                                   "allocator": {"static_memory_plan": False, "replayed": False}})
    p = candidate_peak(c)  # one Peak says it everywhere: the table cell, the words and --json's peak
    assert p.short_source == "sim/allocated" and p.to_json()["replayed"] is False
    assert p.text() == "77.30 GiB (simulated, allocated: no caching-allocator replay)"
    c.simulated["allocator"] = {"static_memory_plan": False, "peak_reserved_bytes": 78 * GiB,
                                "fragmentation_at_peak": 0.01}
    p = candidate_peak(c)
    assert p.short_source == "sim/allocator" and "replayed" not in p.to_json()  # replayed: as before
    assert p.text() == "77.30 GiB (simulated, caching allocator)"
