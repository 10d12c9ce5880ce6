"""Megatron-DeepSpeed's Ulysses asserts equal q and k/v projection widths (megatron/model/transformer.py lines 728-729
at 4efb479d): an export of a grouped-query model over Ulysses says the script stops there (a review: Llama-3.1-70B
over Ulysses 8 was written as expressed)."""

from __future__ import annotations

from memo_sim.export import export_plan
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.plan.schema import Plan
from memo_sim.policy import get_policy


def _plan(layout: Layout, model: str) -> Plan:
    return Plan(model=get_model(model), batch=1, seq_tokens=32768, gpus=layout.gpus, layout=layout,
                policy=get_policy("full_recompute"), profile="h100-sxm5-80gb",
                predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2}, micro_batch=1, framework="deepspeed")


def test_grouped_query_attention_over_ulysses_is_a_gap():
    gaps = export_plan(_plan(Layout(ulysses=8, dp=8, zero=3), "llama-3.1-70b"), "deepspeed", price=False).gaps
    hit = [g for g in gaps if "(grouped-query)" in g.what]
    assert len(hit) == 1 and "projection_size == kv_projection_size" in hit[0].nearest, [g.what for g in gaps]
    # multi-head attention, or no Ulysses: nothing to say
    for plan in (_plan(Layout(ulysses=8, dp=8, zero=3), "gpt-7b"), _plan(Layout(dp=64, zero=3), "llama-3.1-70b")):
        assert not [g for g in export_plan(plan, "deepspeed", price=False).gaps if "grouped-query" in g.what]


def test_the_edit_it_needs_before_running_comes_first():
    """The script stops at its first forward without the hand edit, and that was one gap among several (a review):
    the edit heads the file written, before the plan's summary; a gap the script runs through has none."""
    ex = export_plan(_plan(Layout(ulysses=8, dp=8, zero=3), "llama-3.1-70b"), "deepspeed", price=False)
    edits = [g.before_running for g in ex.gaps if g.before_running]
    assert len(edits) == 1 and "repeat the 8 K/V heads to the 64 query heads" in edits[0], edits
    script = ex.files["deepspeed.sh"].splitlines()
    assert script[2] == f"# BEFORE RUNNING: {edits[0]}", script[:4]
    ex = export_plan(_plan(Layout(dp=64, zero=3), "llama-3.1-70b"), "deepspeed", price=False)
    assert not any(g.before_running for g in ex.gaps) and "BEFORE RUNNING" not in ex.files["deepspeed.sh"]
