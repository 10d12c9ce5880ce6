"""``memo-exec calibrate``: the fitters on synthetic points, a quick CPU calibration whose YAML the
simulator loads and uses, profiles built from its raw results with and without a base profile,
and bad options as one ``error:`` line with exit code 2. The GPU test runs ``--quick`` on CUDA."""

from __future__ import annotations

import copy
import math
import random

import click
import pytest
import torch
import yaml
from click.testing import CliRunner

from memo_exec.calibrate import calibrate_cmd
from memo_exec.calibrate.attention import BlockCase, fit_ring_blocks, ring_block_kernel
from memo_exec.calibrate.datasheet import default_base, known_peak
from memo_exec.calibrate.fit import curve_is_monotone, fit_copy_model, fit_efficiency_curve, fit_latency_bandwidth
from memo_exec.calibrate.memory import _classify
from memo_exec.calibrate.microbench import Progress
from memo_exec.calibrate.writer import build_profile, load_base, write_profile
from memo_sim.cli import cli as sim_cli
from memo_sim.cost.kernel_time import attention_bwd_time, gemm_time, memory_bound_time
from memo_sim.errors import MemoError
from memo_sim.profile import load_profile
from tests.calibration_fixtures import as_cuda_run

MiB = 2**20


# ------------------------------------------------------------------------------------------ fitters
def test_efficiency_fit_is_monotone_clipped_and_tracks_the_median():
    rng = random.Random(0)
    true = lambda f: 0.8 * (1 - math.exp(-f / 3e10))  # noqa: E731
    pts = []
    for _ in range(400):
        f = 10 ** rng.uniform(7, 13)
        pts.append((f, true(f) * rng.uniform(0.85, 1.15)))
    pts += [(1e13, 1.7), (2e13, 0.0), (-5, 0.5), (1e12, float("nan"))]  # above peak, zero, bad flops, NaN
    curve = fit_efficiency_curve(pts)
    assert curve_is_monotone(curve)
    assert all(0 < e <= 1 for _, e in curve)
    assert [f for f, _ in curve] == sorted(f for f, _ in curve)
    assert len(curve) >= 10  # two bins per decade over six decades
    for f, e in curve:
        if 1e8 < f < 1e12:
            assert e == pytest.approx(true(f), rel=0.15, abs=0.01), (f, e)


def test_efficiency_fit_pools_violators():
    # a dip in the middle is pooled with its neighbour, never kept as a decrease
    curve = fit_efficiency_curve([(1e9, 0.3), (1e10, 0.6), (1e11, 0.5), (1e12, 0.7)], bins_per_decade=1)
    assert [e for _, e in curve] == [0.3, 0.55, 0.55, 0.7]
    assert fit_efficiency_curve([(1e9, 3.0)]) == [[1e9, 1.0]]


def test_efficiency_fit_without_points_is_an_error():
    with pytest.raises(MemoError):
        fit_efficiency_curve([(0, 0.5), (1e9, 0.0)])


def test_ring_block_fit_recovers_synthetic_blocks():
    """Blocks timed as t = FLOPs / (peak x eff) + score elements x st, at two head sizes: the fit gives
    st back, and the curves eff (full) and eff / 2 (causal)."""
    peak, st = 1e11, 0.5e-9
    rows = []
    for c in (128, 512, 1024):
        for d in (32, 64):
            for causal in (False, True):
                b = BlockCase(c, 4, d, causal)
                e = c * c * 4 / (2 if causal else 1)
                t = {ph: f / (peak * (0.3 if causal else 0.6)) + e * st
                     for ph, f in (("fwd", b.fwd_flops), ("bwd", b.bwd_flops))}
                rows.append({"c": c, "heads": 4, "head_dim": d, "batch": 1, "causal": causal, "fwd_flops": b.fwd_flops,
                             "fwd_s": t["fwd"], "bwd_flops": b.bwd_flops, "bwd_s": t["bwd"]})
    fit = fit_ring_blocks({"measured": True, "kernel": "k", "rows": rows}, peak)
    for ph in ("fwd", "bwd"):
        assert fit[f"{ph}_score_time"] == pytest.approx(st)
        assert all(x == pytest.approx(0.6, rel=1e-3) for _f, x in fit[f"{ph}_curve"])
        assert all(x == pytest.approx(0.3, rel=1e-3) for _f, x in fit[f"causal_{ph}_curve"])
    # no block's FLOPs may run past the peak: a score time that would leave them faster is cut down
    fast = fit_ring_blocks({"measured": True, "kernel": "k", "rows": rows}, peak / 4)
    assert fast["fwd_score_time"] < st and all(x <= 1 for _f, x in fast["fwd_curve"])
    assert fit_ring_blocks({"measured": False, "reason": "same"}, peak) == {"measured": False, "reason": "same"}


def test_ring_block_kernel_is_measured_only_where_it_differs():
    cpu = torch.device("cpu")
    assert ring_block_kernel("sdpa_flash", cpu, torch.float32, [32, 64]) == ("flash_cpu", "")
    kernel, why = ring_block_kernel("math", cpu, torch.float32, [32, 64])
    assert kernel == "flash_cpu" and "math" in why


def test_latency_bandwidth_fit_recovers_synthetic_link():
    sizes = [4096 * 4 ** k for k in range(10)]
    times = [7e-6 + s / 25e9 for s in sizes]
    bw, lat = fit_latency_bandwidth(sizes, times)
    assert bw == pytest.approx(25e9, rel=1e-6) and lat == pytest.approx(7e-6, rel=1e-6)
    # no latency in the data: clamped at 0, bandwidth through the origin
    bw0, lat0 = fit_latency_bandwidth([1e6, 1e7], [1e6 / 5e9 * 0.99, 1e7 / 5e9])
    assert lat0 >= 0 and bw0 == pytest.approx(5e9, rel=0.02)


def test_copy_model_ignores_cache_resident_middle_sizes():
    sizes = [4096, 65536, MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    cached = {MiB: 5e-6 + MiB / 50e9, 16 * MiB: 5e-6 + 16 * MiB / 40e9}  # served from cache: fast
    times = [cached.get(s, 5e-6 + s / 5e9) for s in sizes]
    bw, lat = fit_copy_model(sizes, times, large_from=64 * MiB)
    assert bw == pytest.approx(5e9, rel=0.01)
    assert lat == pytest.approx(5e-6, rel=0.1)


@pytest.mark.parametrize("name,bf16", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A800-SXM4-80GB", 312.0), ("NVIDIA H100 PCIe", None), ("NVIDIA H200 NVL", None), ("NVIDIA L4", None),
])
def test_known_peaks_only_for_known_gpus(name, bf16):
    """Peaks come from the shipped profile of the device (one place), with that profile's sources;
    a variant no shipped profile describes (H100 PCIe, H200 NVL) gets none (--peak-tflops)."""
    p = known_peak(name)
    assert (p.bf16_tflops if p else None) == bf16
    if p is not None:
        base = load_profile(default_base(name))
        assert p.bf16_tflops * 1e12 == base.gpu.peak_flops["bf16"].value
        assert p.fp32_tflops * 1e12 == base.gpu.peak_flops["fp32"].value
        assert f"hardware_profiles/{base.name}.yaml" in p.source


def test_default_base_reads_the_shipped_profiles():
    assert default_base("NVIDIA A800-SXM4-80GB") == "a800-80gb"
    assert default_base("NVIDIA H200") == "h200-141gb"
    assert default_base("NVIDIA L4") == "h100-sxm5-80gb"  # none describes it: the fallback base


def test_pinned_rounding_classifier():
    req = [3 * MiB + 123, 5 * MiB + 4097, 11 * MiB + 1]
    p2 = [2 ** math.ceil(math.log2(n)) for n in req]
    assert _classify(req, p2)[0] == "power_of_two"
    assert _classify(req, [math.ceil(n / 4096) * 4096 for n in req])[0] == "page"
    assert _classify(req, list(req))[0] == "none"
    # RSS readings: a page of slack and one outlier still read as "none"/"page", not power of two
    rss = [req[0] + 1_400_000, req[1] + 4095, req[2] + 4095]
    assert _classify(req, rss)[0] in ("none", "page")


# ---------------------------------------------------------------------------------- CPU calibration
@pytest.fixture(scope="module")
def cpu_run(cpu_calibration):
    return cpu_calibration


def test_cpu_quick_writes_a_profile_the_simulator_loads(cpu_run):
    out, r, _raw = cpu_run
    path = out / "cpu-test.yaml"
    assert f"wrote {path}" in r.output
    prof = load_profile(path)
    assert prof.name == "cpu-test"
    pv = prof.provenance
    for k in ("command", "date", "hostname", "device", "torch", "measurements", "measured_fields"):
        assert pv.get(k), k
    assert "calibrate" in pv["command"] and "--quick" in pv["command"] and pv["torch"] == str(torch.__version__)
    assert pv["device_kind"] == "cpu"
    # fp32 only: nothing claims a bf16 peak that was not measured
    assert set(prof.gpu.peak_flops) == {"fp32"} and prof.peak("fp32") > 1e8
    with pytest.raises(MemoError, match="bf16"):
        prof.peak("bf16")
    for c in (prof.efficiency.gemm, prof.efficiency.attention_fwd, prof.efficiency.attention_bwd):
        pts = [list(p) for p in c.points]
        assert curve_is_monotone(pts), pts
        assert c.source.startswith("measured:")
    assert 0.2 < max(p[1] for p in prof.efficiency.gemm.points) <= 1  # relative to the best GEMM
    # the machine runs as many executor ranks as the gloo processes its collectives were measured between, each with
    # its device budget in the same RAM: a TP group of 2 stays on it (gpus_per_node 1 refused every TP plan)
    assert prof.node_gpus == 2 and prof.gpu_memory > prof.usable_gpu_memory > 0
    hm, budget = _raw["host_memory"], _raw["cpu_budget"]["bytes"]
    assert _raw["cpu_budget"]["ranks"] == 2
    assert float(prof.host.usable_fraction) == pytest.approx((hm["available"] - 2 * budget) / hm["total"], rel=1e-3)
    assert prof.usable_host_memory > 0
    tiny = ["--model", "llama-3.1-8b", "--layers", "2", "--hidden", "256", "--heads", "8", "--ffn", "512", "--vocab",
            "1024", "--gpus", "2", "--seq", "512", "--dtype", "fp32", "--jobs", "1", "--no-plan"]
    w = CliRunner().invoke(sim_cli, ["whatif", "--profile", str(path), "--tp", "2", *tiny])
    assert w.exit_code == 0 and "tp2" in w.output, w.output
    assert prof.host.pinned_rounding in ("none", "page", "power_of_two")
    for q in (prof.gpu.hbm_bandwidth, prof.host_link.d2h_bandwidth, prof.host_link.h2d_bandwidth,
              prof.host.memory_bandwidth, prof.internode.bandwidth):
        assert float(q) > 1e7 and q.source.startswith("measured:")
    assert 0 <= float(prof.gpu.copy_compute_slowdown) <= 1
    assert 0 < float(prof.efficiency.elementwise) <= 1
    # attention measured at two head sizes per case, the memory-bound ops at two sizes, the machine's speed
    for q in (prof.efficiency.attention_fwd_score_time, prof.efficiency.attention_bwd_score_time,
              prof.efficiency.kernel_latency):
        assert float(q) >= 0 and q.source.startswith("measured:"), q
    # ring CP's blocks run aten's CPU flash kernel, not the math backend: measured apart, its own curves
    e = prof.efficiency
    assert e.has_block_kernel and pv["measurements"]["ring_block_kernel"] == "flash_cpu"
    for c in (e.attention_block_fwd, e.attention_block_bwd, e.attention_block_causal_fwd, e.attention_block_causal_bwd):
        assert curve_is_monotone([list(p) for p in c.points]) and c.source.startswith("measured:"), c
        assert "block_forward" in c.source and "flash_cpu" in c.source
    for q in (e.attention_block_fwd_score_time, e.attention_block_bwd_score_time):
        assert float(q) >= 0 and q.source.startswith("measured:"), q
    assert e.attention_curves("flash", "causal") == (e.attention_block_causal_fwd, e.attention_block_causal_bwd)
    # every case timed is kept as measured, the whole-sequence kernel's and the ring blocks' (`attention_measured`)
    grid = {(h, d) for h, d in _raw["grid"]["attn_heads_dims"]}
    t = e.attention_times
    assert t is not None and t.source.startswith("measured:")
    assert {(k, h, d) for k, h, d, *_ in t.rows} == {(k, h, d) for k in ("whole", "block_full", "block_causal")
                                                    for h, d in grid}
    assert all(f > 0 and b > 0 for *_, f, b in t.rows)
    assert pv["host_malloc"].startswith("host malloc")
    # gloo's collectives are timed between stretches of compute (as a CPU run issues them), back to back beside
    rows = _raw["collectives"]["rows"]
    assert all(r[k + "_back_to_back"] > 0 and r[k] > 0 for r in rows
               for k in ("allgather_s", "reducescatter_s", "allreduce_s", "alltoall_s"))
    assert "sendrecv_s_back_to_back" not in rows[0]  # the link's ping-pong stays back to back
    fit = prof.internode.collectives["all_gather"]
    assert "between stretches of compute" in fit.bandwidth.source
    sp = pv["speed_probe"]
    assert len(sp["samples"]) == 4 and sp["min_gflops"] <= sp["median_gflops"] <= sp["max_gflops"]
    # the simulator's kernel-time model runs on it for an fp32 model
    assert gemm_time(1e9, prof, "fp32") > 0 and attention_bwd_time(1e9, prof, "fp32") > 0
    assert memory_bound_time(1e8, prof) > 0
    # progress went to stderr-style lines, one per measurement stage
    assert "[calibrate" in r.output and "GEMM throughput" in r.output


def test_cpu_profile_drives_memo_sim_whatif(cpu_run, tmp_path):
    from memo_sim.cli import cli as sim_cli

    out, _r, _raw = cpu_run
    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({"name": "tiny-fp32", "layers": 2, "hidden": 64, "heads": 4, "ffn": 256,
                                     "vocab": 128, "dtype": "fp32"}))
    r = CliRunner().invoke(sim_cli, ["whatif", "--model", str(model), "--seq", "256", "--gpus", "1", "--profile",
                                     str(out / "cpu-test.yaml"), "--out", str(tmp_path), "--simulate-top", "1"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "plan.json").exists()


def test_profiles_from_raw_results_with_and_without_base(cpu_run, tmp_path):
    _out, _r, raw = cpu_run
    no_coll = copy.deepcopy(raw)
    no_coll["collectives"] = {"measured": False, "reason": "--no-collectives"}
    with pytest.raises(MemoError, match="--base"):
        build_profile("x", no_coll, None)
    base = load_base("a800-80gb")
    d = build_profile("cpu-with-base", no_coll, base)
    for link in ("nvlink", "internode"):
        for k in ("bandwidth", "latency"):
            assert d[link][k]["source"].startswith("from base profile a800-80gb, not measured")
            assert d[link][k]["value"] == base.raw[link][k]["value"]
    prof = write_profile(d, tmp_path / "cpu-with-base.yaml")
    assert load_profile(tmp_path / "cpu-with-base.yaml").nvlink.bandwidth == prof.nvlink.bandwidth
    assert "nvlink" in d["provenance"]["not_measured_fields"]
    # a profile that the loader would reject is never written
    bad = copy.deepcopy(d)
    bad["efficiency"]["gemm"]["points"] = [[1e9, 0.5], [1e8, 0.6]]
    with pytest.raises(MemoError, match="efficiency.gemm"):
        write_profile(bad, tmp_path / "bad.yaml")
    assert not (tmp_path / "bad.yaml").exists()
    # raw results from before ring blocks were measured (or where the ring runs the whole-sequence
    # kernel) write no block curves
    old = copy.deepcopy(raw)
    old["attention"].pop("ring_blocks", None)
    assert not any(k.startswith("attention_block") for k in build_profile("old", old, base)["efficiency"])


def test_remeasured_attention_keeps_the_ring_blocks_measurements(cpu_run, monkeypatch):
    """The sanity check re-measures the parts whose fits it finds implausible (`memo_exec.calibrate.sanity`); none
    of its checks reads the ring's blocks, so re-measuring attention times the whole-sequence cases again and
    keeps the blocks' rows, re-fitted to the peak (they were 22 s of a 2-core quick calibration's re-measure)."""
    from memo_exec.calibrate import attention as attn_bench
    from memo_exec.calibrate import suite

    _out, _r, raw = cpu_run
    rings = raw["attention"]["ring_blocks"]
    assert rings["measured"], rings  # the CPU's whole-sequence backend is not the ring's block kernel

    def no_ring(*_a, **_k):
        raise AssertionError("the ring's blocks were timed again")

    timed = []

    def run_attention(bench, cases, dtype, backend_name, progress):  # the first run's rows, as if timed again
        timed.append(len(cases))
        return raw["attention"]["backend"], [dict(r) for r in raw["attention"]["rows"]]

    monkeypatch.setattr(attn_bench, "measure_ring_blocks", no_ring)
    monkeypatch.setattr(attn_bench, "run_attention", run_attention)
    opts = suite.CalibrateOptions(name="cpu-test", device="cpu", quick=True)
    again = suite.remeasure(opts, raw, ("attention",), Progress(enabled=False))
    # beside what the fixture's own calibration re-measured (a loaded machine's first copy timings can read
    # implausible: CI beside other jobs re-measured them once)
    assert timed == [len(raw["attention"]["rows"])]
    assert set(again["remeasured"]) == {"attention"} | set(raw.get("remeasured", []))
    blocks = again["attention"]["ring_blocks"]
    assert blocks["rows"] == rings["rows"]
    assert blocks == attn_bench.fit_ring_blocks(rings, again["peak"]["value"])


def test_writer_cuda_branch_takes_topology_from_base(cpu_run, tmp_path):
    _out, _r, raw = cpu_run
    d = build_profile("h100-test", as_cuda_run(raw), load_base("h100-sxm5-80gb"))
    prof = write_profile(d, tmp_path / "h100-test.yaml")
    assert set(prof.gpu.peak_flops) == {"bf16", "fp16", "fp32"} and prof.peak("bf16") == 989e12
    assert prof.node_gpus == 1 and int(prof.host_link.gpus_per_pcie_switch.value) == 1
    assert "capped at gpus_per_node" in prof.host_link.gpus_per_pcie_switch.source
    assert prof.nvlink.bandwidth.source.startswith("from base profile h100-sxm5-80gb, not measured (one GPU")
    assert prof.host.memory_bandwidth.source.startswith("from base profile h100-sxm5-80gb")
    assert float(prof.gpu.reserved_bytes) == pytest.approx(2e9, rel=1e-3)
    assert prof.host.pinned_rounding == "power_of_two" and "HostPool" in prof.host.pinned_rounding_source
    assert d["provenance"]["driver"] == "580.00"
    assert prof.gpu.compute_capability == (9, 0)  # the device's, where the FP8 GEMM layouts depend on it
    node = build_profile("h100-node", as_cuda_run(raw), load_base("h100-sxm5-80gb"), node_from_base=True)
    assert node["node"]["gpus_per_node"]["value"] == 8 and node["host"]["memory"]["unit"] == "TB"


# ---------------------------------------------------------------------------------------- bad input
def _one_error_line(r) -> str:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("error: ") and "Traceback" not in r.output
    return lines[0]


BAD = [
    (["--name", "a/b", "--device", "cpu"], "--name"),
    (["--device", "cpu"], "--name"),
    (["--name", "x", "--device", "tpu"], "--device"),
    (["--name", "x", "--device", "cpu", "--peak-tflops", "100"], "--peak-tflops"),
    (["--name", "x", "--device", "cpu", "--gpu-memory", "10 parsecs"], "--gpu-memory"),
    (["--name", "x", "--device", "cpu", "--gpu-memory", "100TiB"], "--gpu-memory"),
    (["--name", "x", "--device", "cpu", "--attention-backend", "magic"], "--attention-backend"),
    (["--name", "x", "--device", "cpu", "--threads", "0"], "--threads"),
    (["--name", "x", "--device", "cpu", "--attention-shapes", "8y32"], "--attention-shapes"),
    (["--name", "x", "--device", "cpu", "--no-collectives"], "--base"),
    (["--name", "x", "--device", "cpu", "--node-from-base"], "--node-from-base"),
    (["--name", "x", "--device", "cpu", "--base", "no-such-profile"], "no-such-profile"),
    (["--name", "x", "--device", "cpu", "--peak-tflops", "lots"], "--peak-tflops"),
    (["--name", "x", "--colour", "red"], "--colour"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_options_are_one_line_errors(args, needle, tmp_path):
    r = CliRunner().invoke(calibrate_cmd, args + ["--out-dir", str(tmp_path)])
    assert needle in _one_error_line(r)
    assert not list(tmp_path.iterdir())  # nothing written


def test_an_unknown_option_points_at_the_help_as_every_command_does(tmp_path):
    # as `memo-sim whatif --bogus` and `memo-exec run --bogus` (`memo_sim.errors.usage_line`)
    r = CliRunner().invoke(calibrate_cmd, ["--name", "x", "--progress", "--out-dir", str(tmp_path)],
                           prog_name="memo-exec calibrate")
    assert _one_error_line(r) == "error: No such option '--progress'; see `memo-exec calibrate -h`"


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
def test_cuda_without_a_gpu_is_a_one_line_error(tmp_path):
    r = CliRunner().invoke(calibrate_cmd, ["--name", "x", "--device", "cuda", "--out-dir", str(tmp_path)])
    assert "cuda" in _one_error_line(r)


def test_existing_profile_needs_force(tmp_path):
    (tmp_path / "mine.yaml").write_text("keep me\n")
    r = CliRunner().invoke(calibrate_cmd, ["--name", "mine", "--device", "cpu", "--out-dir", str(tmp_path)])
    assert "--force" in _one_error_line(r)
    assert (tmp_path / "mine.yaml").read_text() == "keep me\n"


def test_registered_in_a_group_keeps_one_line_errors(tmp_path):
    @click.group()
    def group():
        pass

    group.add_command(calibrate_cmd)
    r = CliRunner().invoke(group, ["calibrate", "--name", "x", "--bogus", "--out-dir", str(tmp_path)])
    assert "--bogus" in _one_error_line(r)
    r = CliRunner().invoke(group, ["calibrate", "--help"])
    assert r.exit_code == 0 and "--quick" in r.output


# ---------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_quick_calibration(tmp_path):
    import time

    t0 = time.perf_counter()
    r = CliRunner().invoke(calibrate_cmd, ["--device", "cuda", "--quick", "--name", "gpu-test", "--out-dir",
                                           str(tmp_path), "--raw-out", str(tmp_path / "raw.json")])
    elapsed = time.perf_counter() - t0
    assert r.exit_code == 0, r.output
    prof = load_profile(tmp_path / "gpu-test.yaml")
    assert prof.peak("bf16") > 1e14
    for c in (prof.efficiency.gemm, prof.efficiency.attention_fwd, prof.efficiency.attention_bwd):
        assert curve_is_monotone([list(p) for p in c.points])
    assert 0.2 < prof.efficiency.gemm(1e13) <= 1
    assert float(prof.host_link.h2d_bandwidth) > 1e9 and float(prof.host_link.d2h_bandwidth) > 1e9
    assert float(prof.gpu.hbm_bandwidth) > 5e11
    assert prof.gpu_memory > 1e10 and prof.usable_gpu_memory > 0
    assert prof.provenance["device_kind"] == "cuda" and prof.provenance["driver"]
    assert prof.internode.bandwidth.source.startswith("from base profile")
    assert elapsed < 120, f"--quick took {elapsed:.0f} s"


def test_cpu_threads_are_the_free_cores(monkeypatch):
    """Calibrating a CPU: the threads default to the cores not busy less one for the copy streams
    (cores less the rounded load less 1, at least 1, at most torch's default); --threads wins;
    CUDA keeps torch's default."""
    import os

    import torch

    from memo_exec.calibrate import suite

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for load, want in ((0.2, 1), (0.9, 1), (1.4, 1), (7.0, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        n, why = suite.cpu_threads(None, cuda=False)
        assert n == want and "free cores" in why and "copy streams" in why
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    for load, want in ((0.2, 7), (2.6, 4), (9.0, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert suite.cpu_threads(None, cuda=False)[0] == want
    assert suite.cpu_threads(3, cuda=False)[0] == 3
    assert suite.cpu_threads(None, cuda=True)[0] is None



def test_time_kernel_on_a_cpu_is_plain_timing():
    from memo_exec.calibrate.microbench import Bench  # noqa: PLC0415

    x = torch.randn(64, 64)
    tm = Bench(torch.device("cpu"), target_s=0.001, min_repeats=3, max_repeats=5).time_kernel(lambda: x @ x)
    assert tm.method == "events" and tm.calls == 1 and tm.seconds > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_short_cuda_kernel_is_timed_by_graph_replay_below_the_launch_interval():
    # an event pair around one launch from Python times the host's launch interval (an H200, 2026-11-26:
    # every bf16 GEMM of 5e8-2e9 FLOPs took 22 us); graph replays time the kernel
    from memo_exec.calibrate.microbench import Bench  # noqa: PLC0415

    a = torch.randn(2048, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 1024, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(2048, 1024, device="cuda", dtype=torch.bfloat16)
    bench = Bench(torch.device("cuda"), target_s=0.01, min_repeats=3, max_repeats=30)
    events = bench.time(lambda: torch.mm(a, b, out=out))
    graph = bench.time_kernel(lambda: torch.mm(a, b, out=out))
    assert graph.method == "cuda_graph" and graph.calls > 1
    assert graph.seconds < events.seconds


def test_a_cpu_profile_whose_collectives_failed_runs_one_rank(cpu_calibration, tmp_path):
    """Where the gloo collectives were not measured (the links from --base), the profile's machine is one rank, not
    the two it would have measured between (a review of this session's diff)."""
    from memo_exec.calibrate.suite import measured_ranks

    _out, _r, raw = cpu_calibration
    assert measured_ranks(raw["collectives"]) == raw["cpu_budget"]["ranks"] == 2
    failed = copy.deepcopy(raw)
    failed["collectives"] = {"measured": False, "reason": "gloo run failed"}
    failed["cpu_budget"]["ranks"] = measured_ranks(failed["collectives"])
    prof = write_profile(build_profile("cpu-one", failed, load_base("h100-sxm5-80gb")), tmp_path / "cpu-one.yaml")
    assert prof.node_gpus == 1 and "one executor device per process" in prof.gpus_per_node.source
