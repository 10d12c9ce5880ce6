"""[moe] Expert loads as each framework routes them (`memo_sim.layout.moe_balance`): ``forced`` is equal counts
(torchtitan's round-robin debug routing), ``random`` Megatron-Core's --moe-router-force-load-balancing (random
router logits: the loads of uniform random routing, not equal ones), each offered where the framework has it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.layout.moe_balance import parse_balance
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.plan.executor_scope import moe_why_not
from memo_sim.search.frameworks import get_framework


def test_random_logits_load_the_ranks_as_a_uniform_router_does():
    """Megatron's forced balancing replaces the gate's logits by normal noise per token: each rank's load is a
    random draw, its busiest rank above the mean as memo prices a uniform router's (dropless); equal loads are
    torchtitan's round-robin (factor 1)."""
    copies = 4096 * 8
    rand, drop, forced = (parse_balance(b).load_factor(copies, 8) for b in ("random", "dropless", "forced"))
    assert forced == 1.0 and rand == drop > 1.02
    assert parse_balance("random").load_factor(copies, 1) == 1.0
    assert parse_balance("capacity:1.25").load_factor(copies, 1) == 1.25


@pytest.mark.parametrize("framework,offers,lacks", [("megatron", ("random", "capacity:1.5"), ("forced",)),
                                                    ("torchtitan", ("forced",), ("random", "capacity:1.5")),
                                                    ("deepspeed", ("capacity:1.5",), ("forced", "random"))])
def test_each_framework_offers_the_loads_it_can_route(framework, offers, lacks):
    fw = get_framework(framework)
    base = Layout(dp=8, zero=3, dp_mode="fsdp", ep=4) if framework == "torchtitan" else Layout(dp=8, ep=4)
    for b in offers + ("dropless",):
        assert fw.why_not(replace(base, moe_balance=b)) is None, b
    for b in lacks:
        assert f"expert loads {b}" in fw.why_not(replace(base, moe_balance=b)), b


@pytest.mark.parametrize("framework,balance", [("megatron", "forced"), ("torchtitan", "capacity:1.25"),
                                               ("torchtitan", "random")])
def test_whatif_refuses_loads_the_framework_cannot_route_in_one_line(framework, balance):
    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen2-moe-a2.7b", "--gpus", "8", "--seq", "8K", "--profile",
                                 "h100-sxm5-80gb", "--framework", framework, "--moe-balance", balance])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"--moe-balance {balance}" in lines[0] and "Traceback" not in r.output, r.output


def test_whatif_header_names_the_loads_priced():
    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen2-moe-a2.7b", "--gpus", "8", "--seq", "8K", "--profile",
                                 "h100-sxm5-80gb", "--framework", "megatron", "--moe-balance", "random", "--top", "1",
                                 "--no-plan"])  # nothing written into the working folder (a review found plan.json there)
    assert r.exit_code == 0, r.output
    assert ("expert loads: random router logits (Megatron-Core's --moe-router-force-load-balancing): the busiest EP "
            "rank of uniform random routing") in r.output
    assert "-random" in r.output  # the layout label carries it


def test_executor_runs_every_balance_the_simulator_prices():
    from memo_sim.layout.moe_balance import KINDS
    from memo_sim.plan.executor_scope import EXEC_BALANCES

    assert set(EXEC_BALANCES) == set(KINDS)
    for balance in ("forced", "random", "dropless", "capacity:1.25", "capacity:0.5"):
        assert moe_why_not(get_model("qwen2-moe-a2.7b"), Layout(dp=8, ep=4, moe_balance=balance)) is None, balance
