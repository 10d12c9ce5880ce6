"""``memo-exec calibrate``: microbenchmarks that fill every field of a hardware profile.

Public API: `calibrate` (run and write a profile), `calibrate_cmd` (the click command for the
``memo-exec`` group), `fit.fit_efficiency_curve` / `fit.fit_latency_bandwidth` (the fitters).
"""

from memo_exec.calibrate.command import calibrate, calibrate_cmd

__all__ = ["calibrate", "calibrate_cmd"]
