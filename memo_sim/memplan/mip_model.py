"""The offline DSA problem as a mixed-integer program (MEMO section 4.2), solved by python-mip.

Formulation, with sizes divided by their gcd ``g`` (all offsets of a dropped placement are sums
of sizes, so nothing is lost):

    min M
    A_i + S_i <= M                                  for every buffer i
    A_i + S_i <= A_j + M_ij * z_ij                  for every pair (i, j) whose lifetimes overlap
    A_j + S_j <= A_i + M_ji * (1 - z_ij)
    LB <= M <= UB,  0 <= A_i <= UB - S_i,  z_ij binary

``z_ij = 0`` puts ``i`` below ``j``. Only lifetime-overlapping pairs get a binary. ``UB`` is the
peak of the warm start (the heuristic's placement), ``LB`` the max-live bound, and each big-M is
the tight ``M_ij = (UB - S_i) + S_i - 0 = UB`` of ``bounds.pair_big_m`` instead of a device
capacity. Symmetry breaking: buffers with equal size and lifetime are ordered by index, and one
pair of the largest twin-free conflicting buffers is oriented (a placement and its mirror image
``A -> M - A - S`` have the same peak). The warm start is mirrored / relabelled to satisfy both,
then passed with ``model.start``.

Solvers: CBC (bundled with python-mip) or HiGHS (``mip.HIGHS``, present in python-mip 2.0). A
returned solution is checked against every disjunction exactly (after rounding); one that
violates a big-M row, as CBC occasionally returns, is rejected. An accepted one is dropped
(``greedy.compact``) to integer offsets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from memo_sim.memplan.bounds import DSAInstance, buffer_address_bounds, pair_big_m
from memo_sim.memplan.greedy import compact, peak_of

SOLVERS = ("cbc", "highs")


@dataclass
class MipResult:
    """Outcome of one MIP solve; offsets/peak in bytes (``None`` when no usable solution)."""

    solver: str
    status: str
    offsets: np.ndarray | None
    peak: int | None
    bound: int
    gap: float | None
    solve_time_s: float
    build_time_s: float
    improved: bool
    notes: list[str] = field(default_factory=list)


def _solver_name(solver: str, notes: list[str]) -> tuple[str, str]:
    """python-mip solver name for ``solver`` ("cbc" | "highs"), with a fallback note."""
    import mip

    if solver == "highs":
        name = getattr(mip, "HIGHS", None)
        if name is not None:
            return name, "highs"
        notes.append("python-mip has no HiGHS interface here; solved with CBC instead")
    elif solver != "cbc":
        raise ValueError(f"unknown MIP solver {solver!r}; use one of {', '.join(SOLVERS)}")
    return mip.CBC, "cbc"


def _twin_groups(inst: DSAInstance) -> list[np.ndarray]:
    """Groups (size >= 2) of buffers with identical size and lifetime, indices ascending."""
    keys: dict[tuple[int, int, int], list[int]] = {}
    for i in range(inst.n):
        keys.setdefault((int(inst.size[i]), int(inst.lower[i]), int(inst.upper[i])), []).append(i)
    return [np.array(v, dtype=np.int64) for v in keys.values() if len(v) > 1]


def symmetry_fixings(inst: DSAInstance) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    """Pairs (i, j) whose order is fixed (i below j): twins by index, plus one mirror pair."""
    twins = _twin_groups(inst)
    fixed: list[tuple[int, int]] = []
    has_twin = np.zeros(inst.n, dtype=bool)
    for g in twins:
        has_twin[g] = True
        for a in range(len(g) - 1):
            fixed.append((int(g[a]), int(g[a + 1])))
    mirror = None
    pairs = inst.conflicts.pairs
    if len(pairs):
        ok = ~has_twin[pairs[:, 0]] & ~has_twin[pairs[:, 1]]
        if ok.any():
            cand = pairs[ok]
            weight = inst.size[cand[:, 0]] + inst.size[cand[:, 1]]
            k = int(np.argmax(weight))
            mirror = (int(cand[k, 0]), int(cand[k, 1]))
    return fixed, mirror


def normalize_start(inst: DSAInstance, off: np.ndarray, fixed: list[tuple[int, int]],
                    mirror: tuple[int, int] | None) -> np.ndarray:
    """Mirror and relabel a valid placement so it satisfies the symmetry fixings."""
    off = np.asarray(off, dtype=np.int64).copy()
    peak = peak_of(inst, off)
    if mirror is not None and off[mirror[0]] > off[mirror[1]]:
        off = peak - off - inst.size
    for g in _twin_groups(inst):
        off[g] = np.sort(off[g])
    return off


def disjunction_violations(offsets: np.ndarray, size: np.ndarray, pairs: np.ndarray) -> int:
    """How many conflicting pairs overlap in address under ``offsets`` (exact integers)."""
    if len(pairs) == 0:
        return 0
    i, j = pairs[:, 0], pairs[:, 1]
    return int(((offsets[i] < offsets[j] + size[j]) & (offsets[j] < offsets[i] + size[i])).sum())


def solve_mip(inst: DSAInstance, start_offsets: np.ndarray, *, solver: str = "highs",
              time_limit_s: float = 10.0, lower_bound: int | None = None,
              rel_gap: float = 0.0, threads: int = 1, verbose: bool = False) -> MipResult:
    """Minimise the peak with the MIP above, warm-started from ``start_offsets`` (valid).

    The solver stops at a relative gap of ``rel_gap`` or an absolute gap below one size unit
    (every dropped placement's peak is a whole number of units, so that is optimal).

    ``time_limit_s`` bounds building the model too: a model whose pair constraints are not all
    added by then is abandoned (status ``not-built``, the warm start returned unimproved, a note
    saying how far the build got); the solver gets the time the build left.
    """
    import mip

    notes: list[str] = []
    t0 = time.perf_counter()
    solver_name, used = _solver_name(solver, notes)
    n = inst.n
    lb_bytes = max(int(lower_bound or 0), inst.lower_bound())
    start = compact(inst, start_offsets)
    ub_bytes = peak_of(inst, start)
    if n == 0 or ub_bytes <= lb_bytes:
        return MipResult(used, "optimal-start", start, ub_bytes, lb_bytes, 0.0, 0.0,
                         time.perf_counter() - t0, False, notes + ["warm start already meets the lower bound"])
    g = int(np.gcd.reduce(inst.size))
    S = inst.size // g
    ub = ub_bytes // g            # start offsets are sums of sizes: exact
    lb = -(-lb_bytes // g)
    fixed, mirror = symmetry_fixings(inst)
    start_s = normalize_start(inst, start, fixed, mirror) // g
    pairs = inst.conflicts.pairs
    lo, hi = buffer_address_bounds(S, ub)
    bigm = pair_big_m(S, pairs, hi, lo)

    model = mip.Model(name="dsa", sense=mip.MINIMIZE, solver_name=solver_name)
    model.verbose = 1 if verbose else 0
    model.threads = threads
    model.max_mip_gap = max(float(rel_gap), 1e-9)
    model.max_mip_gap_abs = 0.999
    peak = model.add_var(name="M", lb=lb, ub=ub)
    A = [model.add_var(name=f"A{i}", lb=0, ub=int(hi[i])) for i in range(n)]
    model.objective = mip.minimize(peak)
    for i in range(n):
        model += A[i] + int(S[i]) <= peak
    fixed_set = {(min(a, b), max(a, b)): (a < b) for a, b in fixed}
    if mirror is not None:
        fixed_set[(mirror[0], mirror[1])] = True
    z = []
    deadline = t0 + float(time_limit_s)
    for k in range(len(pairs)):
        if k % 1024 == 0 and time.perf_counter() > deadline:
            build = time.perf_counter() - t0
            notes.append(f"the model was not built within the time limit ({k} of {len(pairs)} conflicting pairs "
                         f"added in {build:.1f} s); the warm start stands")
            return MipResult(used, "not-built", start, ub_bytes, lb_bytes, ub_bytes / lb_bytes - 1.0 if lb_bytes else 0.0,
                             0.0, build, False, notes)
        i, j = int(pairs[k, 0]), int(pairs[k, 1])
        si, sj = int(S[i]), int(S[j])
        orient = fixed_set.get((i, j))
        if orient is True:          # i below j
            model += A[i] + si <= A[j]
            z.append(None)
            continue
        if orient is False:         # j below i
            model += A[j] + sj <= A[i]
            z.append(None)
            continue
        zk = model.add_var(var_type=mip.BINARY)
        z.append(zk)
        model += A[i] + si <= A[j] + int(bigm[k, 0]) * zk
        model += A[j] + sj <= A[i] + int(bigm[k, 1]) * (1 - zk)
    warm = [(peak, float(ub))] + [(A[i], float(start_s[i])) for i in range(n)]
    for k in range(len(pairs)):
        if z[k] is not None:
            i, j = int(pairs[k, 0]), int(pairs[k, 1])
            warm.append((z[k], 0.0 if start_s[i] < start_s[j] else 1.0))
    model.start = warm
    build = time.perf_counter() - t0
    t1 = time.perf_counter()
    status = model.optimize(max_seconds=max(deadline - t1, 0.1))
    solve_t = time.perf_counter() - t1
    bound_s = model.objective_bound
    bound_bytes = lb_bytes
    if bound_s is not None and np.isfinite(bound_s):
        bound_bytes = max(lb_bytes, int(np.ceil(bound_s - 1e-6)) * g)
    status_name = status.name.lower()
    result = MipResult(used, status_name, start, ub_bytes, bound_bytes, None, solve_t, build, False, notes)
    if model.num_solutions and status in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
        raw = np.array([A[i].x for i in range(n)], dtype=float)
        cand = np.rint(raw).astype(np.int64)
        # Exact re-check of every disjunction of the solver's answer (after rounding).
        bad = disjunction_violations(cand, S, pairs)
        if np.any(cand < 0) or bad:
            notes.append(f"{used}: rejected a solution that violates {bad} big-M rows")
        else:
            off = compact(inst, cand * g)
            pk = peak_of(inst, off)
            if pk < ub_bytes:
                result.offsets, result.peak, result.improved = off, pk, True
    if result.peak is not None:
        result.bound = min(result.bound, result.peak)
        result.gap = result.peak / result.bound - 1.0 if result.bound else 0.0
    return result
