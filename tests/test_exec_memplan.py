"""Memory plan on: the layer's transient tensors live at planned offsets in one arena.

Plans come from (a) the executor's own layer trace (`memo-exec trace`, meta device, bf16 sizes, so
the executor scales the offsets x2 for fp32) placed by memo_sim's greedy DSA heuristic, and (b)
memo-sim's own trace generator (its tensor names, some of which this executor accepts but does not
place). Gradients must match the reference as without a plan; a bad plan is refused before
anything is allocated."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from click.testing import CliRunner

from memo_exec.arena import ArenaScratch
from memo_exec.cli import cli
from memo_exec.errors import MemoryPlanError
from memo_exec.runner import Executor, RunOptions
from tests.exec_helpers import executor_grads, make_plan, max_rel_error, reference_grads, time_limit
from memo_exec.trace import memory_plan_from_trace, record_layer_trace
from memo_sim.layout.parallel import Layout
from memo_sim.request_trace import RequestTrace
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace, unplaced_in
from memo_sim.model.config import ModelConfig
from memo_sim.plan.schema import write_plan
from memo_sim.policy import get_policy

torch.set_num_threads(1)

MODEL = ModelConfig("exec-test", 4, 256, 8, 1024, vocab=512)
SEQ = 2048
TOL = 1e-5


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(180):
        yield


def own_plan(policy, model=MODEL, seq=SEQ, backend="math"):
    plan = make_plan(model, seq, policy, backend=backend)
    plan.memory_plan = memory_plan_from_trace(record_layer_trace(plan, "meta"))
    return plan


@pytest.fixture(scope="module")
def reference():
    _, _, ex = executor_grads(make_plan(MODEL, SEQ, get_policy("store_all")))
    return reference_grads(ex)


@pytest.mark.parametrize("policy", [get_policy("store_all"), get_policy("full_recompute"),
                                    get_policy("memo", 0.3)], ids=lambda p: p.label())
def test_own_plan_places_every_scratch_tensor(policy, reference):
    plan = own_plan(policy)
    loss, grads, ex = executor_grads(plan)
    assert isinstance(ex.scratch, ArenaScratch)
    assert ex.arena_plan.scale == 2  # bf16 plan, fp32 run
    assert ex.scratch.unplanned == set() and ex.unplanned == []
    assert ex.scratch.arena.numel() == 2 * plan.memory_plan.arena_bytes
    ref_loss, ref_grads = reference
    assert abs(loss - ref_loss) <= TOL * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= TOL, f"{worst}: {err:.2e}"


def test_arena_views_really_alias_the_arena():
    plan = own_plan(get_policy("memo", 0.3), ModelConfig("s", 3, 64, 4, 256, vocab=128), 256)
    ex = Executor(plan, RunOptions(device="cpu", dtype="fp64"))
    ex.allocate()
    base = ex.scratch.arena.data_ptr()
    t = ex.scratch.get("proj", (256, 64), torch.float64)
    assert t.data_ptr() == base + ex.arena_plan.offsets["fwd"]["proj"]
    ex.scratch.free("proj")
    ex.close()


def sim_plan(policy, model=MODEL, seq=SEQ) -> dict:
    """A plan placed on the simulator's own level-1 traces, with its list of what is not placed."""
    ft = layer_forward_trace(model, Layout(), 1, seq)
    bt = layer_backward_trace(model, Layout(), 1, seq, policy)
    mp = memory_plan_from_trace(RequestTrace(ft.buffers + bt.buffers, name="sim"))
    mp["phases"]["fwd"]["unplaced"] = unplaced_in(ft, "fwd")
    mp["phases"]["bwd"]["unplaced"] = unplaced_in(bt, "bwd")
    return mp


@pytest.mark.parametrize("policy", [get_policy("memo", 0.3), get_policy("full_recompute")],
                         ids=lambda p: p.label())
def test_simulator_named_plan_is_accepted(policy, reference):
    plan = make_plan(MODEL, SEQ, policy, memory_plan=sim_plan(policy))
    loss, grads, ex = executor_grads(plan)
    placed = ex.arena_plan.offsets
    assert {"proj", "fc2"} <= set(placed["fwd"])
    assert {"d_act", "d_fc1", "d_ln2", "d_attn", "d_q", "d_k", "d_v", "d_ln1", "rc_proj"} <= set(placed["bwd"])
    assert {"fwd:y", "bwd:dy", "bwd:dx", "bwd:d_h1_part"} <= set(ex.arena_plan.ignored)
    ref_loss, ref_grads = reference
    assert abs(loss - ref_loss) <= TOL * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= TOL, f"{worst}: {err:.2e}"


def test_bilevel_planner_plan_if_available():
    planner = pytest.importorskip("memo_sim.memplan.planner")
    pytest.importorskip("memo_sim.memplan.solve")
    m = ModelConfig("s", 3, 64, 4, 256, vocab=128)
    pol = get_policy("memo", 0.3)
    bp = planner.plan_memory(m, Layout(), 1, 256, pol, time_limit_s=5.0)
    plan = make_plan(m, 256, pol, memory_plan=bp.to_plan_json())
    loss, grads, ex = executor_grads(plan, dtype="fp64")
    ref_loss, ref_grads = reference_grads(ex)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= 1e-10, f"{worst}: {err:.2e}"


SMALL = ModelConfig("s", 3, 64, 4, 256, vocab=128)


def _bad(mutate) -> dict:
    mp = own_plan(get_policy("memo", 0.3), SMALL, 256).memory_plan
    mp = copy.deepcopy(mp.to_dict())
    mutate(mp)
    return mp


@pytest.mark.parametrize("mutate,msg", [
    (lambda mp: mp["phases"]["fwd"]["offsets"].__setitem__("qkv_workspace", 0), "qkv_workspace"),
    (lambda mp: mp["phases"].__setitem__("classifier", {"peak_bytes": 0, "offsets": {}}), "unknown phase"),
    (lambda mp: mp["phases"]["bwd"]["offsets"].__setitem__("d_k", mp["phases"]["bwd"]["offsets"]["d_q"]), "overlaps"),
    (lambda mp: [ph.__setitem__("peak_bytes", 1024) for ph in mp["phases"].values()], "past the arena"),
], ids=["unknown-name", "unknown-phase", "overlap", "too-small"])
def test_bad_plans_are_refused_before_allocation(mutate, msg, monkeypatch):
    plan = make_plan(SMALL, 256, get_policy("memo", 0.3), memory_plan=_bad(mutate))
    allocated = []
    monkeypatch.setattr(Executor, "allocate", lambda self: allocated.append(1))
    with pytest.raises(MemoryPlanError, match=msg):
        Executor(plan, RunOptions(device="cpu"))
    assert not allocated


def test_cli_bad_memory_plan_exits_2(tmp_path):
    plan = make_plan(SMALL, 256, get_policy("memo", 0.3),
                     memory_plan=_bad(lambda mp: mp["phases"]["fwd"]["offsets"].__setitem__("bogus", 0)))
    p = write_plan(plan, tmp_path / "plan.json")
    r = CliRunner().invoke(cli, ["run", str(p), "--device", "cpu", "--steps", "1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "bogus" in lines[0]
    assert not (tmp_path / "o").exists()


def test_trace_command_and_write_plan(tmp_path):
    plan = make_plan(SMALL, 256, get_policy("memo", 0.3))
    p = write_plan(plan, tmp_path / "plan.json")
    r = CliRunner().invoke(cli, ["trace", str(p), "--device", "cpu", "--out", str(tmp_path / "t.json"),
                                 "--write-plan", str(tmp_path / "plan2.json")])
    assert r.exit_code == 0, r.output
    tr = RequestTrace.read_json(tmp_path / "t.json")
    names = {(b.phase, b.name) for b in tr.buffers}
    assert ("fwd", "proj") in names and ("bwd", "rc_proj") in names and ("bwd", "d_qkv") not in names
    sizes = {b.name: b.size for b in tr.buffers if b.phase == "fwd"}
    assert sizes["proj"] == 256 * 64 * 4  # fp32 on CPU
    mp = json.loads((tmp_path / "plan2.json").read_text())["memory_plan"]
    assert set(mp["phases"]) == {"fwd", "bwd"} and mp["arena_bytes"] > 0
    r = CliRunner().invoke(cli, ["run", str(tmp_path / "plan2.json"), "--device", "cpu", "--steps", "1",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    meas = json.loads((tmp_path / "o" / "measured.json").read_text())
    assert meas["meta"]["memory_plan"]["offset_scale"] == 1


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_plans_of_very_short_models_run_with_their_memory_plan(tmp_path, layers):
    """[robust-runs] the what-if's MEMO plan of a 1-3 layer model runs with its memory plan: a model
    whose layers are all kept recomputes nothing, so its plan places no recompute scratch; and a
    plan without the ``unplaced`` list (an earlier release's) still runs."""
    from memo_sim.cli import cli as sim_cli
    from memo_sim.plan.schema import read_plan

    r = CliRunner().invoke(sim_cli, ["whatif", "--layers", str(layers), "--hidden", "128", "--heads", "4", "--ffn", "512",
                                 "--vocab", "512", "--dtype", "fp32", "--seq", "1K", "--gpus", "1", "--policy", "memo",
                                 "--alpha", "0.5", "--jobs", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "plan.json").read_text())
    for ph in d["memory_plan"]["phases"].values():
        ph["unplaced"] = {}
    # the previous release placed the attention kernels' own workspaces too (the issue's refusal:
    # 'attention_workspace' is not a tensor this executor's layer allocates in fwd)
    d["memory_plan"]["phases"]["fwd"]["offsets"]["attention_workspace"] = 0
    d["memory_plan"]["phases"]["bwd"]["offsets"]["attention_bwd_workspace"] = 0
    old = tmp_path / "old.json"
    old.write_text(json.dumps(d))
    for f in (tmp_path / "plan.json", old):
        ex = Executor(read_plan(f), RunOptions(device="cpu", steps=1))
        try:
            res = ex.run()
            assert res.steps and ex.arena_plan is not None  # the transients sat at the plan's offsets
        finally:
            ex.close()


def test_fewer_layers_of_a_memo_plan_run_with_its_memory_plan(tmp_path):
    """A review (2026-11-30): `memo-exec run --layers 2` of a 4-layer MEMO plan was refused ('rc_proj' is not a tensor
    this executor's layer allocates in bwd): a 2-layer run recomputes nothing, so its layer never requests the plan's
    re-run tensors. They are named as not placed, and the rest of the plan places the layer's scratch."""
    from memo_sim.cli import cli as sim_cli
    from memo_sim.plan.schema import read_plan

    r = CliRunner().invoke(sim_cli, ["whatif", "--layers", "4", "--hidden", "128", "--heads", "4", "--ffn", "512",
                                     "--vocab", "512", "--dtype", "fp32", "--seq", "1K", "--gpus", "1", "--policy",
                                     "memo", "--alpha", "0.3", "--jobs", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    ex = Executor(read_plan(tmp_path / "plan.json"), RunOptions(device="cpu", steps=1, layers=2))
    try:
        res = ex.run()
        assert res.steps and ex.arena_plan is not None
        assert any("(--layers) re-runs nothing" in why for why in ex.arena_plan.ignored.values()), \
            ex.arena_plan.ignored
        assert all(k.split(":")[1].startswith("rc_") for k, why in ex.arena_plan.ignored.items() if "--layers" in why)
    finally:
        ex.close()
