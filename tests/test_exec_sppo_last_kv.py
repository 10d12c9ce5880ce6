"""SPPO's last piece's K/V (2026-12-01 review, h1): the simulator prices the K/V of a stage's last piece as an
activation of that piece, offloaded with alpha_i of its other rows (`memo_sim.policy.sppo`: ``cached_kv`` is
``k < n_k - 1`` in `memo_sim.memplan.footprint.sppo_host_stages`), because no later piece attends to it
(papers/sppo.txt sec. 5.1: "K_i and V_i need to participate in the following Q_N computation, where i < N"); memo-exec
kept every piece's K/V in its cache, the last one's too (4 layers: 903,168 host bytes pinned where the simulator said
932,864). Now `memo_exec.sppo.kvcache.PrefixAttention` saves the last piece's chunk through autograd, so the piece's
offload unit moves it, and the host blocks are the simulator's unit by unit, the gradients unchanged."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from memo_sim.plan.schema import read_plan  # noqa: E402

ALPHAS = [0.7, 0.55, 0.3, 0.9]  # every piece offloads some rows (the what-if needed none)


def _plan(tmp_path, *extra: str):
    """A small fp32 SPPO plan with widths (40, 160 elements) that are not multiples of the 256-byte alignment, 4
    subsequences and the ratios `ALPHAS`."""
    from memo_sim.cli import cli as sim

    r = CliRunner().invoke(sim, ["whatif", "--hidden", "40", "--heads", "4", "--vocab", "128", "--dtype", "fp32",
                                 "--seq", "200", "--policy", "sppo", "--subseqs", "4", *extra, "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "plan.json").read_text())
    doc["policy"]["alphas"] = ALPHAS
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    return tmp_path / "plan.json"


def _simulated(plan_file) -> tuple[list, list]:
    """Per stage: the simulator's pinned host bytes (`sppo_host_stages`) and its host block per offloaded unit, in
    the stage's unit order (`Sppo.shard_unit_bytes`, the last piece's with K/V)."""
    from memo_sim.cost.sppo import stage_gpu_shard
    from memo_sim.memplan.footprint import sppo_host_stages
    from memo_sim.profile.loader import load_profile

    plan = read_plan(plan_file)
    prof = load_profile(plan.profile)
    shard = stage_gpu_shard(plan.layout)
    words, blocks = [], []
    for (n_l, n_k, n_off, w), pieces in zip(sppo_host_stages(plan.model, plan.layout, plan.batch, plan.policy, prof),
                                             plan.policy.stage_pieces(plan.model, plan.layout, plan.batch)):
        words.append(w)
        blocks.append([plan.policy.shard_unit_bytes(plan.model, shard, plan.batch, pieces[u // n_l],
                                                    u // n_l < n_k - 1, plan.layout.host_pool,
                                                    prof.host.pinned_rounding).host_block for u in range(n_off)])
    return words, blocks


def _stage_run(rank: int, world: int, plan_file: str) -> dict:
    """This rank's stage of the plan, one step with the offload and one without (same weights and data): the host
    blocks, the units' statistics, the loss and the gradients of each."""
    from memo_exec.data import TokenSource
    from memo_exec.model import GPT
    from memo_exec.sppo.pipeline import PipelineOptions, StageRunner

    plan = read_plan(plan_file)
    m = plan.model
    seq = plan.policy.bounds[-1]
    pieces = plan.policy.stage_pieces(m, plan.layout, plan.batch)
    inputs, targets = TokenSource(m.vocab, plan.batch, seq, seed=0).batch_at(0)
    out = {}
    for offload in (True, False):
        gpt = GPT(m, m.layers, torch.device("cpu"), torch.float32)
        gpt.init_(0)
        runner = StageRunner(gpt, rank, pieces, plan.batch, seq, list(plan.policy.alphas), list(range(world)),
                             torch.device("cpu"), options=PipelineOptions(offload=offload))
        params = runner.parameters()
        for _, p in params:
            p.grad = torch.zeros_like(p)
        try:
            res = runner.step(inputs, targets)
        finally:
            runner.close()
        out[offload] = {"blocks": [b.nbytes for b in runner.offload.host_pools],
                        "pool_bytes": runner.offload.pool_bytes(), "loss": res.loss,
                        "units": [(u.piece, u.layer, u.tensors) for u in res.units],
                        "grads": {n: p.grad.detach().clone().numpy() for n, p in params},
                        "kv_left": runner.stage.cache.nbytes()}
    return out


def _reference(plan_file) -> tuple[float, dict]:
    """The whole-sequence model (`tests.exec_reference.RefGPT`) on the same weights and data: loss and gradients."""
    from memo_exec.data import TokenSource
    from memo_exec.model import GPT
    from tests.exec_reference import RefGPT

    plan = read_plan(plan_file)
    m = plan.model
    seq = plan.policy.bounds[-1]
    gpt = GPT(m, m.layers, torch.device("cpu"), torch.float32)
    gpt.init_(0)
    ref = RefGPT(m, m.layers, "cpu", torch.float32)
    ref.load_from(gpt)
    inputs, targets = TokenSource(m.vocab, plan.batch, seq, seed=0).batch_at(0)
    loss = ref(inputs, targets)
    loss.backward()
    return float(loss.detach()), {k: v.detach().clone() for k, v in ref.grads_by_exec_name().items()}


def _check(plan_file, per_rank: list[dict]) -> None:
    words, blocks = _simulated(plan_file)
    plan = read_plan(plan_file)
    pieces = plan.policy.stage_pieces(plan.model, plan.layout, plan.batch)
    for s, got in enumerate(per_rank):
        on = got[True]
        # the host blocks, unit by unit and in all, are the simulator's (the last piece's K/V rows included)
        assert on["blocks"] == [int(b) for b in blocks[s]], s
        assert on["pool_bytes"] == words[s] > 0, s
        # the last piece's offloaded units saved 10 token-major tensors (x ln1 q k v attn h1 ln2 fc1 act), the others 8
        last = len(pieces[s]) - 1
        offloaded = [(k, j, n) for k, j, n in on["units"] if n]
        assert any(k == last for k, _j, _n in offloaded), s  # the case this test is for
        assert all(n == (10 if k == last else 8) for k, _j, n in offloaded), (s, offloaded)
        assert on["kv_left"] == 0 and got[False]["kv_left"] == 0
        # offloading changes no value: bit-identical to the run that keeps everything on the device
        assert on["loss"] == got[False]["loss"]
        for name, g in on["grads"].items():
            assert (g == got[False]["grads"][name]).all(), (s, name)
    loss, want = _reference(plan_file)
    got_loss = per_rank[-1][True]["loss"]
    assert abs(got_loss - loss) <= 1e-5 * abs(loss)
    grads = {}
    for r in per_rank:
        grads.update({n: torch.from_numpy(g) for n, g in r[True]["grads"].items()})
    assert set(grads) == set(want)
    for n, g in grads.items():
        err = float((g.double() - want[n].double()).norm() / want[n].double().norm())
        assert err < 1e-5, (n, err)


def test_last_pieces_kv_is_offloaded_as_the_simulator_prices_it(tmp_path):
    """One stage of 4 layers, 4 pieces: the last piece's first two units are offloaded (a stage's last two units are
    not), each with its K/V rows; the pinned host bytes equal `sppo_host_stages`' 932,864 (903,168 before the fix:
    two units' K and V, 2 x 2 x 45 rows x 40 fp32, at 256-byte alignment)."""
    from tests.dist_harness import spawn

    plan_file = _plan(tmp_path, "--layers", "4", "--gpus", "1")
    per_rank = spawn(_stage_run, 1, str(plan_file))
    assert per_rank[0][True]["pool_bytes"] == 932_864
    _check(plan_file, per_rank)


def test_each_stages_last_piece_with_multiplexing(tmp_path):
    """PP = 2 with multiplexed partitioning: a stage's last piece (stage 1's is half of subsequence 3, s3.1) offloads
    its K/V; both stages' host bytes are the simulator's and the gradients the whole-sequence model's."""
    from tests.dist_harness import spawn

    plan_file = _plan(tmp_path, "--layers", "6", "--gpus", "2", "--pp", "2", "--multiplex")
    plan = read_plan(plan_file)
    tags = [[p.tag() for p in ps] for ps in plan.policy.stage_pieces(plan.model, plan.layout, plan.batch)]
    assert tags[1][-1] == "s3.1", tags
    _check(plan_file, spawn(_stage_run, 2, str(plan_file)))
