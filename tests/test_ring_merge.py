"""Ring CP's passes beside its kernels (`Layout.ring_merge`, `memo_sim.layout.ring_merge`): PyTorch's
experimental context parallelism merges each ring step's output and log-sum-exp and accumulates each
step's gradients in fp32 eager ops, and gathers K/V at once; torchtitan@2024-12 runs it, the other
frameworks price none."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from memo_exec.cli import cli as exec_cli
from memo_sim.cli import cli as sim_cli
from memo_sim.cost import collectives as coll
from memo_sim.cost import ring_attention
from memo_sim.cost.activations import tokens_per_gpu
from memo_sim.cost.layer_time import backward_costs, forward_costs, full_recompute_costs
from memo_sim.cost.opcost import base_op_name, critical_time
from memo_sim.cost.ring_attention import zigzag_step_blocks
from memo_sim.memplan.trace_gen import attention_buffers
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.layout.ring_merge import RING_MERGE_NAMES, ring_merge
from memo_sim.model.config import PRESETS
from memo_sim.policy.registry import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.frameworks import get_framework

LLAMA = PRESETS["llama-3.1-8b"]
H100 = load_profile("h100-sxm5-80gb")


def test_the_torch_cp_bytes_are_those_counted_from_its_code():
    # per output element Q, with K and V repeated to the query heads (KV = 2 Q, torchtitan's repeat_kv):
    # forward 12 + 38 (cp - 1) (Q) + 4 (cp - 1) (KV); backward 10 + 10 cp (Q) + 28 + 25 (cp - 1) (KV)
    m = ring_merge("torch_cp")
    q = 1000.0
    for cp, fwd, bwd in ((2, 58, 136), (4, 150, 256), (8, 334, 496)):
        assert m.bytes(cp, q, 2 * q, "fwd") == pytest.approx(fwd * q)
        assert m.bytes(cp, q, 2 * q, "bwd") == pytest.approx(bwd * q)
    assert m.bytes(1, q, 2 * q, "fwd") == 0.0
    assert ring_merge("none").bytes(8, q, 2 * q, "bwd") == 0.0
    assert RING_MERGE_NAMES == ("none", "torch_cp", "te_p2p")


def _named(costs, name):
    return [c for c in costs if c.name == name]


def test_a_torch_cp_layer_pays_its_merge_passes_and_sends_repeated_kv_and_fp32_gradients():
    seq = 65536
    plain = Layout(cp=2)
    torch_cp = replace(plain, ring_merge="torch_cp")
    for phase_costs in (forward_costs, backward_costs):
        assert not _named(phase_costs(LLAMA, plain, 1, seq, H100), "cp_ring_merge")
    (fwd,) = _named(forward_costs(LLAMA, torch_cp, 1, seq, H100), "cp_ring_merge")
    (bwd,) = _named(backward_costs(LLAMA, torch_cp, 1, seq, H100), "cp_ring_merge")
    tokens = tokens_per_gpu(torch_cp, 1, seq)
    q = tokens * LLAMA.attn_dim
    kv = tokens * (LLAMA.q_dim + LLAMA.attn_dim)  # K and V repeated to the 32 query heads
    assert fwd.nbytes == pytest.approx(12 * q + 38 * q + 4 * kv)
    assert bwd.nbytes == pytest.approx(10 * q + 10 * 2 * q + 28 * kv + 25 * kv)
    assert fwd.stream == "compute" and fwd.seconds > 0
    # a full recompute re-runs the forward's merges
    assert _named(full_recompute_costs(LLAMA, torch_cp, 1, seq, H100), "cp_ring_merge")[0].nbytes == fwd.nbytes
    # the ring's K/V at the query heads (4x Llama 3.1 8B's 8 K/V heads), its dK/dV in fp32
    assert ring_attention.ring_shift_bytes(LLAMA, torch_cp, 1, seq) == pytest.approx(
        4 * ring_attention.ring_shift_bytes(LLAMA, plain, 1, seq))
    assert ring_attention.ring_shift_bytes(LLAMA, torch_cp, 1, seq, grads=True) == pytest.approx(
        2 * ring_attention.ring_shift_bytes(LLAMA, torch_cp, 1, seq))
    assert ring_attention.ring_shift_bytes(LLAMA, plain, 1, seq, grads=True) == \
        ring_attention.ring_shift_bytes(LLAMA, plain, 1, seq)
    # without CP nothing is priced
    assert not _named(forward_costs(LLAMA, replace(torch_cp, cp=1), 1, seq, H100), "cp_ring_merge")


def test_torch_cp_gathers_kv_at_step_0_and_waits_for_it_at_step_1():
    # PyTorch's CP at its allgather rotate method (torchtitan@2024-12's default): one all-gather of the packed
    # K/V issued at ring step 0 and waited for at step 1, so it runs beside step 0's blocks alone; the later
    # steps' blocks after it (`attention_ring_steps`); the backward's dK/dV still shift one step at a time.
    # Llama 3.1 405B, TP 8 x CP 8: the CP group spans 8 nodes, where the gather outlasts step 0
    model, seq = PRESETS["llama-3.1-405b"], 262144
    lay = Layout(tp=8, cp=8, ring_merge="torch_cp")
    shift = ring_attention.ring_shift_bytes(model, lay, 1, seq)
    link = coll.group_link(H100, 8, 8)
    assert link is H100.internode
    gather_s = coll.ring_allgather_time(8 * shift, 8, *coll.link_params(link, "all_gather"))
    # the same per-step kernels without the gather and the passes (TransformerEngine's ring's, `step_kernels`)
    plain = [c for c in forward_costs(model, replace(lay, ring_merge="te_p2p"), 1, seq, H100) if c.kind == "attention"]
    for costs, phase in ((forward_costs(model, lay, 1, seq, H100), "fwd"),
                         (backward_costs(model, lay, 1, seq, H100), "bwd")):
        names = [c.name for c in costs]
        assert "cp_ring_kv" not in names
        k = names.index("cp_allgather_kv")
        gather, first = costs[k], costs[k + 1]
        assert (gather.stream, gather.overlaps, gather.phase) == ("cp_comm", 1, phase)
        assert gather.nbytes == pytest.approx(7 * shift) and gather.seconds == pytest.approx(gather_s)
        rest = costs[names.index("attention_ring_steps")]
        assert first.name == "attention" and base_op_name(rest.name) == "attention"
        # step 0 runs the rank's own chunks (the zigzag's 2 causal diagonal blocks and 1 full block of the 2·8 + 1),
        # in one causal kernel over both (`step_kernels`: one SDPA call per ring step)
        assert zigzag_step_blocks(8, 3, 0) == [(3, 3, True), (12, 3, False), (12, 12, True)]
        share = ring_attention.first_step_share(first.flops + rest.flops, H100, model.dtype, model.qk_head_dim,
                                                lay.block_kernel, 8, phase, step_kernels=True)
        assert first.seconds == pytest.approx(share * (first.seconds + rest.seconds))
        assert 0.5 / 8 < share < 2 / 8
        # the phase waits for the gather's excess over step 0's one causal kernel over the rank's 2c tokens (on this
        # inter-node group the forward's gather is more than twice that kernel)
        hidden = [replace(c, seconds=0.0) if c.name == "cp_allgather_kv" else c for c in costs]
        assert gather.seconds > 2 * first.seconds if phase == "fwd" else gather.seconds > 0 < first.seconds
        assert critical_time(costs) == pytest.approx(critical_time(hidden) + max(0.0, gather.seconds - first.seconds))
        if phase == "fwd":
            assert first.seconds + rest.seconds == pytest.approx(plain[0].seconds)
        else:  # the dK/dV: cp - 1 shifts beside the later steps, the last one home after them
            dkv = ring_attention.ring_shift_bytes(model, lay, 1, seq, grads=True)
            assert names.index("cp_ring_dkv") == names.index("attention_ring_steps") - 1
            assert costs[names.index("cp_ring_dkv")].nbytes == pytest.approx(7 * dkv)
            assert costs[names.index("cp_ring_dkv_home")].nbytes == pytest.approx(dkv)
    # a ring that shifts K/V (every other framework's) keeps one exchange beside the whole kernel
    costs = forward_costs(model, replace(lay, ring_merge="none"), 1, seq, H100)
    assert "cp_ring_kv" in [c.name for c in costs] and "cp_allgather_kv" not in [c.name for c in costs]


def test_torch_cp_holds_the_gathered_kv_through_the_attention():
    # counted from _templated_ring_attention(_backward): a K/V chunk at the query heads is q + attn = 20 bytes here
    # (bf16, 4 B an fp32 element: x 2). Both passes at step 0: K, V made contiguous (torchtitan hands them
    # transposed), packed for the all-gather, and the 8 gathered chunks: 10 chunks. Backward, while a step's kernel
    # runs: the fp32 dK/dV received, the one packed for the send (referenced until the next wait) and the
    # permute's output (3 fp32 chunks), the last step's dK/dV kernel outputs (1 chunk) and the fp32 grad_query
    model, seq = PRESETS["llama-3.1-405b"], 262144
    assert model.dtype == "bf16"
    lay = Layout(tp=8, cp=8, ring_merge="torch_cp")
    tb = {"q": 10.0, "k": 1.0, "v": 1.0, "attn": 10.0, "lse": 0.5}
    fwd = dict(attention_buffers(model, lay, tb, "fwd", 1, seq))
    bwd = dict(attention_buffers(model, lay, tb, "bwd", 1, seq))
    assert fwd["cp_kv_allgather"] == bwd["cp_kv_allgather"] == pytest.approx(10 * 20)
    assert bwd["cp_dkv_in_flight"] == pytest.approx(3 * 20 * 2)
    assert bwd["cp_step_dkv_outputs"] == pytest.approx(20) and bwd["cp_dq_accumulator_fp32"] == pytest.approx(10 * 2)
    assert "cp_kv_double_buffer" not in fwd and "cp_kv_double_buffer" not in bwd
    # every other ring: the K/V double buffer and 2 dK/dV chunks, in fp32 where the framework accumulates them so
    # (memo's executor, Layout.ring_dkv_fp32), else in the model's dtype (TransformerEngine's p2p CP sends and
    # adds dK/dV in kv.dtype): a review found TE's priced at fp32
    plain_fwd, plain_bwd = (dict(attention_buffers(model, replace(lay, ring_merge="none"), tb, ph, 1, seq))
                            for ph in ("fwd", "bwd"))
    assert plain_fwd["cp_kv_double_buffer"] == plain_bwd["cp_kv_double_buffer"] == pytest.approx(2 * 2)
    assert plain_bwd["cp_dkv_in_flight"] == pytest.approx(2 * 2)
    ours = dict(attention_buffers(model, replace(lay, ring_merge="none", ring_dkv_fp32=True), tb, "bwd", 1, seq))
    assert ours["cp_dkv_in_flight"] == pytest.approx(2 * 2 * 2)
    assert not {"cp_kv_allgather", "cp_step_dkv_outputs", "cp_dq_accumulator_fp32"} & (set(plain_fwd) | set(plain_bwd))


def test_torch_cp_recompute_re_runs_the_gather_and_a_window_is_refused():
    model, seq = PRESETS["llama-3.1-405b"], 262144
    lay = Layout(tp=8, cp=8, ring_merge="torch_cp")
    fwd = [c.name for c in forward_costs(model, lay, 1, seq, H100)]
    again = [c.name for c in full_recompute_costs(model, lay, 1, seq, H100)]
    assert again == fwd and {"cp_allgather_kv", "attention", "attention_ring_steps"} <= set(again)
    selective = [c.name for c in get_policy("selective_recompute").recompute_costs(model, lay, 1, seq, H100)]
    assert selective == ["cp_allgather_kv", "attention", "attention_ring_steps"]
    # PyTorch's CP of 2024-12 runs causal attention over the whole sequence: a sliding-window model is refused
    windowed = replace(LLAMA, sliding_window=4096, sliding_layers=LLAMA.layers)
    why = check_layout(replace(lay, tp=1), windowed, 8, 8, 65536)
    assert why and why.startswith("ring_merge torch_cp:") and "--cp 1" in why
    assert check_layout(replace(lay, tp=1, ring_merge="none"), windowed, 8, 8, 65536) is None


def test_torchtitan_2024_12_searches_a_windowed_model_without_cp_and_refuses_cp_in_one_line(tmp_path):
    model = tmp_path / "swa.yaml"
    model.write_text("name: toy-swa\nlayers: 4\nhidden: 512\nheads: 8\nkv_heads: 2\nffn: 1408\nvocab: 32000\n"
                     "ffn_type: swiglu\nnorm: rmsnorm\nsliding_window: 1024\nsliding_layers: 4\n")
    args = ["whatif", "--model", str(model), "--gpus", "2", "--seq", "16K", "--framework", "torchtitan@2024-12",
            "--profile", "h100-sxm5-80gb", "--no-plan", "--json"]
    r = CliRunner().invoke(sim_cli, args)
    assert r.exit_code == 0, r.output[-800:]
    rows = json.loads(r.stdout)["candidates"]
    assert rows and all(c["layout_degrees"]["cp"] == 1 for c in rows)
    r = CliRunner().invoke(sim_cli, [*args, "--cp", "2"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: --cp 2: torchtitan@2024-12"), r.output
    assert "sliding-window" in lines[0] and "drop --cp" in lines[0]
    # memo's own ring runs it; Megatron-LM's does not (TransformerEngine runs a window under a2a / all_gather CP only:
    # the megatron data's ring_cp_sliding_window, tests/test_export_review_dec1b.py)
    r = CliRunner().invoke(sim_cli, [*args[:-4], "--framework", "any", "--profile", "h100-sxm5-80gb", "--no-plan",
                                     "--json", "--cp", "2"])
    assert r.exit_code == 0, r.output[-800:]
    r = CliRunner().invoke(sim_cli, [*args[:-4], "--framework", "megatron", "--profile", "h100-sxm5-80gb", "--no-plan",
                                     "--json", "--cp", "2"])
    assert r.exit_code == 2 and "sliding window" in r.output, r.output[-800:]


def test_the_layout_field_round_trips_and_a_bad_name_is_one_line():
    lay = Layout(cp=2, ring_merge="torch_cp")
    assert "merge-torch_cp" in lay.label() and "merge" not in Layout(cp=2).label()
    assert Layout.from_dict(lay.to_dict()).ring_merge == "torch_cp"
    assert "ring_merge" not in Layout(cp=2).to_dict()
    why = check_layout(replace(lay, ring_merge="fused"), LLAMA, 2, 8, 4096)
    assert why and "ring_merge must be one of none, torch_cp, te_p2p" in why


def test_torchtitan_2024_12_runs_torch_cp_and_the_others_none():
    assert get_framework("torchtitan@2024-12").adapt(Layout(cp=2)).ring_merge == "torch_cp"
    assert get_framework("megatron").adapt(Layout(cp=2)).ring_merge == "te_p2p"  # tests/test_te_p2p_ring.py
    for name in ("torchtitan", "deepspeed", "any"):
        assert get_framework(name).adapt(Layout(cp=2)).ring_merge == "none", name


def test_the_executor_refuses_a_torch_cp_plan_in_one_line(tmp_path):
    # no framework writes a torch_cp plan the executor's other checks let through (torchtitan@2024-12's
    # are compiled), so the plan is one memo writes with its ring_merge set as torchtitan@2024-12 sets it
    d = tmp_path / "plan"
    r = CliRunner().invoke(sim_cli, ["whatif", "--model", "gpt-7b", "--layers", "4", "--gpus", "2", "--cp", "2",
                                     "--seq", "4K", "--profile", "a800-80gb", "--policy", "full_recompute",
                                     "--simulate-top", "1", "--out", str(d)])
    assert r.exit_code == 0, r.output[-800:]
    plan = json.loads((d / "plan.json").read_text())
    plan["layout"]["ring_merge"] = "torch_cp"
    (d / "plan.json").write_text(json.dumps(plan))
    r = CliRunner().invoke(exec_cli, ["run", str(d / "plan.json"), "--device", "cpu", "--steps", "1", "--out",
                                      str(tmp_path / "run")])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.output
    assert "ring_merge torch_cp" in lines[0]


def test_the_gpu_probe_times_the_passes_this_module_counts():
    # benchmarks/gpu/probe_ring_merge.py times torch's own merge passes against these counts (an H200: never
    # above the HBM's bandwidth); its per-case bytes are the module's
    import importlib.util  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    path = Path(__file__).resolve().parents[1] / "benchmarks/gpu/probe_ring_merge.py"
    spec = importlib.util.spec_from_file_location("probe_ring_merge", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m, c = ring_merge("torch_cp"), mod.COUNTED
    assert c["merge_full"] == m.fwd_q_step and c["grad_add"] == m.bwd_q_step
    assert c["merge_partial"] == m.fwd_q_step / 2 + 8  # half the merge and the torch.cat of the whole in fp32
    assert c["grad_partial_add"] + c["dkv_cat"] == m.bwd_kv_step
