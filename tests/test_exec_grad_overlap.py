"""Data-parallel collectives beside the compute, as the simulator prices them (`memo_exec.distributed.zero`): each
layer's gradient reduction issued right after its gradient is complete and waited for where its buffer is next needed
(``layout.grad_overlap``), and ZeRO 1 / 2's updated weights gathered two layers ahead of the next step's forward
(``layout.param_gather`` overlap). On 2 gloo ranks (dp 2, fp64, 2 micro-batches a replica) against the
single-process run of the same global batch:

- ZeRO 0-3: the loss and every gradient match, and 3 training steps follow the single-process losses (a layer that
  read its stale weights, or a gradient landed before its reduction ended, would leave them);
- the overlap is there, read from the hooks rather than from timings: as each layer's backward of the last
  micro-batch starts (every micro-batch's under ZeRO 2 / 3) the reduction of the layer above is in flight, and as
  each layer's forward of a step after an optimizer step starts (ZeRO 1 / 2) its own gather was issued ahead;
- mutations: a reduction's wait removed (ZeRO 2: the next layer's backward writes the workspace it reads) and an
  ahead-issued gather's wait removed (ZeRO 1: the layer reads weights the gather has not written) are refused by the
  transfer guard on every rank; a schedule that runs a layer's backward more often than it said is refused in one
  line instead of losing that backward's gradient.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.dist_cases import SMALL, plan_for, reference  # noqa: E402
from tests.dist_harness import spawn  # noqa: E402
from tests.exec_helpers import max_rel_error, time_limit  # noqa: E402

TOL = 1e-5
SEQ = 128
STEPS = 3
CASES = [(0, ""), (1, ""), (2, ""), (3, ""), (2, "reduction not waited"), (1, "gather not waited"),
         (1, "schedule says 1 backward")]


def _rank(rank: int, world: int, cases) -> list:
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed import zero
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor
    from memo_exec.distributed.schedule import Schedule
    from memo_exec.errors import ExecError
    from memo_exec.runner import RunOptions
    from memo_sim.layout.parallel import Layout

    real = {k: getattr(zero.GradSync, k) for k in ("before_forward", "before_backward", "_finish_reduce", "_ready")}
    real_per_step = Schedule.layer_backwards_per_step
    out = []
    for z, mode in cases:
        seen: list[tuple] = []  # (step, phase, layer, units in flight as the layer starts)
        step_of = [0]

        def before_forward(self, i):
            seen.append((step_of[0], "fwd", i, frozenset(self.inflight)))
            real["before_forward"](self, i)

        def before_backward(self, i):
            real["before_backward"](self, i)
            seen.append((step_of[0], "bwd", i, frozenset(self.reducing)))

        def reduction_not_waited(self, index):  # the bug: the reduced slice landed without waiting for it
            issued = self.reducing.pop(index)
            self._land(self.units[index], issued.part)

        def gather_not_waited(self, u):  # the bug: the gather issued ahead forgotten, its buffer read as it is
            self.inflight.pop(u.index, None)

        zero.GradSync.before_forward, zero.GradSync.before_backward = before_forward, before_backward
        if mode == "reduction not waited":
            zero.GradSync._finish_reduce = reduction_not_waited
        if mode == "gather not waited":
            zero.GradSync._ready = gather_not_waited
        if mode == "schedule says 1 backward":
            Schedule.layer_backwards_per_step = lambda self: 1
        try:
            lay = Layout(dp=2, zero=z)
            plan = plan_for(lay, SEQ, "store_all", batch=2)
            plan.micro_batch = 1  # 2 micro-batches a replica
            ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=STEPS),
                              build_context(lay, torch.device("cpu")), DeviceSpec("cpu"))
            ex.allocate()
            n_ws = len(getattr(ex.sync, "workspaces", []))
            rec = ex.step(0, optimizer=False)
            grads = ex.full_gradients()
            ex.zero_grads()
            losses = []
            for k in range(STEPS):
                step_of[0] = k + 1
                losses.append(ex.step(k).loss)
            ex.close()
            out.append((rec.loss, grads if rank == 0 else None, losses, seen, None, n_ws))
        except ExecError as e:  # the guard's RaceError, or the schedule's refusal
            out.append((None, None, [], seen, f"{type(e).__name__}: {e}"))
        finally:
            for k, v in real.items():
                setattr(zero.GradSync, k, v)
            Schedule.layer_backwards_per_step = real_per_step
    return out


@pytest.fixture(scope="module")
def runs():
    with time_limit(300):
        return spawn(_rank, 2, CASES, timeout=240)


@pytest.fixture(scope="module")
def ref():
    return reference(SEQ, "store_all", 4, STEPS)


@pytest.mark.parametrize("z", [0, 1, 2, 3])
def test_overlapped_collectives_give_the_one_process_loss_gradients_and_curve(runs, ref, z):
    ref_loss, ref_grads, ref_losses = ref
    i = CASES.index((z, ""))
    for r in runs:
        assert r[i][4] is None, r[i][4]
        assert abs(r[i][0] - ref_loss) <= TOL * abs(ref_loss), (z, r[i][0], ref_loss)
    err, name = max_rel_error(runs[0][i][1], ref_grads)
    assert err <= TOL, (z, name, err)
    for k, (a, b) in enumerate(zip(runs[0][i][2], ref_losses)):
        assert abs(a - b) <= TOL * abs(b), (z, k, a, b)
    assert len(runs[0][i][2]) == STEPS


@pytest.mark.parametrize("z", [2, 3])
def test_the_workspaces_are_the_buckets_the_simulator_prices(runs, z):
    """ZeRO 2 / 3: as many layer workspaces as the simulator prices buckets of whole gradients
    (`memo_sim.cost.memory.unsharded_grad_units`: two under overlapped reductions)."""
    from memo_sim.cost.memory import unsharded_grad_units
    from memo_sim.layout.parallel import Layout

    i = CASES.index((z, ""))
    for r in runs:
        assert r[i][5] == unsharded_grad_units(Layout(dp=2, zero=z)) == 2


def _backwards(seen, step):
    return [(layer, flying) for s, phase, layer, flying in seen if s == step and phase == "bwd"]


@pytest.mark.parametrize("z", [0, 1, 2, 3])
def test_each_layers_reduction_runs_under_the_next_backward(runs, z):
    """As layer i's backward starts, layer i+1's reduction (unit i+2) is in flight: in the last micro-batch under
    ZeRO 0 / 1 (one reduction a step), in every micro-batch under ZeRO 2 / 3."""
    n = SMALL.layers
    i = CASES.index((z, ""))
    for r in runs:
        bwd = _backwards(r[i][3], 0)
        assert [layer for layer, _ in bwd] == list(range(n - 1, -1, -1)) * 2  # two micro-batches
        per_mb = [bwd[:n], bwd[n:]]
        for mb, rows in enumerate(per_mb):
            for layer, flying in rows:
                if layer == n - 1:
                    continue  # the top layer: nothing above it reduced yet
                overlapped = mb == 1 or z >= 2
                assert ((layer + 2) in flying) == overlapped, (z, mb, layer, sorted(flying))
                assert len(flying) <= 2, (z, mb, layer, sorted(flying))  # two reductions in flight at most


@pytest.mark.parametrize("z", [1, 2])
def test_updated_weights_are_gathered_ahead_of_the_next_forward(runs, z):
    """After an optimizer step, each layer's forward finds its own gather issued ahead (ZeRO 1 / 2); the first step
    has none to wait for, ZeRO 0 and 3 none of this kind."""
    n = SMALL.layers
    i = CASES.index((z, ""))
    for r in runs:
        seen = r[i][3]
        for step in range(STEPS + 1):
            fwd = [(layer, flying) for s, phase, layer, flying in seen if s == step and phase == "fwd"]
            first_mb = fwd[:n]
            assert [layer for layer, _ in first_mb] == list(range(n))
            stale = step >= 2  # step 0 (no optimizer) and step 1 (the first with one) start from whole weights
            for layer, flying in first_mb:
                assert ((layer + 1) in flying) == stale, (z, step, layer, sorted(flying))
            assert all(not flying for _, flying in fwd[n:]), (z, step)  # once a step: the later micro-batches


def test_a_reduction_landed_before_its_wait_is_refused(runs):
    i = CASES.index((2, "reduction not waited"))
    for r in runs:
        err = r[i][4]
        assert err is not None and err.startswith("RaceError") and "backward" in err and "gradients" in err, err


def test_a_layer_reading_weights_its_gather_has_not_written_is_refused(runs):
    i = CASES.index((1, "gather not waited"))
    for r in runs:
        err = r[i][4]
        assert err is not None and err.startswith("RaceError") and "layer 0's forward reads unit 1 weights" in err, err


def test_a_schedule_that_runs_more_backwards_than_it_said_is_refused(runs):
    i = CASES.index((1, "schedule says 1 backward"))
    for r in runs:
        err = r[i][4]
        assert err is not None and "layer_backwards_per_step is wrong" in err and "\n" not in err, err
