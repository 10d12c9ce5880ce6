"""The scenarios of the wait-removal test (`tests/test_wait_removal.py`) and the per-rank run that
removes one wait site in one of them. A module of its own so that a gloo rank imports the runs
without the test's scan of the package. Each scenario is a run of another mutation suite's case
(tests/test_race_mutations.py and the suites it draws on): tiny models, fp64, one step.
"""

from __future__ import annotations

import time

import torch


def _memo_offload(rank: int, world: int) -> None:
    from tests.test_race_mutations import _grads

    _grads()


def _sppo(delay_s: float = 0.0):
    def sppo(rank: int, world: int) -> None:
        import tests.test_sppo_exec as T

        T.run_case(rank, world, T._case(2, model=T.MODEL, delay_s=delay_s))  # tied embedding: pp 2 exchanges it
    return sppo


def _ring_cp(rank: int, world: int) -> None:
    from tests.test_dist_ring_attention import _rank

    _rank(rank, world, 0.0)


def _metp_ring(rank: int, world: int) -> None:
    from tests.test_race_mutations import _metp_ring

    _metp_ring(rank, world)


def _metp_layer(rank: int, world: int) -> None:
    from tests.test_race_mutations import _metp_layer

    _metp_layer(rank, world)


def _pipeline(rank: int, world: int) -> None:
    from tests.test_pipeline_exec_dist import run_case
    from tests.test_race_mutations import PIPE_CASE

    run_case(*PIPE_CASE)


def _pipeline_memo(rank: int, world: int) -> None:
    """MEMO on a pipeline rank: its rounding blocks and rule over the rank's units (`pipeline_rounding`)."""
    from tests.test_pipeline_exec_dist import run_case

    run_case(4, {"pp": 2}, "1f1b", "memo")


def _moe_ep(rank: int, world: int) -> None:
    from tests.test_exec_moe import run_case

    run_case(dict(dp=2, ep=2), "memo")


def _zero3(rank: int, world: int) -> None:
    """ZeRO 3 on two data-parallel ranks: each layer's all-gather issued one layer ahead (`GradSync.prefetching`)."""
    from memo_sim.layout.parallel import Layout
    from tests.dist_cases import loss_and_grads, plan_for

    loss_and_grads(plan_for(Layout(dp=2, zero=3), 128, "store_all"), rank)


# name -> (ranks, run), in the order a site's removal picks its scenario (cheapest first)
SCENARIOS = {
    "MEMO offload, one device": (1, _memo_offload),
    "SPPO, one rank": (1, _sppo()),
    "SPPO, two stages": (2, _sppo()),
    "SPPO, two stages, delayed sends": (2, _sppo(delay_s=0.01)),
    "ring CP, two ranks": (2, _ring_cp),
    "METP ring attention, two ranks": (2, _metp_ring),
    "METP layer and W_proj ring, two ranks": (2, _metp_layer),
    "pipeline 1F1B, two ranks": (2, _pipeline),
    "pipeline 1F1B under MEMO, two ranks": (2, _pipeline_memo),
    "MoE EP, two ranks": (2, _moe_ep),
    "ZeRO 3, two ranks": (2, _zero3),
}


def run(rank: int, world: int, scenario: str, site: str | None) -> dict:
    """One run of ``scenario`` on this rank with wait site ``site`` removed (None: none): its
    outcome, seconds, the calls removed and the calls per site."""
    import torch.distributed as dist

    from memo_exec.happens_before import RaceError
    from memo_exec.wait_switch import switched

    torch.set_num_threads(1)
    done = dist.new_group(list(range(world)))  # apart from the groups a refused run leaves transfers on
    race = False
    t0 = time.monotonic()
    with switched(site) as sw:
        try:
            SCENARIOS[scenario][1](rank, world)
            outcome = "ok"
        except Exception as e:  # noqa: BLE001 - returned to the test
            race = isinstance(e, RaceError)
            outcome = f"{type(e).__name__}: {e}"
    seconds = time.monotonic() - t0
    dist.barrier(group=done)  # no rank leaves (closing its connections) while its peer still runs
    return {"outcome": outcome, "race": race, "seconds": seconds, "skipped": sw.skipped, "counts": dict(sw.counts)}
