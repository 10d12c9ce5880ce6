"""Datasheet profiles of NVIDIA Blackwell nodes (HGX B200, GB200 NVL72) and the FP8 peaks of the
Hopper profiles: listed, loaded, not calibrated, dense peaks with their sources, and a what-if
finds a fitting plan on each (the GB200 NVL72 as one 72-GPU NVLink domain)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.profile.loader import REPO_PROFILES, list_profiles, load_profile

BLACKWELL = {"b200-180gb": 8, "gb200-nvl72": 72}  # profile -> GPUs per node (NVLink domain)
HOPPER = ("h100-sxm5-80gb", "h200-141gb")
SUMMARY = "datasheet numbers, assumed GEMM curves, attention curves from public B200 kernel benchmarks"
# the Hopper profiles' curves were measured on single GPUs (benchmarks/gpu/hopper_curves.py)
HOPPER_SUMMARY = "datasheet numbers; GEMM, attention and FP8 GEMM efficiency curves measured on a single Hopper GPU"


def _run(args):
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def test_profiles_lists_the_blackwell_and_h200_profiles():
    out = _run(["profiles"])
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    for name, gpn in {**BLACKWELL, "h200-141gb": 8}.items():
        assert name in rows, out
        assert "INVALID" not in rows[name]
        assert f"  {gpn}  " in rows[name], rows[name]  # the gpus/node column
        assert str(REPO_PROFILES / f"{name}.yaml") in rows[name]
        assert "  datasheet  " in rows[name], rows[name]  # the provenance column
    # and every answer on a profile prints its provenance line
    for name in (*BLACKWELL, "h200-141gb"):
        p = load_profile(name)
        summary = HOPPER_SUMMARY if name == "h200-141gb" else SUMMARY
        assert p.provenance == {"method": "datasheet", "summary": summary}
        assert p.provenance_line() == f"not calibrated (datasheet): {summary}"


@pytest.mark.parametrize("name,gpn", sorted(BLACKWELL.items()))
def test_blackwell_profile_loads_with_dense_peaks(name, gpn):
    assert name in list_profiles()
    p = load_profile(name)
    assert not p.calibrated and p.device_kind == "cuda"
    assert p.node_gpus == gpn
    peaks = {k: p.peak(k) for k in ("bf16", "fp16", "fp32", "fp8", "fp4")}
    assert set(peaks) <= set(p.gpu.peak_flops)
    assert peaks["fp16"] == peaks["bf16"] > 1e15 > peaks["fp32"]
    # dense Blackwell tensor-core peaks double with each halving of the format (datasheets)
    assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"]) and peaks["fp4"] == pytest.approx(2 * peaks["fp8"])
    assert peaks["fp4"] > peaks["fp8"] > peaks["bf16"]
    # MXFP8 runs at the FP8 rate: an assumption, said so (no datasheet line of its own)
    assert p.peak("mxfp8") == peaks["fp8"] and p.gpu.peak_flops["mxfp8"].source.startswith("assumed")
    for k, q in p.gpu.peak_flops.items():
        if k == "mxfp8":
            continue
        assert "datasheet" in q.source or "technical brief" in q.source, (k, q.source)
        if k != "fp32":  # a tensor-core peak: dense, halved where the datasheet gives only the sparse value
            assert "dense" in q.source, (k, q.source)
            assert "sparse value / 2" in q.source or "without" in q.source, (k, q.source)
    # the GEMM curve is a stated assumption; the attention curves are public B200 kernel measurements (no
    # published training run): FlashAttention-2 at about 15% of the peak (Ampere's mma.sync on Blackwell), cuDNN's
    # fused attention forward about half, its backward assumed from the H100's measured backward / forward ratio
    assert p.efficiency.gemm.source.startswith("assumed: same fractions of peak as the H100 profile's assumptions")
    eff = p.efficiency
    assert eff.attention_fwd.source.startswith("public B200 measurements") and eff.attention_bwd.source.startswith(
        "public B200 measurements")
    assert max(y for _x, y in eff.attention_fwd.points) < 0.17 and max(y for _x, y in eff.attention_bwd.points) < 0.16
    fwd, bwd = eff.attention_curves("cudnn")
    assert 0.45 < fwd(1e12) < 0.55 and bwd(2.5e12) == pytest.approx(0.87 * fwd(1e12), rel=0.03)
    assert eff.attention_cudnn_bwd.source.startswith("assumed")
    assert p.efficiency.elementwise.source.startswith("assumed")
    assert 150e9 < p.usable_gpu_memory < p.gpu_memory and p.usable_host_memory > 0
    # 1.8 TB/s both directions, 900 GB/s one direction, at the 80% of it NCCL reaches on NVLink 4 (assumed on NVLink 5)
    assert float(p.nvlink.bandwidth) == pytest.approx(0.8 * 900e9)
    assert float(p.internode.bandwidth) == pytest.approx(50e9)  # one 400 Gb/s NIC per GPU
    from memo_exec.calibrate.sanity import check

    assert check(p, {"env": {"device_kind": "cuda"}}, "bf16") == []  # calibrate's plausibility checks pass


def test_gb200_host_side_is_the_racks_graces():
    p = load_profile("gb200-nvl72")
    assert float(p.host.memory_bytes) == pytest.approx(36 * 480e9)  # 36 Graces x 480 GB LPDDR5X
    assert float(p.host.memory_bandwidth) == pytest.approx(36 * 512e9)
    hl = p.host_link
    assert int(hl.gpus_per_pcie_switch.value) == 2 and int(hl.gpus_per_socket.value) == 2  # 2 GPUs per Grace
    assert "NVLink-C2C" in hl.pcie_switch_bandwidth.source and "NVLink-C2C" in hl.d2h_bandwidth.source


@pytest.mark.parametrize("name", HOPPER)
def test_hopper_profiles_have_dense_fp8_twice_bf16(name):
    p = load_profile(name)
    assert p.peak("fp8") == pytest.approx(2 * p.peak("bf16"), rel=0.01)
    assert "sparse value / 2" in p.gpu.peak_flops["fp8"].source
    assert "fp4" not in p.gpu.peak_flops  # Hopper has no FP4 tensor cores


@pytest.mark.parametrize("name,gpus", sorted(BLACKWELL.items()))
def test_whatif_finds_a_fitting_plan(name, gpus):
    d = json.loads(_run(["whatif", "--model", "llama-3.1-8b", "--gpus", str(gpus), "--seq", "32K", "--profile", name,
                         "--no-plan", "--json", "--jobs", "1", "--pp", "1"]))  # the best has no pipeline either way
    assert d["profile"] == name and d["gpus"] == gpus
    assert d["profile_provenance"]["calibrated"] is False and SUMMARY in d["profile_provenance"]["line"]
    assert not d["nothing_fits"]
    best = d["candidates"][0]
    assert best["status"] == "OK" and best["tier"] == "simulated"
    assert best["peak_gpu_bytes"] <= best["gpu_capacity_bytes"] == pytest.approx(load_profile(name).usable_gpu_memory)
    assert 0 < best["simulated_mfu"] < 1


def test_calibrate_finds_the_datasheet_peaks_of_blackwell_devices():
    """calibrate reads a device's datasheet peaks from the shipped profile whose gpu.model (less its
    parenthesised note) is the name torch reports."""
    from memo_exec.calibrate.datasheet import known_peak

    assert known_peak("NVIDIA B200").bf16_tflops == 2250.0
    assert known_peak("NVIDIA GB200").bf16_tflops == 2500.0
    assert known_peak("NVIDIA B300") is None  # no shipped B300 profile


def test_a_plan_on_part_of_a_gb200_rack_pins_only_its_own_trays_memory():
    """The rack's 36 Graces' memory was one pool for any plan on it: an 8-GPU plan (2 of the 18 trays) could pin the
    other 16 trays' memory, MEMO's alpha solved against 14 TiB where the plan's hosts hold 1.6. Each plan now gets
    the memory of the hosts its GPUs take (`HardwareProfile.host_capacity`); a whole rack's is unchanged, and a node
    of one host (every other profile) keeps the node's whole memory."""
    from memo_sim.api import get_model
    from memo_sim.layout.parallel import Layout
    from memo_sim.memplan.footprint import memory_breakdown
    from memo_sim.policy import get_policy
    from memo_sim.search.whatif import rank

    gb = load_profile("gb200-nvl72")
    assert gb.host_capacity(8) == pytest.approx(gb.usable_host_memory * 2 / 18)
    assert gb.host_capacity(72) == gb.host_capacity(1000) == gb.usable_host_memory
    assert gb.host_capacity(5) == gb.host_capacity(8)  # a started tray's memory is the plan's
    assert gb.host_memory_bandwidth(8) == pytest.approx(4 * 512e9)  # and its 4 Graces' bandwidth, not 36's
    from memo_sim.cost.transfer import host_bandwidth_per_gpu

    assert host_bandwidth_per_gpu(gb, "d2h", 8) == pytest.approx(min(360e9 / 2, 4 * 512e9 / 8))
    h100 = load_profile("h100-sxm5-80gb")
    assert h100.host_capacity(1) == h100.usable_host_memory
    m = get_model("llama-3.1-8b")
    part = memory_breakdown(m, Layout(tp=8), 1, 1 << 20, get_policy("memo", 1.0), gb)
    assert part.host_capacity_bytes == pytest.approx(gb.host_capacity(8))
    best = rank(m, 2 << 20, 8, gb, policies=("memo",), simulate_top=1).best  # alpha against the 2 trays' memory
    assert best is not None and best.memory.host_bytes_per_node <= gb.host_capacity(8)
    words = _run(["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "2M", "--profile", "gb200-nvl72",
                  "--policy", "memo", "--no-plan", "--jobs", "1", "--simulate-top", "1"])
    assert "(the 2 of the node's 18 hosts of 4 GPUs that its 8 GPUs take, " in words, words


def test_gb300_nvl72_is_blackwell_ultra_with_one_and_a_half_times_the_fp4_rate():
    """The GB300 NVL72 rack (Blackwell Ultra): the GB200's bf16 and FP8 rates, 1.5x its dense FP4 rate (three times
    FP8's, not twice as on Blackwell), 284,208 MiB of HBM3e a GPU (the driver's total), one 800 Gb/s NIC a GPU; its Graces' memory as the
    GB300 table gives it (17 TB at 14 TB/s), their links the GB200's (said assumed in each value's source). NVFP4
    GEMMs make a 70B step faster than MXFP8's, MXFP8's than bf16's, and every plan fits."""
    from memo_exec.calibrate.datasheet import known_peak

    p, gb200 = load_profile("gb300-nvl72"), load_profile("gb200-nvl72")
    out = _run(["profiles"])
    row = next(ln for ln in out.splitlines() if ln.startswith("gb300-nvl72 "))
    assert "  72  " in row and "  datasheet  " in row and "Blackwell Ultra" in row
    assert p.provenance == {"method": "datasheet", "summary": SUMMARY} and not p.calibrated
    assert p.node_gpus == 72 and p.host_gpus == 4
    assert p.peak("bf16") == gb200.peak("bf16") and p.peak("fp8") == gb200.peak("fp8") == 2 * p.peak("bf16")
    assert p.peak("fp4") == pytest.approx(1.5 * gb200.peak("fp4")) == pytest.approx(3 * p.peak("fp8"))
    fp4 = p.gpu.peak_flops["fp4"].source
    assert "1,080 PFLOPS without" in fp4 and "dense" in fp4 and "GB300" in fp4
    assert float(p.gpu_memory) == pytest.approx(284208 * 2**20) and float(p.internode.bandwidth) == pytest.approx(100e9)
    # the rack's Graces: the GB300 table's 17 TB at 14 TB/s; their NVLink-C2C links the GB200's (said assumed)
    assert float(p.host.memory_bytes) == float(gb200.host.memory_bytes)
    assert float(p.host.memory_bandwidth) == pytest.approx(14e12)
    assert float(p.host.memory_bandwidth) < float(gb200.host.memory_bandwidth)
    assert "GB300 NVL72 specifications: 17 TB" in p.host.memory_bytes.source
    assert "assumed the GB200" in p.host_link.d2h_bandwidth.source
    # the kernel curves: the B200's public attention measurements and the assumed GEMM fractions, said so
    assert p.efficiency.gemm.source.startswith("assumed: same fractions of peak as the H100 profile's assumptions")
    assert p.efficiency.attention_fwd.source.startswith("public B200 measurements")
    assert "doubled SFU exponential rate" in p.efficiency.attention_fwd.source
    from memo_exec.calibrate.sanity import check

    assert check(p, {"env": {"device_kind": "cuda"}}, "bf16") == []  # calibrate's plausibility checks pass
    assert known_peak("NVIDIA GB300").bf16_tflops == 2500.0
    steps = {}
    for f in ("bf16", "mxfp8", "nvfp4"):
        d = json.loads(_run(["whatif", "--model", "llama-3.1-70b", "--gpus", "72", "--seq", "8K", "--profile",
                             "gb300-nvl72", "--precision", f, "--framework", "megatron", "--no-plan", "--json",
                             "--jobs", "1", "--pp", "1", "--policy", "store_all", "--simulate-top", "1",
                             "--tp", "1", "--zero", "3"]))
        # (the full search's best for each format: tp1-dp72-z3 store_all, its layout fixed here: the same plan, peak
        # and simulated step as the search over tp, cp and ZeRO finds, 2026-12-02, in a ninth of the time)
        best = d["candidates"][0]
        assert best["status"] == "OK" and best["peak_gpu_bytes"] <= best["gpu_capacity_bytes"]
        steps[f] = best["simulated_iteration_s"]
    assert steps["nvfp4"] < steps["mxfp8"] < steps["bf16"], steps
