"""Ring CP and Ulysses ranks follow the plan's static memory plan (level 1) in memo-exec's distributed executor (h1,
2026-12-02), alone and beside Megatron TP, as a TP rank does since h3 (tests/test_dist_exec_split_arena.py).

The ring's and the all-to-alls' buffers come from the layer's scratch under the simulator's names
(memo_sim/memplan/trace_gen.py ``attention_buffers``; memo_exec/distributed/attention.py): the ring's
``cp_kv_double_buffer``, ``cp_out_accumulator_fp32``, ``cp_dkv_in_flight`` and, where the plan accumulates the ring's
gradients in fp32 (``ring_dkv_fp32``), ``cp_dq_accumulator_fp32``; Ulysses' ``ulysses_qkv_alltoall``,
``ulysses_attn_alltoall``, ``ulysses_dattn_alltoall``, ``ulysses_dqkv_alltoall`` and, where its backward re-sends q, k,
v and out (``ulysses_bwd_resend``), ``ulysses_qkv_resend_alltoall`` and ``ulysses_attn_resend_alltoall``. The rank's
layer is dry-run on the meta device with its ring / Ulysses (`memo_exec.distributed.runner.rank_layer_requests`,
nothing communicated), the plan checked against it, and the rank places its scratch in one arena."""

from __future__ import annotations

import dataclasses
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
RING = {"cp_kv_double_buffer", "cp_out_accumulator_fp32", "cp_dkv_in_flight", "cp_dq_accumulator_fp32"}
ULYSSES = {"ulysses_qkv_alltoall", "ulysses_attn_alltoall", "ulysses_dattn_alltoall", "ulysses_dqkv_alltoall",
           "ulysses_qkv_resend_alltoall", "ulysses_attn_resend_alltoall"}


def _sim_plan(out, *split: str):
    """memo-sim's MEMO plan for the split (its framework ``any``: fp32 ring accumulators, Ulysses re-sending)."""
    from memo_sim.cli import cli as sim

    gpus = 1
    for k in range(0, len(split), 2):
        gpus *= int(split[k + 1]) if split[k] in ("--cp", "--ulysses", "--tp") else 1
    r = CliRunner().invoke(sim, ["whatif", *TOY, "--gpus", str(gpus), *split, "--policy", "memo", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu")
    return {"cp2": _sim_plan(out / "cp2", "--cp", "2"), "u2": _sim_plan(out / "u2", "--ulysses", "2"),
            "u2tp2": _sim_plan(out / "u2tp2", "--ulysses", "2", "--tp", "2", "--sp"),
            "cp2tp2": _sim_plan(out / "cp2tp2", "--cp", "2", "--tp", "2", "--sp")}


@pytest.fixture(scope="module")
def reference(plans):
    """The single-process fp64 run of the same model, batch and policy: its loss and gradients."""
    ref_plan = read_plan(plans["cp2"])
    ref_plan.layout, ref_plan.gpus, ref_plan.memory_plan = Layout(), 1, None
    loss, grads, _ = one_process_run(ref_plan)
    return loss, grads


def _requests_and_plan(plan_file):
    """Per phase: the rank's recorded scratch requests {executor name: bytes} (the plan's dtype, math on CPU) and the
    plan's level-1 tensors {executor name: bytes} (the simulator's trace sizes of the placed names, mapped by the
    flavour's ``plan_names``)."""
    from memo_exec.device import DTYPES
    from memo_exec.distributed.runner import LayoutContext, meta_attention, rank_layer_requests
    from memo_exec.distributed.tp import flavour_for
    from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace

    plan = read_plan(plan_file)
    lay, micro = plan.layout, plan.micro_batch or plan.batch
    flavour = flavour_for(lay.tp_mode)(LayoutContext(lay), plan.model)
    rec = rank_layer_requests(plan, flavour, plan.model, micro, DTYPES[plan.model.dtype],
                              meta_attention(lay, plan.model, "math"))
    traces = {"fwd": layer_forward_trace(plan.model, lay, micro, plan.seq_tokens),
              "bwd": layer_backward_trace(plan.model, lay, micro, plan.seq_tokens, plan.policy)}
    out = {}
    for ph, body in plan.memory_plan.phases.items():
        rename = flavour.plan_names().get(ph, {})
        sizes = {b.name: int(b.size) for b in traces[ph].buffers}
        asked: dict[str, int] = {}
        for op, p, name, nb in rec.events:
            if op == "malloc" and p == ph:
                asked.setdefault(name, nb)
        out[ph] = (asked, {rename.get(n, n): sizes[n] for n in body.offsets})
    return out


@pytest.mark.parametrize("case", ["cp2", "u2", "u2tp2", "cp2tp2"])
def test_the_ranks_requests_are_the_plans_level_1(plans, case):
    """Fails before h1: the ring's and the all-to-alls' buffers were torch.empty, not the layer's scratch (no
    ``cp_*`` / ``ulysses_*`` request), and the split rank was not dry-run (`rank_layer_requests` did not exist)."""
    from memo_exec.distributed.runner import memory_plan_not_followed

    ours = RING if case.startswith("cp") else ULYSSES
    for ph, (asked, placed) in _requests_and_plan(plans[case]).items():
        assert set(placed) <= set(asked), (ph, sorted(set(placed) - set(asked)))
        assert {n: asked[n] for n in placed} == placed, ph  # every placed tensor requested at the plan's size
        assert {n for n in asked if n in ours} == {n for n in placed if n in ours}, ph  # all theirs placed
        assert {n for n in placed if n in ours}, ph
    assert memory_plan_not_followed(read_plan(plans[case]), device="cpu") is None  # no note at the start


def _followed(results, ours: set[str]) -> dict:
    """Every rank placed its layer scratch at the plan's offsets (the ring's / all-to-alls' buffers among the
    placed, none left to the caching allocator, nothing placed between steps): rank 0's JSON ``memory_plan``."""
    for _, _, used, not_used, placed in results:
        assert not_used is None and used is not None, not_used
        assert placed == []
        assert used["offset_scale"] == 2  # the fp32 plan's offsets for the fp64 run
        assert not [u for u in used["unplaced_by_plan"] if u.split(":")[1] in ours]
    used = results[0][2]
    assert {n for ph in used["placed"].values() for n in ph if n in ours}
    return used


def _too_small(plan_file, out):
    """The plan with its level-1 bwd ``cp_dkv_in_flight`` moved to run 512 bytes past the arena (the largest phase
    peak): a level 1 too small for the rank's layer."""
    from memo_sim.memplan.trace_gen import layer_backward_trace

    plan = read_plan(plan_file)
    size = next(int(b.size) for b in layer_backward_trace(plan.model, plan.layout, plan.micro_batch or plan.batch,
                                                          plan.seq_tokens, plan.policy).buffers
                if b.name == "cp_dkv_in_flight")
    doc = json.loads(plan_file.read_text())
    phases = doc["memory_plan"]["phases"]
    arena = max(int(p["peak_bytes"]) for p in phases.values())
    phases["bwd"]["offsets"]["cp_dkv_in_flight"] = arena - size + 512
    path = out / "plan-too-small.json"
    path.write_text(json.dumps(doc))
    return path


def test_cp2_ranks_follow_the_plan_and_one_too_small_is_refused(plans, reference, tmp_path):
    """Fails before h1: every ring CP rank's scratch came from the caching allocator ("no memory plan for a layer
    split by cp 2"). A level 1 too small for the ring's dK/dV buffers sends the ranks to the caching allocator, the
    launcher's note and the run naming the tensor in one line."""
    from memo_exec.distributed.runner import memory_plan_not_followed

    bad = _too_small(plans["cp2"], tmp_path)
    line = memory_plan_not_followed(read_plan(bad), device="cpu")
    assert line and "not followed" in line and "cp 2 rank's layer" in line and "bwd:cp_dkv_in_flight" in line, line
    assert "\n" not in line
    results = spawn(plan_step_on_rank, 2, str(plans["cp2"]), str(bad), timeout=120)
    used = _followed([r[0] for r in results], RING)
    assert {"cp_kv_double_buffer", "cp_out_accumulator_fp32"} <= set(used["placed"]["fwd"])
    assert {"cp_kv_double_buffer", "cp_dkv_in_flight", "cp_dq_accumulator_fp32"} <= set(used["placed"]["bwd"])
    assert_matches_reference(results[0][0], reference, TOL)
    for r in results:
        _, _, used, not_used, _ = r[1]
        assert used is None and "does not fit a cp 2 rank's layer" in not_used, not_used
        assert "bwd:cp_dkv_in_flight" in not_used and "runs past the arena" in not_used, not_used
    assert_matches_reference(results[0][1], reference, TOL)


def test_ulysses2_ranks_follow_the_plan(plans, reference):
    """Fails before h1: every Ulysses rank's scratch came from the caching allocator ("no memory plan for a layer
    split by ulysses 2")."""
    results = spawn(plan_step_on_rank, 2, str(plans["u2"]), timeout=120)
    used = _followed([r[0] for r in results], ULYSSES)
    assert {"ulysses_qkv_alltoall", "ulysses_attn_alltoall"} <= set(used["placed"]["fwd"])
    assert {"ulysses_qkv_resend_alltoall", "ulysses_attn_resend_alltoall", "ulysses_dattn_alltoall",
            "ulysses_dqkv_alltoall"} <= set(used["placed"]["bwd"])
    assert_matches_reference(results[0][0], reference, TOL)


def test_ulysses2_tp2_sp_ranks_follow_the_plan(plans, reference):
    """Ulysses beside Megatron TP with SP on 4 ranks: the TP buffers (plan names mapped) and the all-to-alls' in one
    arena per rank."""
    results = spawn(plan_step_on_rank, 4, str(plans["u2tp2"]), timeout=150)
    used = _followed([r[0] for r in results], ULYSSES)
    assert {"ln1_gathered", "ulysses_qkv_alltoall"} <= set(used["placed"]["fwd"])
    assert used["plan_names"]["fwd"]["qkv_input_gathered"] == "ln1_gathered"
    assert_matches_reference(results[0][0], reference, TOL)


def test_a_ulysses_that_keeps_its_head_sharded_tensors_stays_on_the_caching_allocator(plans):
    """ulysses_bwd_resend false (DeepSpeed's): the forward's head-sharded q, k, v, out live to the backward, past the
    forward's arena where the plan's level 1 places them: the one-line note says so."""
    from memo_exec.distributed.runner import memory_plan_not_followed

    plan = read_plan(plans["u2"])
    plan.layout = dataclasses.replace(plan.layout, ulysses_bwd_resend=False)
    line = memory_plan_not_followed(plan, device="cpu")
    assert line and "ulysses 2 keeping its head-sharded" in line and "\n" not in line, line
