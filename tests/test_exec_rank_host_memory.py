"""[answers #30] The memory figure of a run of several ranks draws every rank's host memory (its
pinned pool), stacked by rank and labelled with its coordinates, not rank 0's pool as the node's;
a simulated timeline's host memory stays one line per node. Checked on the matplotlib objects."""

from __future__ import annotations

import pytest

from memo_exec.figures import rank_host_samples
from memo_sim.report import figures as SF
from memo_sim.timeline import MemorySample, Timeline

MiB = 2**20


@pytest.fixture
def captured(monkeypatch):
    figs = []
    monkeypatch.setattr(SF, "_save", lambda fig, path, **_kw: figs.append(fig) or path)
    return figs


def _payload(rank: int, pool: float) -> dict:
    """What a rank sends rank 0: its GPU samples under its rank, its pool under node 0 (-1)."""
    return {"rank": rank, "memory": [MemorySample(0.0, rank, "gpu", 100 * MiB * (1 + rank)),
                                     MemorySample(0.0, -1, "host", pool), MemorySample(1.0, -1, "host", pool)]}


def test_every_rank_host_memory_is_drawn_stacked_and_labelled(captured):
    pools = [8 * MiB, 9 * MiB, 10 * MiB, 11 * MiB]
    payloads = [_payload(r, p) for r, p in enumerate(pools)]
    host = rank_host_samples(payloads, [0, 1, 2, 3])
    assert sorted({m.device for m in host}) == [0, 1, 2, 3] and all(m.kind == "host" for m in host)
    gpu = [m for p in payloads for m in p["memory"] if m.kind == "gpu"]
    meta = {"source": "measured", "device_kind": "cpu",
            "rank_labels": {"0": "cp0 tp0", "1": "cp0 tp1", "2": "cp1 tp0", "3": "cp1 tp1"}}
    SF.memory_figure(Timeline(events=[], memory=gpu + host, meta=meta), "unused.png")
    ax = captured[-1].axes[1]
    labels = [a.get_label() for a in ax.patches]
    assert ["rank 0 (cp0 tp0)", "rank 1 (cp0 tp1)", "rank 2 (cp1 tp0)", "rank 3 (cp1 tp1)"] == \
        [lb for lb in labels if lb.startswith("rank")]
    assert "sum of the 4 ranks' pools" in labels and not any("node" in lb for lb in labels)
    assert ax.get_ylim()[1] * 2**30 >= sum(pools)  # the stack reaches the ranks' sum
    assert "stacked by rank" in ax.get_ylabel()


def test_only_the_drawn_ranks(captured):
    payloads = [_payload(r, 8 * MiB) for r in range(4)]
    assert sorted({m.device for m in rank_host_samples(payloads, [0, 2])}) == [0, 2]


def test_a_simulated_timeline_keeps_one_host_line_per_node(captured):
    mem = [MemorySample(0.0, 0, "gpu", 2**30), MemorySample(0.0, -1, "host", 2**30),
           MemorySample(1.0, -1, "host", 2**30)]
    SF.memory_figure(Timeline(events=[], memory=mem, meta={"source": "simulated"}), "unused.png")
    ax = captured[-1].axes[1]
    assert [ln.get_label() for ln in ax.patches if ln.get_label()] == ["node 0 pinned host"]


def test_ranks_without_host_memory_are_said_so(captured):
    payloads = [_payload(r, 0.0) for r in range(2)]
    gpu = [m for p in payloads for m in p["memory"] if m.kind == "gpu"]
    SF.memory_figure(Timeline(events=[], memory=gpu + rank_host_samples(payloads, [0, 1]), meta={}), "unused.png")
    ax = captured[-1].axes[1]
    assert "no host memory on any of the 2 ranks (0 B)" in {t.get_text() for t in ax.texts}
