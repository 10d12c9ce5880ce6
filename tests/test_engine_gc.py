"""Run-time hygiene of the engine: the SPPO build pauses the cyclic collector and leaves it as
it found it; a finished, failed (OOM) or deadlocked run leaves no reference cycle through its
engine, so the op graph is freed by refcounting as soon as its last user lets go."""

import gc
import weakref

import pytest

from memo_sim.engine.core import Engine, gc_paused
from memo_sim.engine.graph import Device, MemAction, OpGraph
from memo_sim.profile import load_profile

PROFILE = load_profile("a800-80gb")
GB = 1024**3


def _graph(alloc: float) -> OpGraph:
    g = OpGraph([Device(0)])
    a = g.add("k0", device=0, stream="compute", kind="compute", phase="fwd", layer=0, work=1e-3,
              mem_start=(MemAction("gpu", "x", alloc),))
    g.add("off", device=0, stream="d2h", kind="copy", phase="offload", layer=0, work=1e9, nbytes=1e9,
          direction="d2h", deps=[a])
    g.add("k1", device=0, stream="compute", kind="compute", phase="fwd", layer=1, work=1e-3,
          mem_start=(MemAction("gpu", "y", alloc),))
    g.add("k2", device=0, stream="compute", kind="compute", phase="fwd", layer=2, work=1e-3)
    return g


@pytest.mark.parametrize("capacity, status", [(100 * GB, None), (1.5 * GB, "OOM")])
def test_run_leaves_no_cycle(capacity, status):
    enabled = gc.isenabled()
    gc.disable()
    try:
        g = _graph(1 * GB)
        engine = Engine(g, PROFILE, gpu_capacity=capacity)
        run = engine.run()
        assert (run.failure.status if run.failure else None) == status
        ref, eref = weakref.ref(g), weakref.ref(engine)
        del g, engine, run
        assert ref() is None and eref() is None
    finally:
        if enabled:
            gc.enable()


def test_gc_paused_restores_state():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller's gc.disable() stays
    finally:
        gc.enable()
    with pytest.raises(ValueError):
        with gc_paused():
            raise ValueError("x")
    assert gc.isenabled()
