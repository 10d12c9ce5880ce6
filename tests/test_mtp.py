"""Multi-token prediction priced (`ModelConfig.mtp_layers`: DeepSeek-V3's and GLM-4.5's num_nextn_predict_layers,
Megatron-LM's --mtp-num-layers): each module a layer of the last layer's kind, a 2h -> h projection, three norms and a
second pass of the classifier and loss, on the last pipeline stage; its parameters trained beside the model's. It was
named and neither counted nor priced (a user's review: DeepSeek-V3 and GLM-4.5 train with it)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost import collectives as coll
from memo_sim.cost.activations import skeletal_bytes, tokens_per_gpu
from memo_sim.cost.boundary import boundary_times
from memo_sim.cost.kernel_time import gemm_bytes, gemm_time, memory_bound_time
from memo_sim.cost.layer_time import backward_costs, critical_time, forward_costs
from memo_sim.cost.memory import classifier_peak_bytes, model_state_bytes, mtp_activation_bytes
from memo_sim.cost.sppo import stage_model_state_bytes, stage_params
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS, get_model
from memo_sim.model.flops import model_flops_per_iteration
from memo_sim.profile.loader import load_profile
from memo_sim.search.frameworks import get_framework

H100 = load_profile("h100-sxm5-80gb")
DS = PRESETS["deepseek-v3"]
NO_MTP = replace(DS, mtp_layers=0)
LAY = Layout(tp=2, sp=True, ep=8, dp=8)


def test_the_module_is_a_layer_a_projection_and_a_second_head_on_the_time_of_the_head():
    with_, without = boundary_times(DS, LAY, 1, 4096, H100), boundary_times(NO_MTP, LAY, 1, 4096, H100)
    assert without.mtp == 0 and with_.classifier == pytest.approx(without.classifier + with_.mtp)
    layer = (critical_time(forward_costs(DS, LAY, 1, 4096, H100))
             + critical_time(backward_costs(DS, LAY, 1, 4096, H100)))
    toks, h = tokens_per_gpu(LAY, 1, 4096), DS.hidden
    flops = 2 * toks * 2 * h * h / LAY.tp  # forward, data gradient, weight gradient: each its operands' bytes
    proj = sum(gemm_time(flops, H100, "bf16", gemm_bytes(m, n, k, 2))
               for m, n, k in ((toks, h / LAY.tp, 2 * h), (toks, 2 * h, h / LAY.tp), (2 * h, h / LAY.tp, toks)))
    norms = memory_bound_time(15 * toks * h * 2, H100)
    assert with_.mtp == pytest.approx(layer + proj + _projection_comm(LAY, toks) + norms + without.classifier
                                      + without.embedding)
    assert with_.mtp > layer + without.classifier  # DeepSeek-V3's 129K vocabulary: the head about as long as the layer
    two = boundary_times(replace(DS, mtp_layers=2), LAY, 1, 4096, H100)
    assert two.mtp == pytest.approx(2 * with_.mtp)
    assert with_.optimizer > without.optimizer  # the module's states are stepped too


def _projection_comm(lay, toks, forward_only=False):
    """Megatron's module projection under TP with SP: forward the [T, 2h] input and the [T, h / tp] output
    all-gathered; backward the output gradient all-gathered along the sequence, the input re-gathered, its
    gradient reduce-scattered."""
    row, link = toks * DS.hidden * 2, H100.nvlink
    ag = lambda n: coll.ring_allgather_time(n, lay.tp, *coll.link_params(link, "all_gather"))  # noqa: E731
    fwd = ag(2 * row) + ag(row)
    if forward_only:
        return fwd
    return fwd + ag(row) + ag(2 * row) + coll.ring_reduce_scatter_time(
        2 * row, lay.tp, *coll.link_params(link, "reduce_scatter"))


def test_the_projection_runs_in_the_layers_gemm_format_and_gathers_over_tp():
    """Megatron-LM runs ``eh_proj`` inside the FP8 context and splits it as a column-parallel linear whose output is
    gathered: an FP8 recipe makes the module cheaper by the projection's GEMMs, and tensor parallelism adds its
    collectives (all-reduce of the input gradient without sequence parallelism). The module's layer is compared apart:
    DeepSeek-V3's MoE layer at EP 8 runs 32 local experts of 520 tokens, whose FP8 GEMMs on the measured curve gain
    less than their casts cost."""
    from memo_sim.cost.layer_time import backward_costs, forward_costs
    from memo_sim.cost.opcost import critical_time

    fp8 = replace(DS, gemm_format="fp8-tensorwise")

    def outside_the_layer(m) -> float:
        layer = critical_time(forward_costs(m, LAY, 1, 4096, H100)) + critical_time(backward_costs(m, LAY, 1, 4096,
                                                                                                   H100))
        return boundary_times(m, LAY, 1, 4096, H100).mtp - layer

    assert outside_the_layer(fp8) < outside_the_layer(DS)
    from memo_sim.cost.boundary import mtp_projection_comm

    toks = tokens_per_gpu(LAY, 1, 4096)
    assert sum(mtp_projection_comm(DS, LAY, toks, H100)) == pytest.approx(_projection_comm(LAY, toks))
    no_sp = replace(LAY, sp=False)
    row = toks * DS.hidden * 2
    want = (coll.ring_allgather_time(row, 2, *coll.link_params(H100.nvlink, "all_gather")),
            coll.allreduce_time(2 * row, 2, *coll.link_params(H100.nvlink, "all_reduce")))
    assert mtp_projection_comm(DS, no_sp, toks, H100) == pytest.approx(want)
    assert mtp_projection_comm(DS, replace(LAY, tp=1, sp=False), toks, H100) == (0.0, 0.0)
    # the input's re-gather beside the backward GEMMs where the layout overlaps SP's re-gathers (Megatron's)
    over = replace(LAY, sp_regather_overlap=True)
    fwd, bwd = mtp_projection_comm(DS, LAY, toks, H100, beside=1e-4)
    regather = coll.ring_allgather_time(2 * row, 2, *coll.link_params(H100.nvlink, "all_gather"))
    assert mtp_projection_comm(DS, over, toks, H100, beside=1e-4) == pytest.approx((fwd, bwd - min(regather, 1e-4)))
    assert boundary_times(DS, over, 1, 4096, H100).mtp < boundary_times(DS, LAY, 1, 4096, H100).mtp


def test_its_activations_live_with_the_head_and_its_states_on_the_last_stage():
    sk = skeletal_bytes(DS, LAY, 1, 4096)
    toks = tokens_per_gpu(LAY, 1, 4096)
    # its layer's tensors, the projection's inputs, its final-normed rows and their gradient (bf16 under memo's loss)
    kept = sk["total"] + sk["lse"] + sk["scores"] + toks * 4 * DS.hidden * 2 + toks * DS.hidden * (2 + 2)
    assert mtp_activation_bytes(DS, LAY, 1, 4096) == pytest.approx(kept)
    assert mtp_activation_bytes(NO_MTP, LAY, 1, 4096) == 0
    assert classifier_peak_bytes(DS, LAY, 1, 4096) == pytest.approx(classifier_peak_bytes(NO_MTP, LAY, 1, 4096) + kept)
    pipe = Layout(tp=2, sp=True, ep=8, pp=4, dp=2, first_stage_layers=16)
    assert stage_params(DS, pipe, 0) == stage_params(NO_MTP, pipe, 0)
    # the module and a copy of the (untied) embedding it reads, where Megatron builds it (pre_process or mtp_process)
    assert stage_params(DS, pipe, 3) == stage_params(NO_MTP, pipe, 3) + DS.mtp_params() + DS.vocab * DS.hidden
    assert stage_model_state_bytes(DS, pipe, 3) > stage_model_state_bytes(NO_MTP, pipe, 3)
    assert stage_model_state_bytes(DS, pipe, 1) == stage_model_state_bytes(NO_MTP, pipe, 1)
    assert model_state_bytes(DS, LAY) > model_state_bytes(NO_MTP, LAY)  # one stage: the module beside the layers


def test_mfu_counts_the_module_as_megatron_counts_it():
    """training.py counts an MTP layer as one more layer of the last layer's kind, its projection and norms, and the
    logits (1 + mtp_num_layers) times."""
    extra = model_flops_per_iteration(DS, 1, 4096) - model_flops_per_iteration(NO_MTP, 1, 4096)
    per_token = 6 * (DS.mtp_active_params() + DS.vocab * DS.hidden)
    assert extra == pytest.approx(4096 * per_token + 6 * DS.attention_width * 4096 ** 2)
    assert DS.mtp_active_params() < DS.mtp_params() / 10  # 8 of the layer's 256 routed experts


def test_frameworks_that_do_not_train_it_price_their_runs_without_it_and_say_so():
    assert get_framework("megatron").for_model(DS).mtp_layers == 1
    m = get_framework("torchtitan").for_model(DS)
    assert m.mtp_layers == 0 and "multi-token prediction (1 module): torchtitan does not train it" in m.not_modelled
    # DeepSpeed builds none of DeepSeek-V3's MoE layers as the model has them: refused whole, in one line
    from memo_sim.errors import MemoError

    with pytest.raises(MemoError, match="deepspeed's MoE layers"):
        get_framework("deepspeed").for_model(DS)


def _whatif(tmp_path, *extra):
    return CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--layers", "4", "--gpus", "8", "--seq", "4K",
                                    "--profile", "h100-sxm5-80gb", "--ep", "4", "--pp", "2", "--schedule", "1f1b",
                                    "--policy", "store_all", "--batch", "4", "--micro-batch", "1", "--json", "--out",
                                    str(tmp_path / "o"), *extra])


def test_the_last_stage_runs_it_in_every_micro_batch_and_the_flag_drops_it(tmp_path):
    """Qwen3-30B-A3B with an MTP module given (--mtp-layers 1; the config has none) at PP 2, 4 micro-batches: the
    simulated step grows by about the module's time in each micro-batch on the last stage, the JSON names its
    parameters and --mtp-layers 0 is the model without."""
    import json

    runs = {}
    for n in ("0", "1"):
        r = _whatif(tmp_path / n, "--mtp-layers", n)
        assert r.exit_code == 0, r.output
        runs[n] = json.loads(r.stdout)
    m = replace(get_model("qwen3-30b-a3b"), layers=4, mtp_layers=1)
    assert runs["1"]["model"]["mtp_params"] == m.mtp_params() > 0 and runs["0"]["model"]["mtp_params"] == 0
    assert any("multi-token prediction (1 module" in note for note in runs["1"]["model"]["notes"])
    t0, t1 = (runs[n]["candidates"][0]["simulated_iteration_s"] for n in ("0", "1"))
    lay = Layout(ep=4, pp=2, dp=4)
    mtp = boundary_times(m, lay, 1, 4096, H100).mtp
    assert 3 * mtp < t1 - t0 < 5 * mtp, (t0, t1, mtp)
    from memo_sim.plan.schema import read_plan

    from memo_sim.search.estimate import stage_shard

    plan = read_plan(tmp_path / "1" / "o" / "plan.json")  # a stage's GPU as the pipeline prices it (a review)
    own = boundary_times(plan.model, stage_shard(plan.layout), plan.micro_batch, plan.seq_tokens, H100).mtp
    ex = CliRunner().invoke(cli, ["explain", str(tmp_path / "1" / "o" / "plan.json"), "--json"])
    assert ex.exit_code == 0 and json.loads(ex.output)["mtp_s_per_micro_batch"] == pytest.approx(own), ex.output
    ex = CliRunner().invoke(cli, ["explain", str(tmp_path / "1" / "o" / "plan.json")])
    assert "classifier: the 1 multi-token-prediction module included" in ex.output, ex.output


def test_the_executor_runs_modules_on_one_stage_and_on_pipelines_and_refuses_sppo_in_one_line():
    from memo_sim.export.base import mtp_gap, nearest_model
    from memo_sim.plan.executor_scope import plan_why_not
    from memo_sim.policy import get_policy

    qwen = replace(get_model("qwen3-30b-a3b"), layers=4, mtp_layers=1)
    store = get_policy("store_all")
    assert plan_why_not(qwen, Layout(ep=4, dp=4), store, "single_stage", 4, 1, 4096) is None
    assert plan_why_not(qwen, Layout(ep=2, pp=2, dp=2), store, "1f1b", 4, 1, 4096) is None
    from memo_sim.policy.sppo import Sppo

    dense = replace(get_model("gpt-7b"), layers=4, mtp_layers=1)
    why = plan_why_not(dense, Layout(pp=2), Sppo(None, subseqs=4, multiplex=False), "sppo", 1, 1, 4096)
    assert why.startswith("plan model gpt-7b") and "mtp_layers = 1 under schedule sppo" in why
    assert "--mtp-layers 0" in why

    class _Plan:  # what the gap reads of a plan
        model = DS
        layout = LAY

    gaps = mtp_gap(_Plan, "torchtitan", "why")
    assert len(gaps) == 1 and gaps[0].change.mtp_layers == 0 and nearest_model(_Plan, gaps).mtp_layers == 0
    assert mtp_gap(_Plan, "megatron", "why") == []


def test_full_recompute_reruns_the_module_and_a_split_loss_keeps_its_state_meanwhile():
    """A review against Megatron-LM: under full uniform recompute it checkpoints the module (multi_token_prediction.py
    `_checkpointed_forward`): one more layer forward, only its two inputs kept; and the module's loss runs in the
    forward, before the main head's, its fp32 softmax kept for the backward (cross_entropy.py save_for_backward)
    while the main head peaks: 4 bytes per logit with Megatron's vocab_parallel loss, none with memo's chunked one."""
    from memo_sim.cost.memory import classifier_peak_bytes

    lay = replace(LAY, cross_entropy="vocab_parallel")
    toks = tokens_per_gpu(lay, 1, 4096)
    loss = toks * DS.vocab / lay.tp * 4
    rows = toks * DS.hidden * (2 + 2)  # the module's final-normed rows and their gradient, as the model's
    sk = skeletal_bytes(DS, lay, 1, 4096)
    stored = sk["total"] + sk["lse"] + sk["scores"] + toks * 4 * DS.hidden * 2
    assert mtp_activation_bytes(DS, lay, 1, 4096) == pytest.approx(stored + loss + rows)
    assert mtp_activation_bytes(DS, lay, 1, 4096, recompute=True) == pytest.approx(
        toks * 2 * DS.hidden * 2 + loss + rows)
    assert mtp_activation_bytes(DS, LAY, 1, 4096) == pytest.approx(stored + rows)  # memo's chunked loss keeps nothing
    assert classifier_peak_bytes(DS, lay, 1, 4096, recompute_mtp=True) < classifier_peak_bytes(DS, lay, 1, 4096)
    kept, rerun = boundary_times(DS, LAY, 1, 4096, H100), boundary_times(DS, LAY, 1, 4096, H100, recompute_mtp=True)
    h = DS.hidden  # the layer's forward, the projection's forward GEMM and the norms' forward passes again
    proj = gemm_time(2 * toks * 2 * h * h / LAY.tp, H100, "bf16", gemm_bytes(toks, h / LAY.tp, 2 * h, 2))
    again = (critical_time(forward_costs(DS, LAY, 1, 4096, H100)) + proj + _projection_comm(LAY, toks, True)
             + memory_bound_time(6 * toks * h * 2, H100))
    assert rerun.mtp - kept.mtp == pytest.approx(again)


@pytest.mark.slow  # 38 s of the default selection (CI, 2026-11-29): the slow one runs beside it with time to spare
def test_a_framework_that_leaves_the_module_out_says_so_in_the_header_json_and_layout_errors(tmp_path):
    import json

    base = ["whatif", "--model", "glm-4.5-air", "--layers", "4", "--gpus", "8", "--seq", "4K", "--profile",
            "h100-sxm5-80gb", "--policy", "store_all", "--no-plan"]
    r = CliRunner().invoke(cli, [*base, "--framework", "torchtitan", "--json"])
    assert r.exit_code in (0, 3), r.output
    model = json.loads(r.stdout)["model"]
    assert model["mtp_layers"] == 0 and model["mtp_params"] == 0
    assert any("torchtitan does not train it" in n for n in model["notes"]), model["notes"]
    r = CliRunner().invoke(cli, [*base, "--framework", "torchtitan", "--pp", "2",
                                 "--pipeline-model-parallel-layout", "Et*2|t*2mL"])
    assert r.exit_code == 2 and "torchtitan trains no multi-token-prediction module" in r.output, r.output
    r = CliRunner().invoke(cli, [*base, "--framework", "megatron", "--pp", "2",
                                 "--pipeline-model-parallel-layout", "Et*2|t*2mL"])
    assert r.exit_code in (0, 3) and "+ " in r.output.splitlines()[1], r.output  # the module in the header


def test_a_config_asking_for_too_many_modules_is_refused_under_its_own_key(tmp_path):
    import json

    from memo_sim.errors import MemoError

    cfg = json.loads((Path(__file__).parent / "data/hf/deepseek-v3/config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 99}))
    with pytest.raises(MemoError, match="num_nextn_predict_layers: 99 modules: memo models at most 16"):
        get_model(str(tmp_path / "config.json"))
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 2}))
    assert get_model(str(tmp_path / "config.json")).mtp_layers == 2


def test_the_modules_gradients_are_reduced_with_the_last_bucket():
    """The overlapped gradient reduction left the modules' gradients out (it reduced each layer's bucket and the
    embedding's; only the serial, all-at-once reduction counted them): a review."""
    from memo_sim.cost.grad_sync import grad_sync

    with_, without = grad_sync(DS, LAY, H100), grad_sync(NO_MTP, LAY, H100)
    assert without.mtp_grad == 0 and with_.mtp_grad > with_.layer_grad  # a MoE layer, a projection, its norms
    assert with_.embedding_grad == without.embedding_grad and with_.layer_grad == without.layer_grad
    from memo_sim.api import simulate
    from memo_sim.policy import get_policy

    lay, t, bt = Layout(dp=16, zero=1), {}, {}
    for n in (0, 1):
        m = replace(get_model("llama-3.1-8b"), layers=4, mtp_layers=n)
        t[n] = simulate(m, lay, 1, 1024, get_policy("store_all"), H100).iteration_s
        bt[n] = boundary_times(m, lay, 1, 1024, H100)
    # the step grows by the module's compute, its optimizer step and its bucket, reduced after the backward, and by
    # as much of its weights' gather before the head as four short layers do not hide
    grown = t[1] - t[0] - bt[1].mtp - (bt[1].optimizer - bt[0].optimizer)
    sync = grad_sync(m, lay, H100)
    assert 0.95 * sync.mtp_grad <= grown <= 1.05 * (sync.mtp_grad + sync.mtp_gather), (grown, sync)


def test_zero_gathers_the_modules_weights_before_the_head():
    """From ZeRO-1 on the modules' weights are all-gathered as a layer's are (`GradSync.mtp_gather`: the dense part
    over the data group, the routed experts over their replicas), before the head op that runs the modules; twice
    under ZeRO-3 (again before their backward, inside that op); on a pipeline's last stage once an iteration."""
    from memo_sim.cost.grad_sync import grad_sync
    from memo_sim.cost.sppo import stage_grad_sync
    from memo_sim.engine.simulate import simulate
    from memo_sim.policy import get_policy

    qwen = replace(get_model("qwen3-30b-a3b"), layers=4, mtp_layers=1)
    store = get_policy("store_all")
    assert grad_sync(qwen, Layout(ep=4, dp=8), H100).mtp_gather == 0.0  # no ZeRO: nothing gathered
    for zero in (1, 3):
        lay = Layout(ep=4, dp=8, zero=zero)
        sync = grad_sync(qwen, lay, H100)
        assert sync.mtp_gather > 0
        assert grad_sync(replace(qwen, mtp_layers=0), lay, H100).mtp_gather == 0.0
        r = simulate(qwen, lay, 1, 4096, store, H100, record=True, keep_timeline=False)
        heads = [o for o in r.ops if o.name == "allgather_weights" and o.layer is None]
        assert len(heads) == 1
        assert heads[0].end - heads[0].start >= (2 if zero == 3 else 1) * sync.mtp_gather * (1 - 1e-9)
        cls = next(o for o in r.ops if o.name == "classifier")
        assert cls.start >= heads[0].end - 1e-12
    lay = Layout(ep=2, pp=2, dp=4, zero=1)
    r = simulate(qwen, lay, 4, 4096, store, H100, schedule="1f1b", micro_batch=1, record=True, keep_timeline=False)
    heads = [o for o in r.ops if o.name == "allgather_weights" and o.layer is None]
    assert [o.device for o in heads] == [1] and stage_grad_sync(qwen, lay, H100).mtp_gather > 0


def test_interleaved_last_chunk_keeps_each_micro_batchs_module_activations():
    """The modules' activations live from the head to the micro-batch's backward step (they run backward first in
    it, as Megatron-LM's and memo-exec's do): on the last stage one set per micro-batch in flight on the last chunk,
    one under interleaved 1F1B at m = pp as at m = 3 pp (its warm-up, (p - s - 1) x 2 + (v - 1) x p forwards, runs
    the last stage's first chunk only, as Megatron-LM's since 4295be1a6c; before, every forward warmed up at m = pp
    and the last chunk held pp sets). Simulated and analytic (`pipeline_memory`) peaks agree."""
    from memo_sim.cost.memory import mtp_activation_bytes
    from memo_sim.engine.simulate import simulate
    from memo_sim.policy import get_policy
    from memo_sim.search.estimate import stage_shard
    from memo_sim.search.pipeline import pipeline_memory

    store, lay = get_policy("store_all"), Layout(pp=4, vpp=2)
    base = replace(get_model("llama-3.1-8b"), layers=8)
    grown = {}
    for m in (4, 12):
        peak = {}
        for mtp in (0, 1):
            model = replace(base, mtp_layers=mtp)
            r = simulate(model, lay, m, 4096, store, H100, schedule="interleaved_1f1b", micro_batch=1,
                         keep_timeline=False)
            rows = pipeline_memory(model, lay, m, 1, 4096, store, H100, "interleaved_1f1b")[1]
            peak[mtp] = r.pipeline["stages"][3]["peak_gpu_bytes"]
            assert peak[mtp] == pytest.approx(rows[3]["peak_gpu_bytes"])
        grown[m] = peak[1] - peak[0]
    kept = mtp_activation_bytes(replace(base, mtp_layers=1), stage_shard(lay), 1, 4096)
    assert grown[4] == pytest.approx(grown[12]) and grown[4] >= kept


TOY_MTP = ("name: toy\nlayers: 4\nhidden: 256\nheads: 4\nkv_heads: 2\nffn: 512\nvocab: 1024\nffn_type: swiglu\n"
           "norm: rmsnorm\nbias: none\ntied_embeddings: false\nmtp_layers: 1\n")


def test_user_review_answers_name_the_modules_and_the_sum(tmp_path):
    """A user review (2026-11-28): a framework that leaves the modules out is compared naming them (its ratio
    includes them); --schedule sppo with modules gets SPPO's own refusal; --pp under a framework without
    pipelines does not send the user to a schedule it refuses; explain names the end stages' embedding sum and
    counts the wait for the other end stage as pipeline time, not data-parallel traffic."""
    toy = tmp_path / "toy.yaml"
    toy.write_text(TOY_MTP)
    base = ["whatif", "--model", str(toy), "--gpus", "2", "--seq", "1K", "--profile", "h100-sxm5-80gb"]
    r = CliRunner().invoke(cli, base + ["--framework", "deepspeed", "--no-plan"])
    assert r.exit_code == 0, r.output
    assert "the ratio includes the 1 module of multi-token prediction memo's side trains and deepspeed's leaves out" \
        in r.output
    r = CliRunner().invoke(cli, base + ["--schedule", "sppo", "--no-plan"])
    assert r.exit_code == 2 and "--schedule sppo: sppo's pieces price no multi-token-prediction module" in r.output
    r = CliRunner().invoke(cli, base + ["--framework", "deepspeed", "--pp", "2", "--no-plan"])
    assert r.exit_code == 2 and "drop --pp" in r.output and "--schedule" not in r.output.split(";")[-1]
    r = CliRunner().invoke(cli, base + ["--pp", "2", "--tp", "1", "--schedule", "1f1b", "--global-batch", "4",
                                        "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["explain", str(tmp_path / "p" / "plan.json")])
    assert r.exit_code == 0, r.output
    assert "waiting on the first and last stages' sum of the shared embedding's gradient" in r.output
