"""Review fixes (2026-12-01, long context): a plan over both GPU and pinned host memory ranks and reads as over both;
maxseq scans past a failure only where the caching allocator's replay failed it; Ulysses' backward all-to-alls in
the order they run."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.footprint import MemoryBreakdown
from memo_sim.model import get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile
from memo_sim.search.candidate import Candidate, binding_words

GiB = 2**30
TiB = 2**40
K = 1024
H100 = load_profile("h100-sxm5-80gb")
M8 = get_model("llama-3.1-8b")
H200_2M = ["whatif", "--model", "llama-3.1-70b", "--gpus", "64", "--profile", "h200-141gb", "--tp", "8", "--cp", "8",
           "--seq", "2M", "--policy", "memo", "--no-sp", "--no-plan", "--jobs", "1"]


def _run(args, code=0):
    r = CliRunner().invoke(cli, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def _memory(gpu_peak: float, host_node: float) -> MemoryBreakdown:
    return MemoryBreakdown(model_states_bytes=20 * GiB, skeletal_resident_bytes=0.0, rounding_buffer_bytes=40 * GiB,
                           lse_bytes=0.0, transient_peak_bytes=16 * GiB, transient_planned_bytes=16 * GiB,
                           transient_caching_allocator=16 * GiB, layer_boundary_bytes=4 * GiB,
                           classifier_peak_bytes=1 * GiB, peak_gpu_bytes=gpu_peak, gpu_capacity_bytes=78 * GiB,
                           host_bytes_per_gpu=host_node / 8, host_bytes_per_node=host_node,
                           host_capacity_bytes=1.64 * TiB)


def _candidate(gpu_peak: float, host_node: float) -> Candidate:
    def unpriced():
        raise AssertionError("a candidate that does not fit is ranked by its memory, not its estimate")

    return Candidate(M8, Layout(tp=8), get_policy("memo", alpha=0.0), 1, 512 * K, H100, unpriced,
                     _memory(gpu_peak, host_node))


# 1. over both memories

def test_a_plan_over_both_memories_ranks_farther_than_one_over_either():
    """The status stays OOM (the plan file's value) while both overflows count: 8 GiB over the GPU and 1.1 TiB over
    the host is farther than the same 1.1 TiB over the host alone, and than the 8 GiB over the GPU alone."""
    both = _candidate(86 * GiB, 2.74 * TiB)
    host = _candidate(70 * GiB, 2.74 * TiB)
    gpu = _candidate(86 * GiB, 1.0 * TiB)
    assert (both.status, host.status, gpu.status) == ("OOM", "OOHM", "OOM")
    assert both.memory.to_dict()["status"] == "OOM"  # the plan-file value unchanged
    assert both.memory.oom_by == gpu.memory.oom_by and both.memory.oohm_by == host.memory.oohm_by
    assert both.sort_key() > host.sort_key() and both.sort_key() > gpu.sort_key()
    assert sorted([both, host, gpu], key=Candidate.sort_key)[-1] is both
    assert both.memory.over_share == pytest.approx(gpu.memory.over_share + host.memory.over_share)


def test_a_row_and_its_words_name_both_overflows():
    """The row reads "OOM +8.00 GiB, host +1.10 TiB" and the binding words name the pinned host memory too."""
    from memo_sim.report.whatif_answer import status_cell

    both = _candidate(86 * GiB, 2.74 * TiB)
    assert status_cell(both) == "OOM +8.00 GiB, host +1.10 TiB"
    assert status_cell(_candidate(86 * GiB, 1.0 * TiB)) == "OOM +8.00 GiB"
    assert status_cell(_candidate(70 * GiB, 2.74 * TiB)) == "OOHM +1.10 TiB"
    words = binding_words(both)
    assert words.startswith("GPU memory: peak 86.00 GiB of 78.00 GiB") and "; pinned host memory too: " in words
    assert "2.74 TiB of 1.64 TiB usable per node" in words
    assert "pinned host" not in binding_words(_candidate(86 * GiB, 1.0 * TiB))


def test_whatif_h200_2m_closest_is_not_the_plan_over_both():
    """The reviewer's what-if: the ZeRO-0 row (75.42 GiB over the GPU and 1.11 TiB over the host) was named closest
    ahead of the ZeRO 1-3 rows over the host alone by the same 1.11 TiB; it now ranks last and reads over both."""
    out = _run(H200_2M, code=3).output
    first = out.splitlines()[0]
    assert "the closest, tp8-cp8-cudnn-blocks-flash " not in first, first
    assert re.search(r"the closest, tp8-cp8-z[123]-cudnn-blocks-flash memo", first), first
    assert "does not fit: pinned host memory: " in first, first
    rows = [ln for ln in out.splitlines() if re.match(r"\d+ +tp8-cp8", ln)]
    assert len(rows) == 7 and "tp8-cp8-cudnn-blocks-flash " in rows[-1], rows
    assert "OOM +75.42 GiB, host +1.11 TiB" in rows[-1], rows[-1]
    assert all("OOHM" in r for r in rows[:-1]), rows


def test_sppo_stage_reason_names_the_host_too():
    """SPPO's per-point reason (the plan's sppo grid): an OOM stage on a node over its pinned host says both."""
    from memo_sim.memplan.footprint import PipelineMemory, StageMemory

    st = StageMemory(0, _memory(80 * GiB, 4.1 * TiB), 1 * GiB, 0.0, 2 * GiB, "fwd s3 L12", 0.5 * TiB)
    reason = PipelineMemory([st], 4.1 * TiB).reason()
    assert reason.startswith("OOM on stage 0 at fwd s3 L12: 80.00 GiB of 78.00 GiB"), reason
    assert reason.endswith("; pinned host too: 4.10 TiB per node of 1.64 TiB"), reason
    assert "pinned host" not in PipelineMemory([StageMemory(0, _memory(80 * GiB, 1 * TiB), 1 * GiB, 0.0, 2 * GiB,
                                                            "fwd s3 L12", 0.1 * TiB)], 1 * TiB).reason()


# 2. maxseq past a failure: only where the caching allocator's replay failed it

@pytest.mark.parametrize("args", [
    ["--model", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--cp", "2", "--pp", "4", "--dp", "1", "--policy",
     "full_recompute", "--step", "128K"],
], ids=["pipeline-full-recompute"])
def test_maxseq_does_not_scan_past_a_failure_no_replay_decided(args):
    """A pipeline (not replayed) failed on paper: fit is monotone there, so nothing is scanned past the failure and
    the replay's words are not printed. (MEMO on tp1-cp8 was a case here until the h1 review: the replay decides a
    memory plan's fit too, so its failure is scanned past: tests/test_memplan_replay_fit.py.)"""
    out = _run(["maxseq", "--profile", "h100-sxm5-80gb", "--jobs", "1", *args]).output
    assert "past the failure" not in out and "replay is not monotone" not in out, out


def test_maxseq_past_failure_gate():
    """`_replay_failed`: a length fails in the replay only where some candidate fits on paper and is replayed."""
    from memo_sim.search.maxseq import _replay_failed

    c = _candidate(70 * GiB, 0.0)
    assert c.status == "OK"
    # MEMO: the replay decides a memory plan's fit too (its arena one request, the rest the caching allocator's;
    # until the h1 review its memory plan alone decided)
    assert _replay_failed([c])
    fr = Candidate(M8, Layout(tp=8), get_policy("full_recompute"), 1, 512 * K, H100, None, c.memory)
    assert _replay_failed([fr])
    assert not _replay_failed([Candidate(M8, Layout(tp=8), get_policy("full_recompute"), 1, 512 * K, H100, None,
                                         c.memory, schedule="1f1b")])
    assert not _replay_failed([Candidate(M8, Layout(tp=8), get_policy("full_recompute"), 1, 512 * K, H100, None,
                                         _memory(86 * GiB, 0.0))])
    assert not _replay_failed("no layout")


# 3. Ulysses' backward all-to-alls

@pytest.mark.parametrize("resend", [True, False])
def test_ulysses_backward_alltoalls_run_in_their_order(resend):
    """Backward: (q, k, v, out once more,) dout at the attention output's width before the kernel, and dq, dk, dv at
    q, k and v's width after it; the bytes of each all-to-all are the forward's."""
    from memo_sim.cost.layer_time import backward_costs, forward_costs

    lay = Layout(ulysses=8, ulysses_bwd_resend=resend)
    seq = 64 * K
    fwd = forward_costs(M8, lay, 1, seq, H100)
    bwd = backward_costs(M8, lay, 1, seq, H100)
    names = [c.name for c in bwd if c.name.startswith("alltoall") or c.kind == "attention"]
    want = (["alltoall_bwd_inputs"] if resend else []) + ["alltoall_attn", "attention", "alltoall_qkv"]
    assert names == want, names
    f = {c.name: c for c in fwd if c.name.startswith("alltoall")}
    b = {c.name: c for c in bwd if c.name.startswith("alltoall")}
    assert b["alltoall_attn"].nbytes == f["alltoall_attn"].nbytes < b["alltoall_qkv"].nbytes == f["alltoall_qkv"].nbytes
    assert [c.name for c in fwd if c.name.startswith("alltoall") or c.kind == "attention"] == \
        ["alltoall_qkv", "attention", "alltoall_attn"]
