"""Review fixes in memo-exec's run reports: SPPO's memory terms against the SPPO stage's breakdown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memo_exec.compare import sim_memory_breakdown
from memo_sim.plan.schema import read_plan

PROFILE = str(Path(__file__).resolve().parents[1] / "hardware_profiles" / "h100-sxm5-80gb.yaml")
MEMO_SIM = str(Path(sys.executable).parent / "memo-sim")


@pytest.mark.parametrize("pp", [2])
def test_sppo_memory_terms_are_the_sppo_stage_breakdown(tmp_path, pp):
    """Bug 1: an SPPO plan's model_states term is stage 0's (the plan's own breakdown where stage 0 is the
    fullest), not the single-stage breakdown's whole-model states (0.049 GiB against 0.025 GiB)."""
    out = tmp_path / "sppo"
    cmd = [MEMO_SIM, "whatif", "--layers", "4", "--hidden", "256", "--heads", "8",
           "--vocab", "512", "--dtype", "fp32", "--seq", "1K", "--profile", PROFILE, "--gpus", str(pp),
           "--pp", str(pp), "--policy", "sppo", "--subseqs", "4", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0 or not (out / "plan.json").exists():
        pytest.skip(f"memo-sim whatif failed here: {r.stderr[-400:]}")
    plan = read_plan(out / "plan.json")
    from memo_sim.api import load_profile
    from memo_sim.memplan.footprint import sppo_memory

    stage0 = sppo_memory(plan.model, plan.layout, plan.batch, plan.seq_tokens, plan.policy,
                         load_profile(plan.profile)).stages[0].breakdown.to_dict()
    got = sim_memory_breakdown(plan, plan.model.layers)
    assert got is not None
    assert got["model_states_bytes"] == pytest.approx(stage0["model_states_bytes"])
    assert got["skeletal_resident_bytes"] == pytest.approx(stage0["skeletal_resident_bytes"])


def _tied_grad_span(rank: int, world: int) -> list[tuple[str, str]]:
    """One SPPO step of a tied-embedding model on this rank (stage = rank) with a recorder: its spans'
    (op, stream) on dp_comm."""
    import torch

    from memo_exec.measure import Recorder
    from memo_exec.model import GPT
    from memo_exec.sppo.pipeline import StageRunner
    from memo_sim.cost.sppo import partition_bounds, stage_pieces
    from memo_sim.model.config import ModelConfig

    m, seq = ModelConfig("tied", 4, 32, 4, 64, vocab=61), 64
    torch.manual_seed(0)
    gpt = GPT(m, m.layers, torch.device("cpu"), torch.float32)
    gpt.init_(3)
    pieces = stage_pieces(m, 1, partition_bounds(m, 1, seq, 4, "flops"), world, False)
    rec = Recorder(torch.device("cpu"), rank=rank)
    runner = StageRunner(gpt, rank, pieces, 1, seq, [0.5] * 4, list(range(world)), torch.device("cpu"),
                         classifier_chunk=24, timer=rec)
    try:
        for _, p in runner.parameters():
            p.grad = torch.zeros_like(p)
        g = torch.Generator().manual_seed(1)
        inp, tgt = (torch.randint(0, m.vocab, (1, seq), generator=g) for _ in range(2))
        rec.begin_step(0)
        runner.step(inp, tgt)
        step = rec.end_step(runner.streams)
    finally:
        runner.close()
    return [(e.op, e.stream) for e in step.events if e.stream == "dp_comm"]


def test_sppo_tied_embedding_grad_is_a_dp_comm_span():
    """Bug 2: the tied embedding's gradient exchange of stages 0 and pp-1 is a ``dp_comm`` span, as the 1F1B
    executor's and the simulator's ``sum_shared_embedding_grad`` (the report read measured 0 against 3.3 ms)."""
    from tests.dist_harness import spawn

    per_rank = spawn(_tied_grad_span, 2, timeout=120)
    for spans in per_rank:
        assert [op for op, _s in spans] == ["sum_shared_embedding_grad"]
