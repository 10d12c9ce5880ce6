"""Review fixes (MoE and the search): the advice when nothing fits names every pinned flag (--ep and --etp
included), a capacity factor above experts / top-k is refused in one line rather than priced as work no expert
can get, and the what-if's progress names the phase under way (the pipeline families' bounds too) and ends on
the report's own tier-2 line."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cli.common import build_model
from memo_sim.cli.whatif import whatif as whatif_command
from memo_sim.errors import MemoError
from memo_sim.layout.moe_balance import (Balance, capacity_ceiling, capacity_load, capacity_why_not,
                                         measured_why_not, parse_balance)
from memo_sim.profile.loader import load_profile
from memo_sim.search.request import FIXING
from memo_sim.search.whatif import PINNABLE, candidates_for, not_searched, rank

H100 = "h100-sxm5-80gb"


def run(args: list[str]):
    return CliRunner().invoke(cli, args)


# 1. the advice when nothing fits names every pin

# a pinned value of every key `WhatifRequest.fixed` returns, and the words the advice must say for it
PINNED = {
    "batch": (4, "--batch 4"), "global_batch": (64, "--global-batch 64"), "micro_batch": (2, "--micro-batch 2"),
    "tp": (1, "--tp 1"), "cp": (2, "--cp 2"), "ulysses": (2, "--ulysses 2"), "dp": (8, "--dp 8"),
    "zero": (1, "--zero 1"), "sp": (False, "--no-sp"), "alpha": (0.5, "--alpha 0.5"),
    "tp_mode": ("megatron", "tensor-parallel flavours other than megatron (--tp-mode all)"),
    "metp_across_nodes": (True, None), "pp": (4, "--pp 4"), "vpp": (2, "--vpp 2"),
    "schedules": (("1f1b",), "--schedule 1f1b"), "subseqs": (8, "--subseqs 8"),
    "partition": ("flops", "--partition flops"), "multiplex": (True, "--multiplex"),
    "optimizer_offload": (False, "--no-optimizer-offload"),
    "first_stage_layers": (3, "--decoder-first-pipeline-num-layers 3"),
    "last_stage_layers": (5, "--decoder-last-pipeline-num-layers 5"),
    "chunk_layers": ((2, 2), "--pipeline-model-parallel-layout"), "ep": (1, "--ep 1"), "etp": (1, "--etp 1"),
    "moe_dispatcher": ("allgather", "--moe-dispatcher allgather"),
    "moe_balance": ("capacity:1.25", "--moe-balance capacity:1.25"), "dp_mode": ("fsdp", "--dp-mode fsdp"),
    "alloc_conf": ("expandable_segments:True", "--alloc-conf expandable_segments:True"),
    "allocator": ("plan", "--allocator plan"), "rank_order": ("tp-cp-pp-dp", "--rank-order tp-cp-pp-dp"),
    "ep_overlap": (True, "--ep-overlap"), "kernel_fusion": ("eager", "--kernel-fusion eager"),
    "attention": ("materialised", "--attention materialised"), "grad_overlap": (False, "--no-grad-overlap"),
}


def test_every_fixed_key_is_named_by_its_flag_in_the_advice():
    """A review: --ep 1 --etp 1 (the reason nothing fit: Mixtral's experts whole on every GPU) were left out of 'not
    searched', as were --moe-dispatcher, --moe-balance, --dp-mode, --optimizer-offload and --rank-order. Every key
    request.py can put in ``fixed`` has its flag in the one table the advice reads, and the flag is the command's."""
    assert set(PINNED) == set(FIXING), "a new fixed key: add its pinned value and words here and to PINNABLE"
    assert set(FIXING) <= set(PINNABLE)
    options = {o for p in whatif_command.params for o in p.opts + p.secondary_opts}
    for key, (value, words) in PINNED.items():
        advice = "; ".join(not_searched(8, None, "any", {key: value}))
        if key == "metp_across_nodes":  # its own sentence, said only while the rings stay within a node
            assert "METP rings across nodes" not in advice
            continue
        assert words in advice, (key, advice)
        assert re.search(r"--[a-z-]+", words).group(0) in options, words
    plain = "; ".join(not_searched(8, None, "any", {}))  # nothing pinned: no pin named
    assert "other values than" not in plain and "other settings than" not in plain
    for key, value in (("dp_mode", "all"), ("rank_order", "all"), ("moe_dispatcher", "alltoall"),
                       ("moe_balance", "dropless"), ("allocator", "caching")):  # the unpinned search or default
        assert "--" + key.replace("_", "-") not in "; ".join(not_searched(8, None, "any", {key: value}))
    with pytest.raises(MemoError, match="PINNABLE"):
        not_searched(8, None, "any", {"made_up": 1})


def test_whatif_nothing_fits_names_the_pinned_expert_degrees():
    """The review's command: exit 3, and the advice names --ep 1 and --etp 1 beside --tp 1 and --zero 1."""
    r = run(["whatif", "--model", "mixtral-8x7b", "--gpus", "8", "--seq", "4K", "--profile", H100, "--ep", "1",
             "--etp", "1", "--tp", "1", "--zero", "1", "--policy", "full_recompute", "--no-plan", "--jobs", "1"])
    assert r.exit_code == 3, r.output
    line = next(x for x in r.output.splitlines() if "not searched:" in x)
    assert "other values than --tp 1, --zero 1, --ep 1, --etp 1 (drop them" in line


# 2. a capacity factor above experts / top-k

def test_capacity_load_is_capped_at_experts_over_top_k():
    """The executor's rule (memo_exec/moe/capacity.py: min(T, ceil(T k / E F))): the load factor is min(F, E/k)."""
    assert capacity_ceiling(8, 2) == 4 and capacity_load(8, 8, 2) == 4 and capacity_load(1.25, 8, 2) == 1.25
    assert parse_balance("capacity:8").load_factor(1e6, 8, experts=8, top_k=2) == 4
    assert parse_balance("capacity:1.5").load_factor(1e6, 8, experts=8, top_k=2) == 1.5
    assert capacity_why_not(parse_balance("capacity:4"), 8, 2) is None
    why = measured_why_not(parse_balance("capacity:4.5"), 8, 2)
    assert why is not None and "--moe-balance capacity:4 or less" in why and "8/2 = 4" in why
    assert capacity_why_not(Balance("dropless"), 8, 2) is None
    assert capacity_why_not(parse_balance("capacity:32"), 256, 8) is None  # DeepSeek-V3: E/k = 32


def test_whatif_and_export_refuse_a_capacity_above_experts_over_top_k(tmp_path):
    """A review: capacity:8 on Mixtral (E/k = 4) was priced at twice capacity:4's expert work and dispatch buffers,
    and exported as --moe-expert-capacity-factor 8. The what-if refuses it in one line naming the flag and the
    largest factor that means something; a plan file carrying it is refused by export (and every plan reader)."""
    base = ["whatif", "--model", "mixtral-8x7b", "--layers", "2", "--gpus", "8", "--profile", H100, "--tp", "1",
            "--ep", "8", "--dp", "8", "--zero", "1", "--pp", "1", "--seq", "4K", "--policy", "full_recompute",
            "--jobs", "1"]
    bad = run(base + ["--moe-balance", "capacity:8", "--no-plan"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1, bad.output
    assert "--moe-balance" in bad.output and "caps at experts / top-k = 8/2 = 4" in bad.output
    assert "give --moe-balance capacity:4 or less" in bad.output and "Traceback" not in bad.output
    ok = run(base + ["--moe-balance", "capacity:4", "--out", str(tmp_path / "c4")])
    assert ok.exit_code == 0, ok.output
    plan = json.loads((tmp_path / "c4" / "plan.json").read_text())
    assert plan["layout"]["moe_balance"] == "capacity:4"
    plan["layout"]["moe_balance"] = "capacity:8"  # a plan written before the check, or by hand
    (tmp_path / "c8.json").write_text(json.dumps(plan))
    exp = run(["export", str(tmp_path / "c8.json"), "--to", "megatron"])
    assert exp.exit_code == 2 and exp.output.count("\n") == 1, exp.output
    assert "give --moe-balance capacity:4 or less" in exp.output


# 3. the what-if's progress

class Stages:
    """A progress object as `memo_sim.cli.whatif.SearchStatus` is seen by `rank`: every stage's words kept."""

    def __init__(self):
        self.words: list[str] = []

    def stage(self, words: str) -> None:
        self.words.append(words)

    def __call__(self, done: int, total: int) -> None:
        self.words.append(f"simulating: {done} of {total}")


def small_model():
    return build_model("llama-3.1-8b", 4, None, None, None, None)


def test_pipeline_families_bounded_are_told_one_by_one():
    """A review: after 'bound search ...: 8 simulated, every bound left below the best simulated' the screen said
    nothing for 100 s while ~5,124 pipeline families' bounds ran. Each family bounded is told now, with how many
    the bound left out and where the search is (pp and layout of how many)."""
    said: list[str] = []
    res = candidates_for(small_model(), 4096, 8, load_profile(H100), policies=("full_recompute",),
                         pipeline_floor=lambda listed: 1e12, on_stage=said.append)
    unbuilt = res.searched["pipeline"]["not_built"]["families"]
    bounded = [w for w in said if w.startswith("bounding pipeline families")]
    counts = {int(re.search(r": (\d+) bounded", w).group(1)) for w in bounded}
    assert unbuilt > 1 and counts == set(range(1, unbuilt + 1))  # every family's bound is below the floor: each told
    assert bounded[-1].startswith(f"bounding pipeline families (tier 1, analytic): {unbuilt} bounded, {unbuilt} "
                                  f"below the best simulated")
    assert "layout" in bounded[-1] and "of" in bounded[-1]
    assert any(w.startswith("pricing the single-stage layouts x policies (tier 1, analytic): layout 1 of ")
               for w in said)


def test_last_progress_line_is_the_reports_tier2_line():
    """A review: the last line said 'the next bound 0.6% above the best simulated' where the report said 'the
    closest skipped bound is 0.4% below'. The bound search ends on the report's own tier-2 line; the line after the
    floor's bound search names what comes next instead of standing as finished."""
    st = Stages()
    res = rank(small_model(), 4096, 8, load_profile(H100), progress=st, jobs=1, policies=("full_recompute", "memo"))
    assert st.words[-1] == "done: " + res.tier2.line().removeprefix("tier 2: ")
    floor_done = [w for w in st.words if w.startswith("best simulated before the pipelines: ")]
    assert len(floor_done) == 1 and "next: bounding the micro-batch pipeline families" in floor_done[0]
    after = st.words[st.words.index(floor_done[0]) + 1]
    assert after.startswith(("bounding pipeline families", "pricing pipeline families", "checking pipeline layouts"))
