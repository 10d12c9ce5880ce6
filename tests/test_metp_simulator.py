"""[metp] The simulator's METP (cost lists, request traces, memory, engine) against the paper's
closed forms, counted from what the simulator itself holds and sends.

Per GPU, 16-bit (d = 2 bytes), GPT layer (f = 4h, k = v = h), p = tp, b·s tokens:

- Traffic (bytes the GPU sends, ``OpCost.nbytes`` on ``tp_p2p`` / ``tp_bcast``): FFN forward
  8·(p-1)/p·h²·d, backward 16·(p-1)/p·h²·d, together Table 1's 24·(p-1)/p·h²·d; MHA forward
  (4·log2(p)·h² + 2·(p-1)/p·bsh)·d, backward (8·log2(p)·h² + 4·(p-1)/p·bsh)·d, together Table 2's
  (12·log2(p)·h² + 6·(p-1)/p·bsh)·d.
- Kept after the forward (skeletal): METP's FFN keeps its input ln2, bsh/p·d (Table 1's bsh/p);
  METP's MHA its input ln1 and the attention output, 2·bsh/p·d (Table 2's 2bsh/p). Megatron's MHA
  keeps ln1, q, k, v, attn, 5·bsh/p·d (Table 2's 5bsh/p); Megatron's FFN ln2, fc1 and act,
  9·bsh/p·d: the simulator keeps both GeLU's input and output where Table 1 counts one 4h-wide
  tensor (5bsh/p).
- Peak intermediates: METP FFN = ln2 + the T_ij block of the forward trace (4·bsh/p²·d, Table 1's
  term; the trace holds D_ij beside it during the activation), Megatron FFN = the all-gathered
  input of the trace (bsh·d) + fc1 (4·bsh/p·d): ratio (1/p + 4/p²)/(1 + 4/p) = 1/p, 1/2 at p = 2.
  METP MHA = ln1 + attn + the Q/K/V head block of the trace (3·bsh/p²·d), Megatron MHA = the
  gathered input (bsh·d) + q, k, v, attn (4·bsh/p·d): (3 + 2p)/(p(4 + p)), 7/12 at p = 2.
- Double buffers in the traces: 2 x (B + C) blocks = 2·8h²/p·d (FFN), 2 x (W_qkv + W_proj) blocks
  = 2·4h²/p·d (MHA).
- Overlap: with the FFN ring alone (``metp_ffn``) on the a100 profile at p = 8, b = 1 the engine's
  exposed P2P time is 0 at twice the paper's threshold (s = 16K > 8320) and positive at a quarter
  of it (s = 2K); the simulator's own crossover is lower than 8320 because its block GEMMs run
  below peak (eq. 5 assumes peak FLOP/s).
"""

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from memo_sim.api import get_model, get_policy, load_profile, memo_alpha, memory_breakdown, simulate
from memo_sim.cli import cli
from memo_sim.cost import metp
from memo_sim.cost.activations import layer_tensor_bytes, skeletal_bytes
from memo_sim.cost.layer_time import backward_costs, forward_costs, recompute_costs
from memo_sim.cost.memory import model_state_bytes
from memo_sim.cost.opcost import OpCost, chain_dependencies, chain_tail, critical_time, exposed_side_time
from memo_sim.layout.parallel import Layout, check_layout, enumerate_layouts
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import layer_tensors, skeletal_tensors
from memo_sim.search.whatif import candidates_for

K = 1024
A100 = load_profile("a100-sxm4-80gb")
GPT = ModelConfig("gpt-toy", layers=4, hidden=1024, heads=16, ffn=4096)  # f = 4h, k = v = h
D = 2


def _bytes(costs, prefix):
    return sum(c.nbytes for c in costs if c.stream in ("tp_p2p", "tp_bcast") and c.name.startswith(prefix))


def _buf(trace, name):
    (b,) = [b for b in trace.buffers if b.name == name]
    return b.size


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("seq", [8 * K, 64 * K])
def test_ring_traffic_matches_tables(p, seq):
    h, bsh = GPT.hidden, seq * GPT.hidden
    lay = Layout(tp=p, tp_mode="metp")
    fwd, bwd = forward_costs(GPT, lay, 1, seq, A100), backward_costs(GPT, lay, 1, seq, A100)
    ffn_f, ffn_b = _bytes(fwd, "p2p_ffn"), _bytes(bwd, "p2p_ffn")
    assert ffn_f == pytest.approx(8 * (p - 1) / p * h * h * D)
    assert ffn_b == pytest.approx(16 * (p - 1) / p * h * h * D)
    assert ffn_f + ffn_b == pytest.approx(metp.ffn_table(1, seq, h, p)["metp"].comm * D)
    mha_f = sum(_bytes(fwd, pre) for pre in ("bcast_w", "p2p_kv"))
    mha_b = sum(_bytes(bwd, pre) for pre in ("bcast_w", "reduce_dw", "p2p_kv"))
    lg = math.log2(p)
    assert mha_f == pytest.approx((4 * lg * h * h + 2 * (p - 1) / p * bsh) * D)
    assert mha_b == pytest.approx((8 * lg * h * h + 4 * (p - 1) / p * bsh) * D)
    assert mha_f + mha_b == pytest.approx(metp.mha_table(1, seq, h, p, GPT.heads)["metp"].comm * D)
    # one send/recv op per ring step: p-1 forward, 2(p-1) backward (weights, then gradients)
    assert sum(c.name.startswith("p2p_ffn") for c in fwd) == p - 1
    assert sum(c.name.startswith("p2p_ffn") for c in bwd) == 2 * (p - 1)
    # Megatron's FFN traffic is Table 1's 5(p-1)/p·bsh with SP (ring all-gather / reduce-scatter): forward
    # all-gather and reduce-scatter, backward all-gather of the output gradient, reduce-scatter of the input
    # gradient and the input's re-gather for the weight gradient
    meg = Layout(tp=p)
    coll = [c for c in forward_costs(GPT, meg, 1, seq, A100) + backward_costs(GPT, meg, 1, seq, A100)
            if c.stream == "comm"]
    assert len(coll) == 10  # 5 per block, MHA and FFN
    ffn = [c for c in coll if c.name in ("allgather_ln2", "reducescatter_fc2", "allgather_fc2", "reducescatter_ln2",
                                          "allgather_fc1_input")]
    assert len(ffn) == 5
    assert sum(c.nbytes * (p - 1) / p for c in ffn) == pytest.approx(5 * (p - 1) / p * bsh * D)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_per_rank_flops_unchanged_except_the_block_recompute(p):
    seq = 32 * K
    f = lambda costs: sum(c.flops for c in costs if c.stream == "compute")  # noqa: E731
    meg, lay = Layout(tp=p), Layout(tp=p, tp_mode="metp")
    assert f(forward_costs(GPT, lay, 1, seq, A100)) == pytest.approx(f(forward_costs(GPT, meg, 1, seq, A100)), rel=1e-9)
    h, r = GPT.hidden, seq / p
    recompute = 2 * r * h * 4 * h / p * p + 2 * r * h * 3 * h / p * p  # T_ij and Q/K/V blocks, every step
    assert f(backward_costs(GPT, lay, 1, seq, A100)) == pytest.approx(
        f(backward_costs(GPT, meg, 1, seq, A100)) + recompute, rel=1e-9)


@pytest.mark.parametrize("mode,kept", [("megatron", {"x", "ln1", "q", "k", "v", "attn", "h1", "ln2", "fc1", "act"}),
                                       ("metp_ffn", {"x", "ln1", "q", "k", "v", "attn", "h1", "ln2"}),
                                       ("metp", {"x", "ln1", "attn", "h1", "ln2"})])
def test_saved_tensors_by_mode(mode, kept):
    assert {t.name for t in skeletal_tensors(GPT, mode)} == kept | {"lse"}
    assert {t.name for t in layer_tensors(GPT, mode).values() if t.saved} == kept | {"lse"}
    lay = Layout(tp=4, tp_mode=mode)
    sk = skeletal_bytes(GPT, lay, 1, 16 * K)
    unit = 16 * K * GPT.hidden * D / 4  # bsh/p·d
    assert sk["total"] == pytest.approx(unit * {"megatron": 16, "metp_ffn": 8, "metp": 5}[mode])


@pytest.mark.parametrize("p", [2, 4, 8])
def test_kept_activations_match_table_memory_columns(p):
    seq = 32 * K
    unit = seq * GPT.hidden * D / p  # bsh/p·d
    tb = layer_tensor_bytes(GPT, Layout(tp=p, tp_mode="metp"), 1, seq)
    assert tb["ln1"] + tb["attn"] == pytest.approx(2 * unit)  # Table 2 METP: 2bsh/p
    assert tb["ln2"] == pytest.approx(unit)  # Table 1 METP: bsh/p
    assert tb["q"] == tb["fc1"] == tb["act"] == 0.0  # blocks only
    mb = layer_tensor_bytes(GPT, Layout(tp=p), 1, seq)
    assert sum(mb[t] for t in ("ln1", "q", "k", "v", "attn")) == pytest.approx(5 * unit)  # Table 2 Megatron
    assert sum(mb[t] for t in ("ln2", "fc1", "act")) == pytest.approx(9 * unit)  # Table 1 counts 5 (one 4h)


def _peak_intermediates(p, seq):
    bsh_d = seq * GPT.hidden * D
    lay, meg = Layout(tp=p, tp_mode="metp"), Layout(tp=p)
    tm, tg = layer_tensor_bytes(GPT, lay, 1, seq), layer_tensor_bytes(GPT, meg, 1, seq)
    fm, fg = layer_forward_trace(GPT, lay, 1, seq), layer_forward_trace(GPT, meg, 1, seq)
    assert _buf(fm, "metp_fc1_block0") == pytest.approx(4 * bsh_d / p**2)  # T_ij: 4bsh/p²
    assert _buf(fm, "metp_qkv_block0") == pytest.approx(3 * bsh_d / p**2)  # Q/K/V head block: 3bsh/p²
    assert _buf(fg, "fc1_input_gathered") == pytest.approx(bsh_d)  # Megatron's all-gathered input: bsh
    assert _buf(fg, "qkv_input_gathered") == pytest.approx(bsh_d)
    ffn = (tm["ln2"] + _buf(fm, "metp_fc1_block0")) / (_buf(fg, "fc1_input_gathered") + tg["fc1"])
    mha = ((tm["ln1"] + tm["attn"] + _buf(fm, "metp_qkv_block0"))
           / (_buf(fg, "qkv_input_gathered") + tg["q"] + tg["k"] + tg["v"] + tg["attn"]))
    return ffn, mha


@pytest.mark.parametrize("p", [2, 4, 8])
def test_peak_intermediate_ratio_from_the_simulator(p):
    ffn, mha = _peak_intermediates(p, 64 * K)
    assert ffn == pytest.approx(metp.ffn_peak_ratio(p), rel=1e-6)
    assert mha == pytest.approx(metp.mha_peak_ratio(p), rel=1e-6)


def test_peak_intermediate_ratio_at_p2():
    ffn, mha = _peak_intermediates(2, 64 * K)
    assert ffn == pytest.approx(1 / 2, rel=1e-6)
    assert mha == pytest.approx(7 / 12, rel=1e-6)


@pytest.mark.parametrize("p", [2, 8])
def test_traces_hold_the_double_buffers_and_blocks(p):
    seq, h = 32 * K, GPT.hidden
    lay = Layout(tp=p, tp_mode="metp")
    fwd, bwd = layer_forward_trace(GPT, lay, 1, seq), layer_backward_trace(GPT, lay, 1, seq)
    assert _buf(fwd, "metp_ffn_w_double_buffer") == pytest.approx(2 * 8 * h * h / p * D)
    assert _buf(fwd, "metp_mha_w_double_buffer") == pytest.approx(2 * 4 * h * h / p * D)
    assert _buf(bwd, "metp_ffn_dw_double_buffer") == pytest.approx(2 * 8 * h * h / p * D)
    assert _buf(bwd, "metp_mha_dw_reduce_buffers") == pytest.approx(2 * 4 * h * h / p * D)
    for j in range(p):  # every step's blocks, each freed before the next step's
        assert _buf(fwd, f"metp_fc1_block{j}") == pytest.approx(4 * seq * h / p**2 * D)
        assert not [b for b in fwd.buffers if b.name == f"metp_act_block{j}"]  # f(T_ij) in place
        assert _buf(bwd, f"metp_act_block{j}") == pytest.approx(4 * seq * h / p**2 * D)
        assert _buf(bwd, f"metp_d_fc1_block{j}") == pytest.approx(4 * seq * h / p**2 * D)
        assert _buf(fwd, f"metp_kv_double_buffer{j}") == pytest.approx(2 * 2 * seq * h / p**2 * D)
        assert _buf(bwd, f"metp_dkv_in_flight{j}") == pytest.approx(2 * 2 * seq * h / p**2 * D)
    names = {b.name for b in fwd.buffers} | {b.name for b in bwd.buffers}
    assert not {n for n in names if "gathered" in n or n.endswith("_partial")}  # no TP collectives left


def test_long_context_memory_and_model_states():
    m = get_model("gpt-7b")
    seq = 256 * K
    meg, lay = Layout(tp=8), Layout(tp=8, tp_mode="metp")
    assert model_state_bytes(m, lay) == model_state_bytes(m, meg)  # weights split p ways either way
    for pol in ("store_all", "full_recompute"):
        a = memory_breakdown(m, lay, 1, seq, get_policy(pol), A100)
        b = memory_breakdown(m, meg, 1, seq, get_policy(pol), A100)
        assert a.transient_planned_bytes < b.transient_planned_bytes
        assert a.peak_gpu_bytes < b.peak_gpu_bytes


def test_memo_composes_with_metp():
    m = get_model("gpt-7b")
    seq = 128 * K
    lay = Layout(tp=8, tp_mode="metp")
    res = memo_alpha(m, lay, 1, seq, A100)
    assert res.feasible
    pol = get_policy("memo", 0.5)
    rows = seq // 8
    unit = m.hidden * D  # row bytes of an h-wide tensor
    want = rows * 2 * unit + (rows // 2) * 3 * unit  # x, attn whole; half of ln1, h1, ln2
    assert pol.offload_bytes(m, lay, 1, seq) == pytest.approx(want)
    rc = recompute_costs(m, lay, 1, seq, A100, 0.5)
    assert {c.name for c in rc} == {"ln1", "p2p_wproj", "mha_proj_recompute", "add1", "ln2"}
    r = simulate(replace(m, layers=4), lay, 1, seq, pol, A100, keep_timeline=False)
    assert r.ok and r.exposed_p2p_s >= 0.0


def _exposed(seq, mode="metp_ffn"):
    m = replace(get_model("gpt-7b"), layers=2)
    lay = Layout(tp=8, tp_mode=mode)
    r = simulate(m, lay, 1, seq, get_policy("store_all"), A100, keep_timeline=False, record=True)
    assert r.ok
    ring = [o for o in r.ops if o.stream == "tp_p2p" and o.phase == "fwd" and o.layer == 0]
    assert len(ring) == 7 and all(o.link == "nvlink" for o in ring)  # one send/recv per ring step
    return r.exposed_p2p_s, sum(o.end - o.start for o in r.ops if o.stream == "tp_p2p")


def test_exposed_p2p_above_and_below_the_overlap_threshold():
    threshold = metp.overlap_threshold_seq(A100, 8, 1)  # 8320
    above, ring_above = _exposed(2 * 8 * K)
    below, _ = _exposed(2 * K)
    assert 2 * 8 * K > threshold > 2 * K
    assert above <= 1e-6 * ring_above + 1e-12
    assert below > 0.0
    m = get_model("gpt-7b")
    lay = Layout(tp=8, tp_mode="metp_ffn")
    ffn = lambda s: [c for c in forward_costs(m, lay, 1, s, A100) if "ffn" in c.name]  # noqa: E731
    assert exposed_side_time(ffn(16 * K)) == 0.0 and exposed_side_time(ffn(2 * K)) > 0.0


def test_side_op_dependency_rule():
    c = lambda n, s=1.0, ov=0: OpCost(n, "gemm", "fwd", "side" if ov else "compute", s, overlaps=ov)  # noqa: E731
    costs = [c("a"), c("x0", 3.0, 1), c("s0"), c("x1", 1.0, 1), c("s1"), c("b")]
    assert chain_dependencies(costs) == [[], [0], [0], [2, 1], [2, 1], [4, 3]]
    assert critical_time(costs) == pytest.approx(1 + 3 + 1 + 1)
    # a side op overlapping two chain ops (another side op in between does not count)
    costs = [c("w", 5.0, 2), c("a"), c("x", 1.0, 1), c("b"), c("c")]
    assert [sorted(d) for d in chain_dependencies(costs)] == [[], [], [1], [1], [0, 2, 3]]
    assert chain_tail(costs) == [4]
    # a side op still running at the end of the phase is waited for by the next phase
    assert chain_tail([c("a"), c("r", 9.0, 3), c("b")]) == [2, 1]
    assert critical_time([c("a"), c("r", 9.0, 3), c("b")]) == pytest.approx(10.0)


def test_layout_vocabulary_and_validity():
    m = get_model("gpt-7b")
    assert Layout(tp=8).label() == "tp8+sp" and Layout(tp=8).tp_mode == "megatron"
    assert Layout(tp=8, tp_mode="metp").label() == "tp8+metp"
    assert Layout(tp=4, cp=2, tp_mode="metp_ffn").label() == "tp4+metp_ffn-cp2"
    ok = lambda lay, **kw: check_layout(lay, m, lay.gpus, 8, 64 * K, **kw)  # noqa: E731
    assert ok(Layout(tp=8, tp_mode="metp")) is None
    assert ok(Layout(tp=4, cp=2, tp_mode="metp_ffn")) is None
    assert "at least 2" in ok(Layout(tp=1, tp_mode="metp"))
    assert "sp must be on" in ok(Layout(tp=8, sp=False, tp_mode="metp"))
    assert "ring CP" in ok(Layout(tp=4, cp=2, tp_mode="metp"))
    assert "heads" in check_layout(Layout(tp=8, tp_mode="metp"), replace(m, heads=12, hidden=3072), 8, 8, 64 * K)
    gqa = replace(m, kv_heads=4)
    assert "kv heads" in check_layout(Layout(tp=8, tp_mode="metp"), gqa, 8, 8, 64 * K)
    assert check_layout(Layout(tp=8, tp_mode="metp"), get_model("llama-70b"), 8, 8, 64 * K) is None
    wide = Layout(tp=16, tp_mode="metp")
    assert "inside a node" in check_layout(wide, m, 16, 8, 64 * K)
    assert check_layout(wide, m, 16, 8, 64 * K, metp_across_nodes=True) is None
    # Megatron TP over two whole nodes is valid (its collectives priced on the nodes' NICs: test_tp_across_nodes.py);
    # a degree that is neither a divisor of the node nor whole nodes is not
    assert check_layout(Layout(tp=16), m, 16, 8, 64 * K) is None
    assert "inside a node" in check_layout(Layout(tp=12), replace(m, heads=24, hidden=3072), 12, 8, 64 * K,
                                            metp_across_nodes=True)
    valid, _ = enumerate_layouts(m, 8, 8, 64 * K)
    assert valid and all(lay.tp_mode == "megatron" for lay in valid)  # METP only when asked
    valid, _ = enumerate_layouts(m, 8, 8, 64 * K, tp_modes=("metp",))
    assert valid and all(lay.tp_mode == "metp" and lay.sp and lay.tp >= 2 for lay in valid)
    assert Layout.from_dict({"tp": 8, "tp_mode": "metp"}) == Layout(tp=8, tp_mode="metp")


def test_whatif_ranks_metp_beside_megatron():
    m = get_model("gpt-7b")
    res = candidates_for(m, 256 * K, 8, A100, tp=8, policies=("store_all", "memo"))
    modes = {c.layout.tp_mode for c in res.candidates}
    assert modes == {"megatron", "metp_ffn", "metp"}
    assert res.best.layout.metp  # at 256K only METP keeps every activation: Megatron TP+SP store-all is OOM
    only = candidates_for(m, 256 * K, 8, A100, tp=8, tp_mode="metp")
    assert {c.layout.tp_mode for c in only.candidates} == {"metp"}
    meg = candidates_for(m, 256 * K, 16, A100, framework="megatron")
    assert not any(c.layout.metp for c in meg.candidates)


def test_whatif_cli_metp(tmp_path):
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "256K", "--tp-mode", "metp",
                                 "--profile", "a100-sxm4-80gb", "--simulate-top", "1", "--json", "--no-plan"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["tp_mode"] == "metp" and all(c["tp_mode"] == "metp" for c in obj["candidates"])
    rows = obj["metp_vs_megatron"]
    assert rows and all(row["memory_saved_fraction"] > 0 for row in rows)
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "256K", "--tp-mode", "metp",
                                 "--profile", "a100-sxm4-80gb", "--simulate-top", "1", "--out", str(tmp_path),
                                 "--details"])
    assert r.exit_code == 0, r.output
    assert "METP against Megatron TP+SP" in r.output and "tp8+metp" in r.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["layout"]["tp_mode"] == "metp"
    r = CliRunner().invoke(cli, ["simulate", str(tmp_path / "plan.json"), "--out", str(tmp_path / "sim")])
    assert r.exit_code == 0, r.output
    trace = json.loads((tmp_path / "sim" / "trace.json").read_text())
    assert any("tp_p2p" in str(e.get("args", {}).get("name", "")) for e in trace["traceEvents"] if e.get("ph") == "M")


def test_sweep_seq_tp_mode_axis(tmp_path):
    r = CliRunner().invoke(cli, ["whatif", "--layers", "2", "--gpus", "8", "--tp", "8", "--sp", "--tp-mode", "megatron",
                                 "--policy", "store_all", "--seq", "16K", "--simulate-top", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "plan.json"), "--out", str(tmp_path / "sw"),
                                 "--seqs", "8K,32K,128K", "--tp-mode", "megatron,metp", "--policy", "store_all"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "sw" / "seq_by_tp_mode.png").exists() and "crossover tp8+metp store_all" in r.output
    obj = json.loads((tmp_path / "sw" / "seq_by_tp_mode.json").read_text())
    labels = {p["label"] for p in obj["points"]}
    assert labels == {"tp8+sp store_all", "tp8+metp store_all"}
    r = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "plan.json"), "--out", str(tmp_path / "sw2"),
                                 "--seqs", "8K", "--tp-mode", "bogus"])
    assert r.exit_code == 2
