"""`memo-exec run --profile` re-predicts a pipeline's stages with that profile (review of 2026-11-26:
pipeline.md compared the stages with the plan's own prediction, made on the plan's profile)."""

import pytest

pytest.importorskip("torch")

from memo_exec.pipeline.report import simulated_stages  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from memo_sim.policy import get_policy  # noqa: E402
from tests.exec_helpers import make_plan  # noqa: E402


def _plan():
    model = ModelConfig("pipe-4", 4, 256, 4, 1024, vocab=512, dtype="bf16")
    plan = make_plan(model, 1024, get_policy("full_recompute"), batch=4)
    plan.layout = Layout(pp=2)
    plan.gpus = 2
    plan.schedule = "1f1b"
    plan.micro_batch = 1
    return plan


def test_stages_are_simulated_on_the_profile_the_run_names():
    plan = _plan()
    h100, source, res = simulated_stages(plan, 4)
    assert res is not None and "h100-sxm5-80gb" in source and len(h100) == 2
    assert h100[0]["busy_s"] == pytest.approx(res.pipeline["stages"][0]["compute_busy_s"])
    plan.profile = "a100-sxm4-80gb"  # what `write_pipeline_outputs(..., profile=)` does for --profile
    a100, source, _res = simulated_stages(plan, 4)
    assert "a100-sxm4-80gb" in source and a100[0]["busy_s"] > 1.1 * h100[0]["busy_s"]
    none, why, _ = simulated_stages(plan, 2)
    assert none is None and "4 layers, 2 ran" in why


def test_the_schedule_passes_the_runs_profile_to_the_pipeline_report(monkeypatch, tmp_path):
    """`memo-exec run --profile X` of a pipeline: pipeline.md's stages are predicted on X (the plan then names X,
    `memo_exec.runner.use_profile`); without --profile, on the plan file's own profile."""
    from types import SimpleNamespace

    import memo_exec.pipeline.report as pr
    from memo_exec.pipeline.schedules import OneFOneB

    seen = []
    monkeypatch.setattr(pr, "write_pipeline_outputs", lambda out, plan_file, profile=None: seen.append(profile) or [])
    for given in ("/p/calibrated.yaml", None):
        ex = SimpleNamespace(ctx=SimpleNamespace(rank=0), plan=SimpleNamespace(profile=given or "h100-sxm5-80gb"),
                             opts=SimpleNamespace(profile=given))
        assert OneFOneB.write_outputs(SimpleNamespace(ex=ex), tmp_path, tmp_path / "plan.json") == []
    assert seen == ["/p/calibrated.yaml", None]
