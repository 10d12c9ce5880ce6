"""The embedding and the classifier split over the TP group by vocabulary rows (`memo_exec.vocab_parallel`),
as the simulator prices them (`memo_sim.cost.memory`: vocab / tp) and Megatron-LM runs them
(VocabParallelEmbedding, a column-parallel output layer, vocab_parallel_cross_entropy): each TP rank holds
Vp / tp rows of the vocabulary padded to a multiple of 128 x tp, and the loss and every gradient (the shards
gathered) are the one-process run's. A review measured +91% model states on a 32K-vocabulary toy at tp2 when
every TP rank held them whole."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from memo_sim.model.config import ModelConfig  # noqa: E402
from tests.dist_harness import spawn  # noqa: E402
from tests.exec_helpers import max_rel_error  # noqa: E402

TOL = 1e-5  # tests/test_dist_exec.py's
SEQ = 64
# vocabulary 300: 384 rows in one process, 512 at tp2 (256 a rank; rank 1's rows 300..511 padding)
TOY = ModelConfig("vocab-toy", 2, 128, 4, 256, vocab=300, dtype="fp32")
CASES = [(dict(tp=2, sp=sp), tied, mtp) for sp in (True, False) for tied in (True, False) for mtp in (0,)]
CASES += [(dict(tp=2, sp=True), False, 1), (dict(tp=2, sp=False), True, 1)]  # multi-token prediction


def _model(tied: bool, mtp: int) -> ModelConfig:
    return dataclasses.replace(TOY, tied_embeddings=tied, mtp_layers=mtp)


def _rank(rank: int, world: int, cases) -> list:
    """Per case: the summed loss, rank 0's whole gradients (`tests.dist_cases.loss_and_grads`' step) and this
    rank's embedding and classifier shapes."""
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor
    from memo_exec.runner import RunOptions
    from memo_sim.layout.parallel import Layout
    from tests.dist_cases import plan_for

    out = []
    for lay_kw, tied, mtp in cases:
        lay = Layout(**lay_kw)
        plan = plan_for(lay, SEQ, "store_all", model=_model(tied, mtp))
        ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=1),
                          build_context(lay, torch.device("cpu")), DeviceSpec("cpu"))
        ex.allocate()
        shapes = {n: tuple(p.shape) for n, p in ex.gpt.named_parameters(recurse=False) if n in ("wte", "lm_head")}
        loss = ex.step(0, optimizer=False).loss
        grads = ex.full_gradients()
        ex.close()
        out.append((loss, grads if rank == 0 else None, shapes))
    return out


def _check(cases, runs) -> None:
    from memo_sim.layout.parallel import Layout
    from tests.dist_cases import plan_for
    from tests.exec_helpers import one_process_run

    for i, (lay_kw, tied, mtp) in enumerate(cases):
        what = (lay_kw, "tied" if tied else "untied", f"mtp {mtp}")
        for r in runs:
            want = {"wte": (256, TOY.hidden)} | ({} if tied else {"lm_head": (256, TOY.hidden)})
            assert r[i][2] == want, (what, r[i][2])
        ref = plan_for(Layout(), SEQ, "store_all", batch=lay_kw.get("dp", 1), model=_model(tied, mtp))
        ref_loss, ref_grads, _ = one_process_run(ref)
        losses = [r[i][0] for r in runs]
        assert max(losses) - min(losses) <= TOL * abs(ref_loss), (what, losses)
        assert abs(losses[0] - ref_loss) <= TOL * abs(ref_loss), (what, losses[0], ref_loss)
        err, name = max_rel_error(runs[0][i][1], ref_grads)
        assert err <= TOL, (what, name, err)


def test_tp_ranks_hold_their_vocabulary_rows_and_match_one_process():
    """tp2 with and without SP, tied and untied, with multi-token prediction (whose modules embed with the
    model's embedding and join its classifier's rows)."""
    _check(CASES, spawn(_rank, 2, CASES, timeout=600))


@pytest.mark.slow  # four gloo ranks: the default selection is CI's longer one
def test_zero_units_hold_the_vocabulary_shards_four_ranks():
    """The embedding's unit (ZeRO 1 / 3 sharded over the data group) holds the TP rank's vocabulary rows; the
    loss and the gradients gathered over both are one process's."""
    cases = [(dict(tp=2, sp=True, dp=2, zero=3), False, 0), (dict(tp=2, sp=False, dp=2, zero=1), True, 0)]
    _check(cases, spawn(_rank, 4, cases, timeout=600))


BIG = ModelConfig("vocab-32k", 2, 256, 8, 1024, vocab=32768, dtype="fp32", tied_embeddings=False)


def _estimate(rank: int, world: int, lay_kw) -> dict:
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor
    from memo_exec.runner import RunOptions
    from memo_sim.layout.parallel import Layout
    from tests.dist_cases import plan_for

    lay = Layout(**lay_kw)
    ex = DistExecutor(plan_for(lay, SEQ, "store_all", model=BIG), RunOptions(device="cpu", steps=1),
                      build_context(lay, torch.device("cpu")), DeviceSpec("cpu"))
    ex.allocate()
    out = {"estimate": ex.estimate.terms["model_states"], "allocated": sum(ex.sync.state_bytes().values())}
    ex.close()
    return out


@pytest.mark.parametrize("lay_kw", [dict(tp=2, sp=True), dict(tp=2, sp=False, dp=1, zero=0)])
def test_tp2_model_states_are_the_simulators(lay_kw):
    """At tp2 on a 32K-vocabulary toy the embedding and the classifier are most of the parameters: the estimate's
    model states are the simulator's (the executor's norms whole on every TP rank, which the simulator splits, the
    only difference: < 1%) and what the rank allocates."""
    from memo_exec.compare import sim_memory_breakdown
    from memo_sim.layout.parallel import Layout
    from tests.dist_cases import plan_for

    got = spawn(_estimate, 2, lay_kw, timeout=300)
    plan = plan_for(Layout(**lay_kw), SEQ, "store_all", model=BIG)
    sim = sim_memory_breakdown(plan, BIG.layers)["model_states_bytes"]
    for r in got:
        assert abs(r["estimate"] - sim) <= 0.01 * sim, (r, sim)
        assert r["estimate"] == r["allocated"], r
