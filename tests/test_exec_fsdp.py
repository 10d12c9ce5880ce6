"""FSDP plans (``dp_mode: fsdp``) on the distributed executor, gloo on this CPU: dp4 sharded over
all four ranks with reshard_after_forward on and off, and dp4 HSDP (``fsdp_shard`` 2: 2 replicas x
2 shards), under store-all, full recompute and MEMO. Each case's loss and every parameter's
gradient, and every parameter after one optimizer step, against the single-process run of the same
global batch (fp64, the ZeRO tests' 1e-5 norm-wise tolerance, tests/test_dist_exec.py); the
all-gathers per step (two per layer resharded, one kept) and HSDP's replica all-reduces counted
from the ranks' recorded spans; refusals (one line, exit 2, naming the field)."""

from __future__ import annotations

import dataclasses
import functools

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from memo_exec.cli import cli  # noqa: E402
from memo_exec.distributed.runner import check_plan_for_world  # noqa: E402
from memo_exec.errors import ExecError  # noqa: E402
from memo_exec.runner import RunOptions  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.plan.schema import write_plan  # noqa: E402
from tests.dist_cases import SMALL, plan_for  # noqa: E402
from tests.dist_harness import spawn  # noqa: E402
from tests.exec_helpers import max_rel_error, time_limit  # noqa: E402

TOL = 1e-5  # as tests/test_dist_exec.py's ZeRO cases
SEQ = 128
# the sharded cases' model: SMALL's 4 layers at a quarter of its width (the gathers, reduce-scatters and replica
# all-reduces are per layer, whatever its size; SMALL's h=256 made the ranks' fp64 steps most of these tests' time)
MODEL = dataclasses.replace(SMALL, name="small-fsdp", hidden=64, heads=4, ffn=256, vocab=128)
FSDP = dict(dp=4, zero=3, dp_mode="fsdp")
CASES = [
    (dict(FSDP), "store_all"), (dict(FSDP), "full_recompute"), (dict(FSDP), "memo"),
    (dict(FSDP, reshard_after_forward=False), "store_all"),
    (dict(FSDP, reshard_after_forward=False), "full_recompute"),
    (dict(FSDP, reshard_after_forward=False), "memo"),
    (dict(FSDP, fsdp_shard=2), "store_all"), (dict(FSDP, fsdp_shard=2), "full_recompute"),
    (dict(FSDP, fsdp_shard=2), "memo"),
    (dict(FSDP, fsdp_shard=2, reshard_after_forward=False), "memo"),
    (dict(dp=4, zero=3), "memo"),  # today's ZeRO-3: the gather count to compare with
]


def limited(seconds: float):
    """Fail the test (`time_limit`) when it runs past ``seconds``; the gloo ranks have their own
    limit (`spawn`'s timeout)."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*a, **kw):
            with time_limit(seconds):
                return fn(*a, **kw)
        return run
    return wrap


def fsdp_rank_case(rank: int, world: int, cases) -> list:
    """Per case: the loss, rank 0's whole gradients and (after one optimizer step) weights, this
    rank's spans per collective ({op: {layer: count}}) and its shard / replicate sizes."""
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor

    out = []
    for lay_kw, pol in cases:
        lay = Layout(**lay_kw)
        plan = plan_for(lay, SEQ, pol, model=MODEL)
        ctx = build_context(lay, torch.device("cpu"))
        ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=1), ctx, DeviceSpec("cpu"))
        ex.allocate()
        rec = ex.step(0, optimizer=False)
        grads = ex.full_gradients()
        counts: dict[str, dict] = {}
        for e in rec.events:
            if e.op in ("param_all_gather", "grad_reduce_scatter", "grad_replica_all_reduce"):
                counts.setdefault(e.op, {}).setdefault(e.layer, 0)
                counts[e.op][e.layer] += 1
        ex.optimizer_step()
        params = ex.full_parameters()
        sizes = (ctx.size("shard"), ctx.size("replicate"), ex.sync.param_shards[1].numel())
        ex.close()
        out.append((rec.loss, grads if rank == 0 else None, params if rank == 0 else None, counts, sizes))
    return out


def _reference(pol: str, batch: int):
    """Single-process fp64: loss and gradients of the global batch, weights after one step."""
    from memo_exec.runner import Executor

    ex = Executor(plan_for(Layout(), SEQ, pol, batch=batch, model=MODEL),
                  RunOptions(device="cpu", dtype="fp64", steps=1))
    ex.allocate()
    try:
        loss = float(ex.forward_backward(0).item())
        ex.engine.synchronize()
        grads = {n: (ex.main_grads.main[p] if ex.main_grads is not None else p.grad).detach().clone()
                 for n, p in ex.gpt.named_parameters()}
        ex.optimizer_step()
        params = {n: p.detach().clone() for n, p in ex.gpt.named_parameters()}
    finally:
        ex.close()
    return loss, grads, params


# the tests of `runs` are in the slow selection: CI runs both selections side by side, and the default one
# was the longer by 200 s (CI of 2872740, 2026-11-29: default 1,623 s, slow 1,407 s)
@pytest.fixture(scope="module")
def runs():
    return spawn(fsdp_rank_case, 4, CASES, timeout=240)


@pytest.mark.slow
@limited(120)
def test_fsdp_and_hsdp_match_single_process(runs):
    refs = {}
    for i, (lay, pol) in enumerate(CASES):
        if pol not in refs:
            refs[pol] = _reference(pol, 4)
        ref_loss, ref_grads, ref_params = refs[pol]
        what = f"{lay} {pol}"
        losses = [r[i][0] for r in runs]
        assert max(losses) - min(losses) <= TOL * abs(ref_loss), (what, losses)
        assert abs(losses[0] - ref_loss) <= TOL * abs(ref_loss), (what, losses[0], ref_loss)
        err, name = max_rel_error(runs[0][i][1], ref_grads)
        assert err <= TOL, (what, "gradient", name, err)
        err, name = max_rel_error(runs[0][i][2], ref_params)
        assert err <= TOL, (what, "weights after the step", name, err)


@pytest.mark.slow
@limited(120)
def test_hsdp_shards_over_two_ranks_and_all_reduces_over_the_replicas(runs):
    layers = MODEL.layers
    for i, (lay, pol) in enumerate(CASES):
        S = lay.get("fsdp_shard") or 4
        for r in runs:
            shard, replicas, n = r[i][4]
            assert (shard, replicas) == (S, 4 // S), (lay, r[i][4])
            counts = r[i][3]
            rs = counts["grad_reduce_scatter"]
            assert rs == {None: 1, **{k: 1 for k in range(layers)}}, (lay, rs)
            ar = counts.get("grad_replica_all_reduce", {})
            assert ar == ({None: 1, **{k: 1 for k in range(layers)}} if S < 4 else {}), (lay, ar)
        # each rank's shard of a layer: 1/S of it
        assert runs[0][i][4][2] * S >= sum(v.numel() for k, v in runs[0][i][1].items() if k.startswith("layers.0."))


@pytest.mark.slow
@limited(120)
def test_all_gathers_per_step_two_per_layer_resharded_one_kept(runs):
    layers = MODEL.layers
    for i, (lay, pol) in enumerate(CASES):
        per_layer = 1 if lay.get("reshard_after_forward") is False else 2
        for r in runs:
            ag = r[i][3]["param_all_gather"]
            assert ag == {None: 1, **{k: per_layer for k in range(layers)}}, (lay, pol, ag)


# ---------------------------------------------------------------------------------- refusals
@limited(60)
def test_fsdp_combinations_the_executor_does_not_run_are_refused_naming_the_field(tmp_path):
    opts = RunOptions(device="cpu", dtype="fp64")
    plan = plan_for(Layout(dp=2, zero=2, dp_mode="fsdp"), SEQ, "memo")
    for lay, field in ((Layout(dp=2, zero=2, dp_mode="fsdp"), "zero 3"),
                       (Layout(dp=4, zero=3, dp_mode="fsdp", fsdp_shard=3), "shard group (3)")):
        with pytest.raises(ExecError, match=r"dp_mode fsdp: .*" + field.replace("(", r"\(").replace(")", r"\)")):
            check_plan_for_world(plan_for(lay, SEQ, "memo"), lay.gpus, opts)
    # through the command line: one line, exit 2, before any process starts
    p = write_plan(plan, tmp_path / "plan.json")
    r = CliRunner().invoke(cli, ["run", str(p), "--nproc", "2", "--device", "cpu", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "zero 3" in lines[0], r.output
    assert not (tmp_path / "o").exists()


COUNTED = ("param_all_gather", "grad_reduce_scatter")


def fsdp_micro_case(rank: int, world: int, cases) -> list:
    """Per case (layout, policy, sequences per replica, micro-batch): the loss, rank 0's whole gradients and this
    rank's `COUNTED` spans per layer ({op: {layer: count}})."""
    from tests.dist_cases import loss_and_grads

    out = []
    for lay_kw, pol, batch, micro in cases:
        plan = plan_for(Layout(**lay_kw), SEQ, pol, batch=batch, model=MODEL)
        plan.micro_batch = micro
        events: list = []
        loss, grads = loss_and_grads(plan, rank, events)
        counts: dict[str, dict] = {}
        for e in events:
            if e.op in COUNTED:
                counts.setdefault(e.op, {}).setdefault(e.layer, 0)
                counts[e.op][e.layer] += 1
        out.append((loss, grads, counts))
    return out


@limited(180)
def test_fsdp_and_hsdp_accumulate_micro_batches():
    """FSDP reduce-scatters each layer's gradient after each micro-batch's backward (HSDP: then all-reduces it over
    the replicas) and adds it into the shard (`memo_exec.distributed.zero`), as FSDP2 does under gradient
    accumulation (the executor refused these plans before): dp 4 with 2 micro-batches per replica, sharded over all
    four ranks and as HSDP (2 x 2, reshard_after_forward on and off); loss and every gradient as one process.
    The collectives per micro-batch are the simulator's (`memo_sim.engine.schedules.single_stage`): each layer's
    weights gathered before every micro-batch's forward, and before its backward where resharded (FSDP2 frees a kept
    layer after its backward; the simulator once gathered it in the first micro-batch only), its gradient
    reduce-scattered after every backward, and the embedding's and the head's after every micro-batch too (the tied
    embedding, the final norm and the head one unit and one bucket, in both since the FSDP review of 2026-12-01:
    torchtitan's fsdp.py shards them together; the executor once reduced them once a step)."""
    from memo_sim.engine.simulate import simulate
    from memo_sim.profile.loader import load_profile
    from tests.dist_cases import policy_of

    cases = [(dict(FSDP), "full_recompute", 2, 1), (dict(FSDP, fsdp_shard=2), "memo", 2, 1),
             (dict(FSDP, fsdp_shard=2, reshard_after_forward=False), "store_all", 2, 1),
             (dict(FSDP, reshard_after_forward=False), "full_recompute", 2, 1)]
    runs = spawn(fsdp_micro_case, 4, cases, timeout=240)
    for i, (lay, pol, batch, micro) in enumerate(cases):
        ref_loss, ref_grads, _ = _reference(pol, 4 * batch)
        assert abs(runs[0][i][0] - ref_loss) <= TOL * abs(ref_loss), (lay, pol, runs[0][i][0], ref_loss)
        err, name = max_rel_error(runs[0][i][1], ref_grads)
        assert err <= TOL, (lay, pol, name, err)
        m, layers = batch // micro, range(MODEL.layers)
        counts = runs[0][i][2]
        gathers = m * (2 if lay.get("reshard_after_forward", True) else 1)
        assert {k: counts["param_all_gather"][k] for k in layers} == {k: gathers for k in layers}, counts
        assert counts["grad_reduce_scatter"][None] == m and all(counts["grad_reduce_scatter"][k] == m for k in layers)
        sim = simulate(MODEL, Layout(**lay), batch, SEQ, policy_of(pol), load_profile("a800-80gb"), micro_batch=micro,
                       record=True, keep_timeline=False)
        sim_gathers = {k: sum(o.name == "allgather_weights" and o.layer == k for o in sim.ops) for k in layers}
        assert sim_gathers == {k: gathers for k in layers}, (lay, sim_gathers)
        assert sum(o.name.startswith("reducescatter") and o.layer is None for o in sim.ops) == m


# ------------------------------------------------------------------------ FSDP beside pipeline stages
PP_FSDP = dict(pp=2, dp=2, zero=3, dp_mode="fsdp", reshard_after_forward=False)


def fsdp_pipeline_case(rank: int, world: int, cases) -> list:
    """Per case (layout, schedule, policy, sequences per replica, training steps): the loss, rank 0's whole gradients,
    this rank's `COUNTED` spans per layer, its held layers, the estimate's model states against what its GradSync
    holds (the gathered layers' whole weights added at the peak), the losses of the training steps, the step's
    reduce-scatter and pipeline spans (op, layer, start, end) and the model layers of each chunk."""
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor

    out = []
    for lay_kw, schedule, pol, batch, steps in cases:
        plan = plan_for(Layout(**lay_kw), SEQ, pol, batch=batch, model=MODEL)
        plan.schedule, plan.micro_batch = schedule, 1
        ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=max(1, steps)),
                          build_context(plan.layout, torch.device("cpu")), DeviceSpec("cpu"))
        ex.allocate()
        rec = ex.step(0, optimizer=False)
        counts: dict[str, dict] = {}
        for e in rec.events:
            if e.op in COUNTED:
                counts.setdefault(e.op, {}).setdefault(e.layer, 0)
                counts[e.op][e.layer] += 1
        held = sum(u.nbytes for u in ex.sync.units)  # every unit gathered at the peak (kept to its chunk's end)
        states = (ex.estimate.terms["model_states"], ex.sync.state_bytes(), held)
        grads = ex.full_gradients()
        losses = []
        if steps:
            ex.zero_grads()
            losses = [ex.step(k).loss for k in range(steps)]
        spans = [(e.op, e.layer, e.start, e.end) for e in rec.events if e.op == "grad_reduce_scatter" or
                 e.stream == "pipeline"]
        chunks = [list(ex.schedule.chunk_layers(c)) for c in range(ex.schedule.vpp)]
        out.append((rec.loss, grads if rank == 0 else None, counts, list(ex.held), states, losses, spans, chunks))
        ex.close()
    return out


@limited(240)
def test_fsdp_beside_pipeline_stages_matches_single_process():
    """torchtitan's FSDP beside pipeline stages (`memo_sim.dp.fsdp`; the executor refused these plans): pp 2 x dp 2,
    1F1B and interleaved, store all, full recompute and MEMO, 2 and 4 micro-batches a replica. Loss and every gradient
    as one process (and a 3-step curve: the optimizer over the shards); each layer's weights gathered once a step
    and its gradient reduce-scattered once, after its chunk's last backward, as many as the simulator's ops of the same
    rank; the estimate's model states are what the rank holds at its peak (the whole gradients and every held layer's
    gathered weights beside the shards)."""
    from memo_sim.engine.simulate import simulate
    from memo_sim.profile.loader import load_profile
    from tests.dist_cases import policy_of, reference

    cases = [(dict(PP_FSDP), "1f1b", "store_all", 2, 3), (dict(PP_FSDP, vpp=2), "interleaved_1f1b", "memo", 2, 0),
             (dict(PP_FSDP), "1f1b", "full_recompute", 4, 0)]
    runs = spawn(fsdp_pipeline_case, 4, cases, timeout=300)
    for i, (lay, schedule, pol, batch, steps) in enumerate(cases):
        ref_loss, ref_grads, ref_losses = reference(SEQ, pol, 2 * batch, steps, model=MODEL)
        what = (lay, schedule, pol)
        assert abs(runs[0][i][0] - ref_loss) <= TOL * abs(ref_loss), (what, runs[0][i][0], ref_loss)
        err, name = max_rel_error(runs[0][i][1], ref_grads)
        assert err <= TOL, (what, name, err)
        for a, b in zip(runs[0][i][5], ref_losses, strict=True):
            assert abs(a - b) <= TOL * abs(b), (what, runs[0][i][5], ref_losses)
        sim = simulate(MODEL, Layout(**lay), batch, SEQ, policy_of(pol), load_profile("a800-80gb"), schedule=schedule,
                       micro_batch=1, record=True, keep_timeline=False)
        for r in runs:
            counts, held = r[i][2], r[i][3]
            one = {None: 1, **{k: 1 for k in held}}
            assert counts["param_all_gather"] == one and counts["grad_reduce_scatter"] == one, (what, counts)
            for op in ("allgather_weights", "reducescatter_grads"):
                sim_counts = {k: sum(o.name == op and o.layer == k for o in sim.ops) for k in held}
                assert sim_counts == {k: 1 for k in held}, (what, op, sim_counts)
            # each layer's reduce-scatter after its chunk's last backward; interleaved: chunk 1's before chunk 0's
            # last backward starts (beside the pipeline, not at the step's end)
            spans, chunks = r[i][6], r[i][7]
            pipe = {op: (s, e) for op, _, s, e in spans if op.startswith("bwd@")}
            for c, layers in enumerate(chunks):
                for op, layer, start, _ in spans:
                    if op == "grad_reduce_scatter" and layer in layers:
                        assert start >= pipe[f"bwd@c{c}.mb{batch - 1}"][1], (what, layer, spans)
                        if c == 1:
                            assert start <= pipe[f"bwd@c0.mb{batch - 1}"][0], (what, layer, spans)
            est, got, gathered = r[i][4]
            assert got["gradients"] == gathered  # whole gradients through the step
            assert abs(est - (sum(got.values()) + gathered)) <= 0.01 * est, (what, est, got, gathered)
