"""A Megatron TP rank follows the plan's static memory plan (level 1) in memo-exec's distributed executor (h3,
2026-12-01): the rank's layer is dry-run on the meta device through its flavour (`MegatronTP.sizes_only_compute`,
the SP gathers' and partial sums' buffers requested, nothing communicated), the simulator's names of the TP buffers
are mapped to the executor's (`memo_exec.distributed.tp.megatron.PLAN_NAMES`) and `validate_memory_plan` checks the
placement; where it fits, the rank places its scratch in one arena and the launcher says nothing; where it does not,
the rank keeps the caching allocator and the launcher's note names the tensor that does not fit.

memo-sim's own tp plans fit since h4 (2026-12-01): the executor's column-parallel backward allocates the reduce's
output (d_ln2, d_ln1) after freeing the tensors the simulator frees first (memo_exec/layer.py ``LayerCompute.backward``
and ``_backward_attention``, in memo_sim/memplan/trace_gen.py ``_layer_backward_trace``'s order)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.plan.schema import read_plan  # noqa: E402
from tests.dist_harness import spawn  # noqa: E402
from tests.exec_helpers import assert_matches_reference, one_process_run, plan_step_on_rank  # noqa: E402

TOY = ["--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "512", "--dtype", "fp32", "--seq", "512"]
TOL = 1e-5


def _sim_plan(out, sp: str):
    """memo-sim's MEMO plan for tp 2 with (``sp`` "--sp") or without ("--no-sp") sequence parallelism (its level 1:
    the TP rank's layer, SP gathers included, memo_sim/memplan/trace_gen.py)."""
    from memo_sim.cli import cli as sim

    r = CliRunner().invoke(sim, ["whatif", *TOY, "--gpus", "2", "--tp", "2", sp, "--policy", "memo",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


@pytest.fixture(scope="module")
def tp2_sp_plan(tmp_path_factory):
    return _sim_plan(tmp_path_factory.mktemp("tp2sp"), "--sp")


@pytest.fixture(scope="module")
def reference(tp2_sp_plan):
    """The single-process fp64 run of the same model, batch and policy: its loss and gradients."""
    ref_plan = read_plan(tp2_sp_plan)
    ref_plan.layout, ref_plan.gpus, ref_plan.memory_plan = Layout(), 1, None
    loss, grads, _ = one_process_run(ref_plan)
    return loss, grads


def _both_orders_plan(plan_file, out):
    """The plan with its level-1 offsets placed again, first fit by size, so that two tensors share bytes only where
    they are never live together in the simulator's order (memo_sim/memplan/trace_gen.py, what the plan check holds
    a plan to) nor in the executor's (`memo_exec.trace.record_layer_trace` of the TP rank's layer on the meta device):
    a level 1 with the simulator's names and sizes that both orders accept, placed otherwise than the simulator
    places it (memo-sim's own: `test_memo_sims_own_tp2_sp_plan_is_followed_and_one_that_does_not_fit_is_not`)."""
    from memo_exec.distributed.tp.megatron import PLAN_NAMES
    from memo_exec.trace import record_layer_trace
    from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace

    doc = json.loads(plan_file.read_text())
    plan = read_plan(plan_file)
    ex = record_layer_trace(plan, device="meta", dtype="fp32", target="cpu")
    sim = {"fwd": layer_forward_trace(plan.model, plan.layout, plan.batch, plan.seq_tokens),
           "bwd": layer_backward_trace(plan.model, plan.layout, plan.batch, plan.seq_tokens, plan.policy)}
    for ph, body in doc["memory_plan"]["phases"].items():
        names = set(body["offsets"])
        to_sim = {e: n for n, e in PLAN_NAMES[ph].items()}  # an executor name the map renames to is not the plan's
        mine = {b.name: to_sim.get(b.name, None if b.name in PLAN_NAMES[ph] else b.name)
                for b in ex.buffers if b.phase == ph}
        size = {b.name: int(b.size) for b in sim[ph].buffers if b.name in names}
        spans = [[(b.name, b.lower, b.upper) for b in sim[ph].buffers if b.name in names],
                 [(mine[b.name], b.lower, b.upper) for b in ex.buffers if b.phase == ph and mine[b.name] in names]]
        assert {n for n, _, _ in spans[1]} == names == set(size), ph  # every planned tensor in both orders
        assert all(int(b.size) == size[mine[b.name]] for b in ex.buffers  # and of the same size
                   if b.phase == ph and mine[b.name] in names), ph
        together = {(a, c) for sp in spans for a, lo, hi in sp for c, lo2, hi2 in sp
                    if a != c and lo < hi2 and lo2 < hi}  # live together in either order
        placed: dict[str, int] = {}
        for n in sorted(names, key=lambda n: (-size[n], n)):
            off = 0
            for c in sorted((c for c in placed if (n, c) in together), key=placed.get):
                if off < placed[c] + size[c] and placed[c] < off + size[n]:
                    off = placed[c] + size[c]
            placed[n] = off
        body["offsets"] = placed
        body["peak_bytes"] = max(placed[n] + size[n] for n in names)
    path = out / "plan-both-orders.json"
    path.write_text(json.dumps(doc))
    return path


def _followed(results) -> dict:
    """Every rank placed its layer scratch at the plan's offsets (no TP buffer left to the caching allocator, nothing
    placed between steps): rank 0's JSON ``memory_plan``."""
    for _, _, used, not_used, placed in results:
        assert not_used is None and used is not None, not_used
        assert placed == []
        assert used["offset_scale"] == 2  # the fp32 plan's offsets for the fp64 run
        assert not [u for u in used["unplaced_by_plan"] if u.endswith(("_gathered", "_partial"))]
    return results[0][2]


def test_a_tp2_sp_rank_places_its_layer_scratch_at_the_plans_offsets(tp2_sp_plan, reference, tmp_path):
    """Fails before h3: every TP rank's scratch came from the caching allocator ("no memory plan for a layer split
    by tp 2") and the launcher said the plan was not followed."""
    from memo_exec.distributed.runner import memory_plan_not_followed

    path = _both_orders_plan(tp2_sp_plan, tmp_path)
    plan = read_plan(path)
    assert memory_plan_not_followed(plan, device="cpu") is None  # no note at the start of the run
    results = spawn(plan_step_on_rank, 2, str(path), timeout=120)
    used = _followed([r[0] for r in results])
    assert used["placed"]["fwd"] == ["fc2", "fc2_partial", "ln1_gathered", "ln2_gathered", "proj", "proj_partial"]
    assert {"d_h1_gathered", "dy_gathered", "ln1_gathered", "ln2_gathered"} <= set(used["placed"]["bwd"])
    assert used["plan_names"]["fwd"] == {"qkv_input_gathered": "ln1_gathered", "fc1_input_gathered": "ln2_gathered"}
    assert used["plan_names"]["bwd"]["d_proj_gathered"] == "d_h1_gathered"
    assert_matches_reference(results[0][0], reference, TOL)


def _overlapping(plan_file, out):
    """The plan with its level-1 bwd:d_ln2 moved onto bwd:d_ln2_partial (the reduce-scatter's input and output, live
    together in either order): a level 1 that does not fit the rank's layer."""
    doc = json.loads(plan_file.read_text())
    offs = doc["memory_plan"]["phases"]["bwd"]["offsets"]
    offs["d_ln2"] = offs["d_ln2_partial"]
    path = out / "plan-overlap.json"
    path.write_text(json.dumps(doc))
    return path


def test_memo_sims_own_tp2_sp_plan_is_followed_and_one_that_does_not_fit_is_not(tp2_sp_plan, reference, tmp_path):
    """Fails before h4: memo-sim's own tp-2 SP level 1 was refused (``bwd:d_ln2 overlaps bwd:ln2_gathered``: the
    executor allocated the reduce-scatter's output d_ln2 while d_fc1 and the re-gathered ln2, which the simulator
    frees first, were live) and every rank's scratch came from the caching allocator. A hand-edited level 1 that
    does not fit still sends the ranks to the caching allocator, the run and the launcher naming the tensor."""
    from memo_exec.distributed.runner import memory_plan_not_followed

    bad = _overlapping(tp2_sp_plan, tmp_path)
    assert memory_plan_not_followed(read_plan(tp2_sp_plan), device="cpu") is None
    line = memory_plan_not_followed(read_plan(bad), device="cpu")
    assert line and "not followed" in line and "tp 2 rank's layer" in line and "bwd:d_ln2 [" in line, line
    assert "\n" not in line
    results = spawn(plan_step_on_rank, 2, str(tp2_sp_plan), str(bad), timeout=120)
    used = _followed([r[0] for r in results])
    assert {"d_ln1", "d_ln1_partial", "d_ln2", "d_ln2_partial", "ln2_gathered"} <= set(used["placed"]["bwd"])
    assert_matches_reference(results[0][0], reference, TOL)
    for r in results:  # the plan that does not fit: the caching allocator, the reason naming the tensor
        _, _, used, not_used, _ = r[1]
        assert used is None and "does not fit a tp 2 rank's layer" in not_used and "bwd:d_ln2 [" in not_used, not_used
    assert_matches_reference(results[0][1], reference, TOL)


def test_memo_sims_own_tp2_plan_without_sp_is_followed(reference, tmp_path):
    """Fails before h4: without SP the simulator frees d_q/d_k/d_v before the all-reduce's output d_ln1, the
    executor allocated d_ln1 first (``bwd:d_ln1 overlaps bwd:d_q``)."""
    from memo_exec.distributed.runner import memory_plan_not_followed

    path = _sim_plan(tmp_path, "--no-sp")
    assert not read_plan(path).layout.sp
    assert memory_plan_not_followed(read_plan(path), device="cpu") is None
    (r0,), (r1,) = spawn(plan_step_on_rank, 2, str(path), timeout=120)
    used = _followed([r0, r1])
    assert {"d_ln1", "d_ln1_partial", "d_ln2", "d_ln2_partial"} <= set(used["placed"]["bwd"])
    assert not [n for ph in used["placed"].values() for n in ph if n.endswith("_gathered")]  # no SP gathers
    assert_matches_reference(r0, reference, TOL)
