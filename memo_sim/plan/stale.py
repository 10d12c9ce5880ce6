"""Whether a plan's stored prediction is what the simulator predicts for it now: the one rule `memo-sim
check-plan` and `memo-exec run` apply (a hand-edited plan, or one predicted with another profile or memo
version, is compared with its re-simulation, not with the numbers it carries)."""

from __future__ import annotations

from memo_sim.units import fmt_bytes, fmt_time

STALE_TOLERANCE = 0.01  # the stored step time and the re-simulation's: further apart, the prediction is stale


def stale_prediction(predicted, status: str, iteration_s: float | None,
                     peak_gpu_bytes: float | None = None) -> str | None:
    """The stored prediction (``Plan.predicted``) against a re-simulation's ``status``, ``iteration_s`` and
    ``peak_gpu_bytes``, in words ("stored prediction 212.10 ms/iter, re-simulated now 304.95 ms/iter"), or None where
    they agree: another status, or step times or simulated peaks more than `STALE_TOLERANCE` apart (a review: a plan
    edited from EP 1 to EP 8 kept its step time within 1% and its stored peak 9 GiB above the one check-plan printed
    beside it, with no word of it)."""
    if predicted.status != status:
        return f"stored prediction {predicted.status}, re-simulated now {status}"
    if status != "OK":
        return None
    words = []
    if predicted.iteration_s and iteration_s and abs(iteration_s / predicted.iteration_s - 1) > STALE_TOLERANCE:
        words.append(f"{fmt_time(predicted.iteration_s)}/iter, re-simulated now {fmt_time(iteration_s)}/iter")
    stored = getattr(predicted, "peak_gpu_bytes", None)  # compared where both are the event simulator's
    if getattr(predicted, "source", None) == "simulated" and isinstance(stored, (int, float)) and stored > 0 and \
            peak_gpu_bytes and abs(peak_gpu_bytes / stored - 1) > STALE_TOLERANCE:
        words.append(f"peak GPU {fmt_bytes(stored)}, re-simulated now {fmt_bytes(peak_gpu_bytes)}")
    return f"stored prediction {'; '.join(words)}" if words else None


__all__ = ["STALE_TOLERANCE", "stale_prediction"]
