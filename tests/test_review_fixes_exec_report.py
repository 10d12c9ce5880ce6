"""Review fixes in memo-exec's report and the simulator's model-state terms it compares with:

1. ``memo-exec run --profile P``: the per-layer rows and ``layers.png`` priced from the plan's stored
   ``layer_timings_s`` (another profile's) beside iteration rows from the re-simulation on P;
2. optimizer offload with the fp32 recipe: the simulator counted 12 B/param on the host, memo-exec holds 16;
3. MoE under ZeRO-2 with ep = dp: the simulator's unsharded gradient workspace counted the experts (whose
   expert-data-parallel group is one rank) and left out the untied head;
4. ``memo-exec validate``'s divisibility message named ``--seq``, an option validate does not have;
5. the 'Per rank' table's tokens column is one micro-batch's share, not the iteration's.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from memo_exec.cli import cli
from memo_sim.policy import get_policy
from memo_sim.plan.schema import write_plan
from tests.exec_helpers import make_plan, time_limit
from tests.test_exec_cli import LT, PRED  # the plan's predicted values and layer timings the CLI tests use
from memo_sim.model.config import ModelConfig

torch.set_num_threads(1)

SMALL = ModelConfig("review-test", 2, 64, 4, 256, vocab=128)


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(240):
        yield


# --- 1. --profile: every predicted value from the one re-simulation --------------------------------------------

def test_profile_run_prices_the_layer_rows_and_layers_png_from_the_re_simulation(tmp_path, monkeypatch):
    """A review: 'layer forward' 0.000163 s (the plan's A800 layer_timings_s) beside a per-op table and an
    iteration time re-simulated on H100 (0.000124 s), +9592.7% with a calibrated CPU profile."""
    import memo_exec.report as R
    from memo_exec.compare import resimulate

    drawn = []
    real = R.layer_figure
    monkeypatch.setattr(R, "layer_figure", lambda pred, *a, **kw: drawn.append((dict(pred), kw)) or real(pred, *a,
                                                                                                        **kw))
    plan = make_plan(SMALL, 128, get_policy("memo", 0.3), predicted=PRED, layer_timings=LT, chunk=64,
                     profile="a800-80gb")
    p = write_plan(plan, tmp_path / "plan.json")
    r = CliRunner().invoke(cli, ["run", str(p), "--device", "cpu", "--steps", "2", "--out", str(tmp_path / "o"),
                                 "--profile", "h100-sxm5-80gb", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = {row["quantity"]: row for row in doc["totals"]}
    plan.profile = "h100-sxm5-80gb"
    sim, _ = resimulate(plan, SMALL.layers)
    for q, k in (("layer forward", "forward"), ("layer backward", "backward"), ("layer offload (d2h)", "offload")):
        assert rows[q]["predicted"] == pytest.approx(sim.layer_timings[k]) != LT[k], q
        assert "re-simulation" in rows[q]["predicted_from"] and "--profile" in rows[q]["predicted_from"]
    assert drawn and drawn[0][0]["forward"] == pytest.approx(sim.layer_timings["forward"])
    assert "--profile" in drawn[0][1]["predicted_from"]


def test_without_profile_the_layer_rows_stay_the_plans():
    """No --profile and a plan that is not stale: the plan's own stored layer timings, named as such."""
    from types import SimpleNamespace as NS

    from memo_exec.report import predicted_layer_timings

    plan = NS(layer_timings_s=LT, profile="a800-80gb")
    assert predicted_layer_timings(plan, {"layer_timings_s": {"forward": 1.0}}, None, False, "") == \
        (LT, "plan.layer_timings_s")
    lt, said = predicted_layer_timings(plan, {}, None, True, "the simulator refused the plan (x)")
    assert lt == {} and said.startswith("not predicted with --profile a800-80gb")


# --- 2. optimizer offload: the host's fp32 weights whatever the recipe -------------------------------------------

@pytest.mark.parametrize("dtype,precision", [("fp32", None), ("bf16", "megatron"), ("bf16", "zero")])
def test_offloaded_optimizer_host_bytes_are_what_host_adamw_holds(dtype, precision):
    """A review: under the fp32 recipe the simulator counted 12 B/param on the host (no master copy) while
    memo-exec's HostAdamW holds 16 (its own fp32 weights, the gradient copy and two moments), so a run read
    host memory +33.3%; the bf16 recipes' 16 stay as they were."""
    import dataclasses

    from memo_exec.optim_offload import HostAdamW
    from memo_sim.cost.optimizer_offload import host_state_bytes
    from memo_sim.cost.param_split import GpuParams
    from memo_sim.layout.parallel import Layout

    model = dataclasses.replace(SMALL, dtype=dtype, precision=precision)
    layout = Layout(optimizer_offload=True)
    n = 1000
    want = HostAdamW.host_bytes_for(n, torch.float32 if dtype == "fp32" else torch.bfloat16)
    assert host_state_bytes(model, layout, GpuParams(local=n, sharded=n)) == want == 16 * n
    p = torch.nn.Parameter(torch.zeros(n, dtype=torch.float32 if dtype == "fp32" else torch.bfloat16))
    opt = HostAdamW([p])
    p.grad = torch.ones_like(p)
    opt.step()  # the moments exist after the first step
    assert opt.host_state_bytes() == want


# --- 3. MoE under ZeRO 2 with ep = dp: the experts' group of one shards nothing -----------------------------------

def _small_mixtral():
    import dataclasses

    from memo_sim.model.config import PRESETS

    # `memo-sim whatif --model mixtral-8x7b --layers 2 --hidden 256 --heads 8 --kv-heads 4 --vocab 512 --dtype fp32`
    return dataclasses.replace(PRESETS["mixtral-8x7b"], name="mixtral-8x7b-custom", layers=2, hidden=256, heads=8,
                               ffn=896, vocab=512, kv_heads=4, dtype="fp32")


def test_zero2_moe_with_ep_equal_dp_model_states_are_the_executors():
    """A review: with ep = dp = 2 under ZeRO 2 the simulator's model states were 107,018,752 bytes, memo-exec's
    96,534,016 (its run's model_states row): the unsharded gradients counted the experts, which a group of one
    rank never shards (their whole gradients are already the ``grads`` part), and only one vocab share of the
    untied embedding + head unit."""
    from memo_sim.cost.memory import model_state_parts
    from memo_sim.layout.parallel import Layout

    m = _small_mixtral()
    lay = Layout(dp=2, ep=2, zero=2, head_grads_unit=True)  # memo-exec's unit (framework any)
    assert lay.expert_dp == 1
    parts = model_state_parts(m, lay)
    # memo-exec's workspaces: two dense layers' (199,168 each: each layer's reduce-scatter runs under the next
    # layer's backward, `memo_exec.distributed.zero`) and unit 0: embedding, head and final norm (262,400)
    assert parts["unsharded_grads"] == 4 * (2 * 199_168 + 262_400)
    assert model_state_parts(m, lay, experts_only=True)["unsharded_grads"] == 0
    # `memo-exec run --nproc 2`'s model_states (2026-12-03, this VM: its estimate, 96,534,016 with one workspace)
    assert sum(parts.values()) == 97_330_688
    # ZeRO 3 the same: the experts are never gathered (they are whole); two dense layers are (129.8 MB before,
    # memo-exec 97.9 MB)
    assert model_state_parts(m, Layout(dp=2, ep=2, zero=3))["gathered_layers"] == 2 * 4 * 199_168


def test_zero2_moe_experts_sharded_over_a_group_keep_two_layers_whole_gradients():
    """Where the expert data-parallel group has several ranks the experts' ZeRO 2 workspaces (a layer's experts, two
    of them under overlapped reductions: `memo_sim.cost.memory.unsharded_grad_units`) are counted as the dense
    layers' are."""
    from memo_sim.cost.memory import model_state_parts
    from memo_sim.cost.param_split import layer_gpu_params
    from memo_sim.layout.parallel import Layout

    m = _small_mixtral()
    for lay in (Layout(dp=4, ep=2, zero=2, head_grads_unit=True), Layout(dp=2, ep=1, zero=2, head_grads_unit=True)):
        assert lay.expert_dp > 1
        g = layer_gpu_params(m, lay)
        assert model_state_parts(m, lay, experts_only=True)["unsharded_grads"] == 4 * 2 * g.expert_local > 0
        assert model_state_parts(m, lay)["unsharded_grads"] == 4 * (2 * g.local + 2 * 512 * 256 + 256)


# --- 4. validate names its own option -----------------------------------------------------------------------------

def test_validate_names_its_seqs_option_for_a_length_that_divides():
    """A review: `memo-exec validate --cp 3 --seqs 512` said '--seq 516 (or 510) divides'; validate has --seqs."""
    r = CliRunner().invoke(cli, ["validate", "--profile", "h100-sxm5-80gb", "--device", "cpu", "--cp", "3", "--seqs",
                                 "512", "--policies", "store_all", "--steps", "1"])
    assert r.exit_code == 2, r.output
    assert "--seqs 516 (or 510) divides" in r.output and "--seq 516" not in r.output
    assert "Traceback" not in r.output


# --- 5. the 'Per rank' tokens column counts the iteration's tokens ------------------------------------------------

def test_per_rank_tokens_are_the_iterations():
    """A review: pp 2 over 4 micro-batches of 512 tokens read 512 'tokens' per rank beside a headline tokens/s of
    the iteration's 2048."""
    from memo_exec.report import per_rank_markdown, rank_rows

    payloads = [{"rank": r, "coords": {"dp": 0, "pp": r, "cp": 0, "ulysses": 0, "tp": 0}, "summaries": [
        {"stream_busy_s": {"compute": 0.5}}], "steady": {"iteration_s": 0.6}, "local_tokens": 512, "events": [],
        "losses": [6.2]} for r in range(2)]
    rows = rank_rows(payloads, 0.5, 4)
    assert [r["iteration_tokens"] for r in rows] == [2048, 2048] and rows[0]["local_tokens"] == 512
    text = per_rank_markdown(rows, 0.5, "memory")
    line = next(ln for ln in text.splitlines() if ln.startswith("| 0 |"))
    assert line.split(" | ")[6] == "2048", line  # rank | dp | pp | cp | uly | tp | tokens
    assert "4 micro-batch(es) of 512 rows" in text


def test_a_frameworks_buckets_hold_one_vocabulary_matrix_whole_memo_exec_its_unit():
    """memo-exec holds the embedding's, the untied head's and the final norm's gradients whole together under ZeRO 2
    (its first gradient unit, framework any's ``head_grads_unit``); a framework's per-parameter buckets reduce-scatter
    the head's before the embedding's is made, one vocabulary matrix whole at a time."""
    from memo_sim.cost.memory import model_state_parts
    from memo_sim.layout.parallel import Layout
    from memo_sim.search.frameworks import get_framework

    m = _small_mixtral()
    theirs = get_framework("megatron").adapt(Layout(dp=4, ep=2, zero=2))
    mine = get_framework("any").adapt(Layout(dp=4, ep=2, zero=2))
    assert mine.head_grads_unit and not theirs.head_grads_unit
    gap = model_state_parts(m, mine)["unsharded_grads"] - model_state_parts(m, theirs)["unsharded_grads"]
    assert gap == 4 * (512 * 256 + 256)  # the second matrix and the final norm, fp32 gradients
