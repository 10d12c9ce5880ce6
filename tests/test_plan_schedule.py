"""The plan's schedule and micro-batch fields (`memo_sim.layout.schedule`): read, written, checked."""

import json

import pytest

from memo_sim.errors import PlanError
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.layout.schedule import check_schedule, default_schedule
from memo_sim.model.config import get_model
from memo_sim.plan.schema import Plan, read_plan, write_plan
from memo_sim.policy import get_policy


def _plan(**kw):
    args = dict(model=get_model("gpt-7b"), batch=8, seq_tokens=32768, gpus=8, layout=Layout(tp=2, pp=4),
                policy=get_policy("memo", 0.5), profile="a800-80gb",
                predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2})
    args.update(kw)
    return Plan(**args)


def test_defaults_for_plans_without_the_fields():
    assert _plan(layout=Layout(tp=8)).schedule == "single_stage"
    assert _plan().schedule == "1f1b"
    p = _plan()
    assert p.micro_batch == 8 and p.micro_batches == 1
    assert default_schedule(4, "sppo") == "sppo"


def test_round_trip_keeps_schedule_micro_batch_and_vpp(tmp_path):
    p = _plan(layout=Layout(tp=2, pp=4, vpp=2), schedule="interleaved_1f1b", micro_batch=2)
    back = read_plan(write_plan(p, tmp_path / "plan.json"))
    assert back.schedule == "interleaved_1f1b" and back.micro_batch == 2 and back.micro_batches == 4
    assert back.layout == Layout(tp=2, pp=4, vpp=2)
    assert "vpp" not in Layout(tp=2, pp=4).to_dict() and "pp" not in Layout().to_dict()


def test_old_plan_reads_with_default_schedule(tmp_path):
    d = _plan(layout=Layout(tp=8)).to_dict()
    del d["schedule"], d["micro_batch"]
    f = tmp_path / "old.json"
    f.write_text(json.dumps(d))
    back = read_plan(f)
    assert back.schedule == "single_stage" and back.micro_batch == back.batch


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.update(schedule="gpipe"), "schedule"),
    (lambda d: d.update(micro_batch=3), "micro_batch"),
    (lambda d: d.update(schedule="single_stage"), "schedule"),
    (lambda d: d.update(schedule="sppo"), "schedule"),
    (lambda d: d.update(schedule="interleaved_1f1b"), "vpp"),
])
def test_bad_schedule_fields_are_one_line_errors(tmp_path, mutate, needle):
    d = _plan().to_dict()
    mutate(d)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(d))
    with pytest.raises(PlanError) as e:
        read_plan(f)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_check_schedule_rules():
    ok = dict(pp=4, vpp=2, layers=32, batch=8, micro_batch=1, policy_name="memo")
    assert check_schedule("interleaved_1f1b", **ok) is None
    assert "multiple of pp" in check_schedule("interleaved_1f1b", **{**ok, "micro_batch": 4})
    assert "model chunks" in check_schedule("interleaved_1f1b", **{**ok, "layers": 34})
    assert "vpp" in check_schedule("1f1b", **ok)
    assert check_schedule("1f1b", **{**ok, "vpp": 1}) is None
    assert "pp >= 2" in check_schedule("1f1b", **{**ok, "pp": 1, "vpp": 1})


def test_layout_rejects_virtual_stages_without_a_pipeline():
    m = get_model("gpt-7b")
    assert "pp >= 2" in check_layout(Layout(tp=8, vpp=2), m, 8, 8, 4096)
    assert "model chunks" in check_layout(Layout(tp=2, pp=4, vpp=3), m, 8, 8, 4096)
