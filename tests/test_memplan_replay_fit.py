"""A review: a MEMO plan (a static memory plan, `memo_sim.policy.base.uses_memory_plan`) reported as fitting at
maxseq's own answer (gpt-7b tp1-cp8-z3 on 8 A800s: 1376K) ran out of memory in the tool's own caching-allocator replay,
because the engine and maxseq did not replay memory-planned runs: the plan's arena holds its placed transients, the
rest (the layer chain, kept rows, gradients, the workspaces the plan does not place) goes through the caching
allocator, which fragments. Also: `memo-sim simulate` named a tied embedding's gradient sum on every pipeline stage
of an untied model."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.layout import Layout
from memo_sim.memplan.iteration_replay import engine_replay
from memo_sim.memplan.iteration_requests import ARENA_ID, iteration_stream
from memo_sim.model import get_model
from memo_sim.model.layer_graph import UNPLACED
from memo_sim.memplan.iteration_stream import MALLOC
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile

K = 1024
A800 = load_profile("a800-80gb")
M7 = get_model("gpt-7b")
CP8 = ["--model", "gpt-7b", "--gpus", "8", "--tp", "1", "--cp", "8", "--zero", "3", "--pp", "1", "--policy", "memo"]


def _layer_requests(stream, prefix: str) -> set[str]:
    """The names layer 0's ``prefix`` phase (``fwd`` / ``bwd``) asks the caching allocator for."""
    return {bid.split(".", 2)[2] for kind, bid, _s in stream.iteration
            if kind == MALLOC and bid.startswith(f"L0.{prefix}.")}


def test_the_replay_holds_the_arena_for_every_layout_and_the_rest_on_the_caching_allocator():
    """MEMO's arena (the paper plans a TP+SP+CP layer's transients) on one GPU and on a ring-CP layer alike; what the
    plan leaves unplaced (`memo_sim.model.layer_graph.UNPLACED`) is the caching allocator's."""
    memo = get_policy("memo", 0.3)
    for lay in (Layout(dp=8, zero=3), Layout(cp=8, zero=3)):
        s = iteration_stream(M7, lay, 1, 128 * K, memo)
        assert sum(bid == ARENA_ID for _k, bid, _s in s.static) == 1, lay
        assert _layer_requests(s, "bwd") <= set(UNPLACED["bwd"]), lay


def test_the_engine_replays_a_memory_planned_run_and_summary_reports_it():
    """`engine_replay` answered None for a memory plan and the summary's allocator block was a three-field stub."""
    r = engine_replay(M7, Layout(dp=8, zero=3), 1, 128 * K, get_policy("memo", 0.356), A800)
    assert r is not None and r.static_memory_plan and not r.oom
    out = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "128K", "--tp", "1", "--cp",
                                   "1", "--ulysses", "1", "--pp", "1", "--zero", "3", "--policy", "memo", "--json",
                                   "--no-plan"])
    assert out.exit_code == 0, out.output
    c = json.loads(out.output)["candidates"][0]
    a = c["simulated_allocator"]
    assert a["static_memory_plan"] is True and not a["oom"]
    assert {"cuda_mallocs", "peak_reserved_bytes", "memory_stats"} <= set(a)


def test_maxseq_of_a_memo_plan_answers_a_length_whose_replay_fits_and_the_next_does_not():
    """The review's case: maxseq's answer simulates OK, allocator replay included, and its next step runs out of
    memory in the replay, named as the caching allocator's fragmentation of the tensors outside the arena."""
    r = CliRunner().invoke(cli, ["maxseq", *CP8, "--step", "8K", "--jobs", "1", "--json"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.stdout)["answers"]
    best, nxt = a["max_seq_tokens"], a["next_seq_tokens"]
    assert nxt == best + 8 * K
    assert a["binding"].startswith("reserved memory (caching-allocator fragmentation of the tensors outside the "
                                   "memory plan's arena")

    def whatif(seq: int) -> dict:
        out = CliRunner().invoke(cli, ["whatif", *CP8, "--seq", str(seq), "--optimizer-offload", "--json",
                                       "--no-plan", "--jobs", "1"])
        assert out.exit_code in (0, 3), out.output  # 3: nothing fits
        return json.loads(out.output)["candidates"][0]

    fits, fails = whatif(best), whatif(nxt)
    assert fits["simulated_status"] == "OK" and fits["simulated_allocator"]["oom"] is False
    assert fits["simulated_allocator"]["static_memory_plan"] is True
    assert fails["simulated_status"] == "OOM" and fails["simulated_allocator"]["oom"] is True
    assert "fragmentation of the tensors outside the memory plan's arena" in json.dumps(fails["simulated_failure"])


def _stage_words(model: str) -> dict[int, bool]:
    from memo_sim.cli.simulate import _shared_embedding_words

    plan = SimpleNamespace(model=get_model(model), layout=Layout(tp=2, pp=4))
    return {s: "gradient sum" in _shared_embedding_words(plan, s) for s in range(4)}


def test_simulate_names_the_tied_embeddings_sum_only_on_a_tied_models_end_stages():
    """The review: every stage of untied llama-3.1-8b (pp 4) said "a tied embedding's gradient sum"."""
    assert _stage_words("llama-3.1-8b") == {0: False, 1: False, 2: False, 3: False}
    assert _stage_words("gpt-7b") == {0: True, 1: False, 2: False, 3: True}
    src = open("memo_sim/cli/simulate.py").read()
    assert not re.search(r'f"rest on its own collectives and copies, a tied embedding', src)
