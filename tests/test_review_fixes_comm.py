"""Review fixes (2026-12-01) of the simulator's communication and report: Ulysses' backward all-to-alls and ring CP's
dK/dV shifts priced as memo's executor sends them (framework ``any``), and the CSV memory table of explain /
check-plan in one unit per column."""

import csv
import io

from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost import layer_time as lt
from memo_sim.cost import ring_attention
from memo_sim.cost.activations import tokens_per_gpu
from memo_sim.frameworks import load_frameworks
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS
from memo_sim.profile.loader import load_profile

MIB = 2**20


def _adapted(framework: str, **kw) -> Layout:
    return load_frameworks()[framework].adapt(Layout(**kw))


def _bwd_alltoall_bytes(model, lay, seq) -> float:
    return sum(c.nbytes for c in lt.backward_costs(model, lay, 1, seq, load_profile("a800-80gb"))
               if c.name.startswith("alltoall"))


def test_ulysses_backward_prices_the_all_to_alls_memo_exec_sends():
    """A review: framework ``any``'s Ulysses backward priced 2 GiB a layer (dout, dq, dk, dv) where memo-exec
    (memo_exec/distributed/attention.py UlyssesAttention.backward) sends q, k, v, out and dout head-sharded, then
    dq, dk, dv back: 4 GiB for gpt-7b at 256K over 4 ranks. DeepSpeed's and Megatron's autograd send the gradients
    alone."""
    m, seq = PRESETS["gpt-7b"], 262144
    lay = _adapted("any", ulysses=4, dp=2, zero=3)
    assert lay.ulysses_bwd_resend
    qkv = m.q_dim + lay.kv_repeat(m.n_kv_heads, m.heads) * (m.kv_dim + m.v_dim)
    sent = tokens_per_gpu(lay, 1, seq) * (2 * qkv + 2 * m.attn_dim) * 2  # q, k, v, out, dout; dq, dk, dv (bf16)
    assert _bwd_alltoall_bytes(m, lay, seq) == sent == 4096 * MIB
    for fw in ("deepspeed", "megatron"):
        other = _adapted(fw, ulysses=4, dp=2, zero=3)
        assert not other.ulysses_bwd_resend and _bwd_alltoall_bytes(m, other, seq) == 2048 * MIB, fw
    # a GQA model: K/V with each head repeated as memo-exec repeats it (r = 2 at 8 K/V heads over 16 ranks)
    g = PRESETS["llama-3.1-8b"]
    lay = _adapted("any", ulysses=16)
    r = lay.kv_repeat(g.n_kv_heads, g.heads)
    assert r == 2
    qkv = g.q_dim + r * (g.kv_dim + g.v_dim)
    assert _bwd_alltoall_bytes(g, lay, seq) == tokens_per_gpu(lay, 1, seq) * (2 * qkv + 2 * g.attn_dim) * 2
    # the mechanism survives the plan file
    assert Layout.from_dict(lay.to_dict()) == lay and "ulysses_bwd_resend" not in Layout(ulysses=4).to_dict()


def test_ring_cp_dkv_shifts_are_priced_in_the_dtype_the_framework_accumulates_them_in():
    """A review: memo-exec's ring sends its dK/dV accumulators in fp32 (memo_exec.device.acc_dtype), which its
    memory already counted, but the shifts were priced in the model's dtype. TransformerEngine's p2p CP (megatron)
    sends them in the model's dtype (its p2p_comm_buffers are kv.dtype)."""
    m, seq = PRESETS["gpt-7b"], 262144
    mine = _adapted("any", tp=2, cp=4)
    te = _adapted("megatron", tp=2, cp=4)
    assert mine.ring_dkv_fp32 and not te.ring_dkv_fp32
    kv = ring_attention.ring_shift_bytes(m, mine, 1, seq)
    assert ring_attention.ring_shift_bytes(m, mine, 1, seq, grads=True) == 2 * kv
    assert ring_attention.ring_shift_bytes(m, te, 1, seq, grads=True) == kv
    home = {c.name: c.nbytes for c in lt.backward_costs(m, mine, 1, seq, load_profile("a800-80gb"))}
    assert home["cp_ring_dkv_home"] == 2 * kv and home["cp_ring_kv"] == 3 * (kv + 2 * kv)
    assert Layout.from_dict(mine.to_dict()) == mine


TOY = ["--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024", "--seq", "2K"]


def _memory_block(text: str) -> list[list[str]]:
    block = text.split("# GPU memory per GPU:\n", 1)[1].split("\n#", 1)[0]
    return list(csv.reader(io.StringIO(block)))


def test_csv_memory_table_of_explain_and_check_plan_holds_one_unit(tmp_path):
    """A review: the memory table's CSV header said ``bytes`` over cells like "58.74 MiB" and "69.12 GiB (analytic,
    memory plan)"; each column holds one unit named in its header, the peaks' words in a column of their own."""
    out = tmp_path / "toy"
    r = CliRunner().invoke(cli, ["whatif", *TOY, "--gpus", "1", "--policy", "memo", "--alpha", "0.3", "--jobs", "1",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    for cmd in ("explain", "check-plan"):
        r = CliRunner().invoke(cli, [cmd, str(out / "plan.json"), "--format", "csv"])
        assert r.exit_code == 0, r.output
        rows = _memory_block(r.output)
        head, body = rows[0], rows[1:]
        j = head.index("size (GiB)")  # the largest unit the column prints, each cell to its printed digits
        assert all(row[j].replace(".", "", 1).isdigit() for row in body), (cmd, body)
        words = {row[0]: row[head.index("how")] for row in body}
        assert words["peak (the terms above)"] == "analytic, memory plan", (cmd, words)
        assert words["peak (the simulated iteration)"] == "simulated, memory plan", (cmd, words)
        size = {row[0]: row[j] for row in body}
        assert size["attention lse"] == "0.00024414" and float(size["usable GPU memory"]) > 1, (cmd, size)
