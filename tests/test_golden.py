"""Refactors must not move simulated numbers: 20 candidates (7B-65B, every policy) against the
snapshot in tests/data/golden_candidates.json, to 1e-9 relative."""

import json
import math

import pytest

from tests.golden_cases import CASES, GOLDEN, case_id, evaluate

SNAPSHOT = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_golden_candidate_unchanged(case):
    want = SNAPSHOT[case_id(case)]
    got = evaluate(case)
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k]
        if isinstance(w, float) and isinstance(g, float):
            assert math.isclose(g, w, rel_tol=1e-9, abs_tol=0.0), f"{k}: {g!r} != {w!r}"
        else:
            assert g == w, f"{k}: {g!r} != {w!r}"
