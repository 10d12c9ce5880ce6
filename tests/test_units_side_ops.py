"""The coarse ``units`` detail of a micro-batch pipeline (`memo_sim.engine.schedules.stages.collapse_unit`) collapses
a chain with side ops too: ring CP's K/V exchange and the attention it runs beside stay ops of their own, each run of
chain ops between side ops becomes its compute and its collectives. Alone on the GPU the chain takes the same time,
so a pipeline without contention gives the op-by-op run's iteration and peak; with contention it stays close to it,
in fewer ops (before, such chains were kept whole: a CP 2 x PP 16 candidate of 512 micro-batches was 2.5 million
ops)."""

from __future__ import annotations

import pytest

from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.cost.opcost import critical_time
from memo_sim.engine.schedules.stages import collapse_unit
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile

H100 = load_profile("h100-sxm5-80gb")
A800 = load_profile("a800-80gb")
K = 1024


def test_a_ring_cp_chain_keeps_its_side_op_and_its_time():
    model = get_model("llama-3.1-405b")
    lay = Layout(tp=8, sp=True, cp=2, pp=16, dp=4, first_stage_layers=7, last_stage_layers=7)
    for phase, costs in (("fwd", forward_costs(model, lay, 1, 8 * K, H100)),
                         ("bwd", backward_costs(model, lay, 1, 8 * K, H100))):
        assert any(c.overlaps for c in costs)
        out = collapse_unit(costs, phase, lay, H100)
        assert len(out) < len(costs) / 2 + 1, [c.name for c in out]
        # the side ops and the ops they run beside are the chain's own, in the same order
        sides = [(c.name, c.overlaps) for c in costs if c.overlaps]
        assert [(c.name, c.overlaps) for c in out if c.overlaps] == sides
        assert [c.name for c in out if c.name == "attention"] == ["attention"]
        assert out[-1] == costs[-1]  # the phase's last op as it is (the rounding-buffer rule waits on it)
        assert critical_time(out) == pytest.approx(critical_time(costs), rel=1e-12)
        for stream in {c.stream for c in costs}:
            assert sum(c.seconds for c in out if c.stream == stream) == pytest.approx(
                sum(c.seconds for c in costs if c.stream == stream), rel=1e-12), stream
        names = [c.name for c in out]
        assert len(names) == len(set(names)), names  # each collapsed run named apart
    # a chain without side ops collapses as before: its compute, its collectives, its last op
    plain = Layout(tp=8, sp=True, pp=16, dp=8, first_stage_layers=7, last_stage_layers=7)
    out = collapse_unit(forward_costs(model, plain, 1, 8 * K, H100), "fwd", plain, H100)
    assert [c.name for c in out][0] == "layer_fwd" and len(out) == 3


@pytest.mark.parametrize("policy", [("full_recompute", None), ("memo", 0.3)])
def test_units_of_a_ring_cp_pipeline_price_the_op_by_op_run(policy):
    model = get_model("gpt-7b")
    lay = Layout(tp=2, sp=True, cp=2, pp=2)
    pol = get_policy(*policy)

    def run(detail, contention):
        return simulate(model, lay, 16, 32 * K, pol, A800, schedule="1f1b", micro_batch=1, keep_timeline=False,
                        detail=detail, contention=contention)

    ops, units = run("ops", False), run("units", False)
    assert units.n_ops < 0.6 * ops.n_ops
    assert units.iteration_s == pytest.approx(ops.iteration_s, rel=1e-9)
    assert units.peak_gpu_bytes == pytest.approx(ops.peak_gpu_bytes, rel=1e-12)
    ops, units = run("ops", True), run("units", True)
    assert units.ok and units.iteration_s == pytest.approx(ops.iteration_s, rel=0.005)
    assert units.peak_gpu_bytes == pytest.approx(ops.peak_gpu_bytes, rel=1e-9)


def test_beside_side_ops_marks_each_side_op_and_the_chain_ops_it_covers():
    """The side-op rule's one statement (`memo_sim.cost.opcost._walk`) tells the collapse which ops to keep: a side
    op of ``overlaps`` n covers the next n chain ops (side ops between them not counted), and an op after its cover
    is free again."""
    from memo_sim.cost.opcost import OpCost, beside_side_ops, chain_dependencies

    def op(name, overlaps=0):
        return OpCost(name, "gemm", "fwd", "comm" if overlaps else "compute", 1.0, overlaps=overlaps)

    costs = [op("a"), op("s1", 2), op("b"), op("s2", 1), op("c"), op("d"), op("e")]
    assert beside_side_ops(costs) == [False, True, True, True, True, False, False]
    # the same rule the dependencies follow: d waits for both side ops, which s1's cover of b and c and s2's of c make
    assert chain_dependencies(costs)[5] == [4, 1, 3]
    assert beside_side_ops([]) == [] and beside_side_ops([op("a"), op("b")]) == [False, False]
