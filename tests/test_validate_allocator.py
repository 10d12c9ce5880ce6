"""`memo-exec validate`'s caching-allocator rows: the simulator's replay of the iteration beside
``torch.cuda.memory_stats()`` measured over a step (`memo_exec.allocator_counters`): the counters
read from hand-made memory_stats, the comparison with a real replay of a tiny model and fake
measurements, the CPU run that measures nothing (and says why), and on a GPU a real run."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from memo_exec import allocator_counters as AC  # noqa: E402
from memo_exec import validate as V  # noqa: E402
from memo_exec.cli import cli as exec_cli  # noqa: E402
from memo_sim.api import engine_replay  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from memo_sim.policy import get_policy  # noqa: E402
from memo_sim.profile.loader import load_profile  # noqa: E402

TOY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128", "--dtype", "fp32"]
MODEL = ModelConfig("toy", 2, 64, 4, 256, vocab=128, dtype="fp32")
SEQ = 4096


def test_iteration_counters_are_differences_and_older_torch_names_are_read():
    start = {"num_alloc_retries": 2, "num_ooms": 0, "num_device_alloc": 10, "num_device_free": 4}
    end = {"num_alloc_retries": 5, "num_ooms": 0, "num_device_alloc": 17, "num_device_free": 9,
           "reserved_bytes.all.peak": 3 << 30, "allocated_bytes.all.peak": 2 << 30, "segment.all.peak": 8,
           "segment.all.current": 7}
    assert AC.iteration_stats(start, end) == {
        "num_alloc_retries": 3, "num_ooms": 0, "num_device_alloc": 7, "num_device_free": 5,
        "reserved_bytes.all.peak": 3 << 30, "allocated_bytes.all.peak": 2 << 30, "segment.all.peak": 8,
        "segment.all.current": 7}
    old = AC.iteration_stats({"segment.all.allocated": 3, "segment.all.freed": 1},
                             {"segment.all.allocated": 4, "segment.all.freed": 3})
    assert (old["num_device_alloc"], old["num_device_free"], old["num_alloc_retries"]) == (1, 2, None)
    assert AC.run_block(torch.device("cpu"), [(0, None)]) == {"measured": False, "reason": AC.CPU_REASON}


def _replay(policy):
    profile = load_profile("h100-sxm5-80gb")
    sim = V.predict(MODEL, SEQ, policy, profile)
    return sim, V.predicted_allocator(sim, MODEL, SEQ, policy, profile), profile


def test_comparison_of_a_real_replay_with_fake_measurements():
    policy = get_policy("store_all")
    sim, pa, profile = _replay(policy)
    assert pa["static_memory_plan"] is False
    ms = pa["memory_stats"]
    assert {k for k, _, _ in V.ALLOCATOR_QUANTITIES} <= set(ms)
    assert ms["reserved_bytes.all.peak"] >= ms["allocated_bytes.all.peak"] > 0 and ms["segment.all.current"] >= 1
    # without the result's own replay: the engine's, with the engine's arguments (the same numbers)
    bare = type("Bare", (), {"allocator": {}, "micro_batch": 1})()
    assert V.predicted_allocator(bare, MODEL, SEQ, policy, profile) == pa
    assert engine_replay(MODEL, Layout(), 1, SEQ, policy, profile).memory_stats() == ms
    fake = {"measured": True, "alloc_conf": "", "snapshot_segments": 3,
            "memory_stats": {**ms, "reserved_bytes.all.peak": int(ms["reserved_bytes.all.peak"] * 1.25),
                             "num_alloc_retries": ms["num_alloc_retries"] + 2}}
    cmp_ = V.allocator_comparison(pa, fake)
    assert cmp_["status"] == "compared" and cmp_["measured"]
    q = cmp_["quantities"]
    assert q["reserved_bytes.all.peak"]["error_pct"] == pytest.approx(25.0, abs=1e-6)
    assert q["allocated_bytes.all.peak"]["error_pct"] == 0.0 and q["num_alloc_retries"]["difference"] == 2
    memo = get_policy("memo", 0.5)
    _sim, pm, _ = _replay(memo)
    assert pm == {"static_memory_plan": True}
    row = V.ValidationRow("4K store_all", "ran", V._empty(), allocator=cmp_)
    static = V.ValidationRow("4K memo", "ran", V._empty(), allocator=V.allocator_comparison(pm, fake))
    summary = V.summarize([row, static])
    e = summary["allocator_errors"]["reserved_bytes.all.peak"]
    assert e["plans"] == 1 and e["median_abs_error_pct"] == pytest.approx(25.0, abs=1e-6)
    text = "\n".join(V.allocator_section([row, static], summary))
    assert V.ALLOCATOR_SECTION in text and "| 4K memo | static memory plan (no caching-allocator replay) |" in text
    assert "reserved peak (`reserved_bytes.all.peak`)" in text and "+25.0%" in text
    assert "reserved peak |error| over 1 plans: median 25.0%" in text
    json.dumps(row.to_dict())  # validation.json holds it


def test_the_recompute_policies_buffer_is_named_beside_the_replay():
    """memo-exec keeps a recompute policy's re-run tensors in one buffer for the whole run, where the replay frees
    each after its last backward reader (an H200 measured the replay 8-18% under memo-exec's full-recompute peaks:
    reports/gpu-h200-2026-11-30.md): validation.md says so under the allocator rows of those policies only."""
    from memo_sim.memplan.iteration_requests import iteration_stream
    from memo_sim.memplan.iteration_stream import FREE, MALLOC

    # the replay's side of the note: a re-run tensor freed while later backward requests of its layer come
    reqs = iteration_stream(MODEL, Layout(), 1, SEQ, get_policy("full_recompute")).iteration
    names = [bid for _kind, bid, _nb in reqs]
    rec = [i for i, (kind, bid, _nb) in enumerate(reqs) if kind == FREE and bid.startswith("L1.rec.")]
    later = [i for i, (kind, bid, _nb) in enumerate(reqs) if kind == MALLOC and bid.startswith("L1.bwd.")]
    assert rec and later and min(rec) < max(later), names
    plans = [V.PlanSpec(SEQ, get_policy(n)) for n in ("store_all", "full_recompute", "selective_recompute",
                                                       "recompute_mlp", "checkpoint_offload")]
    plans += [V.PlanSpec(SEQ, get_policy("memo", 0.5)), V.PlanSpec(SEQ, None, "skipped: no fit")]
    notes = V.allocator_notes(plans)
    # the MLP / MoE recomputes: the replay holds their re-run tensors as one block for the backward, as they do
    assert [n.split(":")[0] for n in notes] == ["full_recompute", "checkpoint_offload"]
    assert all("one work buffer allocated for the whole run" in n for n in notes)
    policy = get_policy("full_recompute")
    sim, pa, _ = _replay(policy)
    fake = {"measured": True, "alloc_conf": "", "snapshot_segments": 3, "memory_stats": dict(pa["memory_stats"])}
    row = V.ValidationRow("4K full_recompute", "ran", V._empty(), allocator=V.allocator_comparison(pa, fake))
    summary = {**V.summarize([row]), "allocator_notes": V.allocator_notes([V.PlanSpec(SEQ, policy)])}
    text = "\n".join(V.allocator_section([row], summary))
    assert text.rstrip().endswith("- under full_recompute: memo-exec " + notes[0].split("memo-exec ", 1)[1])
    alone = "\n".join(V.allocator_section([row], {**summary, "allocator_notes": V.allocator_notes(plans[:1])}))
    assert "under " not in alone.split("reserved peak |error|", 1)[1]


def test_the_note_stands_only_under_a_compared_replay(tmp_path):
    """validate() names the buffer under a policy whose run was compared with its replay, not under one whose run
    failed (nothing of the replay was held against a run)."""
    plans = V.plan_set([SEQ], ["full_recompute", "checkpoint_offload"], [])
    stats = {k: 1 for k, _, _ in V.ALLOCATOR_QUANTITIES}

    def runner(plan_file, run_dir, device, steps, timeout, threads):
        run_dir.mkdir(parents=True, exist_ok=True)
        if run_dir.name == "plan-01":
            return "failed (exit 1): boom", {}
        block = {"measured": True, "alloc_conf": "", "snapshot_segments": 1, "memory_stats": stats}
        (run_dir / "measured.json").write_text(json.dumps({"format": "memo-timeline", "version": 1, "events": [],
                                                           "memory": [], "meta": {"allocator": block}}))
        return "ran", {"totals": [{"quantity": "iteration time", "measured": 0.01}]}

    _path, summary = V.validate(MODEL, load_profile("h100-sxm5-80gb"), plans, device="cpu", steps=1,
                                out_dir=tmp_path, report_path=None, command="test", runner=runner, record=False)
    assert [n.split(":")[0] for n in summary["allocator_notes"]] == ["full_recompute"]
    md = (tmp_path / "validation.md").read_text()
    assert "- under full_recompute: memo-exec keeps a layer's re-run tensors" in md
    assert "under checkpoint_offload" not in md


def test_cpu_run_says_why_nothing_was_measured(tmp_path):
    out = tmp_path / "val"
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", "h100-sxm5-80gb", *TOY, "--seqs", "256",
                                      "--policies", "store_all", "--device", "cpu", "--steps", "1",
                                      "--no-record", "--out", str(out)])
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "runs" / "plan-00" / "measured.json").read_text())["meta"]
    assert meta["allocator"] == {"measured": False, "reason": AC.CPU_REASON}
    row = json.loads((out / "validation.json").read_text())["rows"][0]
    assert row["allocator"]["status"] == f"not measured: {AC.CPU_REASON}" and not row["allocator"]["measured"]
    assert row["allocator"]["quantities"]["reserved_bytes.all.peak"]["predicted"] > 0
    md = (out / "validation.md").read_text()
    section = md.split(V.ALLOCATOR_SECTION, 1)[1].strip().splitlines()
    assert section[0] == f"Not compared: not measured: {AC.CPU_REASON}."


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_run_measures_the_allocator_counters(tmp_path):
    out = tmp_path / "val"
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", "h100-sxm5-80gb", *TOY[:-2], "--dtype", "bf16",
                                      "--seqs", "4096", "--policies", "store_all,memo", "--alphas", "0.5",
                                      "--device", "cuda", "--steps", "3", "--no-record", "--out", str(out)])
    assert r.exit_code == 0, r.output
    block = json.loads((out / "runs" / "plan-00" / "measured.json").read_text())["meta"]["allocator"]
    assert block["measured"] is True, block
    for key in AC.KEYS:
        assert type(block["memory_stats"][key]) is int, (key, block["memory_stats"])
    ms = block["memory_stats"]
    assert ms["reserved_bytes.all.peak"] >= ms["allocated_bytes.all.peak"] > 0 and ms["segment.all.current"] >= 1
    assert ms["num_ooms"] == 0 and len(block["per_step"]) == 3 and block["step"] == 2
    assert block["snapshot_segments"] is None or block["snapshot_segments"] >= 1
    rows = json.loads((out / "validation.json").read_text())["rows"]
    assert rows[0]["allocator"]["status"] == "compared", rows[0]["allocator"]
    assert rows[1]["allocator"]["status"] == V.STATIC_PLAN
    md = (out / "validation.md").read_text()
    assert V.ALLOCATOR_SECTION in md and "reserved peak |error| over 1 plans" in md
    print(md.split(V.ALLOCATOR_SECTION, 1)[1])
