"""Whether a plan's stored prediction is what the simulator predicts for it now: the one rule `memo-sim
check-plan` and `memo-exec run` apply (a hand-edited plan, or one predicted with another profile or memo
version, is compared with its re-simulation, not with the numbers it carries)."""

from __future__ import annotations

from memo_sim.units import fmt_time

STALE_TOLERANCE = 0.01  # the stored step time and the re-simulation's: further apart, the prediction is stale


def stale_prediction(predicted, status: str, iteration_s: float | None) -> str | None:
    """The stored prediction (``Plan.predicted``) against a re-simulation's ``status`` and ``iteration_s``, in
    words ("stored prediction 212.10 ms/iter, re-simulated now 304.95 ms/iter"), or None where they agree: another
    status, or step times more than `STALE_TOLERANCE` apart."""
    if predicted.status != status:
        return f"stored prediction {predicted.status}, re-simulated now {status}"
    if status == "OK" and predicted.iteration_s and iteration_s and \
            abs(iteration_s / predicted.iteration_s - 1) > STALE_TOLERANCE:
        return (f"stored prediction {fmt_time(predicted.iteration_s)}/iter, re-simulated now "
                f"{fmt_time(iteration_s)}/iter")
    return None


__all__ = ["STALE_TOLERANCE", "stale_prediction"]
