"""Multi-token prediction in the executor (`memo_exec.mtp`; `ModelConfig.mtp_layers`), on CPU with gloo.

- one process: a tiny dense model (LayerNorm, GELU, biases, tied classifier; and RMSNorm, SwiGLU, GQA, an untied
  classifier) and tiny MoE models (the module's layer a MoE layer, and a dense one where the last layer is dense)
  with 1 and 2 modules: the loss and every parameter's gradient against a plain-autograd reference of DeepSeek-V3's
  / Megatron-LM's math written out here (fp64 within 1e-9 relative, fp32 within 1e-5); the parameter count
  ``params() + mtp_params()`` (plus the vocabulary padding), whatever the main layers' activation policy;
- gloo ranks against the single-process run (fp64, 1e-9): tp2 with and without sequence parallelism, cp2, Ulysses 2,
  dp2 under ZeRO 3 and FSDP (weights kept gathered), dp2 x ep2 and tp2 x ep2 for a MoE model, two micro-batches
  accumulated; 10 training steps on the single process's losses;
- the memory estimate counts the modules' states and what they keep (the simulator's `mtp_activation_bytes`);
- under full recompute (a policy that re-runs whole layers) each module keeps its two inputs and re-runs its norms,
  projection and layer before its backward, as Megatron-LM's checkpointed module: the loss and every gradient those of
  store all and of the reference, the modules' kept bytes the simulator's ``mtp_activation_bytes(recompute=True)``,
  and on two gloo ranks (tp2) those of the single process;
- a plan `memo-sim whatif --mtp-layers 1` writes runs through `memo-exec run`; SPPO's is refused in one line
  (pipelines: `tests.test_exec_mtp_pipeline`).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from memo_exec.device import DeviceSpec
from memo_exec.distributed.context import build_context
from memo_exec.distributed.runner import DistExecutor
from memo_exec.model import GPT, vocab_padding_params
from memo_exec.runner import RunOptions
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from tests.dist_cases import policy_of
from tests.dist_harness import spawn
from tests.exec_helpers import executor_grads, make_plan, one_process_run, time_limit

SEQ, BATCH = 32, 2
EPS = 1e-5  # the executor's norms' epsilon (`memo_exec.layer.LN_EPS`)
SCALE = 0.1  # Megatron-LM's --mtp-loss-scaling-factor default

DENSE = ModelConfig("mtp-dense", 2, 32, 4, 64, vocab=96, dtype="fp32", mtp_layers=2)
DENSE_RMS = dataclasses.replace(DENSE, name="mtp-dense-rms", norm="rmsnorm", ffn_type="swiglu", bias="none",
                                tied_embeddings=False, kv_heads=2, mtp_layers=1)
MOE = ModelConfig("mtp-moe", 2, 32, 4, 64, vocab=96, dtype="fp32", experts=4, top_k=2, expert_ffn=24,
                  shared_experts=1, shared_ffn=16, shared_gate=True, dense_layers=1, ffn_type="swiglu",
                  norm="rmsnorm", bias="none", moe_bias=True, mtp_layers=1)
# the last of 3 layers dense (every second layer MoE): the module's layer is a dense one
MOE_DENSE_LAST = dataclasses.replace(MOE, name="mtp-moe-dense-last", layers=3, dense_layers=2, dense_period=2,
                                     mtp_layers=2, norm="layernorm", ffn_type="gelu", bias="all", moe_bias=False,
                                     tied_embeddings=False)
MODELS = {"dense-d2": DENSE, "dense-rms-d1": DENSE_RMS, "moe-d1": MOE, "moe-d2": dataclasses.replace(MOE, mtp_layers=2),
          "moe-dense-last-d2": MOE_DENSE_LAST}


def plan_for(model: ModelConfig, pol: str = "store_all", lay: dict | None = None, batch: int = BATCH, micro: int = 0):
    p = make_plan(model, SEQ, policy_of(pol), batch=batch, chunk=24)
    if lay:
        p.layout = Layout(**lay)
        p.gpus = p.layout.gpus
    if micro:
        p.micro_batch = micro  # gradient accumulation over batch / micro micro-batches
    return p


# ------------------------------------------------------------------------------- the reference
def _norm(x, w, b):
    if b is not None:
        return F.layer_norm(x, (x.shape[-1],), w, b, EPS)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _act(m: ModelConfig, a, width: int):
    return F.silu(a[..., :width]) * a[..., width:] if m.ffn_type == "swiglu" else F.gelu(a)


def _moe(m: ModelConfig, P: dict, pre: str, x):
    """The routed experts (softmax, top-k renormalised) and the gated shared expert, token by expert."""
    xs = x.reshape(-1, m.hidden)
    scores = torch.softmax(F.linear(xs, P[pre + "router_w"], P.get(pre + "router_b")), -1)
    idx = torch.topk(scores.detach(), m.top_k, -1).indices
    w = scores.gather(1, idx)
    w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(xs)
    for e in range(m.experts):
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if rows.numel():
            a = F.linear(xs[rows], P[pre + "expert_w1"][e], P[pre + "expert_b1"][e] if m.moe_bias else None)
            y = F.linear(_act(m, a, m.expert_width), P[pre + "expert_w2"][e],
                         P[pre + "expert_b2"][e] if m.moe_bias else None)
            out = out.index_add(0, rows, y * w[rows, slot].unsqueeze(1))
    if m.shared_experts:
        s = F.linear(_act(m, F.linear(xs, P[pre + "shared_w1"]), m.shared_width), P[pre + "shared_w2"])
        if m.shared_gate:
            s = s * torch.sigmoid(F.linear(xs, P[pre + "shared_gate"]))
        out = out + s
    return out.view_as(x)


def _layer(m: ModelConfig, P: dict, pre: str, x):
    g = lambda n: P.get(pre + n)  # noqa: E731
    b, s, _ = x.shape
    d = m.qk_head_dim
    q, k, v = F.linear(_norm(x, g("ln1_w"), g("ln1_b")), g("wqkv"), g("bqkv")).split([m.q_dim, m.kv_dim, m.kv_dim], -1)
    q, k, v = (t.reshape(b, s, -1, d).transpose(1, 2) for t in (q, k, v))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=m.n_kv_heads != m.heads)
    h1 = x + F.linear(a.transpose(1, 2).reshape(b, s, m.q_dim), g("wo"), g("bo"))
    ln2 = _norm(h1, g("ln2_w"), g("ln2_b"))
    if g("moe.router_w") is not None:
        return h1 + _moe(m, P, pre + "moe.", ln2)
    return h1 + F.linear(_act(m, F.linear(ln2, g("w1"), g("b1")), m.ffn), g("w2"), g("b2"))


def reference_loss(m: ModelConfig, P: dict, inputs, targets):
    """DeepSeek-V3 sec. 2.2 as Megatron-LM's multi_token_prediction.py computes it: module k embeds the tokens
    shifted left by k (0 past the end), concatenates [norm_e(emb); norm_h(h_{k-1})] (h_0 the last layer's output
    before the final norm), projects 2h -> h, runs its layer, its own final norm and the shared classifier against
    the labels shifted by k; positions past the end are masked out of its mean; the total is the main loss plus
    0.1 / D times the modules' losses."""
    V, S = m.vocab, inputs.shape[1]
    head = P["lm_head"] if "lm_head" in P else P["wte"]

    def ce(hid, pre, labels, mask=None):
        logits = _norm(hid, P[pre + "_w"], P.get(pre + "_b")) @ head[:V].t()
        loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none")
        return loss.mean() if mask is None else (loss * mask.reshape(-1)).sum() / mask.sum()

    x = F.embedding(inputs, P["wte"])
    for i in range(m.layers):
        x = _layer(m, P, f"layers.{i}.", x)
    total = ce(x, "lnf", targets)
    h, mtp = x, []
    for k in range(1, m.mtp_layers + 1):
        pre = f"mtp.{k - 1}."
        tok, lab = torch.zeros_like(inputs), torch.zeros_like(targets)
        tok[:, :S - k], lab[:, :S - k] = inputs[:, k:], targets[:, k:]
        mask = torch.zeros_like(inputs, dtype=x.dtype)
        mask[:, :S - k] = 1
        c = torch.cat([_norm(F.embedding(tok, P["wte"]), P[pre + "enorm_w"], P.get(pre + "enorm_b")),
                       _norm(h, P[pre + "hnorm_w"], P.get(pre + "hnorm_b"))], -1)
        h = _layer(m, P, pre + "layer.", F.linear(c, P[pre + "eh_proj"]))
        mtp.append(ce(h, pre + "norm", lab, mask))
    return total + SCALE / m.mtp_layers * sum(mtp)


def reference_grads(ex) -> tuple[float, dict[str, torch.Tensor]]:
    P = {n: p.detach().clone().requires_grad_(True) for n, p in ex.gpt.named_parameters()}
    inputs, targets = ex.data.batch_at(0)
    loss = reference_loss(ex.model, P, inputs, targets)
    grads = torch.autograd.grad(loss, list(P.values()), allow_unused=True)
    return float(loss.detach()), {n: (torch.zeros_like(P[n]) if g is None else g) for n, g in zip(P, grads)}


def max_rel_error(got: dict, want: dict) -> tuple[float, str]:
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    errs = {k: float((got[k] - want[k]).norm() / want[k].norm().clamp_min(1e-300)) for k in want
            if float(want[k].norm()) > 0 or float(got[k].norm()) > 0}
    k = max(errs, key=errs.get)
    return errs[k], k


# ------------------------------------------------------------------------------- one process
@pytest.mark.parametrize("name", list(MODELS))
def test_one_process_loss_and_every_gradient_match_the_reference(name):
    m = MODELS[name]
    with time_limit(60):
        loss, grads, ex = executor_grads(plan_for(m), dtype="fp64")
        want_loss, want = reference_grads(ex)
    assert any(n.startswith("mtp.") for n in grads), sorted(grads)
    assert abs(loss - want_loss) <= 1e-9 * abs(want_loss), (loss, want_loss)
    err, worst = max_rel_error(grads, want)
    assert err <= 1e-9, (name, worst, err)
    # every module parameter gets a gradient (the module is trained, not only run)
    assert all(float(grads[n].norm()) > 0 for n in grads if n.startswith("mtp.") and "expert" not in n), name


def test_fp32_within_1e5_and_the_main_policy_does_not_change_the_module():
    """fp32 at the brief's 1e-5; under MEMO (token-wise offload and recompute of the main layers) the modules'
    activations stay kept (store all), under full recompute the modules re-run: the result is the same."""
    with time_limit(60):
        loss, grads, ex = executor_grads(plan_for(MOE, "store_all"), dtype="fp32")
        want_loss, want = reference_grads(ex)
        assert abs(loss - want_loss) <= 1e-5 * abs(want_loss)
        assert max_rel_error(grads, want)[0] <= 1e-5
        for pol in ("memo", "full_recompute"):
            loss2, grads2, _ = executor_grads(plan_for(DENSE, pol), dtype="fp64")
            loss1, grads1, _ = executor_grads(plan_for(DENSE, "store_all"), dtype="fp64")
            assert abs(loss2 - loss1) <= 1e-12 * abs(loss1)
            assert max_rel_error(grads2, grads1)[0] <= 1e-12, pol


@pytest.mark.parametrize("name", list(MODELS))
def test_parameter_count_is_params_plus_mtp_params(name):
    m = MODELS[name]
    gpt = GPT(m, m.layers, torch.device("meta"), torch.float32)
    assert gpt.param_count() - vocab_padding_params(m) == m.params() + m.mtp_params() == m.trained_params()
    assert len(gpt.mtp) == m.mtp_layers
    assert all((mod.layer.moe is not None) == m.mtp_moe for mod in gpt.mtp), name


def test_memory_estimate_counts_the_modules_states_and_kept_activations():
    from memo_exec.mtp import mtp_kept_bytes
    from memo_exec.runner import Executor
    from memo_sim.cost.memory import mtp_activation_bytes, mtp_head_row_bytes

    with time_limit(60):
        plain = Executor(plan_for(dataclasses.replace(DENSE, mtp_layers=0)), RunOptions(device="cpu")).estimate.terms
        ex = Executor(plan_for(DENSE), RunOptions(device="cpu"))
        est = ex.estimate.terms
        ex.close()
    e = 4  # fp32 on CPU
    assert est["model_states"] - plain["model_states"] == DENSE.mtp_params() * e * 4  # weight, grad, two moments
    kept = mtp_kept_bytes(DENSE, BATCH, SEQ, torch.float32)
    assert est["classifier_peak"] - plain["classifier_peak"] >= kept > 0
    # the simulator's kept bytes (its skeletal tensors, lse and scores, 4h a token): the executor's also hold its
    # norm statistics, and a MoE block's graph as the executor's store all keeps it for every layer; where the last
    # layer is dense the module's is too, which the simulator prices as a MoE layer (as every layer of a MoE model)
    for m, tol in ((DENSE, 0.02), (MOE, 0.05), (MOE_DENSE_LAST, 0.2)):  # the rows apart (the classifier's own)
        sim = mtp_activation_bytes(m, Layout(), BATCH, SEQ) - mtp_head_row_bytes(m, Layout(), BATCH, SEQ)
        assert abs(mtp_kept_bytes(m, BATCH, SEQ, torch.float32) - sim) <= tol * sim, m.name


def step_run(plan, dtype: str = "fp64"):
    """(loss, every parameter's gradient, the step's `memo_exec.measure.StepRecord`) of one step without the
    optimizer on one process."""
    from memo_exec.runner import Executor

    ex = Executor(plan, RunOptions(device="cpu", dtype=dtype, steps=1))
    try:
        ex.allocate()
        rec = ex.step(0, optimizer=False)
        grads = {n: (ex.main_grads.main[p] if ex.main_grads is not None else p.grad).detach().clone()
                 for n, p in ex.gpt.named_parameters()}
    finally:
        ex.close()
    return rec.loss, grads, rec, ex


def module_recomputes(events) -> int:
    """The modules' spans (op ``mtp``) of phase ``recompute`` in a step's events: their re-run forwards."""
    return sum(1 for ev in events if ev.op == "mtp" and ev.phase == "recompute")


@pytest.mark.parametrize("name", ["dense-d2", "dense-rms-d1", "moe-d1", "moe-d2"])
def test_full_recompute_reruns_the_modules_with_the_store_all_loss_and_gradients(name):
    """Under full recompute each module keeps its two inputs and re-runs its norms, projection and layer forward
    before its backward (spans ``mtp`` of phase ``recompute``; none under store all); the loss and every gradient
    are store all's (fp64, 1e-12) and the reference's (1e-9)."""
    m = MODELS[name]
    with time_limit(60):
        loss, grads, rec, ex = step_run(plan_for(m, "full_recompute"))
        loss1, grads1, rec1, _ = step_run(plan_for(m, "store_all"))
        want_loss, want = reference_grads(ex)
    assert module_recomputes(rec.events) > 0 and module_recomputes(rec1.events) == 0, name
    assert abs(loss - loss1) <= 1e-12 * abs(loss1), (loss, loss1)
    err, worst = max_rel_error(grads, grads1)
    assert err <= 1e-12, (name, worst, err)
    assert abs(loss - want_loss) <= 1e-9 * abs(want_loss), (loss, want_loss)
    err, worst = max_rel_error(grads, want)
    assert err <= 1e-9, (name, worst, err)


def module_kept_bytes(m: ModelConfig, pol: str) -> int:
    """What the memory estimate counts for the modules under policy ``pol``: the classifier's peak less the same
    model's without modules (their kept activations, their final-normed rows and those rows' gradient, which the
    simulator counts too: `memo_sim.cost.memory.mtp_head_row_bytes`)."""
    from memo_exec.runner import Executor

    terms = [Executor(plan_for(model, pol), RunOptions(device="cpu")).estimate.terms
             for model in (m, dataclasses.replace(m, mtp_layers=0))]
    return terms[0]["classifier_peak"] - terms[1]["classifier_peak"]


def test_full_recompute_modules_keep_their_two_inputs_as_the_simulator_prices_them():
    """The modules' kept bytes under full recompute: the simulator's ``mtp_activation_bytes(recompute=True)`` (their
    two inputs, 2h a token) less its loss state (none for the executor's chunked loss), within the store-all
    comparison's tolerances, and fewer than under store all."""
    from memo_sim.cost.loss_kernels import loss_kernel
    from memo_sim.cost.memory import mtp_activation_bytes

    with time_limit(60):
        for m, tol in ((DENSE, 0.02), (MOE, 0.05), (MOE_DENSE_LAST, 0.2)):
            lay = plan_for(m).layout
            assert loss_kernel(lay.cross_entropy).kept_fp32 == 0  # the executor's chunked loss keeps no state
            loss_state = m.mtp_layers * BATCH * SEQ * m.vocab / lay.tp * loss_kernel(lay.cross_entropy).kept_fp32
            sim = mtp_activation_bytes(m, lay, BATCH, SEQ, recompute=True) - loss_state
            kept = module_kept_bytes(m, "full_recompute")
            assert abs(kept - sim) <= tol * sim, (m.name, kept, sim)
            assert kept < module_kept_bytes(m, "store_all"), m.name


# ------------------------------------------------------------------------------- gloo ranks
def run_plan(plan, steps: int = 0, before=None, after=None) -> dict:
    """One gloo rank's run of ``plan`` in fp64: step 0's loss and (rank 0) full gradients, then ``steps``
    optimizer steps' losses; ``before(ex)`` / ``after(ex)`` add their dicts' entries, read after allocation and
    after the steps (the pipeline tests' embedding copies and module counts)."""
    ctx = build_context(plan.layout, torch.device("cpu"))
    ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=max(1, steps)), ctx, DeviceSpec("cpu"))
    extra = before(ex) if before else {}
    ex.allocate()
    extra.update(after(ex, "allocated") if after else {})
    rec = ex.step(0, optimizer=False)
    grads = ex.full_gradients()
    losses = []
    if steps:
        ex.zero_grads()
        losses = [ex.step(k).loss for k in range(steps)]
    extra.update(after(ex, "stepped") if after else {})
    ex.close()
    return {"loss": rec.loss, "grads": grads if ctx.rank == 0 else None, "losses": losses,
            "recomputes": module_recomputes(rec.events), **extra}


def run_case(model: str, lay: dict, pol: str = "store_all", steps: int = 0, batch: int = 1, micro: int = 0) -> dict:
    return run_plan(plan_for(MODELS[model], pol, lay, batch=batch, micro=micro), steps)


def rank_cases(rank: int, world: int, cases) -> list:
    return [run_case(**c) for c in cases]


TWO = [dict(model="dense-d2", lay=dict(tp=2, sp=True), steps=10),
       dict(model="dense-rms-d1", lay=dict(tp=2, sp=False), pol="memo"),
       dict(model="dense-d2", lay=dict(cp=2), pol="memo"),
       dict(model="dense-rms-d1", lay=dict(ulysses=2), pol="full_recompute"),
       dict(model="dense-d2", lay=dict(dp=2, zero=3)),
       dict(model="moe-d1", lay=dict(dp=2, ep=2)),
       dict(model="moe-d2", lay=dict(tp=2, sp=True, ep=2), pol="memo"),
       dict(model="moe-dense-last-d2", lay=dict(dp=2, ep=2, zero=2)),
       dict(model="dense-d2", lay=dict(tp=2, sp=True), batch=2, micro=1),  # two micro-batches accumulated
       dict(model="dense-rms-d1", lay=dict(dp=2, zero=3, dp_mode="fsdp", reshard_after_forward=False))]


def test_two_gloo_ranks_match_the_single_process_run():
    results = spawn(rank_cases, 2, TWO, timeout=150)
    for i, case in enumerate(TWO):
        replicas = case["lay"].get("dp", 1)
        plan = plan_for(MODELS[case["model"]], case.get("pol", "store_all"), batch=case.get("batch", 1) * replicas)
        loss, want, losses = one_process_run(plan, case.get("steps", 0))
        got = [r[i] for r in results]
        what = f"{case['model']} {case['lay']} {case.get('pol', 'store_all')}"
        assert all(abs(r["loss"] - loss) <= 1e-9 * abs(loss) for r in got), (what, [r["loss"] for r in got], loss)
        err, worst = max_rel_error(got[0]["grads"], want)
        assert err <= 1e-9, (what, worst, err)
        assert len(got[0]["losses"]) == case.get("steps", 0)
        for a, b in zip(got[0]["losses"], losses, strict=True):  # 10 steps follow the single process's losses
            assert abs(a - b) <= 1e-7 * abs(b), (what, got[0]["losses"], losses)


def test_modules_rerun_draw_random_routing_as_their_forward():
    """Under full recompute a module's MoE layer keeps no routing and re-runs its block before the backward: a
    routing keyed by the model layer (`memo_exec.moe.balance`'s random) must draw there as the forward drew, so the
    gradients are store all's (which keeps the block's graph)."""
    with time_limit(60):
        runs = {pol: executor_grads(plan_for(MODELS["moe-d2"], pol, {"moe_balance": "random"}, batch=1),
                                    dtype="fp64") for pol in ("store_all", "full_recompute")}
    (loss, want, _), (got_loss, got, _) = runs["store_all"], runs["full_recompute"]
    assert abs(got_loss - loss) <= 1e-12 * abs(loss)
    err, worst = max_rel_error(got, want)
    assert err <= 1e-10, (worst, err)


RECOMPUTE = [dict(model="dense-d2", lay=dict(tp=2, sp=True), pol="full_recompute"),
             dict(model="moe-d2", lay=dict(tp=2, sp=True, ep=2), pol="full_recompute")]  # routed again, all-to-all


def test_two_gloo_ranks_rerun_the_modules_under_full_recompute_as_the_single_process():
    """tp2 with sequence parallelism under full recompute (a dense model, and a MoE one with ep2): every rank re-runs
    its modules (its projections' collectives, its layers' shards, the MoE block's routing and all-to-alls) and the
    loss and every gradient are the single process's (fp64, 1e-9)."""
    results = spawn(rank_cases, 2, RECOMPUTE, timeout=90)
    for i, case in enumerate(RECOMPUTE):
        loss, want, _ = one_process_run(plan_for(MODELS[case["model"]], case["pol"], batch=1))
        got = [r[i] for r in results]
        assert all(r["recomputes"] > 0 for r in got), [r["recomputes"] for r in got]
        assert all(abs(r["loss"] - loss) <= 1e-9 * abs(loss) for r in got), ([r["loss"] for r in got], loss)
        err, worst = max_rel_error(got[0]["grads"], want)
        assert err <= 1e-9, (case, worst, err)


# ------------------------------------------------------------------------------- plans memo-sim writes
def test_memo_exec_runs_the_plan_memo_sim_writes_with_mtp_layers(tmp_path):
    from memo_exec.cli import cli as exec_cli
    from memo_sim.cli import cli as sim_cli

    flags = ["--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128", "--layers", "2", "--policy", "memo",
             "--alpha", "0.5", "--mtp-layers", "1", "--dtype", "fp32", "--seq", "256", "--jobs", "1", "--gpus", "1"]
    with time_limit(90):
        r = CliRunner().invoke(sim_cli, ["whatif", *flags, "--out", str(tmp_path / "plan")])
        assert r.exit_code == 0, r.output[-800:]
        assert "memo-exec refuses" not in r.output, r.output
        r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "plan" / "plan.json"), "--device", "cpu", "--steps",
                                          "2", "--out", str(tmp_path / "run"), "--json"])
    assert r.exit_code == 0, r.output[-1500:]
    import json

    meta = json.loads((tmp_path / "run" / "measured.json").read_text())
    text = json.dumps(meta)
    assert '"mtp_layers": 1' in text, text[:2000]


def test_a_pipeline_with_modules_runs_and_another_schedule_is_refused_in_one_line():
    """A micro-batch pipeline runs the modules on its last stage (`tests.test_exec_mtp_pipeline`); a schedule the
    executor does not run them in (SPPO) is refused in one line naming the field."""
    from memo_exec.errors import ExecError
    from memo_exec.runner import run_model

    plan = plan_for(DENSE, lay=dict(pp=2))
    plan.schedule = "1f1b"
    assert run_model(plan, RunOptions(device="cpu")).mtp_layers == 2
    plan.schedule = "sppo"
    with pytest.raises(ExecError, match=r"mtp_layers = 2 under schedule sppo") as e:
        run_model(plan, RunOptions(device="cpu"))
    assert "\n" not in str(e.value)
