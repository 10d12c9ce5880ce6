"""ZeRO 3's all-gathers issued one layer ahead (`memo_exec.distributed.zero.GradSync.prefetching`), as the
simulator prices them (two layers' weights gathered at a time, the next one's gather under the layer that runs):
on 2 gloo ranks (dp 2, ZeRO 3, fp64) against the single-process run of the same batch.

- the loss and every gradient match under store all, full recompute and MEMO; each layer's gather after the first
  is issued before the layer below it finishes its forward (and, in the backward, before the layer above finishes
  its backward), and while a layer runs its forward the next one's weights are whole beside its own;
- a gather's buffer is read only after its wait: with every ahead-issued gather deferred to its wait (the buffer
  NaN until then) the run still matches; with that wait removed the transfer guard (`memo_exec.happens_before`)
  refuses the step where the layer reads the weights, and with the guard off too the loss is wrong (the bug the
  test is for: a layer reading weights its all-gather has not written yet).
"""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")

from tests.dist_cases import SMALL, plan_for, reference  # noqa: E402
from tests.dist_harness import spawn  # noqa: E402
from tests.exec_helpers import max_rel_error, time_limit  # noqa: E402

TOL = 1e-5
SEQ = 128
CASES = [("store_all", ""), ("full_recompute", ""), ("memo", ""), ("store_all", "deferred"),
         ("store_all", "deferred, no wait"), ("store_all", "deferred, no wait, no guard")]


class _Deferred:
    """An all-gather that runs at its wait (every rank defers it alike, so the collectives stay in order)."""

    def __init__(self, gather, out, inp, group) -> None:
        self.args = gather, out, inp, group

    def wait(self) -> None:
        gather, out, inp, group = self.args
        gather(out, inp, group=group)


def _rank(rank: int, world: int, cases) -> list:
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed import zero
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor
    from memo_exec.happens_before import RaceError
    from memo_exec.runner import RunOptions
    from memo_sim.layout.parallel import Layout

    real_gather, real_ready, real_before = zero.all_gather_single, zero.GradSync._ready, zero.GradSync.before_forward
    out = []
    for pol, mode in cases:
        whole_at_forward: list[tuple[int, int]] = []  # (layer, layer units whole) as each layer's forward starts

        def before_forward(self, i):
            real_before(self, i)
            whole_at_forward.append((i, sum(1 for u in self.units[1:] if u.numel and self._gathered(u))))

        def deferred(out_t, inp, group=None, async_op=False):
            if not async_op:
                return real_gather(out_t, inp, group=group)
            out_t.fill_(float("nan"))
            return _Deferred(real_gather, out_t, inp, group)

        def no_wait(self, u):  # the bug: the prefetch forgotten, its buffer read as it is
            self.inflight.pop(u.index, None)

        zero.GradSync.before_forward = before_forward
        zero.all_gather_single = deferred if mode else real_gather
        zero.GradSync._ready = no_wait if "no wait" in mode else real_ready
        os.environ["MEMO_EXEC_RACE_CHECK"] = "0" if "no guard" in mode else "1"
        try:
            lay = Layout(dp=2, zero=3)
            plan = plan_for(lay, SEQ, pol)
            ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=1),
                              build_context(lay, torch.device("cpu")), DeviceSpec("cpu"))
            ex.allocate()
            rec = ex.step(0, optimizer=False)
            grads = ex.full_gradients()
            ex.close()
        except RaceError as e:
            out.append((str(e), None, [], whole_at_forward))
            continue
        finally:
            zero.GradSync.before_forward, zero.GradSync._ready = real_before, real_ready
            zero.all_gather_single = real_gather
            os.environ.pop("MEMO_EXEC_RACE_CHECK", None)
        spans = [(e.op, e.layer, e.phase, e.start, e.end) for e in rec.events
                 if e.op == "param_all_gather" or (e.phase in ("fwd", "bwd") and e.stream == "compute")]
        out.append((rec.loss, grads if rank == 0 else None, spans, whole_at_forward))
    return out


@pytest.fixture(scope="module")
def runs():
    with time_limit(300):
        return spawn(_rank, 2, CASES, timeout=240)


def test_ahead_gathered_weights_give_the_one_process_loss_and_gradients(runs):
    for i, (pol, mode) in enumerate(CASES):
        if "no wait" in mode:
            continue
        ref_loss, ref_grads, _ = reference(SEQ, pol, 2)
        loss = runs[0][i][0]
        assert abs(loss - ref_loss) <= TOL * abs(ref_loss), (pol, mode, loss, ref_loss)
        err, name = max_rel_error(runs[0][i][1], ref_grads)
        assert err <= TOL, (pol, mode, name, err)


def test_a_layer_that_reads_its_weights_before_their_gather_is_caught(runs):
    """The mutation: the wait of an ahead-issued gather removed. The guard refuses the first layer's forward on every
    rank; without the guard the layer reads the NaN the buffer held."""
    caught = [r[CASES.index(("store_all", "deferred, no wait"))][0] for r in runs]
    assert all(isinstance(c, str) and "layer 0's forward reads unit 1 weights" in c for c in caught), caught
    loss = runs[0][CASES.index(("store_all", "deferred, no wait, no guard"))][0]
    ref_loss = reference(SEQ, "store_all", 2)[0]
    assert not math.isfinite(loss) or abs(loss - ref_loss) > TOL * abs(ref_loss), loss


def test_each_gather_is_issued_under_the_layer_before_and_two_layers_are_whole(runs):
    n = SMALL.layers
    for i, (pol, mode) in enumerate(CASES[:3]):
        for r in runs:
            spans, whole = r[i][2], r[i][3]
            gathers: dict[int, list] = {}
            compute: dict[tuple[int, str], tuple] = {}
            for op, layer, phase, s, e in spans:
                if op == "param_all_gather" and layer is not None:
                    gathers.setdefault(layer, []).append(s)
                elif op != "param_all_gather" and layer is not None:
                    compute.setdefault((layer, phase), (s, e))
            assert sorted(gathers) == list(range(n)) and all(len(v) == 2 for v in gathers.values()), (pol, gathers)
            for k in range(1, n):  # forward: layer k's gather issued before layer k-1's forward ends
                assert gathers[k][0] < compute[(k - 1, "fwd")][1], (pol, k)
            for k in range(n - 1):  # backward: layer k's second gather before layer k+1's backward ends
                assert gathers[k][1] < compute[(k + 1, "bwd")][1], (pol, k)
            # while layer k runs forward, its weights and the next layer's are whole (the last layer: its own)
            assert whole == [(k, 2 if k < n - 1 else 1) for k in range(n)], (pol, whole)
