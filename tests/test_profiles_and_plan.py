"""Profiles and plan.json: validated on load, one-line errors naming the field."""

import json

import pytest
import yaml

from memo_sim.errors import PlanError, ProfileError
from memo_sim.layout import Layout
from memo_sim.model import get_model
from memo_sim.plan import Plan, read_plan, write_plan
from memo_sim.policy import get_policy
from memo_sim.profile import list_profiles, load_profile
from memo_sim.profile.loader import REPO_PROFILES


def test_builtin_profiles_load():
    builtin = {"a800-80gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-141gb"}
    assert builtin <= set(list_profiles())
    for n in builtin:
        p = load_profile(n)
        assert p.peak("bf16") > 1e14 and p.usable_gpu_memory > 0 and p.usable_host_memory > 0


def _write_variant(tmp_path, mutate):
    raw = yaml.safe_load((REPO_PROFILES / "a800-80gb.yaml").read_text())
    mutate(raw)
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(raw))
    return f


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: r["gpu"].update(colour="green"), "gpu.colour"),
    (lambda r: r["gpu"].pop("memory"), "gpu.memory: missing"),
    (lambda r: r["gpu"]["memory"].update(unit="GB/s"), "gpu.memory"),
    (lambda r: r["host_link"]["d2h_bandwidth"].update(unit="GiB"), "host_link.d2h_bandwidth"),
    (lambda r: r["gpu"]["hbm_bandwidth"].pop("source"), "source"),
    (lambda r: r["efficiency"]["gemm"].update(points=[[1e9, 1.5]]), "efficiency.gemm.points[0]"),
    (lambda r: r.update(schema="memo-hardware-profile/9"), "schema"),
])
def test_malformed_profile_names_file_and_field(tmp_path, mutate, needle):
    f = _write_variant(tmp_path, mutate)
    with pytest.raises(ProfileError) as e:
        load_profile(f)
    msg = str(e.value)
    assert str(f) in msg and needle in msg and "\n" not in msg


def _plan():
    return Plan(model=get_model("gpt-7b"), batch=1, seq_tokens=262144, gpus=8, layout=Layout(tp=8),
                policy=get_policy("memo", 0.5), profile="a800-80gb",
                predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2})


def test_plan_round_trip(tmp_path):
    p = write_plan(_plan(), tmp_path / "plan.json")
    back = read_plan(p)
    assert back.layout == Layout(tp=8) and back.policy.alpha == 0.5 and back.model == get_model("gpt-7b")


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.update(schema="memo-plan/2"), "schema"),
    (lambda d: d.update(gpus=4), "layout"),
    (lambda d: d["policy"].update(alpha=1.5), "alpha"),
    (lambda d: d.update(attention_backend="magic"), "attention_backend"),
    (lambda d: d.pop("layout"), "layout"),
    (lambda d: d.update(bogus=1), "bogus"),
    (lambda d: d["layer_timings_s"].update(forward=-1), "layer_timings_s.forward"),
])
def test_bad_plan_clear_error(tmp_path, mutate, needle):
    d = _plan().to_dict()
    mutate(d)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(d))
    with pytest.raises(PlanError) as e:
        read_plan(f)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_file_of_another_kind_is_named_for_what_it_is(tmp_path):
    """A plan given as a profile, a profile or an unrelated JSON given as a plan: one line saying
    what the file is not and where the right one comes from (it said 'schema: missing field; add it')."""
    plan = write_plan(_plan(), tmp_path / "plan.json")
    with pytest.raises(ProfileError) as e:
        load_profile(plan)
    assert "not a memo hardware profile (a memo plan)" in str(e.value) and "memo-sim profiles" in str(e.value)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"foo": 1}))
    with pytest.raises(ProfileError) as e:
        load_profile(other)
    assert "not a memo hardware profile (no 'schema' line)" in str(e.value)
    with pytest.raises(PlanError) as e:
        read_plan(other)
    assert "not a memo plan (no 'schema' field)" in str(e.value) and "memo-sim whatif" in str(e.value)
    prof = tmp_path / "prof.json"
    prof.write_text(json.dumps(yaml.safe_load((REPO_PROFILES / "a800-80gb.yaml").read_text())))
    with pytest.raises(PlanError) as e:
        read_plan(prof)
    assert "not a memo plan (schema 'memo-hardware-profile/1')" in str(e.value)
    for err in (e.value,):
        assert "\n" not in str(err)
    lst = tmp_path / "list.json"
    lst.write_text("[1, 2]")
    with pytest.raises(PlanError) as e:
        read_plan(lst)
    assert "not a memo plan (a JSON list, not a mapping)" in str(e.value)  # it named pydantic's _PlanIn
    from memo_sim.errors import MemoError
    from memo_sim.model.config import model_from_file
    for f, what in ((plan, "a memo plan, not a model"), (REPO_PROFILES / "a800-80gb.yaml", "a hardware profile, not a model")):
        with pytest.raises(MemoError) as e:  # they said 'layers: missing field; add it'
            model_from_file(f)
        assert what in str(e.value) and "--model takes a preset" in str(e.value)
