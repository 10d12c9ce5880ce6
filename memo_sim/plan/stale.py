"""Whether a plan's stored prediction is what the simulator predicts for it now: the one rule `memo-sim
check-plan` and `memo-exec run` apply (a hand-edited plan, or one predicted with another profile or memo
version, is compared with its re-simulation, not with the numbers it carries).

The rule compares every stored number memo-exec's report sets beside a measurement (`memo_exec.report.totals_rows`:
the step time, MFU, tokens per GPU per second, exposed copy time, the GPU and host peaks, and one layer's forward,
backward, recompute, offload and prefetch times, ``layer_timings_s``), each with the same tolerance: a review edited
every ``layer_timings_s`` value x 10, or ``predicted.mfu`` to 0.9, kept the step time, and the report compared the
run with the edited numbers without a word."""

from __future__ import annotations

from memo_sim.plan.schema import LAYER_TIMING_KEYS  # the plan's one-layer times
from memo_sim.units import fmt_bytes, fmt_time

STALE_TOLERANCE = 0.01  # the stored number and the re-simulation's: further apart, the prediction is stale
# below this magnitude (1 ns, an MFU of 1e-9, 1 byte) a number is the simulator's float residue of zero: two such
# numbers agree (memo-exec's `memo_exec.compare.REL_ERROR_FLOOR`, the same reading of the engine's residue)
ZERO_RESIDUE = 1e-9
# the stored prediction's rate and time fields (`memo_sim.plan.contract.Prediction`), the `SimResult` attribute
# holding the re-simulation's, and how the words name and print them
RATE_FIELDS = (("mfu", "mfu", "MFU", lambda v: f"{v:.3f}"),
               ("tgs_tokens_per_gpu_s", "tgs", "tokens/GPU/s", lambda v: f"{v:,.0f}"),
               ("exposed_copy_s", "exposed_copy_s", "exposed copy", fmt_time))


def apart(stored, now) -> bool:
    """Whether two numbers differ by more than `STALE_TOLERANCE` of the stored one; a missing one (None) is not
    compared, and numbers below `ZERO_RESIDUE` are zero (a stored 0 against a re-simulated 0.26 ms is apart)."""
    if not isinstance(stored, (int, float)) or not isinstance(now, (int, float)):
        return False
    if abs(stored) < ZERO_RESIDUE or abs(now) < ZERO_RESIDUE:
        return max(abs(stored), abs(now)) >= ZERO_RESIDUE
    return abs(now / stored - 1) > STALE_TOLERANCE


def stale_prediction(predicted, status: str, iteration_s: float | None,
                     peak_gpu_bytes: float | None = None, *, resimulated: dict | None = None,
                     layer_timings_s: dict | None = None) -> str | None:
    """The stored prediction (``Plan.predicted``) against a re-simulation's ``status``, ``iteration_s`` and
    ``peak_gpu_bytes``, in words ("stored prediction 212.10 ms/iter, re-simulated now 304.95 ms/iter"), or None where
    they agree: another status, or step times or simulated peaks more than `STALE_TOLERANCE` apart (a review: a plan
    edited from EP 1 to EP 8 kept its step time within 1% and its stored peak 9 GiB above the one check-plan printed
    beside it, with no word of it).

    ``resimulated`` (`resimulated_numbers`: the re-simulation's MFU, tokens/GPU/s, exposed copy time, host peak and
    one layer's times) and ``layer_timings_s`` (the plan's stored one-layer times) compare the rest of what a report
    prices (`stale_plan` passes both); the peaks, GPU and host, where the stored ones are the event simulator's too
    (an analytic plan's peaks are another model's, `memo_sim.search.plan_build.bare_plan`)."""
    if predicted.status != status:
        return f"stored prediction {predicted.status}, re-simulated now {status}"
    if status != "OK":
        return None
    words = []
    if predicted.iteration_s and iteration_s and abs(iteration_s / predicted.iteration_s - 1) > STALE_TOLERANCE:
        words.append(f"{fmt_time(predicted.iteration_s)}/iter, re-simulated now {fmt_time(iteration_s)}/iter")
    simulated = getattr(predicted, "source", None) == "simulated"  # peaks compared where both are the simulator's
    stored = getattr(predicted, "peak_gpu_bytes", None)
    if simulated and isinstance(stored, (int, float)) and stored > 0 and \
            peak_gpu_bytes and abs(peak_gpu_bytes / stored - 1) > STALE_TOLERANCE:
        words.append(f"peak GPU {fmt_bytes(stored)}, re-simulated now {fmt_bytes(peak_gpu_bytes)}")
    now = resimulated or {}
    for key, _attr, name, fmt in RATE_FIELDS:
        old, new = getattr(predicted, key, None), now.get(key)
        if apart(old, new):
            words.append(f"{name} {fmt(old)}, re-simulated now {fmt(new)}")
    old, new = getattr(predicted, "peak_host_bytes_per_node", None), now.get("peak_host_bytes_per_node")
    if simulated and apart(old, new):
        words.append(f"peak host {fmt_bytes(old)}/node, re-simulated now {fmt_bytes(new)}/node")
    stored_lt, now_lt = layer_timings_s or {}, now.get("layer_timings_s") or {}
    for k in LAYER_TIMING_KEYS:
        if k in stored_lt and apart(stored_lt[k], now_lt.get(k, 0.0)):
            words.append(f"layer {k} {fmt_time(stored_lt[k])}, re-simulated now {fmt_time(now_lt.get(k, 0.0))}")
    return f"stored prediction {'; '.join(words)}" if words else None


def resimulated_numbers(res) -> dict:
    """A re-simulation's (`memo_sim.engine.result.SimResult`) numbers `stale_prediction` compares beyond the step
    time and the GPU peak, in the stored prediction's keys; a field the object lacks reads None (not compared)."""
    out = {key: getattr(res, attr, None) for key, attr, _n, _f in RATE_FIELDS}
    out["peak_host_bytes_per_node"] = getattr(res, "peak_host_bytes_per_node", None)
    out["layer_timings_s"] = getattr(res, "layer_timings", None)
    return out


def stale_plan(plan, res) -> str | None:
    """`stale_prediction` of ``plan``'s stored prediction and ``layer_timings_s`` against ``res``, the plan
    re-simulated as it stands (every layer, its own profile): every number compared."""
    return stale_prediction(plan.predicted, res.status, res.iteration_s, getattr(res, "peak_gpu_bytes", None),
                            resimulated=resimulated_numbers(res),
                            layer_timings_s=getattr(plan, "layer_timings_s", None))


__all__ = ["STALE_TOLERANCE", "ZERO_RESIDUE", "apart", "resimulated_numbers", "stale_plan", "stale_prediction"]
