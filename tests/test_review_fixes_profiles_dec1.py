"""A review of the profiles (2026-12-01): a profile found by its file name but declaring another ``name:``, the
sensitivity check's kernel efficiency perturbation leaving cuDNN's and the quantised formats' curves alone,
latencies and allocator fields without a plausible range, and a PCIe switch count not checked against the node."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.errors import ProfileError
from memo_sim.plan.schema import read_plan, with_profile_reference
from memo_sim.profile.loader import REPO_PROFILES, list_profiles, load_profile
from memo_sim.profile.schema import Curve
from memo_sim.report.sensitivity import perturbed

B200 = REPO_PROFILES / "b200-180gb.yaml"
WHATIF = ["whatif", "--model", "llama-3.1-8b", "--layers", "2", "--gpus", "16", "--seq", "8K", "--tp", "1",
          "--dp", "16"]


def _my_b200(folder, name: str = "b200-180gb"):
    """The review's copy of b200-180gb.yaml: slower HBM and network, its ``name:`` as given."""
    text = B200.read_text(encoding="utf-8")
    text = text.replace("name: b200-180gb", f"name: {name}", 1)
    lines = text.splitlines(keepends=True)
    for i, ln in enumerate(lines):
        if ln.startswith("  hbm_bandwidth:"):
            lines[i] = '  hbm_bandwidth: {value: 2000, unit: GB/s, source: "review"}\n'
    out, section = [], ""
    for ln in lines:
        if ln and not ln[0].isspace():
            section = ln.split(":")[0]
        if section == "internode" and ln.startswith("  bandwidth:"):
            ln = '  bandwidth: {value: 5, unit: GB/s, source: "review"}\n'
        out.append(ln)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "my-b200.yaml"
    path.write_text("".join(out), encoding="utf-8")
    return path


# -- 1: the profile a plan records ----------------------------------------------------------------------------------

def test_a_profile_found_by_its_file_name_declaring_another_name_is_refused(tmp_path, monkeypatch):
    path = _my_b200(tmp_path / "prof2")
    monkeypatch.setenv("MEMO_PROFILES", str(tmp_path / "prof2"))
    with pytest.raises(ProfileError) as e:
        load_profile("my-b200")
    line = str(e.value)
    assert "\n" not in line and str(path) in line and "name: is 'b200-180gb'" in line, line
    assert "set `name: my-b200` in the file" in line, line
    r = CliRunner().invoke(cli, WHATIF + ["--profile", "my-b200", "--out", str(tmp_path / "my")])
    assert r.exit_code == 2 and "set `name: my-b200`" in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "my" / "plan.json").exists()
    # the stock profile of that name is still the stock one; the file by its path still loads
    assert load_profile("b200-180gb").path == str(B200)
    assert float(load_profile(path).gpu.hbm_bandwidth) == 2e12


def test_a_plan_records_the_profile_looked_up_and_is_re_priced_on_it(tmp_path, monkeypatch):
    """The review's profile with its name set: the plan names it and check-plan re-prices on it, not on the stock
    B200 (whose plan of the same layout is several times faster)."""
    _my_b200(tmp_path / "prof2", name="my-b200")
    monkeypatch.setenv("MEMO_PROFILES", str(tmp_path / "prof2"))
    r = CliRunner().invoke(cli, WHATIF + ["--profile", "my-b200", "--out", str(tmp_path / "my")])
    assert r.exit_code == 0 and "(my-b200)" in r.output, r.output
    plan = read_plan(tmp_path / "my" / "plan.json")
    assert plan.profile == "my-b200"
    r = CliRunner().invoke(cli, ["check-plan", str(tmp_path / "my" / "plan.json")])
    assert "another profile" not in r.output, r.output
    stock = read_plan(_stock_plan(tmp_path))
    assert stock.profile == "b200-180gb"
    assert stock.predicted.iteration_s < plan.predicted.iteration_s / 2


def test_with_profile_reference_records_the_name_given_not_the_declared_one(tmp_path):
    plan = read_plan(_stock_plan(tmp_path))
    assert with_profile_reference(plan, "my-b200").profile == "my-b200"
    assert with_profile_reference(plan, plan.profile) is plan
    f = tmp_path / "x.yaml"
    f.write_text(B200.read_text(encoding="utf-8"))
    assert with_profile_reference(plan, str(f)).profile == str(f.resolve())


def _stock_plan(tmp_path):
    out = tmp_path / "stock"
    r = CliRunner().invoke(cli, WHATIF + ["--profile", "b200-180gb", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


def test_every_shipped_profile_declares_its_file_name():
    for name, path in list_profiles().items():
        if path.parent == REPO_PROFILES:
            assert load_profile(path).name == path.stem == name
            assert load_profile(name).name == name


# -- 2: the sensitivity check's kernel efficiency --------------------------------------------------------------------

def _curves(prof) -> dict[str, Curve]:
    e = prof.efficiency
    out = {f.name: getattr(e, f.name) for f in dataclasses.fields(e) if isinstance(getattr(e, f.name), Curve)}
    out.update({f"gemm_formats.{k}": c for k, c in e.gemm_formats})
    return out


@pytest.mark.parametrize("name", ["b200-180gb", "h100-sxm5-80gb"])
def test_kernel_efficiency_scales_every_curve_the_profile_has(name):
    prof = load_profile(name)
    base = _curves(prof)
    assert "attention_cudnn_fwd" in base and "attention_cudnn_bwd" in base
    if name.startswith("h100"):
        assert "gemm_formats.fp8-tensorwise" in base
    for f in (0.8, 1.2):
        moved = _curves(perturbed(prof, "kernel efficiency", f))
        assert set(moved) == set(base)
        for k, c in base.items():
            assert moved[k].points == tuple((x, min(1.0, y * f)) for x, y in c.points), k


def test_a_cudnn_plan_moves_with_kernel_efficiency():
    """The review's B200 plan on cuDNN's attention moved +2.6% with "kernel efficiency +20%": only the GEMM and
    FlashAttention-2 curves were scaled, not the cuDNN ones that price it."""
    from memo_sim.layout.parallel import Layout
    from memo_sim.model.config import get_model, with_overrides
    from memo_sim.search.whatif import make_candidate

    prof = load_profile("b200-180gb")
    model = with_overrides(get_model("llama-3.1-8b"), layers=2)
    lay = Layout(tp=1, dp=1, attention="cudnn")
    assert prof.efficiency.priced_attention_kernel(lay.attention) == "cudnn"
    seq = 128 * 1024
    base = make_candidate(model, lay, "full_recompute", 1, seq, prof, None)
    up = make_candidate(model, lay, "full_recompute", 1, seq, perturbed(prof, "kernel efficiency", 1.2), None)
    assert base.status == up.status == "OK"
    assert up.estimate.tgs / base.estimate.tgs > 1.15, (base.estimate.tgs, up.estimate.tgs)


# -- 3: latencies and allocator fields --------------------------------------------------------------------------------

def _variant(tmp_path, old: str, new: str):
    text = B200.read_text(encoding="utf-8")
    assert old in text, old
    path = tmp_path / "variant.yaml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


def _nvlink_latency(value, unit):
    text = B200.read_text(encoding="utf-8")
    i = text.index("\nnvlink:")
    j = text.index("  latency: {value: 8, unit: us", i)
    return text[:j] + f"  latency: {{value: {value}, unit: {unit}" + text[j + len("  latency: {value: 8, unit: us"):]


@pytest.mark.parametrize("value,unit", [(8, "s"), (8, "ms"), (8, "ns")])
def test_an_nvlink_latency_unit_slip_is_one_line_naming_the_field(tmp_path, value, unit):
    path = tmp_path / "lat.yaml"
    path.write_text(_nvlink_latency(value, unit), encoding="utf-8")
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    line = str(e.value)
    assert "\n" not in line and f"nvlink.latency: {value} {unit} is not plausible" in line, line
    assert "did you mean 8 us?" in line, line
    r = CliRunner().invoke(cli, WHATIF + ["--profile", str(path), "--no-plan"])
    assert r.exit_code == 2 and "nvlink.latency" in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("old,new,field", [
    ("  latency: {value: 12, unit: us", "  latency: {value: 12, unit: s", "internode.latency"),
    ("  latency: {value: 10, unit: us", "  latency: {value: 10, unit: ms", "host_link.latency"),
    ("    sync: {value: 20, unit: us", "    sync: {value: 20, unit: s", "gpu.allocator.sync"),
    ("    cuda_malloc_latency: {value: 50, unit: us", "    cuda_malloc_latency: {value: 50, unit: s",
     "gpu.allocator.cuda_malloc_latency"),
    ("    cuda_free_latency: {value: 50, unit: us", "    cuda_free_latency: {value: 50, unit: ns",
     "gpu.allocator.cuda_free_latency"),
    ("    cuda_malloc_throughput: {value: 2000, unit: GB/s", "    cuda_malloc_throughput: {value: 2000, unit: KB/s",
     "gpu.allocator.cuda_malloc_throughput"),
    ("    cuda_free_throughput: {value: 1000, unit: GB/s", "    cuda_free_throughput: {value: 1000, unit: KB/s",
     "gpu.allocator.cuda_free_throughput"),
])
def test_every_latency_and_allocator_field_has_a_plausible_range(tmp_path, old, new, field):
    with pytest.raises(ProfileError, match=f"{field}: .* is not plausible for a GPU or accelerator"):
        load_profile(_variant(tmp_path, old, new))


def test_a_collective_fit_and_the_kernel_latency_are_range_checked(tmp_path):
    text = B200.read_text(encoding="utf-8")
    fit = ("\n  collectives:\n    all_gather:\n      bandwidth: {value: 400, unit: GB/s, source: t}\n"
           "      latency: {value: LAT, unit: us, source: t}\n")
    i = text.index("\ninternode:")
    for lat, ok in (("0", True), ("20", True), ("20000", False)):
        path = tmp_path / f"fit{lat}.yaml"
        path.write_text(text[:i] + fit.replace("LAT", lat) + text[i + 1:], encoding="utf-8")
        if ok:
            assert float(load_profile(path).nvlink.collectives["all_gather"].latency) == float(lat) * 1e-6
        else:
            with pytest.raises(ProfileError, match="nvlink.collectives.all_gather.latency: 20000 us"):
                load_profile(path)
    j = text.index("  elementwise:")
    path = tmp_path / "kl.yaml"
    path.write_text(text[:j] + "  kernel_latency: {value: 5, unit: s, source: t}\n" + text[j:], encoding="utf-8")
    with pytest.raises(ProfileError, match="efficiency.kernel_latency: 5 s is not plausible"):
        load_profile(path)


def test_the_shipped_and_committed_profiles_latencies_are_in_range():
    from tests.calibration_fixtures import COMMITTED_CPU_PROFILE

    for path in [*REPO_PROFILES.glob("*.yaml"), *COMMITTED_CPU_PROFILE.parent.glob("*.yaml")]:
        load_profile(path)


# -- 4: PCIe switches --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("count,words", [(16, "is more than"), (3, "does not divide")])
def test_a_pcie_switch_count_not_splitting_the_node_is_refused(tmp_path, count, words):
    path = _variant(tmp_path, "gpus_per_pcie_switch: {value: 2,", f"gpus_per_pcie_switch: {{value: {count},")
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    line = str(e.value)
    assert "\n" not in line and f"host_link.gpus_per_pcie_switch: {count} {words} node.gpus_per_node (8)" in line
    assert "give one of 1, 2, 4, 8" in line, line


def test_a_gb200_switch_is_checked_against_its_host_not_its_rack(tmp_path):
    text = (REPO_PROFILES / "gb200-nvl72.yaml").read_text(encoding="utf-8")
    path = tmp_path / "gb.yaml"
    path.write_text(text.replace("gpus_per_pcie_switch: {value: 2,", "gpus_per_pcie_switch: {value: 8,", 1))
    with pytest.raises(ProfileError, match="gpus_per_pcie_switch: 8 is more than node.gpus_per_host \\(4\\)"):
        load_profile(path)
