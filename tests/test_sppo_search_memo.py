"""SPPO's search prices its points from memoised per-piece and per-partition costs
(`memo_sim.search.sppo.solve`, `memo_sim.cost.sppo.piece_timer`, `memo_sim.cost.boundary`): the
memoised search must find exactly what the plain one finds (every point, bound, estimate, memory
and status; the heuristic's choice), memos warm or cold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.memo import clear_caches, unmemoised
from memo_sim.model.config import get_model
from memo_sim.profile.loader import load_profile
from memo_sim.search.sppo import search_sppo

# (preset, layers (None: the preset's), tokens, GPUs, profile); the plain search prices every op list
# afresh, so the default case is a 4-layer model and the real ones are slow
CASES = [("gpt-7b", 4, 16384, 4, "a800-80gb"),
         pytest.param("gpt-7b", None, 131072, 8, "a800-80gb", marks=pytest.mark.slow),
         pytest.param("gpt-13b", None, 262144, 16, "a800-80gb", marks=pytest.mark.slow)]


def _found(search) -> dict:
    return {"space": search.space_size, "solved": search.solved, "note": search.heuristic_note,
            "heuristic": search.heuristic.to_dict() if search.heuristic else None,
            "best": search.best.to_dict() if search.best else None,
            "points": [(p.to_dict(), p.lower_bound_s, p.grid, p.estimate) for p in search.points],
            "rejected": [(lay.label(), why) for lay, why in search.rejected_layouts]}


@pytest.mark.parametrize("name,layers,seq,gpus,profile", CASES)
def test_memoised_search_is_the_plain_one(name, layers, seq, gpus, profile):
    model, prof = get_model(name), load_profile(profile)
    if layers:
        model = replace(model, layers=layers)
    with unmemoised():
        plain = _found(search_sppo(model, seq, gpus, prof))
    clear_caches()
    cold = _found(search_sppo(model, seq, gpus, prof))
    warm = _found(search_sppo(model, seq, gpus, prof))
    assert plain["solved"] > 0 and plain["points"]
    assert cold == plain  # exact: every float bit for bit
    assert warm == plain
