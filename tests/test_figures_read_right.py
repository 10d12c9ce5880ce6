"""Figures that read right (#30 item 7), checked on the matplotlib objects, not on pixels: the
alpha sweep zoomed to its data with the alpha = 0 baseline, the TP-flavour sweep paired (one
colour per layout, one line style per policy) with plain-number GiB ticks, memory from 0 GiB
with short spikes kept, Gantt panels of the asked layers only and a legend of what is drawn,
memory-plan rectangles named, and a trace / figure label for every simulated GPU saying which
GPUs of the plan it stands for."""

import json
from dataclasses import replace

import pytest

from memo_sim.engine.simulate import simulate, sweep_alpha
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile
from memo_sim.report import figures, memplan_figure
from memo_sim.report.chrome_trace import chrome_trace
from memo_sim.request_trace import Buffer, RequestTrace
from memo_sim.search.seq_sweep import sweep_layouts
from memo_sim.timeline import MemorySample, Timeline, TimelineEvent
from tests.figure_capture import capture_saves

K = 1024
GiB = 1024**3
PROFILE = load_profile("a800-80gb")


@pytest.fixture
def captured(monkeypatch):
    """The Figure objects the figure functions save (no PNG written)."""
    return capture_saves(monkeypatch, (figures, "_save"), (memplan_figure, "save_png"))


@pytest.fixture(scope="module")
def memo_run():
    return simulate(get_model("gpt-7b"), Layout(tp=4, cp=2), 1, 128 * K, get_policy("memo", 0.5), PROFILE)


def test_alpha_sweep_zooms_to_its_data_with_a_baseline(captured):
    res = sweep_alpha(get_model("gpt-7b"), Layout(tp=4, cp=2), 1, 192 * K, PROFILE, (0.0, 0.5, 1.0))
    mfu = [100 * r.mfu for r in res if r.ok]
    assert len(mfu) == 3 and max(mfu) - min(mfu) < 5  # a small effect: from 0 it would be a flat line
    figures.alpha_sweep_figure(res, "unused.png")
    top = captured[0].axes[0]
    lo, hi = top.get_ylim()
    assert 0 < lo <= min(mfu) and max(mfu) <= hi  # holds the data, does not start at 0
    assert hi - lo < 4 * (max(mfu) - min(mfu) + 1)  # zoomed: the data fill most of the axis
    base = [ln for ln in top.lines if ln.get_label().startswith("alpha = 0:")]
    assert base and base[0].get_ydata()[0] == pytest.approx(mfu[0])
    assert any("not from 0" in t.get_text() for t in top.texts)


def _plain_number(text: str) -> bool:
    try:
        float(text.replace("\u2212", "-"))
        return True
    except ValueError:
        return False


def test_tp_flavour_sweep_pairs_lines_and_reads_gib(captured):
    model = replace(get_model("gpt-175b"), layers=8)
    layouts = {lay.label(): lay for lay in (Layout(tp=8), Layout(tp=8, tp_mode="metp"))}
    points = []
    for p in ("full_recompute", "memo"):
        points += sweep_layouts(model, {f"{lb} {p}": lay for lb, lay in layouts.items()}, [64 * K, 128 * K],
                                load_profile("a100-sxm4-80gb"), (p,), simulate_fit=False)
    figures.seq_sweep_figure(points, "unused.png", "t")
    fig = captured[0]
    mem = fig.axes[0]
    lines = {ln.get_label(): ln for ln in mem.lines if not ln.get_label().startswith("_")}
    assert len(lines) == 4
    for fl in layouts:  # one colour per layout flavour ...
        assert len({lines[f"{fl} {p}"].get_color() for p in ("full_recompute", "memo")}) == 1
    for p in ("full_recompute", "memo"):  # ... one line style per policy: the two flavours of a policy pair up
        assert len({lines[f"{fl} {p}"].get_linestyle() for fl in layouts}) == 1
    assert len({ln.get_color() for ln in lines.values()}) == 2
    assert len({ln.get_linestyle() for ln in lines.values()}) == 2
    fig.canvas.draw()
    ticks = [t.get_text() for t in mem.get_yticklabels() if t.get_text()]
    assert len(ticks) >= 2 and all(_plain_number(t) for t in ticks)  # "50", "100": no 2^x
    titles = {leg.get_title().get_text() for leg in fig.legends}
    assert titles == {"colour: layout", "line: policy"}
    entries = {t.get_text() for leg in fig.legends for t in leg.get_texts()}
    assert entries == set(layouts) | {"full_recompute", "memo"}


def _spiky_timeline() -> Timeline:
    """60 GiB held for 10 s with a 1 us spike to 75 GiB at 5 s."""
    mem = [MemorySample(0.0, 0, "gpu", 60 * GiB), MemorySample(5.0, 0, "gpu", 75 * GiB),
           MemorySample(5.0 + 1e-6, 0, "gpu", 60 * GiB), MemorySample(10.0, 0, "gpu", 60 * GiB)]
    ev = [TimelineEvent("matmul", 0, "fwd", "compute", 0, 0.0, 10.0)]
    return Timeline(ev, mem, {"source": "simulated", "gpus": 8, "layout": "tp8", "gpu_capacity_bytes": 78 * GiB})


def test_memory_figure_from_zero_with_short_spikes_visible(captured):
    figures.memory_figure(_spiky_timeline(), "unused.png")
    ax = captured[0].axes[0]
    assert ax.get_ylim()[0] == 0
    steps = [p for p in ax.patches if p.get_label() and not p.get_label().startswith("_")]
    top = steps[0]
    values, edges = top.get_data().values, top.get_data().edges
    assert max(values) == pytest.approx(75)  # the 1 us spike is the drawn peak ...
    wide = [edges[i + 1] - edges[i] for i, v in enumerate(values) if v == pytest.approx(75)]
    assert sum(wide) >= 10 / figures.ENVELOPE_BINS * 0.99  # ... at least one interval wide
    assert "stands for all 8 GPUs" in top.get_label()


def test_gantt_draws_only_the_asked_layers_and_a_legend_of_what_is_drawn(memo_run, captured):
    tl = memo_run.timeline
    figures.gantt_figure(tl, "unused.png", (10, 12))
    fig = captured[0]
    panels = [ax for ax in fig.axes if ax.get_title().startswith(("forward", "backward"))]
    layer_marks = {int(t.get_text()[1:]) for ax in panels for t in ax.texts if t.get_text().startswith("L")}
    assert layer_marks and layer_marks <= {10, 11, 12}
    in_range = [e for e in tl.events if e.device == 0 and (e.layer is None or 10 <= e.layer <= 12)]
    phases_there = {figures.phase_label(e.phase) for e in in_range}
    legend = {t.get_text().rsplit(" (", 1)[0] for leg in fig.legends for t in leg.get_texts()}
    assert legend and legend <= phases_there
    assert "optimizer step" not in legend and "classifier" not in legend
    rows = {t.get_text() for t in panels[0].get_yticklabels()}
    assert rows <= {e.stream for e in in_range}
    assert "stands for all 8 GPUs" in fig._suptitle.get_text()


def test_memory_plan_labels_each_large_rectangle(captured):
    bufs = [Buffer("a", 4 * GiB, 0, 30, name="kv_cache"), Buffer("b", 2 * GiB, 2, 20, name="attn_out"),
            Buffer("c", GiB // 64, 3, 4, name="tiny"), Buffer("d", 3 * GiB, 30, 31, name="narrow_tall")]
    trace = RequestTrace(bufs, "t")
    offsets = {"a": 0, "b": 4 * GiB, "c": 6 * GiB, "d": 0}
    memplan_figure.draw_placement(trace, offsets, 7 * GiB, "unused.png")
    ax = captured[0].axes[0]
    labels = {t.get_gid(): t.get_text() for t in ax.texts}
    span, top = 31, 7 * GiB
    large = {b.id for b in bufs if memplan_figure.is_large(b, span, top)}
    assert large == {"a", "b", "d"}
    assert set(labels) == {f"buffer:{i}" for i in large}  # one label per large rectangle, none for the tiny one
    assert labels["buffer:a"].startswith("kv_cache") and "4.00 GiB" in labels["buffer:a"]
    assert labels["buffer:d"] == "narrow_tall"


def _process_names(trace: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def test_trace_names_every_simulated_gpu_and_what_it_stands_for(memo_run):
    names = _process_names(chrome_trace(memo_run.timeline))
    assert names[0].startswith("GPU 0 stands for all 8 GPUs of tp4+sp-cp2")
    model = replace(get_model("gpt-7b"), layers=4)
    r = simulate(model, Layout(tp=2, pp=2, dp=2), 4, 4 * K, get_policy("full_recompute"), PROFILE,
                 schedule="1f1b", micro_batch=1)
    tl = r.timeline
    gpus = {e.device for e in tl.events}
    assert gpus == {0, 1}  # one simulated GPU per stage
    names = _process_names(json.loads(json.dumps(chrome_trace(tl))))
    for d in gpus:
        assert names[d].startswith(f"GPU {d}: pipeline stage {d}, simulated for its 4 identical GPUs")
    assert sum(4 for _ in gpus) == r.layout.gpus  # the processes stand for every rank of the plan


def test_pipeline_gantt_legend_lists_only_what_is_drawn(captured):
    model = replace(get_model("gpt-7b"), layers=4)
    r = simulate(model, Layout(tp=2, pp=2), 4, 4 * K, get_policy("store_all"), PROFILE, schedule="1f1b",
                 micro_batch=1)
    assert not any(e.phase == "recompute" for e in r.timeline.events)
    figures.pipeline_gantt_figure(r.timeline, "unused.png")
    legend = {t.get_text() for leg in captured[0].legends for t in leg.get_texts()}
    assert {"forward", "backward"} <= legend and "recompute" not in legend
    assert "one of its 2 identical GPUs" in captured[0].axes[0].get_title()
