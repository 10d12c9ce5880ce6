"""Shared test data for the calibration tests."""

import copy
from pathlib import Path


def as_cuda_run(raw: dict) -> dict:
    """The CPU run's results reshaped as a one-GPU CUDA run's (structure only: tests the CUDA branch of the
    writer where no GPU is available)."""
    r = copy.deepcopy(raw)
    r["env"].update(device="NVIDIA H100 80GB HBM3", device_kind="cuda", driver="580.00", cuda_runtime="13.0",
                    visible_gpus=1, compute_capability="9.0", multiprocessors=132)
    r["dtype"] = "bf16"
    r["peak"] = {"dtype": "bf16", "value": 989e12, "source": "NVIDIA H100 SXM5 datasheet", "best_measured": 7.5e14,
                 "datasheet": {"bf16": 989e12, "fp32": 67e12}}
    r["memory_start"] = {"total": 85 * 10**9, "free": 84 * 10**9, "torch_reserved": 0, "outside_torch": 10**9}
    r["memory_end"] = {"total": 85 * 10**9, "free": 80 * 10**9, "torch_reserved": 3 * 10**9,
                       "outside_torch": 2 * 10**9}
    r["pinned"] = {"measured": True, "mode": "power_of_two", "method": "host_memory_stats", "detail": "3 -> 4"}
    r["collectives"] = {"measured": False, "reason": "one GPU visible: no NVLink to measure"}
    for k in ("cpu_budget", "framework_rss"):
        r.pop(k, None)
    return r


# `memo-exec calibrate --device cpu --quick --threads 1 --name cpu-quick-vm` on this project's 2-core VM
# (2026-11-27, 108 s, no sanity warning): a calibrated CPU profile for the slow tests that need one but do not
# test the calibration itself (the default selection calibrates afresh for those: conftest's cpu_calibration)
COMMITTED_CPU_PROFILE = Path(__file__).resolve().parent / "data" / "profiles" / "cpu-quick-vm.yaml"
