"""[answers #30 item 1] A profile carries the validation error measured for it (a typed
``validation`` section the loader reads, printed beside its provenance), and an uncalibrated
profile's what-if answer says which assumed inputs could change the ranking (analytic tier)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.errors import ProfileError
from memo_sim.profile.loader import REPO_PROFILES, load_profile

VALIDATION = {"median_abs_iteration_error": 0.124, "plans": 6, "device": "NVIDIA A800-SXM4-80GB",
              "date": "2026-11-23"}


def _profile_with(tmp_path, **extra):
    raw = yaml.safe_load((REPO_PROFILES / "a800-80gb.yaml").read_text())
    raw.update(extra, name="a800-validated")
    path = tmp_path / "a800-validated.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_validation_section_is_read_and_shown(tmp_path):
    p = load_profile(str(_profile_with(tmp_path, validation=VALIDATION)))
    assert p.validation["median_abs_iteration_error"] == 0.124 and p.validation["plans"] == 6
    assert p.provenance_line().endswith("validated on NVIDIA A800-SXM4-80GB (2026-11-23): median |iteration error| "
                                        "12.4% over 6 plans")
    d = json.loads(CliRunner().invoke(cli, ["whatif", "--layers", "2", "--seq", "16K", "--profile",
                                            str(tmp_path / "a800-validated.yaml"), "--json", "--no-plan",
                                            "--simulate-top", "1", "--jobs", "1"]).output)
    assert d["profile_provenance"]["validation"]["plans"] == 6 and "12.4%" in d["profile_provenance"]["line"]
    assert load_profile("a800-80gb").validation == {}  # none measured: nothing claimed


def test_a_bad_validation_section_is_one_line(tmp_path):
    with pytest.raises(ProfileError) as e:
        load_profile(str(_profile_with(tmp_path, validation={**VALIDATION, "plans": 0})))
    assert "validation" in str(e.value) and "\n" not in str(e.value)


def test_sensitivity_line_for_an_uncalibrated_profile_only():
    from memo_sim.model.config import get_model
    from memo_sim.report.sensitivity import perturbed, sensitivity_line
    from memo_sim.search.whatif import fold_duplicates, rank

    prof = load_profile("a800-80gb")
    res = rank(get_model("gpt-7b"), 256 * 1024, 8, prof, simulate_top=0, tp=8, tp_mode="all", jobs=1)
    shown = fold_duplicates(res.candidates)
    line = sensitivity_line(shown, prof)
    assert line.startswith("sensitivity (uncalibrated profile; the best")
    for what in ("kernel efficiency", "host-link bandwidth", "network bandwidth"):
        assert what in line
    slower = perturbed(prof, "host-link bandwidth", 0.5)
    assert float(slower.host_link.d2h_bandwidth) == pytest.approx(0.5 * float(prof.host_link.d2h_bandwidth))
    calibrated = dataclasses.replace(prof, provenance={"method": "calibrated", "device": "x", "date": "y"})
    assert sensitivity_line(shown, calibrated) == ""


def test_a_bare_number_for_a_quantity_and_an_exponent_without_a_point_read_as_users_write_them(tmp_path):
    """'memory: 94' named an internal class ('_QuantityIn') and no fix; 'value: 3e9' (a string to YAML 1.1,
    which wants a decimal point) was refused as 'not a valid number' (a user's review)."""
    raw = yaml.safe_load((REPO_PROFILES / "a800-80gb.yaml").read_text())
    raw["gpu"]["memory"] = 94
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump({**raw, "name": "bare"}))
    with pytest.raises(ProfileError) as e:
        load_profile(str(bare))
    msg = str(e.value)
    assert "gpu.memory: a quantity is a mapping, got 94; write {value: 94, unit: ..., source: ...}" in msg, msg
    assert "_QuantityIn" not in msg and "\n" not in msg
    raw = yaml.safe_load((REPO_PROFILES / "a800-80gb.yaml").read_text())
    text = yaml.safe_dump({**raw, "name": "exp"}).replace("value: 79.33\n", "value: 7933e-2\n", 1)
    assert "value: 7933e-2" in text
    exp = tmp_path / "exp.yaml"
    exp.write_text(text)
    assert load_profile(str(exp)).gpu_memory == load_profile("a800-80gb").gpu_memory


def test_a_misspelt_field_is_named_with_the_field_meant(tmp_path):
    """'hbm_bandwith:' read as 'gpu.hbm_bandwidth: missing field', the typo unnamed (a user's review); the same
    rule serves every file memo validates (`memo_sim.errors.validation_message`)."""
    text = (REPO_PROFILES / "a800-80gb.yaml").read_text().replace("hbm_bandwidth:", "hbm_bandwith:", 1)
    path = tmp_path / "typo.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert str(e.value).endswith("gpu.hbm_bandwith: unknown field; did you mean 'hbm_bandwidth'?"), str(e.value)


def test_a_profile_without_the_dtypes_peak_names_its_file_and_the_key_to_add(tmp_path):
    raw = yaml.safe_load((REPO_PROFILES / "a800-80gb.yaml").read_text())
    raw["gpu"]["peak_flops"].pop("bf16")
    path = tmp_path / "nobf16.yaml"
    path.write_text(yaml.safe_dump({**raw, "name": "nobf16"}))
    from memo_sim.errors import MemoError

    with pytest.raises(MemoError) as e:
        load_profile(str(path)).peak("bf16")
    msg = str(e.value)
    assert str(path) in msg and "gpu.peak_flops has no 'bf16'" in msg and "add bf16: {value: ..." in msg, msg


def test_a_misspelt_peak_key_is_named_where_a_format_asks_for_its_peak(tmp_path):
    """'fp8e4m3:' under gpu.peak_flops loads (the keys are open) and is read by nothing; --precision fp8-* then said
    only 'has no fp8 peak' (a user's review): the refusal names the key to rename. A100 (no FP8 at all): no hint."""
    from memo_sim.cli import cli as sim_cli

    text = (REPO_PROFILES / "h100-sxm5-80gb.yaml").read_text()
    i = text.index("    fp8:")
    path = tmp_path / "typo-fp8.yaml"
    path.write_text(text[:i] + "    fp8e4m3:" + text[i + len("    fp8:"):])
    base = ["whatif", "--layers", "2", "--precision", "fp8-tensorwise", "--no-plan", "--gpus", "1", "--seq", "4K"]
    r = CliRunner().invoke(sim_cli, base + ["--profile", str(path)])
    assert r.exit_code == 2 and "its gpu.peak_flops.fp8e4m3 is read as no format's: rename it fp8" in r.output
    a100 = CliRunner().invoke(sim_cli, base + ["--profile", "a100-sxm4-80gb"])
    assert a100.exit_code == 2 and "rename it" not in a100.output and "has no fp8 peak" in a100.output


def test_a_profile_is_found_by_the_name_it_declares(tmp_path, monkeypatch):
    """Every answer prints a profile's name: field, but --profile looked for the file name only (a user's
    review): a file cluster-a.yaml declaring name: my-h100-4gpu is found by its declared name, and by its file name
    only where the two agree (a later review: a copied profile found by its file name but declaring the stock name
    wrote plans every later command re-priced on the stock profile)."""
    text = (REPO_PROFILES / "h100-sxm5-80gb.yaml").read_text().replace("name: h100-sxm5-80gb", "name: my-h100-4gpu", 1)
    (tmp_path / "cluster-a.yaml").write_text(text)
    monkeypatch.setenv("MEMO_PROFILES", str(tmp_path))
    assert load_profile("my-h100-4gpu").name == "my-h100-4gpu"
    with pytest.raises(ProfileError, match="set `name: cluster-a` in the file"):
        load_profile("cluster-a")
    with pytest.raises(ProfileError, match="not found"):
        load_profile("my-h100-8gpu")


def test_a_profile_named_in_part_gets_the_ones_it_may_mean():
    """`--profile h100` listed every profile and named none (a user's review): the ones it begins, or the nearest."""
    with pytest.raises(ProfileError, match="did you mean h100-sxm5-80gb or h100-sxm5-96gb-500w\\?"):
        load_profile("h100")
    with pytest.raises(ProfileError, match="did you mean h200-141gb\\?"):
        load_profile("h200-141")
