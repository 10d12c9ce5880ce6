"""A review's findings on multi-token prediction (`ModelConfig.mtp_layers`): a last pipeline stage that holds the
modules and the loss alone (a layout ending ``|mL``) counted one micro-batch's kept module activations beside the next
micro-batch's classifier in a same-instant bookkeeping spike, and the caching-allocator replay asked for the whole head
term, the modules' saved tensors included, in one request."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.memory import classifier_peak_bytes, mtp_activation_bytes
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.iteration_requests import iteration_stream
from memo_sim.memplan.iteration_stream import MALLOC
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile

H100 = load_profile("h100-sxm5-80gb")
STORE = get_policy("store_all")


def test_a_stage_of_the_modules_and_loss_alone_peaks_at_what_is_live():
    """'Et*2|t*3|t*3|mL': the last stage has no layers, so its backward step has no compute op; the modules' kept
    block must be gone before the next micro-batch's classifier allocates, and the simulated stage peak equals the
    analytic one (`pipeline_memory`), model states and one classifier."""
    from memo_sim.engine.simulate import simulate
    from memo_sim.search.pipeline import pipeline_memory

    model = replace(get_model("llama-3.1-8b"), layers=8, mtp_layers=1)
    lay = Layout(pp=4, chunk_layers=(2, 3, 3, 0))
    r = simulate(model, lay, 4, 4096, STORE, H100, schedule="1f1b", micro_batch=1, keep_timeline=False)
    rows = pipeline_memory(model, lay, 4, 1, 4096, STORE, H100, "1f1b")[1]
    assert r.pipeline["stages"][3]["peak_gpu_bytes"] == pytest.approx(rows[3]["peak_gpu_bytes"])


def test_the_replay_requests_the_modules_tensors_apart_from_the_head():
    """The head's term (`classifier_peak_bytes`) holds the modules' kept tensors (`mtp_activation_bytes`); the
    replay asks for the main head's logits as before and for each module's tensors on their own, none as large as
    the modules' whole term, the same bytes in all, and the stream's live peak is the one the lump gave."""
    model = replace(get_model("deepseek-v3"), layers=4)
    lay = Layout(ep=8, dp=8, cross_entropy="vocab_parallel")
    for name in ("store_all", "full_recompute"):
        pol = get_policy(name)
        stream = iteration_stream(model, lay, 1, 8192, pol)
        mtp = mtp_activation_bytes(model, lay, 1, 8192, pol.recomputes_mtp)
        sizes = {bid: size for kind, bid, size in stream.iteration if kind == MALLOC}
        modules = [size for bid, size in sizes.items() if bid.startswith("mtp0.") and not bid.endswith(".chunk")]
        assert len(modules) >= 3 and sum(modules) == pytest.approx(mtp, abs=len(modules))
        assert max(modules) < mtp  # the loss's fp32 softmax may be most of it, still one tensor of several
        head = classifier_peak_bytes(model, lay, 1, 8192, recompute_mtp=pol.recomputes_mtp)
        assert sizes["cls.chunk"] < head - mtp
        lump = iteration_stream(replace(model, mtp_layers=0), lay, 1, 8192, pol)
        live = [s.max_live_bytes() - s.static_bytes for s in (stream, lump)]  # the modules' states are static
        assert live[0] - live[1] == pytest.approx(mtp, rel=1e-3)
