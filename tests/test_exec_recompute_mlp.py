"""Megatron's ``--recompute-modules mlp`` in the executor (`memo_exec.activations.recompute_mlp`; before 2026-11-29
memo-exec refused the what-if's Megatron plan with it in one line): every layer keeps store all's tensors but the
MLP's (ln2, fc1, act), which one buffer shared by the layers holds and the MLP's re-run (fc2 and its reduce-scatter
too, as Megatron's checkpoint re-runs) rebuilds before each layer's backward. Loss and gradients are store all's on
one process and on gloo ranks (TP with and without SP, ring CP, ZeRO 3); the estimate keeps one layer's MLP tensors
where store all keeps every layer's."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from memo_exec.runner import Executor, RunOptions  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from memo_sim.policy import get_policy  # noqa: E402
from tests.dist_cases import rank_case, reference  # noqa: E402
from tests.dist_harness import spawn  # noqa: E402
from tests.exec_helpers import executor_grads, make_plan, time_limit  # noqa: E402

GELU = ModelConfig("mlp-gelu", 3, 64, 4, 256, vocab=128, dtype="fp32")
SWIGLU = ModelConfig("mlp-swiglu", 3, 64, 4, 192, vocab=128, dtype="fp32", kv_heads=2, ffn_type="swiglu",
                     norm="rmsnorm", bias="none", tied_embeddings=False)
MLP = ("ln2", "fc1", "act")


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(300):
        yield


@pytest.mark.parametrize("model", [GELU, SWIGLU], ids=["gelu", "swiglu"])
def test_gradients_are_store_alls_and_each_layer_reruns_its_mlp_before_its_backward(model):
    l0, g0, _ = executor_grads(make_plan(model, 256, get_policy("store_all")), dtype="fp64")
    seen = []

    def watch(ex):
        orig = ex.policy.recompute

        def recompute(compute, weights, storage, i):
            seen.append(i)
            orig(compute, weights, storage, i)
        ex.policy.recompute = recompute

    l1, g1, ex = executor_grads(make_plan(model, 256, get_policy("recompute_mlp")), dtype="fp64", setup=watch)
    assert set(g1) == set(g0) and abs(l1 - l0) <= 1e-12 * abs(l0)
    for k in g0:
        assert float((g0[k] - g1[k]).norm()) <= 1e-12 * float(g0[k].norm()) + 1e-300, k
    assert seen == [2, 1, 0]
    # the layers share one MLP buffer (the later layers' forwards overwrite the earlier ones'); the rest is their own
    st = ex.policy.storages
    for name in MLP:
        assert len({s.tensors[name].data_ptr() for s in st}) == 1, name
    assert len({s.tensors["q"].data_ptr() for s in st}) == len(st)


def test_the_trace_reruns_the_mlp_and_the_estimate_keeps_one_layers_mlp():
    ex = Executor(make_plan(GELU, 256, get_policy("recompute_mlp")), RunOptions(device="cpu", steps=2))
    try:
        res = ex.run()
        est = ex.policy.device_bytes()
    finally:
        ex.close()
    rec = sorted((e.op, e.layer) for e in res.steps[-1].events if e.phase == "recompute")
    assert rec == sorted((op, i) for i in range(3) for op in ("ln2", "fc1", "act", "fc2")), rec
    sa = Executor(make_plan(GELU, 256, get_policy("store_all")), RunOptions(device="cpu", steps=1))
    try:
        sa.allocate()
        full = sa.policy.device_bytes()
        per_mlp = sum(t.numel() * t.element_size() for n, t in sa.policy.storages[0].tensors.items() if n in MLP)
    finally:
        sa.close()
    assert est["buffers"] == per_mlp > 0
    assert est["skeletal_resident"] == full["skeletal_resident"] - 3 * per_mlp


def test_a_mixture_of_experts_is_refused_in_one_line():
    from memo_exec.errors import ExecError

    moe = ModelConfig("moe", 2, 64, 4, 256, vocab=128, dtype="fp32", experts=4, top_k=2, expert_ffn=64)
    plan = make_plan(moe, 128, get_policy("store_all"))
    plan.policy = get_policy("recompute_mlp")
    ex = Executor(plan, RunOptions(device="cpu", steps=1))
    try:
        with pytest.raises(ExecError, match="recompute_mlp re-runs a dense MLP") as e:
            ex.allocate()
    finally:
        ex.close()
    assert "\n" not in str(e.value)


CASES = [(dict(tp=2, sp=True), 512, "recompute_mlp", 1, 3), (dict(tp=2, sp=False), 512, "recompute_mlp", 1, 0),
         (dict(cp=2), 512, "recompute_mlp", 1, 0), (dict(dp=2, zero=3), 512, "recompute_mlp", 1, 0)]


def test_two_gloo_ranks_match_one_process():
    """TP 2 with and without SP (the re-run's collectives: the next test), ring CP, ZeRO 3 (the weights gathered back
    for the backward that re-runs the MLP): loss and every gradient as one process's (fp64), every layer re-run, a
    3-step curve."""
    results = spawn(rank_case, 2, CASES, timeout=300)
    # a case without training steps takes the reference of one with them (same sequence and global batch): a
    # reference's loss and gradients are its first step's whatever steps follow (`one_process_run`)
    refs = {}
    for lay, seq, _pol, batch, steps in sorted(CASES, key=lambda c: -c[4]):  # those with training steps first
        key = (seq, 2 if "dp" in lay else batch, steps)
        if key not in refs:
            same = [k for k in refs if k[:2] == key[:2]] if steps == 0 else []
            refs[key] = refs[same[0]] if same else reference(seq, "store_all", key[1], steps)
    for i, (lay, seq, pol, batch, steps) in enumerate(CASES):
        ref_loss, ref, ref_losses = refs[(seq, 2 if "dp" in lay else batch, steps)]
        loss, grads, recomputed, losses = results[0][i]
        assert abs(loss - ref_loss) <= 1e-9 * abs(ref_loss), lay
        for k in ref:
            assert float((grads[k] - ref[k]).norm()) <= 1e-9 * float(ref[k].norm()) + 1e-300, (lay, k)
        assert recomputed == 4, lay  # SMALL's 4 layers
        for a, b in zip(losses, ref_losses):
            assert abs(a - b) <= 1e-9 * abs(b), lay


def _tp_comms(rank: int, world: int, cases) -> list:
    """Per (sp, policy): this rank's TP collectives of one step, by name."""
    from collections import Counter

    from memo_sim.layout.parallel import Layout
    from tests.dist_cases import loss_and_grads, plan_for

    out = []
    for sp, pol in cases:
        events: list = []
        loss_and_grads(plan_for(Layout(tp=2, sp=sp), 256, pol), rank, events)
        out.append(dict(Counter(e.op for e in events if e.op.startswith("tp_") and "grad" not in e.op)))
    return out


def test_the_rerun_runs_fc1s_and_fc2s_tp_collectives_again_as_the_simulator_prices_them():
    """Beyond store all's, one step re-runs per layer fc1's all-gather and fc2's reduce-scatter (SP), or fc2's
    all-reduce (TP without SP), as Megatron's checkpointed MLP does; the simulator's recompute ops name the same
    collectives (a review: it left the all-reduce out)."""
    from memo_sim.layout.parallel import Layout
    from memo_sim.profile.loader import load_profile
    from tests.dist_cases import SMALL

    cases = [(sp, pol) for sp in (True, False) for pol in ("store_all", "recompute_mlp")]
    got = spawn(_tp_comms, 2, cases, timeout=300)[0]
    n = SMALL.layers
    extra = [{k: got[i + 1].get(k, 0) - got[i].get(k, 0) for k in set(got[i]) | set(got[i + 1])} for i in (0, 2)]
    assert {k: v for k, v in extra[0].items() if v} == {"tp_all_gather": n, "tp_reduce_scatter": n}, got
    assert {k: v for k, v in extra[1].items() if v} == {"tp_all_reduce": n}, got
    prof = load_profile("h100-sxm5-80gb")
    for sp, want in ((True, {"allgather_ln2", "reducescatter_fc2"}), (False, {"allreduce_fc2"})):
        ops = get_policy("recompute_mlp").recompute_costs(SMALL, Layout(tp=2, sp=sp), 1, 256, prof)
        assert {c.name for c in ops if c.kind == "collective"} == want, (sp, [c.name for c in ops])


def test_memos_search_never_answers_a_recompute_module_on_metp_and_the_simulator_refuses_it():
    """Megatron-LM's recompute modules are parts of its own TP layer, which METP's has not (and memo-exec re-runs in
    the Megatron layer only): the what-if leaves the pairs out (a review found it answering recompute_mlp on
    metp_ffn, which memo-exec refused after starting its ranks), and the simulator refuses one in one line."""
    from memo_sim.engine.simulate import simulate
    from memo_sim.errors import MemoError
    from memo_sim.layout.parallel import Layout
    from memo_sim.profile.loader import load_profile
    from memo_sim.search.whatif import candidates_for

    prof = load_profile("h100-sxm5-80gb")
    model = ModelConfig("m", 4, 1024, 16, 4096, vocab=32000)
    res = candidates_for(model, 32768, 4, prof, policies=("recompute_mlp",), tp_mode="all")
    assert res.candidates and all(c.layout.tp == 1 or c.layout.tp_mode == "megatron" for c in res.candidates)
    assert any("tp_mode metp" in why for _lay, why in res.rejected_layouts)  # searched, and left out saying why
    for mode in ("metp_ffn", "metp"):
        with pytest.raises(MemoError, match=f"tp_mode {mode} does not have") as e:
            simulate(model, Layout(tp=2, tp_mode=mode), 1, 32768, get_policy("recompute_mlp"), prof)
        assert "\n" not in str(e.value)
    assert get_policy("recompute_mlp").layout_why_not(Layout(tp=2)) is None


def test_sweep_seq_over_tp_flavours_leaves_the_metp_pairs_out_or_refuses_them_by_name(tmp_path):
    """The sequence sweep over TP flavours runs a plan's policies on each flavour's layout: a recompute module
    policy is left out of METP's runs (the CI run of 63e04e2 failed on the README tour's sweep, which it stopped
    with exit 2), and refused in one line where asked for by name."""
    import json

    from click.testing import CliRunner

    from memo_sim.cli import cli

    r = CliRunner().invoke(cli, ["whatif", "--layers", "2", "--hidden", "256", "--heads", "8", "--vocab", "512",
                                 "--seq", "4K", "--gpus", "2", "--tp", "2", "--pp", "1", "--tp-mode", "megatron",
                                 "--policy", "store_all", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    s = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "p" / "plan.json"), "--out", str(tmp_path / "s"),
                                 "--seqs", "4K", "--tp-mode", "megatron,metp", "--json"])
    assert s.exit_code == 0, s.output
    doc = json.loads((tmp_path / "s" / "mfu_vs_seq.json").read_text())
    pairs = {(d["layout"]["tp_mode"], d["policy"]["policy"]) for d in doc}
    assert ("megatron", "recompute_mlp") in pairs and ("metp", "recompute_mlp") not in pairs, pairs
    assert ("metp", "store_all") in pairs
    bad = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "p" / "plan.json"), "--out", str(tmp_path / "b"),
                                   "--seqs", "4K", "--tp-mode", "megatron,metp", "--policy", "recompute_mlp"])
    assert bad.exit_code == 2 and "tp_mode metp does not have" in bad.output and not (tmp_path / "b").exists()
    assert len(bad.output.strip().splitlines()) == 1
