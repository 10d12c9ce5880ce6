"""Figures (#19 item 4, #16 item 4): one artist per stream, phases named by what they are, ZeRO-3
backward gathers outside the forward panel, adaptive time units, the solver's alpha on the sweep,
failed runs of each policy drawn apart."""

import pytest
from matplotlib.axes import Axes

from memo_sim.engine.simulate import simulate, sweep_alpha
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile
from memo_sim.report import figures
from memo_sim.report.figures import FWD_PHASES, _window, default_layer_range, time_unit

K = 1024


@pytest.fixture
def captured(monkeypatch):
    """The Figure objects the figure functions save (no PNG written)."""
    figs = []

    def fake_save(fig, path, **_kw):
        figs.append(fig)
        return path

    monkeypatch.setattr(figures, "_save", fake_save)
    return figs


def test_time_unit_adapts():
    assert time_unit(5e-4) == (1e-6, "us")
    assert time_unit(0.25) == (1e-3, "ms")
    assert time_unit(30.0) == (1.0, "s")
    assert time_unit(430.0) == (60.0, "min")


def _zero3_timeline():
    r = simulate(get_model("gpt-7b"), Layout(tp=2, cp=4, zero=3), 1, 256 * K, get_policy("memo", 0.2),
                 load_profile("a800-80gb"))
    assert r.ok
    return r.timeline


def test_gantt_forward_panel_excludes_backward_weight_gathers(captured, monkeypatch):
    tl = _zero3_timeline()
    assert any(e.phase == "weight_gather_bwd" for e in tl.events)
    layers = default_layer_range(tl)
    t0, t1 = _window(tl.events, layers, FWD_PHASES)
    classifier = min(e.start for e in tl.events if e.phase == "classifier")
    assert t1 <= classifier  # the forward panel ends before the backward starts
    calls = []
    real = Axes.broken_barh
    monkeypatch.setattr(Axes, "broken_barh", lambda self, *a, **k: (calls.append(1), real(self, *a, **k))[1])
    figures.gantt_figure(tl, "unused.png", layers)
    fig = captured[0]
    panels = [ax for ax in fig.axes if ax.get_title().startswith(("forward", "backward"))]
    streams = len(panels[0].get_yticklabels())
    assert len(calls) <= streams * len(panels)  # one call per stream and panel, not one per event
    labels = {t.get_text().rsplit(" (", 1)[0] for leg in fig.legends for t in leg.get_texts()}  # less "(3.75 ms)"
    assert "ZeRO-3 weight gather for backward" in labels and "forward" in labels
    assert all(ax.get_xlabel().split()[0] in ("us", "ms", "s", "min") for ax in panels)


def test_gantt_of_a_large_timeline_renders_fast(tmp_path):
    import time

    r = simulate(get_model("gpt-175b"), Layout(tp=8, cp=8, zero=3), 1, 256 * K, get_policy("memo", 0.2),
                 load_profile("a800-80gb"))
    assert len(r.timeline.events) > 4000
    t = time.perf_counter()
    figures.gantt_figure(r.timeline, tmp_path / "gantt.png")
    assert time.perf_counter() - t < 5.0  # one broken_barh per stream: well under a second on an idle core


def test_memory_figure_time_axis_in_minutes_for_long_runs(captured):
    r = simulate(get_model("gpt-7b"), Layout(tp=8), 1, 1024 * K, get_policy("memo", 0.14), load_profile("a800-80gb"))
    assert r.iteration_s > 120
    figures.memory_figure(r.timeline, "unused.png")
    assert captured[0].axes[-1].get_xlabel().endswith("(min)")
    gpu = captured[0].axes[0]  # the step patches set the limits themselves (`figures._stairs`): the whole curve shows
    steps = [p for p in gpu.patches if type(p).__name__ == "StepPatch"]
    assert len(steps) == 2 and steps[0].get_label().startswith("GPU 0") and not steps[0].get_fill() and steps[1].get_fill()
    assert gpu.get_ylim()[1] >= r.peak_gpu_bytes / 2**30 and gpu.get_xlim()[1] >= r.iteration_s / 60


def test_alpha_sweep_marks_the_solvers_alpha(captured):
    res = sweep_alpha(get_model("gpt-7b"), Layout(tp=8), 1, 128 * K, load_profile("a800-80gb"), (0.0, 0.5, 1.0))
    figures.alpha_sweep_figure(res, "unused.png", solver_alpha=0.37)
    top = captured[0].axes[0]
    marks = [ln for ln in top.lines if list(ln.get_xdata()) == [0.37, 0.37]]
    assert marks and "solver's alpha = 0.370" in marks[0].get_label()


def test_mfu_vs_seq_failures_drawn_per_policy(captured):
    model, lay, prof = get_model("gpt-7b"), Layout(tp=8), load_profile("a800-80gb")
    res = [simulate(model, lay, 1, s, get_policy(p), prof, keep_timeline=False)
           for p in ("store_all", "full_recompute") for s in (256 * K, 4096 * K)]
    failed = [r for r in res if not r.ok]
    assert len({r.policy.name for r in failed}) == 2  # both policies fail at 4M tokens
    figures.mfu_vs_seq_figure(res, "unused.png")
    ax, strip = captured[0].axes
    mfu_points = [y for ln in ax.lines for y in ln.get_ydata()] + [p[1] for c in ax.collections for p in c.get_offsets()]
    assert mfu_points and min(mfu_points) >= 0 and ax.get_ylim()[0] == 0  # no run drawn as a negative MFU
    fail_points = [tuple(p) for col in strip.collections for p in col.get_offsets()]
    assert len(fail_points) == len(failed)
    assert len(set(fail_points)) == len(fail_points)  # none stacked on another
    assert [t.get_text() for t in strip.get_yticklabels()] == ["store_all", "full_recompute"]
    assert "does not fit" in strip.get_title(loc="left")
