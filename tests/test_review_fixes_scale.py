"""A user planning at scale: the what-if's progress counts every bound-search batch, and a pipeline hop leaves the
node where any pair of its GPUs does (a review: 56 of 64 pairs of a tp8-dp8-pp2 hop across two NVL72 racks were
priced on NVLink by the first pair alone)."""

from __future__ import annotations

from memo_sim.layout.parallel import Layout, pp_stride, stage_rank, stages_cross_nodes
from memo_sim.model.config import get_model
from memo_sim.profile.loader import load_profile
from memo_sim.search.whatif import rank


def test_a_hop_crosses_where_any_of_its_pairs_does():
    lay = Layout(tp=8, dp=8, pp=2)
    pairs = [stage_rank(lay, i) for i in range(64)]
    crossing = sum(1 for r in pairs if r // 72 != (r + pp_stride(lay)) // 72)
    assert crossing == 56 and stages_cross_nodes(lay, 0, 1, 72)
    assert not stages_cross_nodes(Layout(tp=4, pp=2), 0, 1, 8)  # ranks 0-3 and 4-7 share a node
    assert stages_cross_nodes(Layout(tp=8, pp=2), 0, 1, 8)


def test_the_progress_counts_every_batch_of_the_bound_search():
    """The bound search's count runs over every batch (a review: each batch restarted at 1 of 4); since a later review
    (its total was every fitting candidate, an ETA of minutes for seconds of work) it is said in the stage words,
    'bound search ...: k simulated', with no total."""
    import re

    class Stages:
        def __init__(self):
            self.words: list[str] = []

        def __call__(self, done, total):
            pass

        def stage(self, words):
            self.words.append(words)

    seen = Stages()
    rank(get_model("gpt-7b"), 32768, 8, load_profile("a800-80gb"), progress=seen)
    done = [int(m.group(1)) for w in seen.words if w.startswith("bound search")
            for m in [re.search(r": (\d+) simulated", w)] if m]
    assert done == sorted(done) and len(done) > 1 and done[-1] > 4, seen.words
