"""``memo-exec run`` / ``memo-exec trace`` through click's CliRunner: outputs exist and parse, user
errors exit with code 2 and one ``error:`` line, before anything is allocated."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from memo_exec.cli import cli
from tests.exec_helpers import make_plan, time_limit
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS, ModelConfig
from memo_sim.plan.schema import Plan, read_plan, write_plan
from memo_sim.policy import get_policy
from memo_sim.timeline import Timeline
from tests.cli_run import one_error_line

torch.set_num_threads(1)

SMALL = ModelConfig("cli-test", 4, 64, 4, 256, vocab=128)
PRED = {"status": "OK", "iteration_s": 0.05, "mfu": 0.4, "tgs_tokens_per_gpu_s": 5000.0, "peak_gpu_bytes": 2.0e8,
        "peak_host_bytes_per_node": 1.0e6, "exposed_copy_s": 0.0}
LT = {"forward": 0.004, "backward": 0.008, "recompute": 0.001, "offload": 0.002, "prefetch": 0.002}


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(180):
        yield


def _plan(tmp_path, policy=get_policy("memo", 0.3), model=SMALL, seq=256, name="plan.json", **kw):
    return write_plan(make_plan(model, seq, policy, predicted=PRED, layer_timings=LT, chunk=100, **kw),
                      tmp_path / name)


def test_run_writes_valid_outputs(tmp_path):
    p = _plan(tmp_path)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["run", str(p), "--device", "cpu", "--steps", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    tl = Timeline.read_json(out / "measured.json")
    assert tl.meta["source"] == "measured"
    assert {"compute", "d2h", "h2d"} <= set(tl.streams())
    phases = {e.phase for e in tl.events}
    assert {"fwd", "bwd", "recompute", "offload", "prefetch", "optimizer"} <= phases
    assert all(e.end >= e.start >= 0 for e in tl.events)
    assert tl.meta["steady_state"]["iteration_s"] > 0
    assert len(tl.meta["steps"]) == 2 and tl.meta["steady_state"]["steps_averaged"] == [1]
    rows = {c["quantity"]: c for c in tl.meta["comparison"]}
    it = rows["iteration time"]
    # PRED is made up: the run says the stored prediction is stale and compares with the re-simulation
    assert it["predicted"] != PRED["iteration_s"]
    assert "warning: the plan's stored prediction 50.00 ms/iter" in r.output
    # an H100 plan run on the CPU: no relative error of times (an audit: +10,310% read as an error), and why
    assert it["rel_error"] is None and it["not_comparable"].startswith("not comparable (")
    assert rows["layer offload (d2h)"]["measured"] > 0 and rows["layer recompute"]["measured"] > 0
    assert rows["pinned host memory"]["measured"] == tl.meta["pinned_host_bytes"] > 0
    chrome = json.loads((out / "trace.json").read_text())
    xs = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(tl.events) and all(e["dur"] >= 0 for e in xs)
    md = (out / "report.md").read_text()
    assert "## Measured vs predicted" in md and "| iteration time |" in md and "layers.png" in md
    if os.path.exists("/proc/stat"):  # what other processes took of the cores during the run (memo_exec.host_share)
        assert "## The machine during the run" in md and "other processes used" in md
    assert "## Streams: measured vs predicted" in md and "| d2h | exposed |" in md
    assert "## Per layer and op class" in md and "| 0 | offload |" in md
    assert "## Memory: the executor's estimate vs the simulator's breakdown" in md and "| transient_peak |" in md
    assert "the pool is part of the RSS" in md and "gantt_overlay.png" in md
    # the last step's raw spans say how they differ from the comparison's busy times (a review read two values)
    assert "The spans as recorded" in md.split("## Streams (last step)")[1]
    # a GPU profile's plan on a CPU: its times' relative errors are not printed (#30: "+374252.8%")
    it_row = next(ln for ln in md.splitlines() if ln.startswith("| iteration time |"))
    assert "not comparable" in it_row and "describes a cuda device, this ran on cpu" in md
    assert "| 0 | forward |" in md and "%" not in next(ln for ln in md.splitlines() if ln.startswith("| 0 | forward |"))
    streams = {(r["stream"], r["quantity"]): r for r in tl.meta["streams"]}
    assert set(streams) == {(s, q) for s in ("compute", "d2h", "h2d") for q in ("busy", "exposed", "overlapped")}
    d2h = {q: streams[("d2h", q)] for q in ("busy", "exposed", "overlapped")}
    assert d2h["busy"]["measured_s"] > 0 and d2h["busy"]["predicted_s"] > 0
    assert d2h["exposed"]["measured_s"] + d2h["overlapped"]["measured_s"] == pytest.approx(d2h["busy"]["measured_s"])
    ops = {(r["layer"], r["op"]): r for r in tl.meta["ops"]}
    assert {(i, c) for i in range(2) for c in ("forward", "recompute", "backward", "offload", "prefetch")} <= set(ops)
    assert (3, "offload") not in ops and (3, "backward") in ops  # the last two layers stay on the device
    r = ops[(0, "forward")]
    assert r["rel_error"] is None and r["not_comparable"] == it["not_comparable"]
    for png in ("timeline.png", "memory.png", "layers.png", "gantt_overlay.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*.tmp")) and not list(out.glob(".*.png"))


def test_run_json_has_per_stream_and_per_op_rows(tmp_path):
    p = _plan(tmp_path, get_policy("full_offload"))
    r = CliRunner().invoke(cli, ["run", str(p), "--device", "cpu", "--steps", "2", "--out", str(tmp_path / "o"),
                                 "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)  # the stale prediction's warning line goes to stderr
    assert doc["policy"] == "full_offload" and len(doc["losses"]) == 2
    assert {row["stream"] for row in doc["streams"]} == {"compute", "d2h", "h2d"}
    assert all(row["predicted_s"] is not None for row in doc["streams"])
    classes = {row["op"] for row in doc["ops"] if row["layer"] is not None}
    assert classes == {"forward", "backward", "offload", "prefetch"}  # full offload recomputes nothing
    head = [row for row in doc["ops"] if row["layer"] is None]  # the classifier beside the simulator's
    assert len(head) == 1 and head[0]["measured_s"] > 0 and head[0]["predicted_s"] > 0, head
    assert {row["term"] for row in doc["memory"]} >= {"model_states", "buffers", "transient_peak", "peak_total"}
    assert doc["stale_prediction"] and "re-simulated" in doc["totals_predicted_from"]  # PRED is made up
    assert "re-simulated" in doc["streams_ops_predicted_from"]
    assert set(doc["files"]) >= {"report", "measured", "trace", "overlay"}


def test_run_fewer_layers_and_token_file(tmp_path):
    p = _plan(tmp_path, get_policy("full_recompute"), model=ModelConfig("cli-8", 8, 64, 4, 256, vocab=128))
    np.save(tmp_path / "tok.npy", (np.arange(5000) % 100).astype(np.int64))
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["run", str(p), "--device", "cpu", "--steps", "1", "--out", str(out), "--layers",
                                 "3", "--tokens", str(tmp_path / "tok.npy"), "--attention-backend", "sdpa_flash"])
    assert r.exit_code == 0, r.output
    tl = Timeline.read_json(out / "measured.json")
    assert tl.meta["layers"] == 3 and tl.meta["plan_layers"] == 8
    assert tl.meta["attention_backend"] == "sdpa_flash"
    assert {e.layer for e in tl.events if e.layer is not None} == {0, 1, 2}
    md = (out / "report.md").read_text()
    assert "ran 3 of the plan's 8 layers" in md


def test_unknown_schema_exits_2(tmp_path):
    p = _plan(tmp_path)
    raw = json.loads(p.read_text())
    raw["schema"] = "memo-plan/99"
    p.write_text(json.dumps(raw))
    line = one_error_line(CliRunner().invoke(cli, ["run", str(p), "--device", "cpu", "--out", str(tmp_path / "o")]))
    assert "schema" in line and "memo-plan/99" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,needle", [
    (["--attention-backend", "sdpa_cudnn"], "needs a CUDA device"),
    (["--attention-backend", "flash_attn"], "flash_attn"),
    (["--device", "cuda"] if not torch.cuda.is_available() else ["--layers", "0"], "cuda" if not
     torch.cuda.is_available() else "layers"),
    (["--tokens", "/nonexistent/tokens.npy"], "no such file"),
    (["--steps", "0"], "steps"),
])
def test_user_errors_exit_2(tmp_path, args, needle):
    p = _plan(tmp_path)
    r = CliRunner().invoke(cli, ["run", str(p), "--device", "cpu", "--out", str(tmp_path / "o"), *args])
    assert needle in one_error_line(r)


def test_model_that_does_not_fit_exits_2(tmp_path):
    plan = Plan(PRESETS["gpt-7b"], 1, 1_048_576, 1, Layout(), get_policy("store_all"), "a800-80gb", PRED, LT)
    p = write_plan(plan, tmp_path / "big.json")
    line = one_error_line(CliRunner().invoke(cli, ["run", str(p), "--device", "cpu", "--out", str(tmp_path / "o")]))
    assert "does not fit" in line and "GiB" in line


def test_multi_gpu_layout_exits_2(tmp_path):
    plan = Plan(SMALL, 1, 256, 2, Layout(tp=2), get_policy("store_all"), "a800-80gb", PRED, LT)
    p = write_plan(plan, tmp_path / "tp2.json")
    line = one_error_line(CliRunner().invoke(cli, ["run", str(p), "--device", "cpu"]))
    assert "uses 2 devices" in line and "--nproc 2" in line


def test_missing_plan_file_exits_2(tmp_path):
    assert "no such plan file" in one_error_line(CliRunner().invoke(cli, ["run", str(tmp_path / "nope.json")]))


def test_trace_target_picks_the_backend_auto_resolves_to(tmp_path):
    p = _plan(tmp_path)  # attention_backend "math" in make_plan; switch it to auto
    raw = json.loads(p.read_text())
    raw["attention_backend"] = "auto"
    p.write_text(json.dumps(raw))
    for target, backend_is_math in (("cpu", True), ("cuda", False)):
        out = tmp_path / f"{target}.json"
        r = CliRunner().invoke(cli, ["trace", str(p), "--target", target, "--out", str(out)])
        assert r.exit_code == 0, r.output
        meta = json.loads(out.read_text())["meta"]
        assert (meta["attention_backend"] == "math") == backend_is_math, meta
    r = CliRunner().invoke(cli, ["trace", str(p), "--target", "tpu"])
    assert r.exit_code == 2


def test_trace_meta_device_for_a_big_model(tmp_path):
    plan = Plan(PRESETS["gpt-7b"], 1, 131072, 1, Layout(), get_policy("memo", 0.25), "h100-sxm5-80gb", PRED, LT,
                attention_backend="sdpa_flash")
    p = write_plan(plan, tmp_path / "big.json")
    r = CliRunner().invoke(cli, ["trace", str(p), "--out", str(tmp_path / "t.json"),
                                 "--write-plan", str(tmp_path / "p2.json")])
    assert r.exit_code == 0, r.output
    from memo_sim.request_trace import RequestTrace

    tr = RequestTrace.read_json(tmp_path / "t.json")
    sizes = {(b.phase, b.name): b.size for b in tr.buffers}
    assert sizes[("fwd", "proj")] == 131072 * 4096 * 2  # bf16, no memory touched
    assert sizes[("bwd", "d_act")] == 131072 * 16384 * 2
    assert sizes[("bwd", "rc_proj")] == (131072 - 32768) * 4096 * 2  # 75% of the tokens recomputed
    p2 = read_plan(tmp_path / "p2.json")
    assert p2.memory_plan.element_bytes == 2


def test_bad_flag_is_one_line_and_exit_2(tmp_path):
    from click.testing import CliRunner

    from memo_exec.cli import cli

    for args in (["run", "plan.json", "--nproc", "0"], ["run"], ["run", "plan.json", "--pg-timeout", "-1"]):
        r = CliRunner().invoke(cli, args)
        text = r.output.strip()
        assert r.exit_code == 2 and text.startswith("error:") and "\n" not in text, (args, r.output)


def test_a_plan_of_several_nodes_is_told_how_to_launch_on_them(tmp_path):
    """A 16-GPU plan on 8-GPU nodes was told `--nproc 16 on this machine or torchrun --nproc-per-node 16` (a user's
    review, of a 512-GPU plan): on CUDA it is told torchrun over its nodes (a 12-GPU plan: 8 on the first, 4 on the
    last, as the simulator places them), or a one-node plan to try; on a CPU, whose ranks are processes, --nproc."""
    import dataclasses

    from memo_exec.cli import multi_device_words

    p = make_plan(SMALL, 256, get_policy("store_all"), predicted=PRED, layer_timings=LT)
    p16, p12, p2 = (dataclasses.replace(p, layout=Layout(dp=n), gpus=n, batch=n) for n in (16, 12, 2))
    line = multi_device_words(p16, "p.json", "cuda")
    assert "uses 16 devices on 2 nodes of 8" in line and "torchrun --nnodes 2 --nproc-per-node 8 (" in line, line
    line = multi_device_words(p12, "p.json", "cuda")
    assert "--nnodes 2 --nproc-per-node 8 on the first node and 4 on the last" in line, line
    for plan, kind in ((p2, "cuda"), (p16, "cpu")):
        assert f"uses {plan.gpus} devices: run it with --nproc {plan.gpus} on this machine" in \
            multi_device_words(plan, "p.json", kind)
    path = write_plan(p16, tmp_path / "p16.json")  # the command says it in one line
    line = one_error_line(CliRunner().invoke(cli, ["run", str(path), "--device", "cpu", "--out", str(tmp_path / "o")]))
    assert "--nproc 16 on this machine" in line, line


def test_a_plan_of_another_element_width_reads_its_memory_errors_as_not_comparable(tmp_path):
    """A bf16 plan run in fp32 on a CPU printed memory errors like transient_peak +430% (a user's review), which are
    the widths' ratio, not the estimate's error; an fp32 plan keeps its percentages."""
    import dataclasses

    def memory_rows(model, name):
        out = tmp_path / name
        r = CliRunner().invoke(cli, ["run", str(_plan(tmp_path, model=model, name=f"{name}.json")), "--device", "cpu",
                                     "--steps", "1", "--out", str(out)])
        assert r.exit_code == 0, r.output
        md = (out / "report.md").read_text()
        table = md.split("## Memory: the executor's estimate vs the simulator's breakdown")[1].split("\n\n")[2]
        return md, [ln for ln in table.splitlines() if ln.startswith("| ") and "term" not in ln]

    md, rows = memory_rows(dataclasses.replace(SMALL, dtype="bf16"), "bf16")
    if "this run computes in float32" in md:  # a CPU without bf16 kernels runs bf16 plans in fp32
        assert all(r.rstrip(" |").endswith(("not comparable", "—")) for r in rows), rows
    md, rows = memory_rows(dataclasses.replace(SMALL, dtype="fp32"), "fp32")
    assert any("%" in r for r in rows) and "not comparable" not in "".join(rows), rows


def test_a_tp_layers_predicted_times_say_they_hold_its_collectives():
    """A TP 2 run's report gave 'layer forward 36.4 ms' predicted above a per-op table summing 23.0 ms, the difference
    the layer's TP collectives, unsaid (a user's review): the layer rows name what their prediction holds."""
    import dataclasses
    from types import SimpleNamespace as NS

    from memo_exec.report import totals_rows

    p = make_plan(SMALL, 256, get_policy("store_all"), predicted=PRED, layer_timings=LT)
    meta = {"tokens": 256, "device_kind": "cpu", "world": 1, "memory_estimate_total_bytes": 1}
    for tp, said in ((1, False), (2, True)):
        plan = dataclasses.replace(p, layout=Layout(tp=tp, sp=tp > 1), gpus=tp)
        rows = {r["quantity"]: r for r in totals_rows(NS(plan=plan, steady={}, meta=meta, estimate=NS()), PRED, "s")}
        assert ("TP collectives" in rows["layer forward"]["predicted_from"]) == said
