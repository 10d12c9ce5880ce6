"""Mixture-of-experts layers in the executor (`memo_exec.moe`), on CPU with gloo.

- the block's math against a naive per-token loop (softmax and sigmoid routers, SwiGLU and GELU,
  shared experts with and without the gate), deterministic top-k ties, parameter counts equal to
  `ModelConfig.params()`;
- expert parallelism against the single-process executor on the same global batch (fp64, loss and
  every gradient within 1e-9 relative; the brief asks 1e-5): dp2 x ep2 and tp2 (SP) x ep2 (2 ranks),
  tp2 x dp2 x ep2, tp2 x dp2 x ep4 and pp2 x dp2 x ep2 (1F1B, 4 micro-batches) on 4 ranks, under store all, full recompute and MEMO;
  10 optimizer steps on the single process's loss curve;
- an unbalanced routing (every token to the experts of EP rank 0: rank 1 receives no rows) that
  still matches, and the same run with the all-to-all's split sizes mutated, which must fail;
- forced balance (round-robin by position: equal counts) on dp2 x ep2 and tp2 (SP) x ep2, random balance (a uniform
  draw per layer and position) on dp2 x ep2, tp2 (SP) x ep2 and pp2 x dp2 x ep2, against the single process routed
  so too;
- the allgather dispatcher on dp2 x ep2 (with the unbalanced routing) and tp2 (SP) x ep2;
- a capacity factor (Megatron-Core's token dropping with padding): the selection against the rule written out per
  expert, padding that adds nothing, and dp2 x ep2 (dropping, padding, the unbalanced routing, the allgather
  dispatcher) and tp2 (SP) x ep2 against the single process grouping its rows as the ranks do;
- the deepep dispatcher (a token once per EP rank it reaches) on dp2 x ep2 (with the unbalanced routing and a
  capacity), tp2 (SP) x ep2 and tp2 x dp2 x ep4, its rows' all-to-alls under the simulator's names;
- expert tensor parallelism (etp 2: each expert's FFN sliced over the ETP pair, the pair's copies all-gathered,
  the partial outputs reduce-scattered) on tp2 (SP) x etp2 (store all with 3 steps, MEMO with GELU, a capacity
  factor, the allgather dispatcher), dp2 x etp2, and on 4 ranks tp2 x dp2 x ep2 x etp2 (alltoall and allgather),
  tp2 x dp2 x etp2 (the slices' expert-DP all-reduce, 3 steps) and tp2 x pp2 x etp2 (1F1B), with the ETP
  collectives timed under the simulator's names and the model layers; routed-expert biases under etp 2 (3 steps);
  an ETP pair that receives no rows; the experts' ZeRO 1-3 over the expert-DP pairs (3 steps), and ZeRO 2 over 2
  micro-batches with expert-DP 2 and no dense replica; FSDP with ep2 on 4 ranks (the experts over their expert-DP
  pairs, resharded or kept);
- one-line refusals (MLA, sinks under Ulysses, sliding layers the model does not place, ...);
  Qwen3-MoE's attention (QK norms, heads wider than hidden / heads) runs.
"""

from __future__ import annotations

import dataclasses

import re

import pytest
import torch

from memo_exec.model import vocab_padding_params
from memo_exec.device import DeviceSpec
from memo_exec.distributed.context import build_context
from memo_exec.distributed.runner import DistExecutor
from memo_exec.runner import RunOptions
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from tests.dist_cases import policy_of
from tests.dist_harness import spawn
from tests.exec_helpers import executor_grads, make_plan, one_process_run, time_limit

TOL = 1e-9  # fp64
SEQ = 64
MOE = ModelConfig("moe-small", 4, 64, 4, 128, vocab=128, dtype="fp32", experts=4, top_k=2, expert_ffn=48,
                  shared_experts=1, shared_ffn=32, shared_gate=True, dense_layers=1, ffn_type="swiglu",
                  norm="rmsnorm", bias="none", moe_bias=True)
POLICIES = ("store_all", "full_recompute", "memo", "recompute_moe", "selective_recompute", "recompute_norm_act")


def plan_for(lay: dict, pol: str, batch: int = 1, schedule: str = "", micro: int = 0, model: ModelConfig = MOE):
    p = make_plan(model, SEQ, policy_of(pol), batch=batch, chunk=64)
    p.layout = Layout(**lay)
    p.gpus = p.layout.gpus
    if schedule:
        p.schedule = schedule
    if micro:
        p.micro_batch = micro
    return p


def skew_router(ex) -> None:
    """Every token's top-2 are experts 0 and 1 (EP rank 0's under ep 2): the other rank receives nothing."""
    with torch.no_grad():
        for lw in ex.gpt.layers:
            if lw.moe is not None:
                lw.moe.router_b.copy_(torch.tensor([4.0, 3.0, -4.0, -4.0], dtype=lw.moe.router_b.dtype))


def swap_splits() -> None:
    """Mutation: the all-to-all told the sizes it sends where it should use the sizes it receives."""
    from memo_exec.moe import dispatchers

    orig = dispatchers.all_to_all
    dispatchers.all_to_all = lambda x, out_splits, in_splits, group, tag=None: orig(x, in_splits, in_splits, group, tag)


# ------------------------------------------------------------------------------- per rank
def run_case(lay: dict, pol: str, steps: int = 0, batch: int = 1, schedule: str = "", micro: int = 0,
             skew: bool = False, mutate: bool = False, dtype: str = "fp64", variant: int = 0) -> dict:
    if mutate:
        swap_splits()  # a forked rank: the patch dies with the process
    plan = plan_for(lay, pol, batch, schedule, micro, model=VARIANTS[variant])
    ctx = build_context(plan.layout, torch.device("cpu"))
    ex = DistExecutor(plan, RunOptions(device="cpu", dtype=dtype, steps=max(1, steps)), ctx, DeviceSpec("cpu"))
    ex.allocate()
    if skew:
        skew_router(ex)
    rec = ex.step(0, optimizer=False)
    grads = ex.full_gradients()
    recomputed = len({e.layer for e in rec.events if e.phase == "recompute"})
    moe_recomputed = sorted({e.layer for e in rec.events if e.op == "moe_recompute"})
    offloaded = sorted({e.layer for e in rec.events if e.phase == "offload"})
    losses = []
    if steps:
        ex.zero_grads()
        losses = [ex.step(k).loss for k in range(steps)]
    ex.close()
    return {"loss": rec.loss, "grads": grads if ctx.rank == 0 else None, "losses": losses, "recomputed": recomputed,
            "moe_recomputed": moe_recomputed, "offloaded": offloaded,
            "ep_ops": sorted({(e.op, e.phase) for e in rec.events if e.stream == "ep_comm"}),
            # the model layers the ETP collectives name, and those the rank's compute runs
            "etp_layers": sorted({e.layer for e in rec.events
                                  if e.op.endswith(("_allgather_etp", "_reducescatter_etp"))}),
            "moe_layers": sorted({e.layer for e in rec.events if e.op == "moe"}),
            # the bytes the rows' dispatch all-to-alls sent in the forward (alltoall's or deepep's)
            "dispatch_bytes": sum(e.nbytes for e in rec.events if e.phase == "fwd" and e.op in
                                  ("moe_dispatch_alltoall_ep", "moe_dispatch_alltoall_dedup_ep"))}


def rank_cases(rank: int, world: int, cases) -> list:
    return [run_case(**c) for c in cases]


def rank_error(rank: int, world: int, case) -> str | None:
    try:
        run_case(**case)
    except Exception as e:  # noqa: BLE001 - returned to the test
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


# ------------------------------------------------------------------------------- reference
_REF: dict = {}


def rank_groups(tp: int):
    """A setup hook: the single process's MoE block drops to the capacity per group of rows as the ranks it stands
    for do, each sequence of the batch on its own data-parallel rank (one a replica) and, with Megatron SP,
    interleaved over ``tp`` ranks (`memo_exec.distributed.context.local_token_index`)."""
    def setup(ex) -> None:
        rows = torch.arange(ex.batch * ex.seq)
        ex.compute.moe.set_balance(ex.plan.layout.balance, rows % ex.seq, (rows // ex.seq) * tp + rows % ex.seq % tp)
    return setup


def reference(pol: str, batch: int, steps: int = 0, skew: bool = False, dtype: str = "fp64", variant: int = 0,
              balance: str = "dropless", tp: int = 1):
    key = (pol, batch, steps, skew, dtype, variant, balance, tp)
    if key not in _REF:
        plan = plan_for({"moe_balance": balance}, pol, batch, model=VARIANTS[variant])
        if balance.startswith("capacity"):  # the ranks' groups of rows (no training steps)
            group = rank_groups(tp)
            loss, grads, _ = executor_grads(plan, dtype=dtype, setup=lambda ex: (skew_router(ex) if skew else None,
                                                                                 group(ex)))
            _REF[key] = (loss, grads, [])
        elif skew or dtype != "fp64":
            loss, grads, _ = executor_grads(plan, dtype=dtype, setup=skew_router if skew else None)
            _REF[key] = (loss, grads, [])
        else:
            _REF[key] = one_process_run(plan, steps)
    return _REF[key]


def check(case: dict, results: list, world: int) -> None:
    lay = case["lay"]
    replicas = lay.get("dp", 1)
    got = results[0]
    loss, want, losses = reference(case["pol"], case.get("batch", 1) * replicas, case.get("steps", 0),
                                   case.get("skew", False), case.get("dtype", "fp64"), case.get("variant", 0),
                                   lay.get("moe_balance", "dropless"), lay.get("tp", 1))
    tol = TOL if case.get("dtype", "fp64") == "fp64" else 1e-5
    what = f"{lay} {case['pol']} {case.get('dtype', 'fp64')} variant {case.get('variant', 0)}"
    assert all(abs(r["loss"] - loss) <= tol * abs(loss) for r in results), (what, [r["loss"] for r in results], loss)
    assert set(got["grads"]) == set(want), (what, sorted(set(got["grads"]) ^ set(want)))
    for k in want:
        err = float((got["grads"][k] - want[k]).norm() / want[k].norm().clamp_min(1e-300))
        assert err <= tol or float(want[k].norm()) == 0.0, (what, k, err)
    if case["pol"] in ("memo", "full_offload"):
        # an offloaded MoE layer rebuilds its block from ln2 before its backward; a kept one keeps its graph (under
        # ZeRO 3 too: the weights it saved are gathered back into the same storage before the backward)
        for r in results:
            model = VARIANTS[case.get("variant", 0)]
            assert r["moe_recomputed"] == [i for i in r["offloaded"] if not model.dense_layer_at(i)], (what, r)
        assert any(r["moe_recomputed"] for r in results) or lay.get("pp", 1) > 1, what
    elif case["pol"] not in ("store_all", "recompute_norm_act"):  # MoE blocks rebuilt from ln2 before their backward
        assert all(r["moe_recomputed"] for r in results), what
    else:  # store all keeps every block's graph, under ZeRO 3 too (its weights re-gathered in place, as FSDP does);
        # recompute_norm_act too, but the experts' activation output
        assert all(not r["moe_recomputed"] for r in results), what
    for a, b in zip(got["losses"], losses, strict=True):
        assert abs(a - b) <= 1e-7 * abs(b), (what, got["losses"], losses)


# ------------------------------------------------------------------------------- single process
def _naive_block(mb, x: torch.Tensor, model: ModelConfig) -> torch.Tensor:
    """Per token, per chosen expert: the block's formula written out (the router's own top-k)."""
    import torch.nn.functional as F

    from memo_exec.moe.experts import ffn

    logits = F.linear(x, mb.router_w, mb.router_b)
    s = torch.softmax(logits, -1) if model.router == "softmax" else torch.sigmoid(logits)
    llama4 = model.router == "sigmoid_topk"  # Llama 4: the sigmoid of the chosen logit, on the expert's input
    out = torch.zeros_like(x)
    sw = (model.swiglu_limit or True) if model.ffn_type == "swiglu" else False  # GPT-OSS's: its limit
    for t in range(x.shape[0]):
        allowed = range(model.experts)
        if model.router_groups:  # a group's score: the sum of its top_k / group_topk best experts' scores
            size = model.experts // model.router_groups
            best = [sum(sorted((float(s[t, e]) for e in range(g * size, (g + 1) * size)),
                               reverse=True)[:model.top_k // model.router_group_topk])
                    for g in range(model.router_groups)]
            picked = sorted(range(model.router_groups), key=lambda g: (-best[g], g))[:model.router_group_topk]
            allowed = [e for e in allowed if e // size in picked]
        order = sorted(allowed, key=lambda e: (-float(s[t, e]), e))[:model.top_k]
        z = 1.0 if llama4 else sum(float(s[t, e]) for e in order)
        for e in order:
            b1 = mb.expert_b1[e] if mb.expert_b1 is not None else None
            b2 = mb.expert_b2[e] if mb.expert_b2 is not None else None
            p = model.router_scaling * float(s[t, e]) / z
            if llama4:
                out[t] += ffn(p * x[t:t + 1], mb.expert_w1[e], mb.expert_w2[e], b1, b2, sw)[0]
            else:
                out[t] += p * ffn(x[t:t + 1], mb.expert_w1[e], mb.expert_w2[e], b1, b2, sw)[0]
    if mb.shared_w1 is not None:
        sh = ffn(x, mb.shared_w1, mb.shared_w2, None, None, sw)
        if mb.shared_gate is not None:
            sh = sh * torch.sigmoid(F.linear(x, mb.shared_gate))
        out += sh
    return out


VARIANTS = [MOE, dataclasses.replace(MOE, name="moe-sigmoid-gelu", router="sigmoid", ffn_type="gelu", norm="layernorm",
                                     bias="all", shared_experts=0, shared_ffn=0, shared_gate=False, moe_bias=False,
                                     dense_layers=0, top_k=3),
            # Qwen3-MoE's attention: heads of 32 where hidden / heads is 16, QK norms; no shared experts
            dataclasses.replace(MOE, name="moe-qwen3", head_dim=32, qk_norm=True, shared_experts=0, shared_ffn=0,
                                shared_gate=False, moe_bias=False, dense_layers=0),
            # Llama 4 Maverick's pattern: dense layers 0 and 2 between MoE layers 1 and 3 (dense_period 2)
            dataclasses.replace(MOE, name="moe-alternating", dense_layers=2, dense_period=2),
            # routed experts without biases (the etp cases' SwiGLU model; `MOE` itself has them)
            dataclasses.replace(MOE, name="moe-no-expert-bias", moe_bias=False),
            # GPT-OSS's attention: sinks, sliding windows on the even layers, biased projections; no shared experts;
            # its clamped SwiGLU (`memo_exec.moe.experts`)
            dataclasses.replace(MOE, name="moe-gpt-oss", attention_sinks=True, sliding_window=24, sliding_layers=2,
                                sliding_period=2, bias="all", shared_experts=0, shared_ffn=0, shared_gate=False,
                                dense_layers=0, swiglu_limit=7.0),
            # DeepSeek-V3's routing: sigmoid scores, each token's top-4 from its best 2 of 4 groups of two experts
            # (a group scored by its top-2, as V3's 8 of 256 from 4 of 8 groups), the weights scaled by 2.5
            # (routed_scaling_factor); a shared expert, one dense layer
            dataclasses.replace(MOE, name="moe-grouped", router="sigmoid", experts=8, top_k=4, router_groups=4,
                                router_group_topk=2, router_scaling=2.5),
            # Llama 4's: top-1 of the logits, its sigmoid scaling the expert's input, a shared expert; chunked attention
            # (16-token chunks) on layers 0-2, layer 3 full (chunked_period 4); dense and MoE layers alternating
            # (Maverick's)
            dataclasses.replace(MOE, name="moe-llama4", router="sigmoid_topk", top_k=1, shared_gate=False,
                                attention_chunk=16, chunked_layers=3, chunked_period=4, dense_layers=2,
                                dense_period=2),
            # DeepSeek-V3's layer: latent attention (queries through a latent of 20, keys and values through one of
            # 24 beside an 8-wide shared key; heads of 16 + 8 and values of 12) with its grouped sigmoid routing
            dataclasses.replace(MOE, name="moe-mla", router="sigmoid", experts=8, top_k=4, router_groups=4,
                                router_group_topk=2, router_scaling=2.5, bias="none", kv_lora_rank=24, q_lora_rank=20,
                                head_dim=16, qk_rope_dim=8, v_head_dim=12)]
ETP_MODEL = 4  # the variant the etp cases run (SwiGLU, shared experts with their gate)
OSS_MODEL = 5
GROUPED_MODEL = 6
MLA_MODEL = len(VARIANTS) - 1
LLAMA4_MODEL = 7


@pytest.mark.parametrize("model", VARIANTS, ids=lambda m: m.name)
def test_block_math_and_params_match_the_formula(model):
    from memo_exec.layer import LayerWeights
    from memo_exec.model import GPT
    from memo_exec.moe.block import MoEBlock

    with time_limit(60):
        gpt = GPT(model, model.layers, torch.device("cpu"), torch.float64)
        assert gpt.param_count() - vocab_padding_params(model) == model.params()
        gpt.init_(0)
        assert [lw.moe is None for lw in gpt.layers] == [model.dense_layer_at(i) for i in range(model.layers)]
        lw: LayerWeights = gpt.layers[next(i for i in range(model.layers) if not model.dense_layer_at(i))]
        x = torch.randn(24, model.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            y, idx, _ = MoEBlock(model).math(lw.moe, x)
            want = _naive_block(lw.moe, x, model)
        assert float((y - want).norm() / want.norm()) < 1e-12
        assert idx.shape == (24, model.top_k)


def test_top_k_ties_pick_the_lower_expert_index():
    from memo_exec.moe.routers import router_for, top_k

    s = torch.tensor([[0.2, 0.3, 0.3, 0.2], [1.0, 1.0, 1.0, 1.0]])
    assert top_k(s, 2).tolist() == [[1, 2], [0, 1]]
    idx, w = router_for(MOE)(torch.zeros(3, 4), 2)
    assert idx.tolist() == [[0, 1]] * 3 and torch.allclose(w, torch.full((3, 2), 0.5))


def test_group_limited_routing_picks_from_the_best_groups_and_scales_the_weights():
    """Megatron-LM's group_limited_topk: a group scored by the sum of its top_k / group_topk best scores, the experts
    of the other groups out of reach however high they score; the normalised weights times router_scaling."""
    from memo_exec.moe.routers import router_for, top_k

    # 4 groups of 2 experts. Top 4 of 2 groups, a group scored by its 2 best (here both) experts: row 0's expert 0
    # scores highest but its group (0.9 + 0.0) loses to groups 3 (0.6 + 0.45) and 1 (0.5 + 0.5)
    s = torch.tensor([[0.9, 0.0, 0.5, 0.5, 0.1, 0.1, 0.6, 0.45],
                      [0.1, 0.1, 0.5, 0.5, 0.5, 0.5, 0.2, 0.2]])
    assert top_k(s, 4).tolist() == [[0, 6, 2, 3], [2, 3, 4, 5]]  # not limited
    assert top_k(s, 4, groups=4, group_topk=2).tolist() == [[6, 2, 3, 7], [2, 3, 4, 5]]
    # top 2 of 1 group: row 1's groups 1 and 2 tie (1.0), the lower one is picked
    assert top_k(s, 2, groups=4, group_topk=1).tolist() == [[6, 7], [2, 3]]
    # top 1 of 2 groups (top_k below the groups picked): a group scored by its best expert
    assert top_k(s, 1, groups=4, group_topk=2).tolist() == [[0], [2]]
    model = VARIANTS[GROUPED_MODEL]
    assert (model.top_k, model.router_groups, model.router_group_topk, model.router_scaling) == (4, 4, 2, 2.5)
    logits = torch.logit(s.double())
    idx, w = router_for(model)(logits, 4)
    assert idx.tolist() == [[6, 2, 3, 7], [2, 3, 4, 5]]
    want = torch.tensor([[0.6, 0.5, 0.5, 0.45], [0.5] * 4], dtype=torch.float64)
    assert torch.allclose(w, want / want.sum(-1, keepdim=True) * 2.5)
    # the forward's routing kept for the backward: the same experts, the weights from the new scores
    idx2, w2 = router_for(model)(logits, 4, idx)
    assert idx2 is idx and torch.equal(w2, w)


GLM_CONFIG = {"model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"], "hidden_size": 64,
              "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 4,
              "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
              "routed_scaling_factor": 2.5, "norm_topk_prob": True, "vocab_size": 256, "rms_norm_eps": 1e-5,
              "rope_theta": 10000, "partial_rotary_factor": 0.5, "attention_bias": True, "use_qk_norm": False,
              "num_nextn_predict_layers": 0, "tie_word_embeddings": False, "hidden_act": "silu"}


def test_a_glm_moe_config_is_planned_and_run_with_its_grouped_scaled_routing(tmp_path):
    """A GLM-4.5-shaped Hugging Face config (sigmoid routing from 2 of 4 expert groups, weights scaled by 2.5, a dense
    first layer, a shared expert): the what-if's plan runs in memo-exec (it refused router groups and scaling before
    2026-11-30, and its dense layers' view of the model kept the groups without the experts)."""
    from click.testing import CliRunner

    from memo_exec.cli import cli as exec_cli
    from memo_sim.plan.schema import read_plan
    from tests.exec_helpers import whatif_plan_of_config

    with time_limit(120):
        m = read_plan(whatif_plan_of_config(tmp_path, GLM_CONFIG)).model
        assert (m.router, m.router_groups, m.router_group_topk, m.router_scaling, m.dense_layers) == \
            ("sigmoid", 4, 2, 2.5, 1)
        r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "p" / "plan.json"), "--device", "cpu", "--steps", "1",
                                          "--out", str(tmp_path / "run")])
        assert r.exit_code == 0, r.output
    assert (tmp_path / "run" / "report.md").is_file()


def test_softmax_routing_scores_the_groups_on_the_logits():
    """Megatron-LM's default softmax router takes the top-k of the logits (its softmax after), its sigmoid router
    the top-k of the sigmoids: groups of two, the best group's two experts. Row 0's groups (3, -10) and (1, 1) rank
    group 1 first on the logits' sums, group 0 on the softmax probabilities' (a review: the executor summed
    probabilities); row 1's (6, -0.5) and (1, 1) rank group 0 first on the logits, group 1 on the sigmoids."""
    from memo_exec.moe.routers import router_for

    model = dataclasses.replace(MOE, experts=4, top_k=2, router_groups=2, router_group_topk=1)
    logits = torch.tensor([[3.0, -10.0, 1.0, 1.0], [6.0, -0.5, 1.0, 1.0]], dtype=torch.float64)
    idx, w = router_for(model)(logits, 2)
    assert idx.tolist() == [[2, 3], [0, 1]] and torch.allclose(w[0], torch.tensor([0.5, 0.5], dtype=torch.float64))
    sig = dataclasses.replace(model, router="sigmoid")
    assert router_for(sig)(logits, 2)[0].tolist() == [[2, 3], [2, 3]]


@pytest.mark.parametrize("pol", POLICIES)
def test_single_process_policies_agree(pol):
    """Store all keeps the blocks' graphs, full recompute, MEMO and recompute_moe (Megatron's
    --recompute-modules layernorm moe: the norms rebuilt, the block re-run) rebuild them, selective
    recompute re-runs the attention core: same loss and gradients."""
    with time_limit(60):
        loss, grads, _ = executor_grads(plan_for({}, pol), dtype="fp64")
        ref_loss, ref, _ = reference("store_all", 1)
    assert abs(loss - ref_loss) <= 1e-12 * abs(ref_loss)
    for k in ref:
        assert float((grads[k] - ref[k]).norm()) <= 1e-12 * float(ref[k].norm()) + 1e-300, k


# ------------------------------------------------------------------------------- two ranks
TWO = [dict(lay=dict(dp=2, ep=2), pol="store_all", steps=10),
       dict(lay=dict(dp=2, ep=2), pol="full_recompute"),
       dict(lay=dict(dp=2, ep=2), pol="memo"),
       dict(lay=dict(dp=2, ep=2, zero=1), pol="memo"),
       dict(lay=dict(dp=2, ep=2), pol="store_all", skew=True),
       dict(lay=dict(dp=2), pol="memo"),  # ep 1 with dp 2: the experts replicated, reduced with the dense weights
       dict(lay=dict(tp=2, sp=True, ep=2), pol="store_all"),  # EP over the TP pair: each routes its SP shard
       dict(lay=dict(tp=2, sp=True, ep=2), pol="memo"),
       dict(lay=dict(dp=2, ep=2, zero=2), pol="store_all"),  # per-layer reduce-scatter of the dense part
       dict(lay=dict(dp=2, ep=2, zero=3), pol="store_all"),  # weights freed between forward and backward
       dict(lay=dict(dp=2, zero=3), pol="store_all"),  # ep 1: the routed experts freed and gathered back too
       dict(lay=dict(dp=2, ep=2), pol="store_all", dtype="fp32"),  # the brief's fp32 at 1e-5
       dict(lay=dict(dp=2, ep=2), pol="memo", variant=1),  # sigmoid router, GELU, LayerNorm, no shared experts
       dict(lay=dict(dp=2, ep=2), pol="recompute_moe", steps=10),  # the block re-run, its all-to-alls too
       dict(lay=dict(tp=2, sp=True, ep=2), pol="recompute_moe"),
       # Megatron's layernorm moe_act: the norms rebuilt, the block's graph kept but the experts' activation output
       dict(lay=dict(dp=2, ep=2), pol="recompute_norm_act", steps=3),
       dict(lay=dict(tp=2, sp=True, ep=2), pol="recompute_norm_act", variant=1),
       dict(lay=dict(tp=2, sp=True, ep=2), pol="memo", variant=2),  # Qwen3-MoE: QK norms summed over the TP pair
       dict(lay=dict(dp=2, ep=2), pol="memo", variant=3),  # dense and MoE layers alternating
       # DeepSeek-V3's group-limited routing and scaled weights, each token's experts from its best two groups
       dict(lay=dict(tp=2, sp=True, ep=2), pol="memo", variant=GROUPED_MODEL),
       # Llama 4's router (its weight on the expert's input) and chunked attention over the TP pair's heads
       dict(lay=dict(tp=2, sp=True, ep=2), pol="memo", variant=LLAMA4_MODEL),
       # forced balance: round-robin by position in the sequence, on each rank's rows as on one process
       dict(lay=dict(dp=2, ep=2, moe_balance="forced"), pol="memo"),
       dict(lay=dict(tp=2, sp=True, ep=2, moe_balance="forced"), pol="store_all"),
       # random balance: a uniform draw keyed by layer and position, each rank drawing its own rows' experts
       dict(lay=dict(dp=2, ep=2, moe_balance="random"), pol="memo"),
       dict(lay=dict(tp=2, sp=True, ep=2, moe_balance="random"), pol="store_all"),
       # a capacity factor: each rank drops and pads its own rows' copies to E x C (C = ceil(T k / E x F))
       dict(lay=dict(dp=2, ep=2, moe_balance="capacity:0.75"), pol="store_all"),  # copies dropped
       dict(lay=dict(dp=2, ep=2, moe_balance="capacity:1.5"), pol="memo"),  # dropped and padded, the block re-run
       dict(lay=dict(dp=2, ep=2, moe_balance="capacity:1"), pol="store_all", skew=True),  # rank 1: padding only
       dict(lay=dict(dp=2, ep=2, moe_balance="capacity:1", moe_dispatcher="allgather"), pol="full_recompute"),
       dict(lay=dict(tp=2, sp=True, ep=2, moe_balance="capacity:0.75"), pol="recompute_moe"),
       # the allgather dispatcher: every rank's tokens gathered, outputs reduce-scattered
       dict(lay=dict(dp=2, ep=2, moe_dispatcher="allgather"), pol="store_all", steps=3),
       dict(lay=dict(dp=2, ep=2, moe_dispatcher="allgather"), pol="memo"),
       dict(lay=dict(dp=2, ep=2, moe_dispatcher="allgather"), pol="store_all", skew=True),
       dict(lay=dict(tp=2, sp=True, ep=2, moe_dispatcher="allgather"), pol="recompute_moe"),
       # DeepEP's deduplicated dispatch: a token once per EP rank holding one of its experts
       dict(lay=dict(dp=2, ep=2, moe_dispatcher="deepep"), pol="store_all", steps=3),
       dict(lay=dict(dp=2, ep=2, moe_dispatcher="deepep"), pol="memo"),
       dict(lay=dict(dp=2, ep=2, moe_dispatcher="deepep"), pol="store_all", skew=True),
       dict(lay=dict(dp=2, ep=2, moe_dispatcher="deepep", moe_balance="capacity:0.75"), pol="full_recompute"),
       dict(lay=dict(tp=2, sp=True, ep=2, moe_dispatcher="deepep"), pol="recompute_moe"),
       # expert tensor parallelism: each expert's FFN sliced over the pair, the pair's copies all-gathered
       dict(lay=dict(tp=2, sp=True, etp=2), pol="store_all", variant=ETP_MODEL, steps=3),
       dict(lay=dict(tp=2, sp=True, etp=2), pol="memo", variant=1),  # GELU: one half to slice, not two
       dict(lay=dict(dp=2, etp=2), pol="full_recompute", variant=ETP_MODEL),  # ETP over the data-parallel pair
       dict(lay=dict(tp=2, sp=True, etp=2, moe_balance="capacity:0.75"), pol="recompute_moe", variant=ETP_MODEL),
       dict(lay=dict(tp=2, sp=True, etp=2, moe_dispatcher="allgather"), pol="store_all", variant=ETP_MODEL),
       # routed-expert biases (GPT-OSS): fc1's sliced, fc2's added by ETP rank 0 alone (3 steps: once it is nonzero, a
       # second rank adding it would leave the one process's curve)
       dict(lay=dict(tp=2, sp=True, etp=2), pol="store_all", steps=3),
       dict(lay=dict(dp=2, etp=2, moe_dispatcher="allgather"), pol="memo", steps=3),
       # the sequence split outside TP: each rank routes its own shard of the ring's (cp) or Ulysses' sequence, the
       # experts folded over the pair as over a data-parallel one; Ulysses' all-to-alls around the attention
       dict(lay=dict(cp=2, ep=2), pol="store_all", steps=3),
       dict(lay=dict(cp=2, ep=2), pol="memo"),
       dict(lay=dict(cp=2, ep=2, moe_dispatcher="deepep"), pol="recompute_moe"),
       dict(lay=dict(ulysses=2, ep=2), pol="store_all", steps=3),
       dict(lay=dict(ulysses=2, ep=2), pol="memo"),
       dict(lay=dict(ulysses=2, ep=2), pol="full_recompute"),
       dict(lay=dict(ulysses=2, ep=2, moe_dispatcher="allgather"), pol="recompute_norm_act"),
       # latent attention beside expert parallelism (DeepSeek-V3's layer): MEMO's rows of the latents rebuilt, ZeRO 3
       dict(lay=dict(dp=2, ep=2), pol="memo", variant=MLA_MODEL),
       dict(lay=dict(dp=2, ep=2, zero=3), pol="store_all", variant=MLA_MODEL, steps=3)]


@pytest.mark.slow  # 39 s of the default selection (CI, 2026-11-29): the slow one runs beside it with time to spare
def test_two_ranks_dp2_ep2_match_single_process():
    """dp2 dense x ep2 experts: every policy, ZeRO 1, an unbalanced routing, 10 steps; dp2 with ep 1;
    tp2 (SP) x ep2."""
    results = spawn(rank_cases, 2, TWO, timeout=240)
    for i, case in enumerate(TWO):
        check(case, [r[i] for r in results], 2)
        if case["lay"].get("moe_dispatcher") == "allgather":  # its collectives timed under the simulator's names
            ops = set(results[0][i]["ep_ops"])
            names = ("moe_dispatch_allgather_etp_ep", "moe_combine_reducescatter_etp_ep")
            assert {(name, d) for name in names for d in ("fwd", "bwd")} <= ops, ops
        if case["lay"].get("moe_dispatcher") == "deepep":
            ops = set(results[0][i]["ep_ops"])
            names = ("moe_dispatch_alltoall_dedup_ep", "moe_combine_alltoall_dedup_ep")
            assert {(name, d) for name in names for d in ("fwd", "bwd")} <= ops, ops
        for r in results:  # every rank (a pipeline's later stage too)
            check_etp_ops(case, r[i])
    # the same routing (dp2 x ep2, store all, the first step): deepep sends a token once per rank it reaches, fewer
    # rows than the all-to-all's k copies (2 of 4 experts a rank: a token's two experts often share one), never
    # fewer than one per token
    a2a, dedup = (sum(r[TWO.index(c)]["dispatch_bytes"] for r in results)
                  for c in (TWO[0], next(c for c in TWO if c["lay"].get("moe_dispatcher") == "deepep")))
    assert a2a / MOE.top_k <= dedup < a2a, (dedup, a2a)


def check_etp_ops(case: dict, got: dict) -> None:
    """Under etp > 1 the alltoall dispatcher's experts gather and reduce-scatter over the ETP group, timed under the
    simulator's names (`memo_sim.layout.moe_dispatchers.alltoall`); the allgather dispatcher needs no such step."""
    lay = case["lay"]
    if lay.get("etp", 1) == 1:
        return
    names = {(n, d) for n in ("moe_dispatch_allgather_etp", "moe_combine_reducescatter_etp") for d in ("fwd", "bwd")}
    ops = set(got["ep_ops"])
    if lay.get("moe_dispatcher", "alltoall") == "alltoall":
        assert names <= ops, ops
        # on a pipeline's later stage too, each is tagged with the model layer the rank runs (the chunk's timer)
        assert got["etp_layers"] and got["etp_layers"] == got["moe_layers"], (got["etp_layers"], got["moe_layers"])
    else:
        assert not names & ops, ops


def test_wrong_split_sizes_fail():
    """With every token routed to rank 0's experts, all-to-all split sizes that do not match the
    counts exchanged are an error on some rank (not a silent mismatch)."""
    case = dict(lay=dict(dp=2, ep=2), pol="store_all", skew=True, mutate=True)
    try:
        errors = spawn(rank_error, 2, case, timeout=60)
    except AssertionError as e:  # a rank died on the broken collective
        errors = [str(e)]
    assert any(errors), errors


# ------------------------------------------------------------------------------- four ranks
# tp2 x dp2 x ep2: EP over each TP pair, the experts' gradients all-reduced over the expert-DP pair;
# tp2 x dp2 x ep4: one EP group of all four ranks (no expert-DP)
FOUR = [dict(lay=dict(tp=2, sp=True, dp=2, ep=2), pol="store_all", steps=10),
        dict(lay=dict(tp=2, sp=True, dp=2, ep=2), pol="memo"),
        dict(lay=dict(tp=2, sp=True, dp=2, ep=2), pol="full_recompute"),
        dict(lay=dict(tp=2, sp=True, dp=2, ep=4), pol="memo"),
        dict(lay=dict(pp=2, dp=2, ep=2), pol="memo", batch=4, schedule="1f1b", micro=1),
        dict(lay=dict(pp=2, dp=2, ep=2), pol="store_all", batch=4, schedule="1f1b", micro=1),
        # layernorm moe_act on a pipeline: each micro-batch in flight its own norm buffer under the kept graphs
        dict(lay=dict(pp=2, dp=2, ep=2), pol="recompute_norm_act", batch=4, schedule="1f1b", micro=1),
        # data parallelism outermost (Megatron-LM's --use-tp-pp-dp-mapping): ranks 0 and 1 are one replica's stages
        # (the experts whole on each rank: in that order memo folds expert groups inside a replica's stage only)
        dict(lay=dict(pp=2, dp=2, rank_order="tp-cp-pp-dp"), pol="store_all", batch=4, schedule="1f1b", micro=1),
        # random routing keyed by the model's layer: a stage's layers draw as the same layers do on one process
        dict(lay=dict(pp=2, dp=2, ep=2, moe_balance="random"), pol="store_all", batch=4, schedule="1f1b", micro=1),
        # DeepEP over 4 ranks of one expert each: a token's 2 experts on 2 of them, or on 1 (sent once)
        dict(lay=dict(tp=2, sp=True, dp=2, ep=4, moe_dispatcher="deepep"), pol="memo"),
        # Ulysses 2 x TP 2 (SP): EP over all four, each routing its quarter of the sequence; ring CP 2 x DP 2: EP over
        # each CP pair, the experts' gradients over the DP pair
        dict(lay=dict(tp=2, sp=True, ulysses=2, ep=4), pol="memo"),
        dict(lay=dict(cp=2, dp=2, ep=2, zero=1), pol="store_all", steps=3),
        # DeepSeek-V3's layer on two stages (its dense first layer on stage 0), full recompute of the latents
        dict(lay=dict(pp=2, dp=2, ep=2), pol="full_recompute", batch=4, schedule="1f1b", micro=1, variant=MLA_MODEL),
        # etp2 x ep2: ETP pairs {0, 1} and {2, 3}, EP pairs {0, 2} and {1, 3} (etp apart); etp2 with ep 1: the slices'
        # gradients all-reduced over the expert-DP pairs {0, 2} and {1, 3}; etp2 on a pipeline's stages
        dict(lay=dict(tp=2, sp=True, dp=2, ep=2, etp=2), pol="memo", variant=ETP_MODEL),
        dict(lay=dict(tp=2, sp=True, dp=2, etp=2), pol="store_all", variant=ETP_MODEL, steps=3),
        dict(lay=dict(tp=2, sp=True, dp=2, ep=2, etp=2, moe_dispatcher="allgather"), pol="full_recompute",
             variant=ETP_MODEL),
        dict(lay=dict(tp=2, sp=True, pp=2, etp=2), pol="memo", variant=ETP_MODEL, batch=2, schedule="1f1b", micro=1),
        # ZeRO over the expert-DP pairs {0, 2} and {1, 3} (the experts' own GradSync): optimizer states (3 steps on
        # the one process's losses), gradients, weights gathered around each layer
        dict(lay=dict(tp=2, sp=True, dp=2, ep=2, zero=1), pol="store_all", steps=3),
        dict(lay=dict(tp=2, sp=True, dp=2, ep=2, zero=3), pol="store_all", steps=3),
        dict(lay=dict(tp=2, sp=True, dp=2, etp=2, zero=2), pol="memo", variant=ETP_MODEL, steps=3),
        # expert-DP 2 with no dense replica (tp 4 over ep 2: the pairs {0, 2} and {1, 3}), ZeRO 2 over 2 micro-batches:
        # each micro-batch's expert gradients reduce-scattered and added into the shard
        dict(lay=dict(tp=4, sp=True, ep=2, zero=2), pol="store_all", batch=2, micro=1),
        # every token to EP rank 0's experts: the other ETP pair gathers no rows (padded to one zero row each)
        dict(lay=dict(tp=2, sp=True, dp=2, ep=2, etp=2), pol="store_all", skew=True),
        # FSDP as torchtitan runs a MoE (efsdp): the dense weights over the 4 ranks, the experts over their expert-DP
        # pairs, resharded after the forward or kept to the backward as the dense layers are
        dict(lay=dict(dp=4, zero=3, dp_mode="fsdp", ep=2), pol="store_all", steps=3),
        dict(lay=dict(dp=4, zero=3, dp_mode="fsdp", ep=2, reshard_after_forward=False), pol="memo"),
        # GPT-OSS's attention (sinks split with their heads over TP, windows) beside expert parallelism
        dict(lay=dict(tp=2, sp=True, dp=2, ep=2), pol="memo", variant=OSS_MODEL, steps=3),
        # FSDP beside pipeline stages (torchtitan's): every weight gathered once a step and each chunk's gradients
        # reduce-scattered after its last backward; the experts whole on each rank of ep 2 (expert-DP 1), or sharded
        # with the dense weights (ep 1)
        dict(lay=dict(pp=2, dp=2, ep=2, zero=3, dp_mode="fsdp", reshard_after_forward=False), pol="store_all", batch=4,
             schedule="1f1b", micro=1, steps=3),
        dict(lay=dict(pp=2, dp=2, zero=3, dp_mode="fsdp", reshard_after_forward=False), pol="memo", batch=4,
             schedule="1f1b", micro=1),
        # Llama 4 on two stages: the second stage's layers 2 (chunked) and 3 (full attention, MoE) placed by the
        # model's layer index
        dict(lay=dict(pp=2, dp=2, ep=2), pol="full_recompute", batch=4, schedule="1f1b", micro=1,
             variant=LLAMA4_MODEL),
        # Llama 4's weight on the input of the ETP pair's gathered copies (as Megatron-Core's experts apply it)
        dict(lay=dict(tp=2, sp=True, dp=2, ep=2, etp=2), pol="memo", variant=LLAMA4_MODEL),
        # ZeRO 2 over expert-DP pairs on dense and MoE layers in turn: each MoE layer's expert reduce-scatter runs
        # under the next layers' backward in the other of the two workspaces (`memo_exec.distributed.zero`)
        dict(lay=dict(dp=4, ep=2, zero=2), pol="store_all", batch=2, micro=1, variant=3, steps=3)]
# the ETP, ZeRO, FSDP and GPT-OSS cases in the slow selection, which CI runs beside the default one (the two take
# about as long: .ci/run)
FOUR, FOUR_MORE = FOUR[:13], FOUR[13:]


def _four_ranks(cases):
    results = spawn(rank_cases, 4, cases, timeout=400)
    for i, case in enumerate(cases):
        check(case, [r[i] for r in results], 4)
        for r in results:  # every rank (a pipeline's later stage too)
            check_etp_ops(case, r[i])


def test_four_ranks_tp2_dp2_ep2_and_pp2_ep2_match_single_process():
    _four_ranks(FOUR)


@pytest.mark.slow
def test_four_ranks_etp_zero_fsdp_and_gpt_oss_match_single_process():
    _four_ranks(FOUR_MORE)


# ------------------------------------------------------------------------------- refusals
REFUSED = [
    # latent attention runs on one TP rank's heads (tests/test_exec_architectures.py), not over a TP group
    ("kv_lora_rank = 32 (latent attention) with tp 2", dict(tp=2, sp=True), dataclasses.replace(MOE, kv_lora_rank=32, q_lora_rank=32, head_dim=16, qk_rope_dim=8,
                                                    v_head_dim=16)),
    # sinks and windows run on a rank holding its heads' whole sequence (tests/test_exec_attention_sinks.py); which
    # layers slide must be said
    ("attention_sinks with ulysses 2", dict(ulysses=2), dataclasses.replace(MOE, attention_sinks=True)),
    ("sliding_layers = 2 of 4 without sliding_period", dict(), dataclasses.replace(MOE, sliding_window=16,
                                                                                    sliding_layers=2)),
]


@pytest.mark.parametrize("field,lay,model", REFUSED, ids=[r[0].split(" ")[0] for r in REFUSED])
def test_plans_the_executor_cannot_run_are_refused_naming_the_field(field, lay, model):
    from memo_exec.errors import ExecError
    from memo_exec.runner import run_model

    plan = plan_for(lay, "store_all", model=model)
    with pytest.raises(ExecError, match=re.escape(field)) as e:
        run_model(plan, RunOptions(device="cpu"))
    assert "\n" not in str(e.value)


def test_forced_balance_routes_every_expert_the_same_copies_and_is_not_the_routers_choice():
    """memo-exec's forced balance (`memo_exec.moe.balance`): copy j of the token at position p to expert
    (p*k + j) mod E, so each expert gets seq*k/E copies of every sequence (the simulator's load factor 1); the
    router still weighs them (its gate gets gradients); the single process routes so too, and not as its
    router would (else the distributed cases above could match a reference that ignored the balance)."""
    from memo_exec.moe.balance import ROUTER_CHOOSES, ROUTINGS, round_robin
    from memo_sim.plan.executor_scope import EXEC_BALANCES

    assert set(ROUTINGS.names()) | set(ROUTER_CHOOSES) == set(EXEC_BALANCES)
    pos = torch.arange(2 * SEQ) % SEQ  # two sequences
    idx = round_robin(pos, MOE.top_k, MOE.experts)
    assert torch.bincount(idx.reshape(-1), minlength=MOE.experts).tolist() == [2 * SEQ * MOE.top_k // MOE.experts] * 4
    assert all(len(set(r)) == MOE.top_k for r in idx.tolist())  # k distinct experts a token
    # a TP rank's interleaved rows and a CP rank's two chunks route as the same positions do on one process
    assert torch.equal(round_robin(pos[1::2], 2, 4), idx[1::2])
    with time_limit(60):
        forced, _g, _ = reference("memo", 1, balance="forced")
        router, _g2, _ = reference("memo", 1)
        loss, grads, _ = executor_grads(plan_for({"moe_balance": "forced"}, "store_all"), dtype="fp64")
    assert abs(loss - forced) <= 1e-12 * abs(forced) and abs(forced - router) > 1e-6 * abs(router)
    gate = [k for k in grads if k.endswith("router_w")]
    assert gate and all(float(grads[k].norm()) > 0 for k in gate)


def test_random_balance_draws_uniform_k_subsets_per_layer_and_is_not_the_routers_choice():
    """memo-exec's random balance (`memo_exec.moe.balance`, Megatron-Core's --moe-router-force-load-balancing): each
    position's k experts a uniform draw, distinct, different across layers, the same for a rank's shard of the rows
    as on one process; loads near uniform routing's; the single process routes so too, and not as its router would."""
    from memo_exec.moe.balance import uniform_draw

    E, k, n = 16, 4, 20000
    pos = torch.arange(n)
    idx = uniform_draw(pos, k, E, 3)
    assert idx.shape == (n, k) and all(len(set(r)) == k for r in idx[:2000].tolist())
    assert torch.equal(uniform_draw(pos[1::2], k, E, 3), idx[1::2])  # a shard draws its rows alone
    assert torch.equal(uniform_draw(pos, k, E, 3), idx)  # deterministic
    other = uniform_draw(pos, k, E, 4)
    assert float((other != idx).float().mean()) > 0.5  # another layer, another draw
    counts = torch.bincount(idx.reshape(-1), minlength=E).double()
    expect = n * k / E
    chi2 = float(((counts - expect) ** 2 / expect).sum())
    assert chi2 < 45.0, chi2  # chi-square with 15 degrees of freedom: p < 1e-4 beyond 40 for a uniform draw
    pairs = torch.bincount((idx[:, 0] * E + idx[:, 1]), minlength=E * E).reshape(E, E)
    assert int(pairs.diagonal().sum()) == 0 and int((pairs + pairs.T).fill_diagonal_(1).min()) > 0  # every pair drawn
    with time_limit(60):
        drawn, _g, _ = reference("memo", 1, balance="random")
        router, _g2, _ = reference("memo", 1)
        forced, _g3, _ = reference("memo", 1, balance="forced")
        loss, grads, _ = executor_grads(plan_for({"moe_balance": "random"}, "store_all"), dtype="fp64")
    assert abs(loss - drawn) <= 1e-12 * abs(drawn)
    assert abs(drawn - router) > 1e-6 * abs(router) and abs(drawn - forced) > 1e-6 * abs(forced)
    gate = [k for k in grads if k.endswith("router_w")]
    assert gate and all(float(grads[k].norm()) > 0 for k in gate)


def _capacity_rule(idx: torch.Tensor, weights: torch.Tensor, E: int, F: float) -> list[tuple[int, int]]:
    """Megatron-Core's apply_router_token_dropping with pad_to_capacity, written out per expert: (row, expert) of
    every copy, expert-major; the C = ceil(T k / E x F) rows of largest probability (zero where the row did not
    choose the expert), ties to the lower row; every row where C exceeds the rows."""
    import math

    T, k = idx.shape
    c = math.ceil(T * k / E * F)
    out = []
    for e in range(E):
        p = [sum(float(weights[t, j]) for j in range(k) if int(idx[t, j]) == e) for t in range(T)]
        rows = sorted(range(T), key=lambda t: (-p[t], t))
        out += [(t, e) for t in (rows if c > T else rows[:c])]
    return out


def test_capacity_keeps_the_largest_probabilities_per_expert_and_pads_with_zero_weight():
    from memo_exec.moe.capacity import padded_copies

    # four tokens all to expert 0 (k 1, weight 1): capacity 2 keeps rows 0 and 1 there, pads expert 1 with them
    src, exp = padded_copies(torch.zeros(4, 1, dtype=torch.int64), torch.ones(4, 1), 2, 1.0)
    assert src.tolist() == [0, 1, 0, 1] and exp.tolist() == [0, 0, 1, 1]
    g = torch.Generator().manual_seed(3)
    for F in (0.5, 1.0, 1.5, 3.0):
        idx = torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(20)])
        w = torch.softmax(torch.randn(20, 2, generator=g, dtype=torch.float64), -1)
        src, exp = padded_copies(idx, w, 6, F)
        assert list(zip(src.tolist(), exp.tolist(), strict=True)) == _capacity_rule(idx, w, 6, F), F
        groups = torch.arange(20) % 2  # two ranks' interleaved rows: each group its own capacity
        src, exp = padded_copies(idx, w, 6, F, groups)
        want = [(int(torch.arange(20)[groups == r][t]), e) for r in (0, 1)
                for t, e in _capacity_rule(idx[groups == r], w[groups == r], 6, F)]
        assert list(zip(src.tolist(), exp.tolist(), strict=True)) == want, F


def test_capacity_padding_adds_nothing_and_dropping_loses_the_copies():
    """A capacity every row reaches computes every token's routed copies (the padding's weight is zero): the block's
    output is dropless's; below it the kept copies alone, as the per-token formula over them gives."""
    import torch.nn.functional as Fn

    from memo_exec.model import GPT
    from memo_exec.moe.block import MoEBlock
    from memo_exec.moe.experts import ffn
    from memo_sim.layout.moe_balance import parse_balance

    model = dataclasses.replace(MOE, shared_experts=0, shared_ffn=0, shared_gate=False)
    gpt = GPT(model, model.layers, torch.device("cpu"), torch.float64)
    gpt.init_(0)
    lw = gpt.layers[1].moe
    x = torch.randn(24, model.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y0, idx, _ = MoEBlock(model).math(lw, x)
        for cf, full in ((2.0, True), (0.5, False)):
            blk = MoEBlock(model)
            blk.set_balance(parse_balance(f"capacity:{cf}"), torch.arange(24))
            y, idx2, (src, exp) = blk.math(lw, x)
            assert torch.equal(idx2, idx)
            if full:
                assert src.numel() == 24 * model.experts  # C = T: every row to every expert
                assert float((y - y0).norm() / y0.norm()) < 1e-13
                continue
            assert torch.bincount(exp).tolist() == [6] * model.experts  # ceil(24 * 2 / 4 * 0.5) each
            w = torch.softmax(Fn.linear(x, lw.router_w, lw.router_b), -1)
            want = torch.zeros_like(x)
            for t, e in zip(src.tolist(), exp.tolist(), strict=True):
                chosen = idx[t].tolist()
                p = float(w[t, e]) / float(w[t, chosen].sum()) if e in chosen else 0.0
                b1 = lw.expert_b1[e] if lw.expert_b1 is not None else None
                b2 = lw.expert_b2[e] if lw.expert_b2 is not None else None
                want[t] += p * ffn(x[t:t + 1], lw.expert_w1[e], lw.expert_w2[e], b1, b2, True)[0]
            assert float((y - want).norm() / want.norm()) < 1e-12
            assert float((y - y0).norm() / y0.norm()) > 0.1  # copies dropped


def test_executor_dispatchers_are_the_contracts():
    """The dispatchers memo-exec runs (ep > 1) are the ones `memo_sim.plan.executor_scope` lets through, and the
    allgather one's timed collectives carry the simulator's names (`memo_sim.cost.moe.step_cost`)."""
    from memo_exec.moe.dispatchers import AG_COMBINE, AG_DISPATCH, DISPATCHERS
    from memo_sim.layout.moe_dispatchers import DISPATCHERS as SIM
    from memo_sim.plan.executor_scope import EXEC_DISPATCHERS

    assert set(DISPATCHERS.names()) - {"local"} == set(EXEC_DISPATCHERS)
    # the collectives no simulator op prices are the ones the reports leave out of the ep_comm rows
    from memo_exec.compare import UNPRICED_EP_OPS
    from memo_exec.moe.dispatchers import COUNTS_A2A, DEDUP_SLOTS, PROBS_A2A

    assert set(UNPRICED_EP_OPS) == {COUNTS_A2A, PROBS_A2A, DEDUP_SLOTS}
    from memo_exec.moe.dispatchers import DEDUP_COMBINE, DEDUP_DISPATCH

    for name, ours in (("allgather", (AG_DISPATCH, AG_COMBINE)), ("deepep", (DEDUP_DISPATCH, DEDUP_COMBINE))):
        steps = SIM.get(name)
        assert ours == tuple(f"moe_{w}_{s.collective}_{s.group}" for w, s in
                             (("dispatch", steps.dispatch[0]), ("combine", steps.combine[0]))), name
