"""``memo-exec calibrate``'s allocator costs (`memo_exec.calibrate.allocator`): the fit on synthetic
calls, the profile fields from synthetic measurements (written and read back by the simulator's
loader), the CPU run (nothing measured: the loader's assumed defaults), the CUDA run without a
measurement (the base profile's values), and the measurement itself on a GPU."""

from __future__ import annotations


import pytest
import torch

from memo_exec.calibrate import allocator as alloc
from memo_exec.calibrate.microbench import Progress
from memo_exec.calibrate.writer import build_profile, load_base, write_profile
from memo_sim.profile import load_profile
from memo_sim.profile.schema import DEFAULT_ALLOCATOR_COSTS
from tests.calibration_fixtures import as_cuda_run

MiB, GiB = 2**20, 2**30
SIZES = [32 * MiB, 128 * MiB, 512 * MiB, 2 * GiB, 8 * GiB]


def test_fit_recovers_latency_and_throughput():
    """t = 40 us + bytes / 3 TB/s exactly: the fit returns both."""
    lat, tp = alloc.fit_call_cost(SIZES, [40e-6 + n / 3e12 for n in SIZES])
    assert lat == pytest.approx(40e-6, rel=1e-9) and tp == pytest.approx(3e12, rel=1e-9)


def test_fit_without_a_size_dependence_reports_an_unbounded_throughput():
    """60 us whatever the size, or slightly less for larger blocks (noise): a latency of about
    60 us and no per-byte cost; a tiny positive slope stays a (huge) finite throughput."""
    lat, tp = alloc.fit_call_cost(SIZES, [60e-6] * 5)
    assert lat == pytest.approx(60e-6, rel=1e-9) and tp == alloc.UNBOUNDED_THROUGHPUT
    lat, tp = alloc.fit_call_cost(SIZES, [61e-6, 60.5e-6, 60e-6, 59.5e-6, 59e-6])
    assert lat == pytest.approx(60e-6, rel=0.02) and tp == alloc.UNBOUNDED_THROUGHPUT
    lat, tp = alloc.fit_call_cost(SIZES, [60e-6, 61e-6, 59e-6, 60e-6, 60.5e-6])
    assert lat == pytest.approx(60e-6, rel=0.02) and 8 * GiB / tp < 1e-6


def test_fit_without_a_latency_goes_through_the_origin():
    """t = bytes / 1 TB/s minus a little: a negative intercept is clamped to 0."""
    lat, tp = alloc.fit_call_cost(SIZES, [n / 1e12 - 1e-6 for n in SIZES])
    assert lat == 0.0 and tp == pytest.approx(1e12, rel=0.01)


def _measured(sync=15e-6, m_lat=30e-6, m_tp=4e12, f_lat=80e-6, f_tp=1.5e12) -> dict:
    rows = [{"bytes": n, "repeats": 5, "malloc_s": m_lat + n / m_tp, "free_s": f_lat + n / f_tp} for n in SIZES]
    raw = {"measured": True, "sync_s": sync, "sync_samples": 200, "empty_cache_overhead_s": 5e-6, "rows": rows,
           "alloc_conf": "", "expandable_segments": False, "method": "synthetic"}
    raw["fit"] = alloc.fit_results(raw)
    return raw


def test_measured_costs_are_written_with_units_and_provenance(cpu_calibration, tmp_path):
    _out, _r, raw = cpu_calibration
    r = as_cuda_run(raw)
    r["allocator"] = _measured()
    d = build_profile("h100-alloc", r, load_base("h100-sxm5-80gb"))
    units = {k: v["unit"] for k, v in d["gpu"]["allocator"].items()}
    assert units == {"sync": "us", "cuda_malloc_latency": "us", "cuda_malloc_throughput": "GB/s",
                     "cuda_free_latency": "us", "cuda_free_throughput": "GB/s"}
    prof = write_profile(d, tmp_path / "h100-alloc.yaml")
    a = load_profile(tmp_path / "h100-alloc.yaml").gpu.allocator
    assert a == prof.gpu.allocator
    assert float(a.sync) == pytest.approx(15e-6, rel=1e-3)
    assert float(a.cuda_malloc_latency) == pytest.approx(30e-6, rel=1e-3)
    assert float(a.cuda_malloc_throughput) == pytest.approx(4e12, rel=1e-3)
    assert float(a.cuda_free_latency) == pytest.approx(80e-6, rel=1e-3)
    assert float(a.cuda_free_throughput) == pytest.approx(1.5e12, rel=1e-3)
    for k in alloc.FIELDS:
        src = getattr(a, k).source
        assert src.startswith("measured:") and "NVIDIA H100" in src, k
    assert "cudaMalloc/cudaFree" in a.cuda_free_latency.source
    assert set(f"gpu.allocator.{k}" for k in alloc.FIELDS) <= set(d["provenance"]["measured_fields"])
    assert d["provenance"]["measurements"]["allocator"]["cuda_free"]["latency_us"] == pytest.approx(80, rel=1e-3)


def test_cuda_run_without_a_measurement_takes_the_base_profile(cpu_calibration, tmp_path):
    _out, _r, raw = cpu_calibration
    r = as_cuda_run(raw)
    r["allocator"] = alloc.not_measured("allocator measurement failed (synthetic)")
    d = build_profile("h100-base", r, load_base("h100-sxm5-80gb"))
    prof = write_profile(d, tmp_path / "h100-base.yaml")
    base = load_profile("h100-sxm5-80gb").gpu.allocator
    for k in alloc.FIELDS:
        assert float(getattr(prof.gpu.allocator, k)) == pytest.approx(float(getattr(base, k)))
        assert getattr(prof.gpu.allocator, k).source.startswith("from base profile h100-sxm5-80gb, not measured")
    assert "gpu.allocator" in d["provenance"]["not_measured_fields"]


def test_cpu_calibration_writes_nothing_and_keeps_the_assumed_defaults(cpu_calibration):
    out, _r, raw = cpu_calibration
    assert raw["allocator"]["measured"] is False and "CPU" in raw["allocator"]["reason"]
    import yaml

    written = yaml.safe_load((out / "cpu-test.yaml").read_text())
    assert "allocator" not in written["gpu"]
    prof = load_profile(out / "cpu-test.yaml")
    assert prof.gpu.allocator == DEFAULT_ALLOCATOR_COSTS
    assert prof.gpu.allocator.sync.source.startswith("assumed default")
    assert str(prof.provenance["measurements"]["allocator"]).startswith("not measured")
    assert any(f.startswith("gpu.allocator (CPU run") for f in prof.provenance["not_measured_fields"])


def test_run_on_cpu_measures_nothing():
    res = alloc.run(torch.device("cpu"), quick=True, progress=Progress(enabled=False))
    assert res == {"measured": False, "reason": res["reason"]} and "CPU" in res["reason"]


def test_sizes_fit_in_a_quarter_of_free_memory():
    assert alloc.sizes_for(True, 80 * GiB) == [32 * MiB, 512 * MiB, 2 * GiB]
    assert alloc.sizes_for(False, 80 * GiB)[-1] == 8 * GiB
    small = alloc.sizes_for(False, 1 * GiB)
    assert max(small) == 256 * MiB and all(n % (2 * MiB) == 0 for n in small)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_allocator_costs_on_cuda():
    res = alloc.run(torch.device("cuda"), quick=True, progress=Progress(enabled=False))
    assert res["measured"], res.get("reason")
    fit = res["fit"]
    assert 0 < fit["sync_s"] < 1e-3  # an idle synchronise: microseconds
    assert fit["malloc_latency_s"] >= 0 and fit["free_latency_s"] >= 0
    assert fit["malloc_throughput"] > 1e9 and fit["free_throughput"] > 1e9
    for row in res["rows"]:  # the fit reproduces every size within a factor of three
        assert row["malloc_s"] > 0
        model = fit["malloc_latency_s"] + row["bytes"] / fit["malloc_throughput"]
        assert model / 3 < row["malloc_s"] < model * 3
