"""Review fixes (long context, b): the pinned-host words of pipelines and SPPO count what each GPU pins and say
"full" only where the host is; full recompute and checkpoint offload keep no layer's attention lse past its
forward (one layer's is rebuilt beside the recompute buffer, as memo-exec holds it); the caching-allocator replay
asks for the loss's tensors one by one, not one block of their sum."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.activations import skeletal_bytes
from memo_sim.cost.loss_kernels import loss_kernel
from memo_sim.cost.memory import classifier_peak_bytes, loss_tokens
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.footprint import memory_breakdown
from memo_sim.memplan.iteration_requests import iteration_stream
from memo_sim.memplan.iteration_stream import FREE, MALLOC
from memo_sim.memplan.stage_plan import StageStep, stage_model_trace
from memo_sim.memplan.trace_gen import model_trace
from memo_sim.model.config import get_model
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.candidate import binding_words, host_memory_words
from memo_sim.search.pipeline import _shape, _stage_unit_terms, pipeline_candidate
from memo_sim.units import fmt_bytes

K = 1024


def _llama(layers: int):
    return replace(get_model("llama-3.1-8b"), layers=layers)


# ------------------------------------------------------------------ 1. pinned-host words of pipelines and SPPO
def _pipeline():
    m, prof = _llama(8), load_profile("h100-sxm5-80gb")
    lay = Layout(pp=2, cp=2, vpp=2)
    return m, prof, pipeline_candidate(m, lay, "memo", 4, 1, 256 * K, prof, "interleaved_1f1b")


def test_pipeline_host_words_count_units_in_flight_at_the_plans_alpha():
    """A review: a pp2 cp4 MEMO plan read "30 offloaded layers x 8 GPUs x 6.98 GiB", the node's total over the
    single-stage template's 240 layers; each GPU holds its stage's (layer, micro-batch) units in flight, each
    pinning one block at the plan's alpha. The words now give those units and that block, and they multiply to
    the priced total."""
    m, prof, c = _pipeline()
    shape = _shape(m, c.layout, c.batch, c.micro_batch, prof, c.schedule)
    _worst, units, offloaded, node_units = shape.host_units
    block = _stage_unit_terms(m, shape.shard, c.micro_batch, c.seq, c.policy, prof)[5]
    assert node_units * block == pytest.approx(c.memory.host_bytes_per_node)
    words = host_memory_words(c)
    assert "offloaded layers x" not in words, words
    assert f"{node_units} offloaded (layer, micro-batch) units" in words, words
    assert f"x {fmt_bytes(block)} pinned per unit at alpha {c.policy.alpha:.3f}" in words, words
    for s in range(c.layout.pp):
        assert f"stage {s}: {offloaded[s]} of the {units[s]} (layer, micro-batch) units in flight" in words, words


def test_sppo_host_words_give_each_stage_gpus_pinned_bytes():
    """A review: an SPPO pp8 plan read "30 offloaded layers x 8 GPUs x 17.14 GiB pinned per layer" (the total over
    240); each stage GPU pins its own (piece, layer) units at their pieces' alphas. The words give each stage's
    pinned bytes per GPU as the pricing counts them (`sppo_host_stages`), and they add up to the total."""
    from memo_sim.memplan.footprint import sppo_host_stages
    from memo_sim.search.sppo.candidates import sppo_candidates

    m, prof = _llama(8), load_profile("h100-sxm5-80gb")
    _s, cands, _rej, why = sppo_candidates(m, 256 * K, 4, prof, pp=4, subseqs=8)
    assert cands, why
    c = cands[0]
    stages = sppo_host_stages(m, c.layout, c.batch, c.policy, prof)
    assert sum(b for *_r, b in stages) == pytest.approx(c.memory.host_bytes_per_node)  # one GPU a stage here
    words = host_memory_words(c)
    assert "offloaded layers x" not in words, words
    for s, (n_l, n_k, n_off, pinned) in enumerate(stages):
        assert (f"x {fmt_bytes(pinned)} pinned per GPU ({n_l} layers x {n_k} subsequence pieces: {n_off} of the "
                f"{n_l * n_k} units offloaded") in words, words


def test_host_bound_alpha_not_called_full_where_the_simulated_host_is_below_it():
    """A review: "alpha 0.348: host memory full" beside "pinned host 1.58 TiB (simulated) of 1.64 TiB": the solver
    fills the analytic count (every unit in flight at once) to the usable memory, the simulated iteration pinned
    less. The words say the host memory sets alpha on the analytic count and what the simulated iteration pins,
    not "full"; where the simulated iteration pins what the analytic count does, "host memory full" stays."""
    _m, _prof, c = _pipeline()
    host = c.memory.host_bytes_per_node
    below = replace(c, alpha_note="host memory full",
                    simulated={"status": "OK", "peak_host_bytes_per_node": 0.9 * host})
    words = binding_words(below)
    assert "full" not in words.replace("GPU memory", ""), words
    assert "set by the host memory on the analytic count" in words and fmt_bytes(0.9 * host) in words, words
    at = replace(c, alpha_note="host memory full", simulated={"status": "OK", "peak_host_bytes_per_node": host})
    assert "host memory full --" in binding_words(at)


# ------------------------------------------------------------------ 2. the lse of recomputing policies
@pytest.mark.parametrize("name", ["full_recompute", "checkpoint_offload"])
def test_recomputing_policies_keep_one_rebuilt_lse_not_every_layers(name):
    """A review: explain of a llama-3.1-70b full-recompute plan showed "attention lse 640.00 MiB" (80 layers') where
    memo-exec drops the lse after each forward (memo_exec/activations/full_recompute.py ``after_forward``) and
    counts one layer's. The policy keeps none across layers (`Policy.keeps_lse`); one layer's lives in the recompute
    buffer's window, in the analytic footprint, the event schedule's tensors and both level-2 traces."""
    m, prof, lay, seq = _llama(4), load_profile("h200-141gb"), Layout(tp=2, cp=2), 64 * K
    pol = get_policy(name)
    sk = skeletal_bytes(m, lay, 1, seq)
    assert not pol.keeps_lse and sk["lse"] > 0
    assert "lse" not in dict(pol.forward_kept(sk)) and dict(pol.recompute_allocated(sk))["lse"] == sk["lse"]
    mem = memory_breakdown(m, lay, 1, seq, pol, prof)
    assert mem.lse_bytes == 0
    assert mem.backward_buffer_bytes == pytest.approx(sk["total"] - sk["input"] + sk["lse"])
    kept = memory_breakdown(m, lay, 1, seq, get_policy("store_all"), prof)  # a policy that keeps it: every layer's
    assert kept.lse_bytes == pytest.approx(m.layers * sk["lse"])
    trace = model_trace(m, lay, 1, seq, pol, 1 << 20, 1 << 20)
    ids = {b.id: b.size for b in trace.buffers}
    assert not any(i.endswith(".lse") for i in ids), sorted(ids)
    assert ids["recompute_buffer"] >= sk["total"] - sk["input"] + sk["lse"]
    assert any(i.endswith(".lse") for i in (b.id for b in model_trace(m, lay, 1, seq, get_policy("store_all"),
                                                                        1 << 20, 1 << 20).buffers))
    pipe = Layout(tp=2, cp=2, pp=2)
    order = [StageStep("F", 0), StageStep("F", 1), StageStep("B", 0), StageStep("B", 1)]
    st = stage_model_trace(m, pipe, 1, seq, pol, 1 << 20, 1 << 20, order, 0)
    assert not any(b.id.endswith(".lse") for b in st.buffers), sorted(b.id for b in st.buffers)


def test_selective_recompute_keeps_one_rebuilt_lse_not_every_layers():
    """Selective recompute re-runs the attention core before the backward, its lse with it: memo-exec
    (memo_exec/activations/selective_recompute.py) counts one layer's; the simulator kept every layer's."""
    m, prof, lay, seq = _llama(4), load_profile("h200-141gb"), Layout(tp=2, cp=2), 64 * K
    pol = get_policy("selective_recompute")
    sk = skeletal_bytes(m, lay, 1, seq)
    assert not pol.keeps_lse and "lse" not in dict(pol.forward_kept(sk))
    assert dict(pol.recompute_allocated(sk))["lse"] == sk["lse"] > 0
    mem = memory_breakdown(m, lay, 1, seq, pol, prof)
    assert mem.lse_bytes == 0 and mem.backward_buffer_bytes == pytest.approx(sk["lse"])
    trace = model_trace(m, lay, 1, seq, pol, 1 << 20, 1 << 20)
    assert not any(b.id.endswith(".lse") for b in trace.buffers)


# ------------------------------------------------------------------ 3. the loss's tensors, one request each
def _classifier_requests(stream):
    names = stream.phase_names
    k = names.index("classifier")
    return [r for r, p in zip(stream.iteration, stream.phase_of) if p == k]


@pytest.mark.parametrize("kernel", ["vocab_parallel", "torch_fused", "chunked"])
def test_replay_asks_for_the_logits_and_their_fp32_copy_apart(kernel):
    """A review: maxseq of llama-3.1-8b under DeepSpeed (Ulysses 8, ZeRO 3, checkpoint offload) failed at 704K on
    "a 64.58 GiB request": 90112 tokens x 128256 logits x (2 + 4) B as one block, where Megatron-LM's vocab-parallel
    loss allocates the bf16 logits and their ``.float()`` copy apart (memo-exec's chunked head too: ``torch.mm``,
    then ``logits.to(acc)``). Each of the loss's tensors is its own request now, none larger than a logit's 4 fp32
    bytes, and at the head's peak they hold the kernel's live bytes per logit, as the analytic head does."""
    m, seq = _llama(2), 704 * K
    lay = Layout(ulysses=8, zero=3, cross_entropy=kernel)
    stream = iteration_stream(m, lay, 1, seq, get_policy("checkpoint_offload"))
    cls = _classifier_requests(stream)
    d = DTYPE_BYTES[m.dtype]
    logits = loss_tokens(lay, 1, seq) * m.vocab / lay.tp
    k = loss_kernel(kernel)
    sizes = {bid: size for kind, bid, size in cls if kind == MALLOC}
    assert sizes["cls.chunk"] == pytest.approx(logits * d, abs=1)
    assert sizes["cls.fp32_copy.chunk"] == pytest.approx(logits * 4, abs=1)
    assert max(sizes.values()) <= logits * 4 + 1  # no block of their sum
    live = peak = 0
    for kind, bid, size in cls:
        if not bid.startswith("cls.") or bid == "cls.final_norm":
            continue
        live += size if kind == MALLOC else -sizes[bid]
        peak = max(peak, live)
    assert peak == pytest.approx(logits * k.live_bytes_per_logit(d), abs=8)
    head = classifier_peak_bytes(m, lay, 1, seq)
    assert peak + 2 * skeletal_bytes(m, lay, 1, seq)["input"] == pytest.approx(head, abs=8)
    assert all(kind in (MALLOC, FREE) for kind, _b, _s in cls)
