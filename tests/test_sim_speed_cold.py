"""`benchmarks/sim_speed.py`'s `cold()` empties every cache of the analytic tier: it named four cached functions
and failed with AttributeError once one was renamed (found 2026-12-02 when the benchmark was re-run); it now
walks the loaded memo_sim modules, so a cache added or renamed is emptied too."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from memo_sim.model.config import get_model
from memo_sim.profile.loader import load_profile
from memo_sim.search.whatif import candidates_for

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sim_speed.py"


def _load(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # the script imports its sibling `machine`
    spec = importlib.util.spec_from_file_location("sim_speed_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


def test_cold_empties_every_lru_cache_of_the_analytic_tier(monkeypatch):
    bench = _load(monkeypatch)
    candidates_for(get_model("gpt-7b"), 131072, 8, load_profile("a800-80gb"), policies=("memo",))
    caches = [obj for name, m in list(sys.modules.items()) if name.startswith("memo_sim.")
              for obj in vars(m).values() if hasattr(obj, "cache_info") and obj.__module__ == name]
    assert caches and any(c.cache_info().currsize for c in caches)
    from memo_sim.memplan import trace_gen  # named, so the walk cannot pass by missing them

    named = [trace_gen._layer_forward_trace, trace_gen._layer_backward_trace]
    assert all(f.cache_info().currsize for f in named)
    bench.cold()
    assert all(c.cache_info().currsize == 0 for c in caches + named)
