"""A fresh-user review's findings (2026-12-06): one name per GPU peak, a plan's framework against its policy, the
executor's refusal of Llama 4's chunked attention under Ulysses in words that hold, a rank order that cannot place a
one-node job apart, linear-attention configs refused, check-plan's arena beside its layer transients."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.layout.rank_order import places_apart
from memo_sim.model.config import ModelConfig, get_model
from memo_sim.plan.executor_scope import attention_why_not
from memo_sim.plan.schema import Plan
from memo_sim.policy import get_policy
from memo_sim.search.candidate import deciding_peak_words
from memo_sim.search.plan_check import runnable_problems

GiB = 1 << 30
DATA = Path(__file__).parent / "data" / "hf"


def test_reserved_peak_words_name_the_replays_allocated_peak_and_the_simulators_own():
    """The review: "the allocated peak 73.51 GiB" beside check-plan's torch.cuda.max_memory_allocated() ~ 69.42 GiB:
    the first is the event simulator's high-water mark, the second the replay's allocated peak."""
    alloc = {"peak_reserved_bytes": 76.5 * GiB, "peak_allocated_bytes": 69.42 * GiB}
    words = deciding_peak_words("73.51 GiB (simulated)", 73.51 * GiB, alloc, 77.18 * GiB)
    assert "PyTorch's reserved peak 76.50 GiB" in words
    assert "69.42 GiB allocated at most" in words
    assert "the simulator's own peak (each phase's tensors one block) 73.51 GiB (simulated)" in words
    assert "the allocated peak 73.51" not in words
    # where the simulator's peak decides, it is the one number given
    assert deciding_peak_words("80.00 GiB", 80 * GiB, alloc, 100 * GiB) == "GPU memory 80% full (80.00 GiB of 100.00 GiB"


def test_a_job_on_one_node_is_placed_alike_in_every_rank_order():
    """The review: a 4-GPU pp2 x dp2 plan was said to sit on other nodes in the other order (8-GPU nodes)."""
    assert not places_apart(Layout(pp=2, dp=2), 8)
    assert not places_apart(Layout(pp=2, dp=4), 8)  # 8 GPUs: one node still
    assert places_apart(Layout(pp=2, dp=8), 8)
    assert places_apart(Layout(tp=2, pp=2, dp=4), 8)


def _plan(policy: str, framework: str, alpha: float | None = None) -> Plan:
    model = ModelConfig("tiny", layers=2, hidden=256, heads=8, ffn=1024, vocab=512)
    return Plan(model, 1, 256, 1, Layout(), get_policy(policy, alpha), "h100-sxm5-80gb", {"status": "OK"}, {},
                framework=framework)


def test_a_plan_whose_framework_does_not_offer_its_policy_is_refused():
    """The review: a plan edited to "framework": "megatron" beside MEMO's policy was valid for check-plan."""
    problems = runnable_problems(_plan("memo", "megatron", 0.3), memory_plan=False)
    assert problems and problems[0].startswith("framework: megatron does not offer the policy memo (it offers store_all"), problems
    assert not runnable_problems(_plan("selective_recompute", "megatron"), memory_plan=False)
    # memo's own (any) runs every policy its executor has: a hand-made plan of selective recompute stays valid
    assert not runnable_problems(_plan("selective_recompute", "any"), memory_plan=False)


def test_chunked_attention_under_ulysses_is_refused_for_what_the_executor_lacks():
    """The review: "on a rank that holds the whole sequence of its heads" is what Ulysses gives, so the refusal
    contradicted itself."""
    model = get_model("llama-4-scout")
    why = attention_why_not(model, Layout(ulysses=4, tp=2))
    assert why is not None
    assert "whole sequence of its heads" not in why
    assert "ring and Ulysses attention run plain causal masks" in why and "plan without cp, ulysses" in why


@pytest.mark.parametrize("extra", [{"full_attention_interval": 4, "linear_num_value_heads": 32},
                                   {"layer_types": ["linear_attention", "linear_attention", "linear_attention",
                                                    "full_attention"] * 12}])
def test_linear_attention_keys_are_refused_in_a_family_memo_reads(tmp_path, extra):
    """The review: Qwen3-Next's config relabelled qwen3_moe was read with its gated-DeltaNet layers priced as full
    attention, ten keys dropped without a note."""
    raw = json.loads((DATA / "qwen3-30b-a3b" / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw, **extra}))
    with pytest.raises(MemoError) as e:
        get_model(str(path))
    key = next(iter(extra))
    assert f"{key}:" in str(e.value) and "not modelled" in str(e.value)
    path.write_text(json.dumps(raw))  # the config itself still reads
    assert get_model(str(path)).moe


def test_an_answer_on_the_edge_names_the_fastest_simulated_plan_with_room_for_the_measured_error():
    """The review: the default answer at 99.9% of the GPU, while a runner-up that leaves 11 GiB gave up 18.8%; the
    margin line names the fastest simulated plan whose deciding peak fits 17.7% higher (memo-exec's measured top), or
    the --headroom that searches for one."""
    from types import SimpleNamespace

    from memo_sim.report.whatif_answer import margin_line

    cap = 78 * GiB

    def cand(peak: float, reserved: float, tgs: float, label: str):
        return SimpleNamespace(simulated={"peak_gpu_bytes": peak, "allocator": {"static_memory_plan": False,
                                                                                 "peak_reserved_bytes": reserved}},
                               policy=get_policy("full_recompute"), layout=Layout(tp=8, sp=True) if label else
                               Layout(tp=8), memory=SimpleNamespace(gpu_capacity_bytes=cap, peak_gpu_bytes=peak),
                               status="OK", tgs=tgs)

    best = cand(0.97 * cap, 0.995 * cap, 100.0, "")
    tight = cand(0.9 * cap, 0.9 * cap, 95.0, "x")  # 0.9 x 1.177 > 1: no room for the error's top
    roomy = cand(0.8 * cap, 0.84 * cap, 81.0, "x")
    words = margin_line(SimpleNamespace(best=best, shown=[best, tight, roomy]))
    assert "the fastest simulated plan that fits a peak 17.7% higher: #3 tp8+sp full_recompute, 81 tokens/GPU/s " \
           "(19.0% below the answer), peak 84.0% of the usable memory (--headroom 15% searches" in words, words
    words = margin_line(SimpleNamespace(best=best, shown=[best, tight]))
    assert words.endswith("no simulated plan of the ranking fits a peak 17.7% higher: --headroom 15% searches with "
                          "that room"), words
