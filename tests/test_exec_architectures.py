"""The executor builds the plan model's architecture (`memo_sim.model.config`: norm, bias,
tied_embeddings), and its loss and every gradient match a plain-autograd reference of that
architecture (tests/exec_reference.py) under each activation policy.

Tiny shapes (4 layers, so MEMO's rounding buffers are reused) in fp32 on CPU; tolerance 1e-5 relative (norm-wise per parameter, and on the loss).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner

from memo_exec.cli import cli as exec_cli
from memo_exec.device import DeviceSpec
from memo_exec.distributed.context import build_context
from memo_exec.distributed.runner import DistExecutor
from memo_exec.errors import ExecError
from memo_exec.layer import LayerWeights, layer_biases
from memo_exec.model import GPT, vocab_padding_params
from memo_exec.runner import RunOptions
from memo_sim.layout.parallel import Layout
from memo_sim.cli import cli as sim_cli
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy
from memo_sim.policy.sppo import Sppo
from tests.dist_cases import loss_and_grads
from tests.dist_harness import spawn
from tests.exec_helpers import bf16_within_autograd_noise, executor_grads, make_plan, max_rel_error, reference_grads, time_limit

torch.set_num_threads(1)

TOL = 1e-5
SHAPES = {"layers": 4, "hidden": 64, "heads": 4, "ffn": 160, "vocab": 96}
ARCHS = {
    # Qwen2: RMSNorm, a bias on QKV only, untied classifier, GQA, SwiGLU
    "qwen2": ModelConfig("qwen2-like", **SHAPES, kv_heads=2, ffn_type="swiglu", norm="rmsnorm", bias="qkv",
                         tied_embeddings=False),
    # Llama: RMSNorm, no biases, untied classifier
    "llama": ModelConfig("llama-like", **SHAPES, kv_heads=2, ffn_type="swiglu", norm="rmsnorm", bias="none",
                         tied_embeddings=False),
    "gpt": ModelConfig("gpt-like", **SHAPES),
    # the remaining combinations the fields allow: a GELU FFN without biases, LayerNorm untied
    "gelu-rms-nobias": ModelConfig("gelu-rms", **SHAPES, norm="rmsnorm", bias="none"),
    "layernorm-qkv-untied": ModelConfig("ln-qkv", **SHAPES, kv_heads=1, bias="qkv", tied_embeddings=False),
    # DeepSeek-V3's latent attention (no rotary embedding, as memo-exec runs none): queries through a latent of 20,
    # keys and values through one of 24 beside an 8-wide shared key, heads of 16 + 8 (query / key) and 12 (value)
    "mla": ModelConfig("mla-like", **SHAPES, head_dim=16, kv_lora_rank=24, q_lora_rank=20, qk_rope_dim=8,
                       v_head_dim=12, ffn_type="swiglu", norm="rmsnorm", bias="none", tied_embeddings=False),
    # DeepSeek-V2-Lite's: the queries projected directly (no q_lora_rank)
    "mla-direct-q": ModelConfig("mla-q", **SHAPES, head_dim=16, kv_lora_rank=24, qk_rope_dim=8, v_head_dim=16,
                                ffn_type="swiglu", norm="rmsnorm", bias="none"),
}
POLICIES = {"store_all": get_policy("store_all"), "full_recompute": get_policy("full_recompute"),
            "memo0.5": get_policy("memo", 0.5)}


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(120):
        yield


@pytest.mark.parametrize("arch", list(ARCHS))
def test_parameters_are_the_architectures(arch):
    m = ARCHS[arch]
    lw = LayerWeights(m, m.layers, torch.device("meta"), torch.float32)
    names = {n for n, _ in lw.named_parameters()}
    assert sum(p.numel() for p in lw.parameters()) == m.layer_params()
    assert {"ln1_b", "ln2_b"} <= names if m.norm == "layernorm" else not names & {"ln1_b", "ln2_b"}
    assert names & {"bqkv", "bo", "b1", "b2"} == set(layer_biases(m))
    gpt = GPT(m, m.layers, torch.device("meta"), torch.float32)
    assert sum(p.numel() for p in gpt.parameters()) - vocab_padding_params(m) == m.params()
    outer = {n for n, _ in gpt.outer_parameters()}
    assert ("lm_head" in outer) == (not m.tied_embeddings) and ("lnf_b" in outer) == (m.norm == "layernorm")


def test_biases_by_setting():
    q, ll, g = ARCHS["qwen2"], ARCHS["llama"], ARCHS["gpt"]
    assert layer_biases(q) == ("bqkv",) and layer_biases(ll) == ()
    assert layer_biases(g) == ("bqkv", "bo", "b1", "b2")
    assert layer_biases(ModelConfig("s", 1, 64, 4, 96, ffn_type="swiglu")) == ("bqkv", "bo")


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_gradients_match_autograd(arch, policy):
    m = ARCHS[arch]
    plan = make_plan(m, 96, POLICIES[policy], batch=2, chunk=70)
    loss, grads, ex = executor_grads(plan)
    ref_loss, ref_grads = reference_grads(ex)
    assert abs(loss - ref_loss) <= TOL * abs(ref_loss)
    err, worst = max_rel_error(grads, ref_grads)
    assert err <= TOL, f"{arch} {policy}: gradient of {worst} off by {err:.2e}"
    if policy == "memo0.5":  # half the token rows offloaded, the rest rebuilt token-wise (4 layers: the
        assert ex.policy.n_off == 2 * 96 // 2  # rounding buffers are reused, so a row not rebuilt is stale)
    if not m.tied_embeddings:  # the untied head and the embedding are distinct, with distinct gradients
        assert ex.gpt.lm_head.data_ptr() != ex.gpt.wte.data_ptr()
        assert not torch.allclose(grads["lm_head"], grads["wte"])


@pytest.mark.parametrize("policy", ["store_all", "memo0.5"])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "mla"])
def test_bf16_within_autograd_noise(arch, policy):
    """bf16 with fp32 main gradients: the RMSNorm statistics and backward are as good as bf16 autograd."""
    _, grads, ex = executor_grads(make_plan(ARCHS[arch], 96, POLICIES[policy], batch=2, chunk=70), dtype="bf16")
    assert ex.main_grads is not None
    assert bf16_within_autograd_noise(ex, grads) == []


def test_hf_qwen_plan_runs_one_step(tmp_path):
    """A plan made from the Qwen2.5 config.json with shape overrides keeps the architecture (GQA:
    the config's 4 KV heads under 8 heads) and runs one step on the CPU executor."""
    r = CliRunner().invoke(sim_cli, ["whatif", "--model", "tests/data/hf/qwen2.5-7b/config.json", "--layers", "2",
                                     "--hidden", "128", "--heads", "8", "--ffn", "256", "--vocab", "512",
                                     "--dtype", "fp32", "--seq", "512", "--gpus", "1", "--policy", "memo",
                                     "--alpha", "0.5", "--jobs", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "plan.json").read_text())["model"]
    assert (m["norm"], m["bias"], m["tied_embeddings"], m["ffn_type"], m["kv_heads"]) == \
        ("rmsnorm", "qkv", False, "swiglu", 4)
    out = tmp_path / "run"
    r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "plan.json"), "--device", "cpu", "--steps", "1",
                                      "--out", str(out)])
    assert r.exit_code == 0, r.output
    measured = json.loads((out / "measured.json").read_text())
    assert measured["meta"]["params"] == ModelConfig.from_dict(m).params()


@pytest.mark.parametrize("q_latent", [True, False], ids=["q-latent", "q-direct"])
def test_a_latent_attention_memo_plan_runs_with_its_memory_plan(tmp_path, q_latent):
    """The what-if's MEMO plan of a latent-attention model carries a static memory plan whose backward places the
    latents' gradients (d_kv_latn, d_kv_lat, d_q_latn, d_q_lat, d_ln1) in the simulator's order; memo-exec takes and
    frees them in that order, so it runs the plan with it (it refused 'd_q_lat is not a tensor this executor's layer
    allocates', then 'd_ln1 overlaps d_q', on the day latent attention landed)."""
    model = {"name": "mla-plan", "layers": 3, "hidden": 128, "heads": 4, "ffn": 256, "vocab": 256, "dtype": "fp32",
             "head_dim": 16, "kv_lora_rank": 32, "qk_rope_dim": 8, "v_head_dim": 16, "ffn_type": "swiglu",
             "norm": "rmsnorm", "bias": "none", **({"q_lora_rank": 48} if q_latent else {})}
    (tmp_path / "m.json").write_text(json.dumps(model))
    r = CliRunner().invoke(sim_cli, ["whatif", "--model", str(tmp_path / "m.json"), "--seq", "1K", "--gpus", "1",
                                     "--policy", "memo", "--jobs", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert {"d_kv_lat", "d_ln1"} <= set(plan["memory_plan"]["phases"]["bwd"]["offsets"])
    r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "plan.json"), "--device", "cpu", "--steps", "1",
                                      "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert "- memory plan: arena" in (tmp_path / "run" / "report.md").read_text()


# ---------------------------------------------------------------------------- distributed (gloo)
DIST_MODELS = {k: dataclasses.replace(ARCHS[k], dtype="fp32", name=f"{k}-dist") for k in ("qwen2", "llama")}
DIST_CASES = [  # (model, layout, schedule, policy, batch): against the single-process fp64 run
    ("qwen2", {"tp": 2, "sp": True}, "single_stage", "memo0.5", 1),
    ("llama", {"tp": 2, "sp": False}, "single_stage", "store_all", 1),
    ("qwen2", {"dp": 2, "zero": 3}, "single_stage", "full_recompute", 1),
    ("qwen2", {"pp": 2}, "1f1b", "store_all", 2),
    ("qwen2", {"cp": 2}, "single_stage", "memo0.5", 1),
    ("llama", {"ulysses": 2}, "single_stage", "full_recompute", 1),
    ("qwen2", {"pp": 2}, "sppo", "sppo", 1),
    ("qwen2", {"tp": 2, "sp": True, "tp_mode": "metp_ffn"}, "single_stage", "memo0.5", 1),
    ("qwen2", {"tp": 2, "sp": True, "tp_mode": "metp"}, "single_stage", "store_all", 1),
    ("llama", {"tp": 2, "sp": True, "tp_mode": "metp_ffn"}, "single_stage", "full_recompute", 1),
]
# the two-level METP attention's travelling weight block carries the QKV bias
REFUSED = [("llama", {"tp": 2, "sp": True, "tp_mode": "metp"}, "single_stage", "store_all", 1)]
DIST_POLICIES = POLICIES | {"sppo": Sppo(subseqs=2, bounds=(0, 32, 64), alphas=(0.0, 0.0), partition="explicit")}


def _dist_plan(arch, lay, schedule, pol, batch):
    plan = make_plan(DIST_MODELS[arch], 64, DIST_POLICIES[pol], batch=batch, chunk=48)
    plan.layout = Layout(**lay)
    plan.gpus = plan.layout.gpus
    plan.schedule = schedule
    plan.micro_batch = 1
    return plan


def rank_arch_cases(rank: int, world: int, cases, refused) -> list:
    out = []
    for case in cases:
        out.append(loss_and_grads(_dist_plan(*case), rank))
    for case in refused:
        plan = _dist_plan(*case)
        try:
            DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=1),
                         build_context(plan.layout, torch.device("cpu")), DeviceSpec("cpu"))
            out.append(None)
        except ExecError as e:
            out.append(str(e))
    return out


def test_two_ranks_every_path_matches_single_process_and_full_metp_refuses_no_qkv_bias():
    results = spawn(rank_arch_cases, 2, DIST_CASES, REFUSED, timeout=600)
    for i, (arch, lay, schedule, pol, batch) in enumerate(DIST_CASES):
        dp = lay.get("dp", 1)
        plan = make_plan(DIST_MODELS[arch], 64, POLICIES.get(pol, POLICIES["store_all"]), batch=batch * dp, chunk=48)
        ref_loss, ref_grads, _ = executor_grads(plan, dtype="fp64")
        what = (arch, lay, pol)
        assert all(abs(r[i][0] - ref_loss) <= TOL * abs(ref_loss) for r in results), (what, ref_loss)
        err, worst = max_rel_error(results[0][i][1], ref_grads)
        assert err <= TOL, (what, worst, err)
    for k, (arch, lay, schedule, _, _) in enumerate(REFUSED):
        msg = results[0][len(DIST_CASES) + k]
        assert msg is not None and "\n" not in msg and "bias = 'none'" in msg and "metp_ffn" in msg, (lay, msg)


def test_padded_vocabulary_rows_change_no_loss_and_get_no_gradient():
    """The classifier's weight holds `padded_vocab` rows (aligned GEMMs); with the real vocabulary
    passed, rows past it get no probability: the loss and the real rows' gradients are the
    unpadded head's, the padding rows' gradient is zero even when their weights are not."""
    from memo_exec.model import ChunkedHead, padded_vocab

    torch.manual_seed(0)
    V, h, T = 100, 16, 24
    Vp = padded_vocab(V)
    assert Vp == 128 and padded_vocab(128) == 128 and padded_vocab(50257) == 50304
    hf = torch.randn(T, h, dtype=torch.float64, requires_grad=True)
    w = torch.randn(Vp, h, dtype=torch.float64, requires_grad=True)  # padding rows deliberately non-zero
    tg = torch.randint(0, V, (T,))
    loss = ChunkedHead.apply(hf, w, tg, 10, None, V)
    loss.backward()
    hf2, w2 = hf.detach().clone().requires_grad_(), w.detach()[:V].clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(hf2 @ w2.t(), tg)
    ref.backward()
    assert torch.allclose(loss, ref)
    assert torch.allclose(hf.grad, hf2.grad) and torch.allclose(w.grad[:V], w2.grad)
    assert torch.count_nonzero(w.grad[V:]) == 0
    unmasked = ChunkedHead.apply(hf.detach(), w.detach(), tg, 10, None, None)
    assert not torch.allclose(unmasked, ref)  # without the real vocabulary the padding rows would count


def test_a_classifier_chunk_in_the_arena_gives_the_allocated_chunks_result():
    """`ChunkPlace`: the head's logits and their fp32 copy carved from a plan's arena (chunks cut to
    the rows that fit) give the same loss and gradients as allocated chunks; too small an arena
    places nothing."""
    from memo_exec.model import ChunkedHead, ChunkPlace

    torch.manual_seed(1)
    V, h, T = 256, 32, 4096
    hf = torch.randn(T, h, dtype=torch.bfloat16)
    w = (torch.randn(V, h) * 0.1).to(torch.bfloat16)
    tg = torch.randint(0, 200, (T,))

    def run(scratch):
        a, b = hf.clone().requires_grad_(), w.clone().requires_grad_()
        loss = ChunkedHead.apply(a, b, tg, 2048, None, 200, scratch)
        loss.backward()
        return loss, a.grad, b.grad

    want = run(None)
    arena = torch.full((1536 * V * 6 + 257,), 7, dtype=torch.uint8)  # 1536 rows fit; an odd length
    assert ChunkPlace.rows_for(arena.numel(), 2048, V, 2, 4) == 1536
    got = run(arena)
    assert int(arena[:16].sum()) != 7 * 16  # the arena was written
    for g, x in zip(got, want):
        assert torch.allclose(g.float(), x.float(), rtol=1e-2, atol=1e-3)
    assert ChunkPlace.rows_for(100 * V * 6, 2048, V, 2, 4) == 0  # fewer than MIN_ARENA_ROWS rows: not placed
