"""Mutation tests of every copy the executor makes: the single-device offload, SPPO's
per-subsequence offload and prefetch and its stage-to-stage P2P, ring CP's P2P double buffers,
METP's rings (the inner K/V ring, the FFN ring, the MHA's weight broadcasts and gradient reduces,
the W_proj ring) and the pipeline executor's P2P. Each test removes one declared wait or moves one
slot choice (a monkeypatch of the one method that makes it, never a user-visible flag) and the
run must fail with `RaceError` (or its subclass `SlotMismatch`) at issue time, a skipped P2P wait
with a message naming the transfer. No copy is delayed anywhere here: the detector
(`memo_exec.happens_before`) reasons on the issue order and on physical regions (storage address,
byte spans, what the bytes hold), so every outcome is the same on an idle and on a loaded machine.

Counted mutations (each removed or swapped in turn; 68 in all):

| component                                | waits | slot / buffer choices | bug patterns |
|------------------------------------------|-------|-----------------------|--------------|
| single-device offload                    | 4 (*) | 4                     | 2            |
| SPPO offload / prefetch                  | 4     | 2                     | 2            |
| SPPO stage-to-stage P2P                  | 2     | -                     | -            |
| ring CP                                  | 4     | 4                     | -            |
| METP inner K/V ring (ring attention)     | 4     | 7                     | -            |
| METP FFN ring                            | 4     | 7                     | -            |
| METP MHA weight broadcasts / dW reduces  | 6     | 7                     | -            |
| METP W_proj ring (MEMO's recompute)      | 1     | 2                     | -            |
| pipeline executor P2P (1F1B)             | 2     | -                     | -            |

(*) in tests/test_exec_mutations.py (each for every layer and for layers 0, 1, 3); the rest here.
(The stage P2P receive buffers are fresh per message: no slot to choose; the pipeline's
activation slots are mutated in tests/test_pipeline_exec_dist.py.) The distributed and SPPO
mutations each run in one spawn (its ranks are killed at its timeout: none outlives the test);
a mutation that leaves unmatched transfers behind runs last in its process group or on a group
of its own.
"""

from __future__ import annotations

import pytest
import torch

from memo_exec.activations import token_offload
from memo_exec.activations.token_offload import TokenOffload
from memo_exec.happens_before import HappensBefore, RaceError, Region, SlotMismatch, TransferGuard
from memo_sim.model.config import ModelConfig
from tests.dist_harness import spawn
from tests.exec_helpers import executor_grads, make_plan, max_rel_error, policy, reference_grads, time_limit

torch.set_num_threads(1)

MEMO = policy("memo", 0.3)


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(300):
        yield


def _grads(layers: int = 6, seq: int = 128):
    model = ModelConfig("race-mut", layers, 64, 4, 256, vocab=128)
    return executor_grads(make_plan(model, seq, MEMO, chunk=64), dtype="fp64")


# -- the detector's physical regions ------------------------------------------------------------------
def test_regions_are_the_bytes_a_view_covers():
    buf = torch.zeros(4, 6, dtype=torch.float64)
    rows, cols, other = buf[1:3], buf[:, 2:4], buf[3:]
    assert Region.of(rows, "r").spans == ((48, 144),)
    assert Region.of(cols, "c").spans == ((16, 32), (64, 80), (112, 128), (160, 176))
    assert Region.of(rows, "r").overlaps(Region.of(cols, "c"))
    assert not Region.of(rows, "r").overlaps(Region.of(other, "o"))
    assert not Region.of(rows, "r").overlaps(Region.of(torch.zeros(4, 6), "elsewhere"))
    assert Region.of(buf.view(-1)[6:18], "flat").covers(Region.of(rows, "r"))


def test_a_read_must_find_what_it_expects():
    hb = HappensBefore()
    host = torch.zeros(2, 8)
    slot0, slot1 = Region.of(host[0], "slot 0", "layer 0 x"), Region.of(host[1], "slot 1", "layer 1 x")
    hb.access("d2h", "offload(0)", writes=[slot0])
    hb.access("d2h", "offload(1)", writes=[slot1])
    hb.barrier()  # ordered: only the content can tell a wrong slot
    hb.access("h2d", "prefetch(1)", reads=[slot1])
    with pytest.raises(SlotMismatch, match="expecting layer 0 x, but that memory holds layer 1 x"):
        hb.access("h2d", "prefetch(0)", reads=[Region.of(host[1], "slot 1", "layer 0 x")])
    with pytest.raises(SlotMismatch, match="no declared write put it there"):
        hb.access("h2d", "prefetch(2)", reads=[Region.of(torch.zeros(3), "fresh", "layer 2 x")])


def test_transfer_guard_names_the_transfer_that_was_not_waited():
    g = TransferGuard()
    a, b = torch.zeros(8), torch.zeros(8)
    g.access("fill", writes=[Region.of(a, "a", "block 0")])
    tok = g.posted("kv step 0", [Region.of(a, "a")], [Region.of(b, "b", "block 1")])
    g.access("compute", reads=[Region.of(a, "a", "block 0")])  # reading the send buffer is fine
    with pytest.raises(RaceError, match="transfer 'kv step 0' receives into it and was not waited on"):
        g.access("block 1", reads=[Region.of(b, "b", "block 1")])
    with pytest.raises(RaceError, match="transfer 'kv step 0' sends from it"):
        g.access("overwrite", writes=[Region.of(a, "a", "block 2")])
    g.waited(tok)
    g.access("block 1", reads=[Region.of(b, "b", "block 1")])
    with pytest.raises(RaceError, match="aliased double buffer"):
        g.posted("kv step 1", [Region.of(b, "b")], [Region.of(b[2:], "b", "block 2")])


# -- the single-device offload: slot choices -----------------------------------------------------------
def _swap_slot(direction: bool):
    orig = TokenOffload._host_slot

    def swapped(self, i, to_host):
        j = i ^ 1 if to_host == direction and (i ^ 1) < self.n_offloaded else i
        return orig(self, j, to_host)
    return swapped


@pytest.mark.parametrize("direction", [True, False], ids=["offload-slot", "prefetch-slot"])
def test_offload_a_layer_into_the_neighbouring_host_slot_is_a_mismatch(monkeypatch, direction):
    """Copies stay ordered, so only the physical regions and their content can see it."""
    monkeypatch.setattr(TokenOffload, "_host_slot", _swap_slot(direction))
    with pytest.raises(SlotMismatch, match="expecting layer 3 x, but that memory holds layer 2 x"):
        _grads()


def test_host_slots_aliased_across_layers_are_caught_on_four_layers(monkeypatch):
    """Every layer offloaded into slot 0 (on 4 layers, where ``i % 2 == i`` would hide an alias)."""
    monkeypatch.setattr(TokenOffload, "_host_slot", lambda self, i, to_host: self.host[0])
    with pytest.raises(RaceError, match="layer 0"):
        _grads(layers=4)


def test_one_rounding_buffer_for_every_layer_is_caught(monkeypatch):
    monkeypatch.setattr(token_offload, "rounding_buffer", lambda i: 0)
    with pytest.raises(RaceError):
        _grads()


# -- the single-device offload: the patterns of shipped offload bugs -----------------------------------
def test_a_reload_that_ignores_its_copy_event_is_a_race(monkeypatch):
    monkeypatch.setattr(TokenOffload, "_backward_waits_for_prefetch", lambda self, j: None)
    with pytest.raises(RaceError, match=r"race on .*prefetch\(\d\) writes it on h2d"):
        _grads()


def test_a_wait_issued_inside_the_side_streams_own_context_orders_nothing(monkeypatch):
    """``with torch.cuda.stream(side): side.wait_stream(torch.cuda.current_stream())`` waits for the
    side stream itself: here, the offload's event recorded on the d2h stream it then waits on."""
    def own_context(self, i):
        self.engine.d2h.record(self.ev_fwd[i])
        self.engine.d2h.wait_event(self.ev_fwd[i])

    monkeypatch.setattr(TokenOffload, "_offload_waits_for_forward", own_context)
    with pytest.raises(RaceError, match="recorded on d2h itself: the wait orders nothing"):
        _grads()


def test_unmutated_offload_is_exact_and_checked():
    loss, grads, ex = _grads()
    assert ex.engine.hb.checked > 100
    ref_loss, ref_grads = reference_grads(ex)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= 1e-10, f"{worst}: {err:.2e}"


# -- SPPO: per-subsequence offload and prefetch (one spawned rank runs every mutation) ---------------
SPPO_MUTATIONS = {
    "baseline": None,
    "offload waits for forward": ("_offload_waits_for_forward", lambda self, made: None),
    "prefetch waits for alloc": ("_prefetch_waits_for_alloc", lambda self, ready: None),
    "prefetch waits for offload": ("_prefetch_waits_for_offload", lambda self, u: None),
    "backward waits for prefetch": ("_backward_waits_for_prefetch", lambda self, u: None),
    "host slot aliased across layers": ("_slot", lambda self, k, j, i: (k, 0, i)),
    "prefetch reads the neighbouring layer's slot": (
        "_prefetch_source", lambda self, u, i: self.units[(u.key[0], u.key[1] ^ 1)].saved[i].host),
    "wait inside the side stream's context": ("_offload_waits_for_forward", "own-context"),
    "side stream reads a freed tensor": ("_hold", None),
}


def _sppo_mutations(rank: int, world: int) -> dict[str, str]:
    import tests.test_sppo_exec as T
    from memo_exec.sppo.offload import SequenceOffload
    from memo_exec.streams import HostCopyStream

    def own_context(self, made):
        self.streams.d2h.record(made)
        self.streams.d2h.wait_event(made)

    case = T._case(2, model=T.MODEL)
    out = {}
    for name, patch in SPPO_MUTATIONS.items():
        with pytest.MonkeyPatch.context() as mp:
            if patch is not None and patch[0] == "_hold":
                mp.setattr(HostCopyStream, "_hold", lambda self, pairs: None)
            elif patch is not None:
                mp.setattr(SequenceOffload, patch[0], own_context if patch[1] == "own-context" else patch[1])
            try:
                res = T.run_case(rank, world, case)
            except RaceError as e:
                out[name] = f"{type(e).__name__}: {e}"
                continue
        want = T.reference(case["model"], case["batch"], case["dtype"], case["seed"])[1]
        out[name] = f"ok {T._rel(T._merge([res]), want)[0]:.1e} {res['offload_bytes']}"
    return out


@pytest.fixture(scope="module")
def sppo_results():
    return spawn(_sppo_mutations, 1, timeout=240)[0]


def test_sppo_unmutated_is_exact(sppo_results):
    ok, err, nbytes = sppo_results["baseline"].split()
    assert ok == "ok" and float(err) < 1e-10 and int(nbytes) > 0


@pytest.mark.parametrize("name", [n for n in SPPO_MUTATIONS if n != "baseline"])
def test_sppo_mutation_is_caught(sppo_results, name):
    got = sppo_results[name]
    want = {"host slot aliased across layers": "SlotMismatch", "prefetch reads the neighbouring layer's slot":
            "SlotMismatch", "wait inside the side stream's context": "orders nothing",
            "side stream reads a freed tensor": "not held by d2h"}.get(name, "race on")
    assert want in got, got


# -- ring CP: the P2P double buffers (two gloo ranks, every mutation in one spawn) --------------------
def _outcome(patch, run) -> str:
    """``ok <run()>`` with ``patch`` applied (the arguments of one ``monkeypatch.setattr``, or None),
    or the `RaceError` that refused it, in one line."""
    with pytest.MonkeyPatch.context() as mp:
        if patch is not None:
            mp.setattr(*patch)
        try:
            return f"ok {run()}"
        except RaceError as e:
            return f"{type(e).__name__}: {e}"


def _each_mutation(muts: dict, run) -> dict[str, str]:
    """Run ``run`` under every mutation in turn; after a refused one, wait for the transfers it left
    in flight and meet the other rank, so the next starts from a clean ring."""
    import torch.distributed as dist

    from memo_exec.distributed import p2p
    from memo_exec.metp.lane import Lane

    posted = []
    orig, orig_coll = p2p._guarded, Lane._post_collective

    def collect(tr, *a):
        posted.append(tr)
        return orig(tr, *a)

    def collect_coll(self, *a):
        posted.append(orig_coll(self, *a))
        return posted[-1]

    out = {}
    with pytest.MonkeyPatch.context() as keep:
        keep.setattr(p2p, "_guarded", collect)
        keep.setattr(Lane, "_post_collective", collect_coll)
        for name, patch in muts.items():
            out[name] = _outcome(patch, lambda: f"{run():.1e}")
            for tr in posted:
                tr.guard = None
                tr.wait()
            posted.clear()
            dist.barrier()
    return out


CP_WAITS = ("cp_kv_ring forward", "cp_kv_ring backward", "cp_dkv_ring backward step 0", "cp_dkv_ring backward step 1")
CP_SWAPS = ("forward K/V", "backward K/V", "dK/dV accumulator")


def _cp_mutations(rank: int, world: int) -> dict[str, str]:
    from memo_exec.distributed.attention import RingAttention
    from tests.test_dist_ring_attention import _rank

    orig_wait, orig_swap, orig_shift = RingAttention._wait, RingAttention._swap, RingAttention._shift
    muts = {"baseline": None}
    for site in CP_WAITS:
        muts[f"skip wait {site}"] = ("_wait", lambda self, tr, what, t, s=site: None if tr.name.startswith(s)
                                     else orig_wait(self, tr, what, t))
    for site in CP_SWAPS:
        muts[f"no swap {site}"] = ("_swap", staticmethod(lambda st, a, b, s=site: (a, b) if st == s
                                                         else orig_swap(st, a, b)))
    muts["receive into the send buffer"] = ("_shift", lambda self, send, recv, name, rc:
                                            orig_shift(self, send, send, name, rc))
    return _each_mutation({n: None if p is None else (RingAttention, *p) for n, p in muts.items()},
                          lambda: _rank(rank, world, 0.0)[1][0].abs().max())


@pytest.fixture(scope="module")
def cp_results():
    return spawn(_cp_mutations, 2, timeout=180)


def test_ring_cp_mutations_fail_at_once_naming_the_transfer(cp_results):
    for r in cp_results:
        assert r.pop("baseline").startswith("ok")
        assert len(r) == len(CP_WAITS) + len(CP_SWAPS) + 1
        for name, got in r.items():
            assert got.startswith(("RaceError", "SlotMismatch")), (name, got)
            if name.startswith("skip wait"):
                site = name.removeprefix("skip wait ")
                assert f"transfer '{site}" in got and "not waited on" in got, (name, got)


# -- METP's ring attention (two gloo ranks, every mutation in one spawn) ------------------------------
METP_WAITS = ("p2p_kv.0", "p2p_kv_dkv.0", "p2p_dkv.0", "p2p_dkv_home")
METP_HALVES = ("forward K/V", "forward K/V receive", "backward K/V", "backward K/V receive", "dK/dV", "dK/dV send",
               "dK/dV home")
B, N, H, HK, D = 2, 8, 4, 2, 8  # N rows of every sequence per rank, interleaved: every rank reads every block


def _metp_ring(rank: int, world: int):
    from memo_exec.metp.lane import Lane, RingOptions
    from memo_exec.metp.ledger import Ledger
    from memo_exec.metp.ring_attention import ring_attention_backward, ring_attention_forward

    g = torch.Generator().manual_seed(3)
    S = N * world
    q, k, v, do = (torch.randn(B, S, h * D, generator=g, dtype=torch.float64) for h in (H, HK, HK, H))
    mine = torch.arange(N) * world + rank  # positions rank, rank + p, ...
    ql, kl, vl, dol = (t[:, mine].reshape(B * N, -1).contiguous() for t in (q, k, v, do))
    opts = RingOptions()
    out, lse = torch.empty_like(ql), torch.empty(B, H, N, dtype=torch.float64)
    ring_attention_forward(ql, kl, vl, B, H, HK, out, lse, opts, Lane(opts, torch.device("cpu"), "fwd"), Ledger(), "",
                           "interleaved")
    dq, dk, dv = torch.empty_like(ql), torch.empty_like(kl), torch.empty_like(vl)
    ring_attention_backward(ql, kl, vl, out, dol, lse, B, H, HK, dq, dk, dv, opts,
                            Lane(opts, torch.device("cpu"), "bwd"), Ledger(), "", "interleaved")
    # the reference: causal attention over the whole sequence, gradients by autograd
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    bh = lambda t, h: t.view(B, S, h, D).transpose(1, 2)  # noqa: E731
    kk, vv = (bh(t, HK).repeat_interleave(H // HK, 1) for t in (kr, vr))
    ref = torch.nn.functional.scaled_dot_product_attention(bh(qr, H), kk, vv, is_causal=True)
    ref = ref.transpose(1, 2).reshape(B, S, H * D)
    ref.backward(do)
    err = max(float((a.view(B, N, -1) - b[:, mine]).abs().max())
              for a, b in ((out, ref.detach()), (dq, qr.grad), (dk, kr.grad), (dv, vr.grad)))
    return err


def _metp_mutations(rank: int, world: int) -> dict[str, str]:
    muts = {"baseline": None}
    for site in METP_WAITS:
        muts[f"skip wait {site}"] = _skip_lane_wait(None, site)
    for site in METP_HALVES:
        muts[f"swap half {site}"] = _swap_half(site)
    return _each_mutation(muts, lambda: _metp_ring(rank, world))


def _skip_lane_wait(phase: str | None, site: str):
    """Mutation: the METP lane does not wait for transfer ``site`` (in ``phase``, or any)."""
    from memo_exec.metp.lane import Lane

    orig = Lane.wait
    return (Lane, "wait", lambda self, p: None if p is not None and phase in (None, self.phase) and
            p.handle.name.split(" + ")[0] == site else orig(self, p))


def _swap_half(site: str):
    """Mutation: slot choice ``site`` takes the other half of its double buffer."""
    from memo_exec.metp.lane import Lane

    orig = Lane.half
    return (Lane, "half", staticmethod(lambda st, t: orig(st, t + (st == site))))


@pytest.fixture(scope="module")
def metp_results():
    return spawn(_metp_mutations, 2, timeout=180)


def test_metp_ring_mutations_fail_at_once_naming_the_transfer(metp_results):
    for r in metp_results:
        ok, err = r.pop("baseline").split()
        assert ok == "ok" and float(err) < 1e-12
        assert len(r) == len(METP_WAITS) + len(METP_HALVES)
        for name, got in r.items():
            assert got.startswith(("RaceError", "SlotMismatch")), (name, got)
            if name.startswith("skip wait"):
                site = name.removeprefix("skip wait ")
                assert f"transfer '{site}" in got and "not waited on" in got, (name, got)


# -- METP's FFN ring, the MHA's weight broadcasts and gradient reduces, the W_proj ring -----------------
METP_LAYER_WAITS = (("fwd", "p2p_ffn_w0"), ("bwd", "p2p_ffn_w0"), ("bwd", "p2p_ffn_dw0"), ("bwd", "p2p_ffn_dw_home"),
                    ("fwd", "bcast_w0"), ("fwd", "bcast_w1"), ("bwd", "bcast_w0"), ("bwd", "bcast_w1"),
                    ("bwd", "reduce_dw0"), ("bwd", "reduce_dw1"), ("recompute", "p2p_wproj0"))
METP_LAYER_HALVES = ("ffn W", "ffn W receive", "ffn bwd W", "ffn bwd W receive", "ffn dW", "ffn dW send",
                     "ffn dW home", "mha fwd W broadcast", "mha fwd W", "mha bwd W broadcast", "mha bwd W", "mha dW",
                     "mha dW reduce", "mha dW collect", "wproj", "wproj receive")
METP_LAYER = {"h": 32, "heads": 4, "kv_heads": 4, "f": 64, "layers": 1, "B": 1, "s": 32, "swiglu": False, "seed": 11}


def _metp_layer(rank: int, world: int) -> float:
    """One METP layer (ring FFN under MEMO's recompute, two-level MHA) forward and backward, and the
    W_proj ring: the worst relative error against the dense reference."""
    from memo_exec.metp.lane import RingOptions
    from tests.test_metp_exec import _model_case, _proj_recompute_case

    loss_err, errs, _ = _model_case(rank, world, METP_LAYER, "memo", True, "interleaved", RingOptions())
    return max(loss_err, *errs.values(), _proj_recompute_case(rank, world))


def _metp_layer_mutations(rank: int, world: int) -> dict[str, str]:
    muts = {"baseline": None}
    for phase, site in METP_LAYER_WAITS:
        muts[f"skip wait {phase} {site}"] = _skip_lane_wait(phase, site)
    for site in METP_LAYER_HALVES:
        muts[f"swap half {site}"] = _swap_half(site)
    return _each_mutation(muts, lambda: _metp_layer(rank, world))


@pytest.fixture(scope="module")
def metp_layer_results():
    return spawn(_metp_layer_mutations, 2, timeout=180)


def test_metp_layer_unmutated_is_exact(metp_layer_results):
    for r in metp_layer_results:
        ok, err = r["baseline"].split()
        assert ok == "ok" and float(err) < 1e-10, r["baseline"]


@pytest.mark.parametrize("phase,site", METP_LAYER_WAITS, ids=[f"{p}-{s}" for p, s in METP_LAYER_WAITS])
def test_metp_layer_skipped_wait_fails_at_once_naming_the_transfer(metp_layer_results, phase, site):
    for r in metp_layer_results:
        got = r[f"skip wait {phase} {site}"]
        assert got.startswith("RaceError") and f"transfer '{site}'" in got and "not waited on" in got, got


@pytest.mark.parametrize("site", METP_LAYER_HALVES)
def test_metp_layer_wrong_half_is_a_race_or_a_mismatch(metp_layer_results, site):
    for r in metp_layer_results:
        got = r[f"swap half {site}"]
        assert got.startswith(("RaceError", "SlotMismatch")), got


# -- stage-to-stage P2P: SPPO's stages and the pipeline executor (two gloo ranks) -----------------------
def _fresh_group_each(muts: dict, run) -> dict[str, str]:
    """Run ``run(group)`` under every mutation in turn, each on a process group of its own: a refused
    mutation leaves unmatched transfers in flight (a peer stopped early), which die with their group
    instead of meeting the next mutation's messages."""
    import torch.distributed as dist

    done = dist.new_group(list(range(dist.get_world_size())))
    out = {}
    for name, patch in muts.items():
        group = dist.new_group(list(range(dist.get_world_size())))
        out[name] = _outcome(patch, lambda group=group: run(group))
    dist.barrier(group=done)  # no rank leaves (closing its connections) while its peer still runs
    return out


def _sppo_stage_step(rank: int, world: int, group) -> str:
    import tests.test_sppo_exec as T
    from memo_exec.sppo.pipeline import StageRunner

    case = T._case(2, model=T.MODEL)
    m = case["model"]
    gpt = T._gpt(m, T.DT[case["dtype"]], case["seed"])
    pieces = T._pieces(m, 1, world, case["n"], case["partition"], case["mux"])
    runner = StageRunner(gpt, rank, pieces, 1, T.SEQ, T._alphas(case["n"]), list(range(world)), torch.device("cpu"),
                         group=group, classifier_chunk=24)
    try:
        for _, p in runner.parameters():
            p.grad = torch.zeros_like(p)
        inp, tgt = T.TokenSource(m.vocab, 1, T.SEQ, seed=case["seed"]).batch_at(0)
        res = runner.step(inp, tgt)
    finally:
        runner.close()
    return f"{res.loss if res.loss is not None else 0.0:.12e}"


STAGE_WAITS = ("send", "receive")  # a skipped send wait leaves nothing unmatched; a skipped receive (last) does


def _skip_stage_wait(cls, which: str):
    """Mutation: the stage does not wait for its receives (or its sends)."""
    orig = cls._wait

    def skipped(self, tr):
        return None if tr.name.startswith("recv" if which == "receive" else "send") else orig(self, tr)
    return cls, "_wait", skipped


def _sppo_stage_mutations(rank: int, world: int) -> dict[str, str]:
    from memo_exec.sppo.pipeline import StageRunner

    muts = {"baseline": None} | {f"skip {w} waits": _skip_stage_wait(StageRunner, w) for w in STAGE_WAITS}
    return _fresh_group_each(muts, lambda g: _sppo_stage_step(rank, world, g))


@pytest.fixture(scope="module")
def sppo_stage_results():
    return spawn(_sppo_stage_mutations, 2, timeout=180)


def test_sppo_stage_p2p_unmutated_runs(sppo_stage_results):
    import tests.test_sppo_exec as T

    want = T.reference(T.MODEL, 1, "fp64", 11)[0][0]
    assert all(r["baseline"].startswith("ok") for r in sppo_stage_results)
    assert abs(float(sppo_stage_results[1]["baseline"].split()[1]) - want) < 1e-9 * abs(want)


@pytest.mark.parametrize("which", STAGE_WAITS)
def test_sppo_stage_skipped_wait_fails_at_once_naming_the_transfer(sppo_stage_results, which):
    _assert_stage_wait_named(sppo_stage_results, which)


def _assert_stage_wait_named(results, which: str) -> None:
    """Every rank refused the run with a `RaceError` naming the send or receive left unwaited."""
    for r in results:
        got = r[f"skip {which} waits"]
        kind = "recv_" if which == "receive" else "send_"
        assert got.startswith("RaceError") and f"transfer '{kind}" in got and "not waited on" in got, got


PIPE_CASE = (4, {"pp": 2}, "1f1b", "store_all")


def _pipeline_mutations(rank: int, world: int) -> dict[str, str]:
    from memo_exec.pipeline.schedules import PipelineSchedule
    from tests.test_pipeline_exec_dist import run_case

    import torch.distributed as dist

    done = dist.new_group(list(range(world)))  # apart from the pp group, which the last mutation leaves unmatched
    muts = {"baseline": None} | {f"skip {w} waits": _skip_stage_wait(PipelineSchedule, w) for w in STAGE_WAITS}
    out = {}
    for name, patch in muts.items():  # one group (pp = world: the default one): the receive mutation last
        out[name] = _outcome(patch, lambda: f"{run_case(*PIPE_CASE)['loss']:.12e}")
    dist.barrier(group=done)  # no rank leaves (closing its connections) while its peer still runs
    return out


@pytest.fixture(scope="module")
def pipeline_results():
    return spawn(_pipeline_mutations, 2, timeout=180)


def test_pipeline_p2p_unmutated_matches_one_process(pipeline_results):
    from tests.test_pipeline_exec_dist import reference

    want = reference(PIPE_CASE[0])[0]
    got = float(pipeline_results[0]["baseline"].split()[1])
    assert abs(got - want) <= 1e-9 * abs(want), (got, want)


@pytest.mark.parametrize("which", STAGE_WAITS)
def test_pipeline_skipped_wait_fails_at_once_naming_the_transfer(pipeline_results, which):
    _assert_stage_wait_named(pipeline_results, which)
