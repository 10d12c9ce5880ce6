"""A degree the request fixes that the framework never offers is the answer's reason (a review: --zero 1 under
megatron@2021 said 'does not offer tp4+sp-pp2-z1 (TP with sequence parallelism)')."""

from __future__ import annotations

from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.search.frameworks import get_framework


def test_a_fixed_zero_stage_the_framework_never_runs_is_named():
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--seq", "16K", "--policy", "full_recompute", "--tp",
                                 "4", "--zero", "1", "--framework", "megatron@2021", "--no-plan"])
    assert r.exit_code == 2 and r.output.strip().endswith("megatron@2021 does not offer ZeRO stage 1 (it offers 0)"), \
        r.output
    fw = get_framework("deepspeed")
    assert "ring context parallelism" in fw.fixed_why_not(cp=2) and fw.fixed_why_not(ulysses=8, zero=3) is None
