"""[answers #30 item 7] The executor's figures of a run of several ranks draw every rank (or one
per pipeline stage and context position beyond `MAX_RANKS_DRAWN`), each labelled with its
coordinates; `layers.png`'s predicted bars are readable however much smaller than the measured
ones they are (a log axis and the value written on each). Checked on the matplotlib objects."""

from __future__ import annotations

import pytest

from memo_exec import figures as F
from memo_sim.report import figures as SF
from memo_sim.timeline import MemorySample, Timeline, TimelineEvent
from tests.figure_capture import capture_saves


@pytest.fixture
def captured(monkeypatch):
    return capture_saves(monkeypatch, (F, "save_png"), (SF, "_save"))


def _rank_rows(n_cp=2, n_tp=2):
    return [{"rank": c * n_tp + t, "dp": 0, "pp": 0, "cp": c, "ulysses": 0, "tp": t}
            for c in range(n_cp) for t in range(n_tp)]


def _measured(ranks: int, slow: float = 1.0) -> Timeline:
    ev, mem = [], []
    for r in ranks if isinstance(ranks, list) else range(ranks):
        t = 0.0
        for layer in range(3):
            for phase, stream in (("fwd", "compute"), ("comm", "comm")):
                ev.append(TimelineEvent(f"l{layer}.{phase}", layer, phase, stream, r, t, t + 0.1 * slow * (1 + r)))
            t += 0.2 * slow * (1 + r)
        for layer in reversed(range(3)):
            ev.append(TimelineEvent(f"l{layer}.bwd", layer, "bwd", "compute", r, t, t + 0.2 * slow))
            t += 0.2 * slow
        mem.append(MemorySample(0.0, r, "gpu", 2**30 * (1 + r)))
    meta = {"source": "measured", "device_kind": "cpu", "rank_labels": {"0": "cp0 tp0", "1": "cp0 tp1",
                                                                        "2": "cp1 tp0", "3": "cp1 tp1"}}
    return Timeline(events=ev, memory=mem, meta=meta)


def test_rank_labels_and_which_ranks_are_drawn():
    rows = _rank_rows()
    assert F.rank_coords(rows) == {0: "cp0 tp0", 1: "cp0 tp1", 2: "cp1 tp0", 3: "cp1 tp1"}
    drawn, note = F.ranks_to_draw(rows)
    assert [r["rank"] for r in drawn] == [0, 1, 2, 3] and note == "all 4 ranks"
    big = _rank_rows(n_cp=4, n_tp=4)  # 16 ranks: one per context position (tp = 0)
    drawn, note = F.ranks_to_draw(big)
    assert [r["rank"] for r in drawn] == [0, 4, 8, 12] and note.startswith("4 of 16 ranks")


def test_gantt_and_memory_draw_every_rank_labelled(captured):
    tl = _measured(4)
    SF.gantt_figure(tl, "unused.png", (0, 2), devices=[0, 1, 2, 3], note="all 4 ranks")
    fig = captured[-1]
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    for r, c in enumerate(("cp0 tp0", "cp0 tp1", "cp1 tp0", "cp1 tp1")):
        assert f"CPU {r} (rank {r}: {c}): forward, layers 0..2" in titles
        assert f"CPU {r} (rank {r}: {c}): backward, layers 0..2" in titles
    assert "all 4 ranks" in fig._suptitle.get_text()
    SF.memory_figure(tl, "unused.png")
    labels = [ln.get_label() for ln in captured[-1].axes[0].patches + captured[-1].axes[0].lines]
    assert {f"CPU {r} (rank {r}: {c})" for r, c in F.rank_coords(_rank_rows()).items()} <= set(labels)


def test_a_rank_holding_none_of_the_drawn_layers_gets_no_row_and_is_named(captured):
    """A pipeline rank of the embedding alone ('E|t*2L'): the whole figure failed ('no events for layers') and the
    report drew rank 0 only; the other ranks' rows are drawn and the note says why that rank has none."""
    tl = _measured([1])
    tl.events.append(TimelineEvent("embedding", None, "fwd", "compute", 0, 0.0, 0.1))
    SF.gantt_figure(tl, "unused.png", (0, 2), devices=[0, 1], note="all 2 ranks")
    fig = captured[-1]
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert any("forward, layers 0..2" in t for t in titles) and not any(t.startswith("CPU 0") for t in titles)
    assert "no row for device 0: none of layers 0..2 runs there" in fig._suptitle.get_text()
    with pytest.raises(Exception, match="no events for layers"):
        SF.gantt_figure(tl, "unused.png", (0, 2), device=0)  # one device asked for: still refused


def test_overlay_has_one_panel_per_rank(captured):
    pred = _measured([0], slow=0.001)
    pred.meta["source"] = "simulated"
    F.overlay_gantt(pred, _measured(4), "unused.png", "t", ranks=_rank_rows(), note="all 4 ranks")
    axes = captured[-1].axes
    assert [ax.get_title(loc="left").split(":")[0] for ax in axes] == \
        ["rank 0 (cp0 tp0)", "rank 1 (cp0 tp1)", "rank 2 (cp1 tp0)", "rank 3 (cp1 tp1)"]
    for ax in axes:  # both the prediction and the rank's measurement are drawn in every panel
        colours = {tuple(round(c, 3) for c in coll.get_facecolor()[0]) for coll in ax.collections
                   if len(coll.get_paths())}
        assert len(colours) == 2


def test_layer_figure_predicted_bars_readable_beside_much_larger_measured(captured):
    predicted = {"forward": 4e-4, "backward": 7e-4, "recompute": 2e-4, "offload": None, "prefetch": 3e-4}
    steady = [(f"rank {r}", {"layer_forward_s": 0.2, "layer_backward_s": 0.4, "layer_recompute_s": 0.1,
                             "layer_offload_s": 1e-3, "layer_prefetch_s": 1e-3}) for r in range(4)]
    per_layer = [(lab, {"fwd": {"0": 0.2, "1": 0.2}, "bwd": {"0": 0.4, "1": 0.4}}) for lab, _ in steady]
    F.layer_figure(predicted, steady, per_layer, 1, "unused.png", "all 4 ranks")
    ax1, ax2 = captured[-1].axes[:2]
    assert ax1.get_yscale() == "log"  # 0.2 ms beside 400 ms: a linear axis would hide the prediction
    lo, hi = ax1.get_ylim()
    assert lo <= 0.2 and hi >= 400
    heights = sorted(round(p.get_height(), 6) for p in ax1.patches)
    assert 0.4 in heights and 0.2 in heights  # the predicted bars are there, at their values
    notes = {t.get_text() for t in ax1.texts}
    assert {"0.4", "0.7", "0.2", "0.3", "not predicted"} <= notes, notes
    assert len(ax1.get_legend().get_texts()) == 5  # predicted + one per rank
    legend = {t.get_text() for t in ax2.get_legend().get_texts()}
    assert {"fwd", "bwd", "rank 0", "rank 3"} <= legend
    F.layer_figure({"forward": 0.15, "backward": 0.3}, [("", {"layer_forward_s": 0.2, "layer_backward_s": None})],
                   [("", {"fwd": {"0": 0.2}})], 1, "unused.png")
    assert captured[-1].axes[0].get_yscale() == "linear"  # comparable numbers: a linear axis
    assert "not measured" in {t.get_text() for t in captured[-1].axes[0].texts}  # a missing bar is named


def test_times_compare_only_on_the_profiles_kind_of_device(tmp_path):
    import yaml

    from memo_exec.report import times_comparable
    from memo_sim.profile.loader import REPO_PROFILES

    assert not times_comparable({"device_kind": "cpu"}, "a800-80gb")  # a GPU plan on a CPU
    assert times_comparable({"device_kind": "cuda"}, "a800-80gb")
    raw = yaml.safe_load((REPO_PROFILES / "h100-sxm5-80gb.yaml").read_text())
    raw.update(name="my-cpu", provenance={"method": "calibrated", "device_kind": "cpu"})
    cpu = tmp_path / "my-cpu.yaml"
    cpu.write_text(yaml.safe_dump(raw))
    assert times_comparable({"device_kind": "cpu"}, str(cpu)) and not times_comparable({"device_kind": "cuda"},
                                                                                       str(cpu))
