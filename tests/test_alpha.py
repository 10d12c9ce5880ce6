"""MEMO's alpha: closed form and python-mip LP agree, infeasible cases included."""

import itertools

import pytest

from memo_sim.policy.alpha import AlphaProblem, solve_alpha_closed_form, solve_alpha_lp

GiB = 2**30
GRID = list(itertools.product(
    [0.5 * GiB, 2 * GiB],  # s_input (= s_attn)
    [7 * GiB, 28 * GiB],  # s_others
    [12.8e9, 25.6e9],  # bandwidth
    [0.05, 0.3, 2.0],  # t_layer
    [2 * 2**40, 200 * GiB, 5 * GiB],  # m_cpu per GPU
))


@pytest.mark.parametrize("si,so,bw,t,mc", GRID)
def test_lp_matches_closed_form(si, so, bw, t, mc):
    p = AlphaProblem(si, si, so, bw, t, 32, mc)
    a, b = solve_alpha_closed_form(p), solve_alpha_lp(p)
    assert a.feasible == b.feasible
    if a.feasible:
        assert a.alpha == pytest.approx(b.alpha, abs=1e-6)
        assert 0.0 <= a.alpha <= 1.0
        # the answer satisfies both constraints
        used = si + si + a.alpha * so
        assert used / bw <= t * (1 + 1e-9)
        assert used <= p.per_layer_host_cap() * (1 + 1e-9)
    else:
        assert a.binding == b.binding


def test_known_cases():
    # offload of input+attn alone exceeds the layer time: infeasible on overlap
    p = AlphaProblem(4 * GiB, 4 * GiB, 28 * GiB, 10e9, 0.1, 32, 1e15)
    r = solve_alpha_closed_form(p)
    assert not r.feasible and r.binding == "overlap"
    # everything fits: alpha = 1
    r = solve_alpha_closed_form(AlphaProblem(GiB, GiB, 14 * GiB, 25e9, 10.0, 32, 1e15))
    assert r.alpha == 1.0 and r.binding == "none"
    # host-bound: (n-2) * (2 + 14a) GiB <= 150 GiB -> a = (5 - 2) / 14
    r = solve_alpha_closed_form(AlphaProblem(GiB, GiB, 14 * GiB, 25e9, 10.0, 32, 150 * GiB))
    assert r.binding == "host_memory" and r.alpha == pytest.approx(3 / 14)


def test_an_infeasible_alpha_says_what_alpha_0_still_does():
    """'alpha 0.000: infeasible (...); alpha=0' on a chosen plan beside 552 GiB of pinned host memory read as a
    broken plan (a review): alpha 0 still offloads each layer's input and attention output; the note says so and
    what the binding limit costs."""
    from memo_sim.policy.alpha import AlphaResult

    over = AlphaResult(None, "overlap", False, "closed-form")
    assert over.alpha_or_zero == 0.0 and "infeasible" not in over.note()
    assert over.note().startswith("alpha 0: no token beyond each layer's input and attention output offloaded")
    assert over.note().endswith("the stall is priced")
    assert AlphaResult(0.4, "host_memory", True, "closed-form").note() == "host memory full"
