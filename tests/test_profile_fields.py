"""A user's review: profile validation took 1000x unit slips and contradictory fields (``gpu.memory: 80 TB``, HBM at
3.35 GB/s, a bf16 peak in GFLOP/s, an fp8 peak below the bf16 one, 16 GPUs per host on an 8-GPU node, a key given
twice) and the what-if answered on them; `memo-sim profiles` listed a profile with an unknown
``efficiency.gemm_formats`` key as valid where ``whatif`` refused it. Each is now one line naming the field and the
fix, exit status 2 (`memo_sim.profile.plausible`, `memo_sim.profile.loader.profile_document`)."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.errors import ProfileError
from memo_sim.profile.loader import REPO_PROFILES, list_profiles, load_profile

H100 = REPO_PROFILES / "h100-sxm5-80gb.yaml"
WHATIF = ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--no-plan"]


def _variant(tmp_path, old: str, new: str, name: str = "slip.yaml"):
    text = H100.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path = tmp_path / name
    path.write_text(text.replace(old, new), encoding="utf-8")
    return path


def _refused(path) -> str:
    """The what-if's one error line on the profile ``path`` (exit status 2, no traceback)."""
    r = CliRunner().invoke(cli, WHATIF + ["--profile", str(path)])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert str(path) in lines[0]
    return lines[0]


@pytest.mark.parametrize("old,new,needles", [
    ("memory: {value: 85017493504, unit: B,", "memory: {value: 80, unit: TB,",
     ["gpu.memory: 80 TB is not plausible for a GPU", "did you mean 80 GB?"]),
    ("hbm_bandwidth: {value: 3350, unit: GB/s,", "hbm_bandwidth: {value: 3.35, unit: GB/s,",
     ["gpu.hbm_bandwidth: 3.35 GB/s is not plausible", "did you mean 3.35 TB/s?"]),
    ("bf16: {value: 989, unit: TFLOP/s,", "bf16: {value: 989, unit: GFLOP/s,",
     ["gpu.peak_flops.bf16: 989 GFLOP/s is not plausible", "did you mean 989 TFLOP/s?"]),
    ("  bandwidth: {value: 370, unit: GB/s,", "  bandwidth: {value: 370, unit: MB/s,",
     ["nvlink.bandwidth: 370 MB/s is not plausible", "did you mean 370 GB/s?"]),
    ("  bandwidth: {value: 370, unit: GB/s,", "  bandwidth: {value: 3600, unit: GB/s,",  # its Gb/s, in GB/s
     ["nvlink.bandwidth: 3600 GB/s is not plausible", "check the value and its unit"]),
    ("fp8: {value: 1979, unit: TFLOP/s,", "fp8: {value: 500, unit: TFLOP/s,",
     ["gpu.peak_flops.fp8: 500 TFLOP/s is below gpu.peak_flops.bf16 (989 TFLOP/s)", "dense, not sparse"]),
    ('source: "HGX 8-GPU baseboard"}', 'source: "HGX 8-GPU baseboard"}\n  gpus_per_host: {value: 16, unit: count, '
     'source: "x"}', ["node.gpus_per_host: 16 is more than node.gpus_per_node (8)", "1, 2, 4, 8"]),
    ('source: "HGX 8-GPU baseboard"}', 'source: "HGX 8-GPU baseboard"}\n  gpus_per_host: {value: 3, unit: count, '
     'source: "x"}', ["node.gpus_per_host: 3 does not divide node.gpus_per_node (8)"]),
    ("gpus_per_socket: {value: 4,", "gpus_per_socket: {value: 64,",
     ["host_link.gpus_per_socket: 64 is more than node.gpus_per_node (8)"]),
    ("gpus_per_socket: {value: 4,", "gpus_per_socket: {value: 3,",
     ["host_link.gpus_per_socket: 3 does not divide node.gpus_per_node (8)"]),
])
def test_a_unit_slip_or_a_contradiction_is_one_line_naming_the_field(tmp_path, old, new, needles):
    line = _refused(_variant(tmp_path, old, new))
    for needle in needles:
        assert needle in line, line


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    """YAML keeps the last of two ``hbm_bandwidth:`` silently: the reader sees the first, memo read the second."""
    text = H100.read_text(encoding="utf-8")
    first = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith("  hbm_bandwidth:"))
    path = _variant(tmp_path, "  copy_compute_slowdown:",
                    '  hbm_bandwidth: {value: 335, unit: GB/s, source: "typo"}\n  copy_compute_slowdown:')
    line = _refused(path)
    assert f"gpu.hbm_bandwidth is given twice (lines {first} and {first + 1}); YAML keeps the last" in line, line
    raw = yaml.safe_load(H100.read_text(encoding="utf-8"))
    js = tmp_path / "twice.json"
    js.write_text(json.dumps(raw).replace('"name": "h100-sxm5-80gb"', '"name": "a", "name": "b"'), encoding="utf-8")
    assert "key 'name' is given twice in one object; JSON keeps the last" in _refused(js)


def test_the_listing_applies_the_whatifs_gemm_format_check(tmp_path, monkeypatch):
    """`memo-sim profiles` listed a profile whose efficiency.gemm_formats names no format as valid; whatif refused
    it. Both read it through the loader now."""
    path = _variant(tmp_path, "    fp8-tensorwise:\n", "    fp8_tensorwise:\n", name="typo-format.yaml")
    # found by its file name, the file declares that name (`memo_sim.profile.loader._named`)
    path.write_text(path.read_text(encoding="utf-8").replace("name: h100-sxm5-80gb", "name: typo-format", 1),
                    encoding="utf-8")
    monkeypatch.setenv("MEMO_PROFILES", str(tmp_path))
    r = CliRunner().invoke(cli, ["profiles"])
    assert r.exit_code == 0, r.output
    row = next(ln for ln in r.output.splitlines() if ln.startswith("typo-format "))
    assert "INVALID" in row and "efficiency.gemm_formats.fp8_tensorwise: no such GEMM format" in row, row
    line = _refused(path)
    assert "did you mean 'fp8-tensorwise'?" in line and "name one of fp8-tensorwise" in line, line


def test_every_profile_memo_ships_or_tests_with_loads():
    """The ranges cover the shipped profiles (an A100 to a GB300 NVL72 rack) and the calibrated CPU profiles."""
    from tests.calibration_fixtures import COMMITTED_CPU_PROFILE

    names = list_profiles()
    assert {"a100-sxm4-80gb", "gb300-nvl72", "h100-sxm5-80gb"} <= set(names)
    for path in [*names.values(), *COMMITTED_CPU_PROFILE.parent.glob("*.yaml")]:
        load_profile(path)


def _raw_h100() -> dict:
    return yaml.safe_load(H100.read_text(encoding="utf-8"))


def test_a_measured_field_is_not_range_checked_and_a_calibrated_node_may_fill_sockets_unevenly(tmp_path):
    """calibrate measured it on the device and wrote its unit (its tests reshape a CPU run as a GPU's), and a node of
    the 6 GPUs it saw keeps the base profile's 4 a socket: refused only where typed by hand."""
    raw = _raw_h100()
    raw["gpu"]["hbm_bandwidth"] = {"value": 15, "unit": "GB/s", "source": "measured"}
    raw["node"]["gpus_per_node"]["value"] = 6
    path = tmp_path / "typed.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ProfileError, match="gpu.hbm_bandwidth: 15 GB/s is not plausible"):
        load_profile(path)
    raw["provenance"] = {"method": "calibrated", "tool": "memo-exec calibrate",
                         "measured_fields": ["gpu.hbm_bandwidth"]}
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    p = load_profile(path)
    assert float(p.gpu.hbm_bandwidth) == 15e9 and p.node_gpus == 6 and p.host_link.gpus_per_socket.value == 4
    raw["provenance"] = {"method": "datasheet"}
    raw["gpu"]["hbm_bandwidth"] = _raw_h100()["gpu"]["hbm_bandwidth"]
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ProfileError, match="host_link.gpus_per_socket: 4 does not divide node.gpus_per_node"):
        load_profile(path)


def test_a_cpu_profile_keeps_its_own_ranges(tmp_path):
    """A CPU's 8 GiB budget, 15 GB/s and 76 GFLOP/s would be slips on a GPU; device_kind cpu reads them as a CPU's."""
    from tests.calibration_fixtures import COMMITTED_CPU_PROFILE

    raw = yaml.safe_load(COMMITTED_CPU_PROFILE.read_text(encoding="utf-8"))
    raw["provenance"]["measured_fields"] = []  # every field range-checked, as if typed
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert load_profile(path).device_kind == "cpu"
    raw["gpu"]["memory"] = {"value": 80000, "unit": "TB", "source": "typo"}
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ProfileError, match=r"gpu.memory: 80000 TB is not plausible for a CPU profile"):
        load_profile(path)


@pytest.mark.parametrize("name,mib", [("gb200-nvl72", 189471), ("gb300-nvl72", 284208)])
def test_grace_blackwell_memory_is_the_drivers_total(name, mib):
    """GB200 and GB300 gave the datasheet's decimal GB (186e9, 279e9 bytes: 173.23 and 259.84 GiB) where the B200
    and H200 give the total the driver reports; nvidia-smi -q -x on real GB200 and GB300 nodes reports
    189471 MiB and 284208 MiB (NVIDIA/k8s-test-infra's hardware captures, cited in each value's source)."""
    p = load_profile(name)
    assert float(p.gpu_memory) == mib * 2**20
    assert f"{mib} MiB" in p.gpu.memory_bytes.source and "k8s-test-infra" in p.gpu.memory_bytes.source
