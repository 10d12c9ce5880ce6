"""[fidelity] --framework restricts the search to what a framework offers; maxseq finds the
longest length that fits (the same answer as a linear scan) and says what binds next."""

import json

import pytest
from click.testing import CliRunner

from memo_sim.api import get_model, load_profile
from memo_sim.cli import cli
from memo_sim.errors import MemoError
from memo_sim.search.maxseq import _fits, _ranked, max_seq
from memo_sim.search.whatif import candidates_for

K = 1024
A800 = load_profile("a800-80gb")
M7 = get_model("gpt-7b")


def test_megatron_offers_tp_sp_cp_dp_with_distributed_optimizer_and_no_offload():
    res = candidates_for(M7, 256 * K, 16, A800, framework="megatron")
    assert res.candidates
    for c in res.candidates:
        lay = c.layout
        assert lay.ulysses == 1 and lay.zero <= 1 and (lay.sp or lay.tp == 1)
        assert c.policy.name in ("store_all", "full_recompute", "selective_recompute")
    assert any("megatron does not offer" in why for _, why in res.rejected_layouts)


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
    r = CliRunner().invoke(cli, ["whatif", "--seq", "512K", "--framework", "megatron", "--simulate-top", "1",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "megatron's best:" in r.output and "memo's best:" in r.output
    r = CliRunner().invoke(cli, ["whatif", "--seq", "512K", "--framework", "megatron", "--simulate-top", "1",
                                 "--json", "--no-plan"])
    obj = json.loads(r.output)
    assert obj["framework"] == "megatron" and obj["memo_best"]["policy"] == "memo"


@pytest.mark.parametrize("policy", ["full_recompute", "memo"])
def test_maxseq_equals_a_linear_scan(policy):
    step = 256 * K
    ans = max_seq(M7, 8, A800, policy, step=step, simulate=False)
    k = 1
    while _fits(_ranked(M7, k * step, 8, A800, policy, "any")):
        k += 1
    assert ans.max_seq == (k - 1) * step and ans.next_seq == k * step
    assert ans.binding.startswith(("GPU memory", "pinned host memory"))


def test_maxseq_command(tmp_path):
    r = CliRunner().invoke(cli, ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--policy", "memo", "--json"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.output)["answers"]
    assert a["max_seq_tokens"] >= 1024 * K and 0 < a["mfu"] < 1 and a["binding"]
    r = CliRunner().invoke(cli, ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--step", "0"])
    assert r.exit_code == 2


def test_a_simulated_failure_ranks_after_every_fit_without_a_throughput():
    """The event simulator can fail a candidate the analytic tier passed (e.g. the caching
    allocator's fragmentation): it has no throughput and must sort after the fits, not crash."""
    res = candidates_for(M7, 256 * K, 8, A800, policies=("full_recompute",))
    first = res.candidates[0]
    first.simulated = {"status": "OOM", "iteration_s": None, "mfu": None, "tgs_tokens_per_gpu_s": None}
    ranked = sorted(res.candidates, key=lambda c: c.sort_key())
    ok = [c for c in ranked if c.status == "OK"]
    assert ranked[:len(ok)] == ok and first in ranked[len(ok):]
