"""A user's review of 2026 jobs on the command line (2026-12-03): a dispatcher answered where it dispatches nothing,
and a what-if said nothing fits where the optimizer on the host fitted."""

from __future__ import annotations

from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import PRESETS
from tests.cli_run import one_line, run_sim

MIXTRAL = PRESETS["mixtral-8x7b"]


def test_deepep_at_ep_1_dispatches_nothing_and_is_refused():
    """--moe-dispatcher deepep on a GB200 NVL72 answered an ep 1 plan named deepep (every EP layout refused by
    DeepEP's node limit, ep 1 let through), and its Megatron export wrote the flex dispatcher at EP 1, which
    Megatron-LM's MoEFlexTokenDispatcher asserts against (TPxEP > 1): now one line naming the node limit; on 8-GPU
    nodes ep 1 is refused with deepep and ep >= 2 runs."""
    r = run_sim(["whatif", "--model", "mixtral-8x7b", "--gpus", "16", "--seq", "32K", "--profile", "gb200-nvl72",
                 "--moe-dispatcher", "deepep", "--no-plan"], code=2)
    assert "nodes of at most 8 GPUs" in one_line(r), r.output
    why = check_layout(Layout(dp=16, moe_dispatcher="deepep"), MIXTRAL, 16, 8, 32768)
    assert why and "at least 2 expert-parallel ranks" in why and "ep 1 dispatches nothing" in why, why
    assert check_layout(Layout(dp=16, ep=8, moe_dispatcher="deepep"), MIXTRAL, 16, 8, 32768) is None
    assert check_layout(Layout(dp=16, moe_dispatcher="alltoall"), MIXTRAL, 16, 8, 32768) is None


def test_the_optimizer_goes_to_the_host_where_the_simulator_fits_nothing():
    """The estimate fitted one candidate, the event simulator ran it out of memory (fragmentation), and the what-if
    answered 'nothing fits' (exit 3) without the optimizer-on-host layouts its help says it searches where nothing
    fits; --optimizer-offload fitted at 11.03 s. They are searched after tier 2 too now, and the answer says why."""
    r = run_sim(["whatif", "--model", "llama-3.1-70b", "--gpus", "32", "--seq", "128K", "--profile", "h100-sxm5-80gb",
                 "--tp", "8", "--ulysses", "4", "--policy", "store_all", "--policy", "offload_attn", "--policy",
                 "recompute_mlp", "--no-plan"])
    answer = r.output.splitlines()[0]
    assert answer.startswith("answer: ") and "-optim-offload" in answer and " fits: " in answer, answer
    assert "nothing fits with the optimizer on the GPU in the event simulator" in r.output, r.output
    # the plan the optimizer on the GPU would have been: still listed, out of memory in the simulator
    assert any("OOM" in ln and "tp8+sp-uly4-z3-cudnn " in ln for ln in r.output.splitlines()), r.output


def test_an_unknown_optional_field_names_the_nearest_one(tmp_path):
    """A model file's ``topk`` got 'remove it or check the spelling' (top_k is optional, so no missing field paired
    with it) where ``hiden`` got 'did you mean'; the nearest top-level field is named now, and a name near none
    keeps the plain fix."""
    base = "name: t\nlayers: 2\nhidden: 256\nheads: 4\nffn: 512\nvocab: 1000\n"
    (tmp_path / "m.yaml").write_text(base + "experts: 8\ntopk: 2\nexpert_ffn: 128\n")
    r = run_sim(["whatif", "--model", tmp_path / "m.yaml", "--gpus", "1", "--seq", "4K", "--no-plan"], code=2)
    assert "topk: unknown field; did you mean 'top_k'?" in one_line(r), r.output
    (tmp_path / "n.yaml").write_text(base + "bogus_thing: 3\n")
    r = run_sim(["whatif", "--model", tmp_path / "n.yaml", "--gpus", "1", "--seq", "4K", "--no-plan"], code=2)
    assert "bogus_thing: unknown field; remove it or check the spelling" in one_line(r), r.output


def test_a_plan_simulated_on_another_profile_says_whose_alpha_it_runs(tmp_path):
    """`simulate --profile OTHER` said the plan's alpha 'was set by hand' where the what-if's solver set it for the
    plan's own profile: it names that profile now; on its own profile the alpha is the solver's."""
    plan = tmp_path / "plan.json"
    run_sim(["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "256K", "--profile", "h100-sxm5-80gb",
             "--tp", "1", "--ulysses", "8", "--zero", "2", "--policy", "memo", "--out", tmp_path])
    r = run_sim(["simulate", plan, "--profile", "b200-180gb", "--out", tmp_path / "b200"])
    binding = next(ln for ln in r.output.splitlines() if ln.startswith("binding: "))
    assert "is the plan's (made for h100-sxm5-80gb; the solver gives" in binding and "by hand" not in binding, binding
    r = run_sim(["simulate", plan, "--out", tmp_path / "h100"])
    binding = next(ln for ln in r.output.splitlines() if ln.startswith("binding: "))
    assert "is the solver's" in binding, binding


def test_fsdp_alone_keeps_sppo_to_layouts_without_data_parallelism():
    """--dp-mode fsdp restricted every other row to FSDP while SPPO's side compared and wrote a ZeRO 1 plan over two
    replicas without a word: SPPO, whose replicas run ZeRO 0/1, is searched without data parallelism there, and the
    searched line says so."""
    from memo_sim.profile.loader import load_profile
    from memo_sim.search.whatif import candidates_for

    res = candidates_for(PRESETS["llama-3.1-70b"], 32768, 32, load_profile("h100-sxm5-80gb"), dp_mode="fsdp",
                         policies=("sppo", "memo"))
    sppo = [c for c in res.candidates if c.sppo is not None]
    assert sppo and all(c.layout.dp == 1 for c in sppo), {c.layout.label() for c in sppo}
    assert all(c.layout.dp_mode == "fsdp" or c.layout.state_shards == 1 for c in res.candidates if c.sppo is None)
    assert "without data parallelism only (--dp-mode fsdp" in res.searched["sppo"], res.searched


def test_megatrons_export_says_why_ulysses_becomes_a_ring(tmp_path):
    """The nearest Megatron-LM plan of TP 2 x Ulysses 4 over 4 K/V heads turns Ulysses into a ring (TransformerEngine's
    all-to-all CP splits each TP rank's 2 K/V heads whole, never over 4) and said only 'ring context parallelism', as
    if Megatron had no all-to-all CP: the gap names the K/V rule now."""
    run_sim(["whatif", "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq", "32K", "--profile", "h100-sxm5-80gb",
             "--tp", "2", "--ulysses", "4", "--ep", "8", "--cp", "1", "--policy", "store_all", "--out", tmp_path])
    r = run_sim(["export", tmp_path / "plan.json", "--to", "megatron", "--nearest", "--out", tmp_path / "m"])
    gap = next(ln for ln in r.output.splitlines() if "DeepSpeed-Ulysses over 4 GPUs" in ln)
    assert "kv heads (4) not divisible by tp x ulysses (8)" in gap and "ring context parallelism over 4" in gap, gap


def test_sppos_swiglu_keeps_fc1_and_act_as_priced():
    """SPPO's layer ran SwiGLU as autograd's silu(g) * u, which kept silu(g) beside fc1 and act: one [n, ffn] piece a
    layer more than the simulator prices, offloaded with the rest (17.04 against 14.60 MiB a subsequence; a review).
    `memo_exec.sppo.stage.SwiGLU` keeps fc1 alone and rebuilds silu(g); its gradient is autograd's."""
    import torch
    import torch.nn.functional as F

    from memo_exec.sppo.stage import SwiGLU

    n, f, h = 6, 5, 4
    fc1 = torch.randn(n, 2 * f, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(h, f, dtype=torch.float64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(tuple(t.shape)), t)[1], lambda t: t):
        out = F.linear(SwiGLU.apply(fc1, f), w2)
    assert sorted(s for s in saved if s[0] == n) == [(n, f), (n, 2 * f)], saved  # act (fc2's input) and fc1
    dy = torch.randn_like(out)
    mine = torch.autograd.grad(out, (fc1, w2), dy)
    ref = torch.autograd.grad(F.linear(F.silu(fc1[:, :f]) * fc1[:, f:], w2), (fc1, w2), dy)
    for a, b in zip(mine, ref):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)
