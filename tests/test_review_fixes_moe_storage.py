"""A MoE model that mixes dense-FFN layers in (DeepSeek-V3's first 3, GLM-4.5-Air's first, Llama 4's alternate
ones) gave every layer's preallocated storage a dense layer's fc1 and act under store all, recompute_moe and
recompute_norm_act, though a MoE layer's block writes neither (DeepSeek-V3: 58 layers each holding an unused
[T, 2 x 18432] and [T, 18432]). Each layer now holds what it writes (`ActivationPolicy.layer_names`); a pipeline
chunk's instance, bound to its layers after allocation, keeps them at the positions some run of its length puts a
dense layer at."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from memo_exec.activations.registry import make_policy
from memo_exec.layer import storage_bytes
from memo_sim.policy import get_policy
from tests.exec_helpers import time_limit
from tests.test_exec_moe import MOE, SEQ, plan_for

DEEPSEEK_LIKE = dataclasses.replace(MOE, layers=6, dense_layers=3)  # the first 3 dense, as DeepSeek-V3's


def _policy(pol: str, model, layers: int):
    return make_policy(get_policy(pol), model, 1, SEQ, layers, torch.float32, torch.device("cpu"), None, None, None)


@pytest.mark.parametrize("pol", ["store_all", "recompute_moe", "recompute_norm_act"])
def test_a_moe_layer_holds_no_dense_ffn_storage(pol):
    """One process, every layer: the dense layers (0-2) keep fc1 and act, the MoE layers (3-5) neither; the
    estimate's skeletal term is what the blocks hold plus what the MoE blocks keep."""
    from memo_exec.runner import Executor, RunOptions

    with time_limit(60):
        ex = Executor(plan_for({}, pol, model=DEEPSEEK_LIKE), RunOptions(device="cpu", dtype="fp32", steps=1))
        try:
            ex.allocate()
            pol_ = ex.policy
            for i in range(6):
                names = set(pol_.storages[i].tensors)
                assert ({"fc1", "act"} <= names) == (i < 3), (i, sorted(names))
            blocks = sum(b.numel() for b in pol_.blocks)
            assert ex.estimate.terms["skeletal_resident"] == blocks + pol_.moe_kept_bytes(
                lambda i: pol != "recompute_moe", ("eact",) if pol == "recompute_norm_act" else ())
            ffn = storage_bytes(DEEPSEEK_LIKE, SEQ, torch.float32, ("fc1", "act"))
            per_layer = max(b.numel() for b in pol_.blocks)
            assert blocks == 6 * per_layer - 3 * ffn  # three MoE layers' fc1 and act no longer allocated
            ex.forward_backward(0)  # the dense and MoE layers run on their storage
        finally:
            ex.close()


def test_a_pipeline_chunks_instance_keeps_the_dense_ffn_where_a_dense_layer_may_fall():
    """An instance of 2 layers of the 6 (a stage of 2): positions 0 and 1 can hold one of the first 3 layers, so
    both keep fc1 and act; with the dense layers the first 1 of 6, only position 0 can."""
    both = _policy("store_all", DEEPSEEK_LIKE, 2)
    assert all({"fc1", "act"} <= set(both.layer_names(("x", "fc1", "act"), i)) for i in (0, 1))
    one = _policy("store_all", dataclasses.replace(MOE, layers=6, dense_layers=1), 2)
    assert one.layer_names(("x", "fc1", "act"), 0) == ("x", "fc1", "act")
    assert one.layer_names(("x", "fc1", "act"), 1) == ("x",)
    from memo_sim.model.config import ModelConfig

    dense = _policy("store_all", ModelConfig("dense-small", 4, 64, 4, 128, vocab=128, dtype="fp32"), 4)
    assert dense.layer_names(("x", "fc1", "act"), 3) == ("x", "fc1", "act")  # a dense model: every layer its FFN


@pytest.mark.parametrize("pol", ["recompute_moe", "recompute_norm_act"])
def test_megatrons_layernorm_recompute_rebuilds_only_the_norms_of_their_own(pol):
    """Megatron-LM's ``--recompute-modules layernorm`` rebuilds a norm only where it is a module of its own: its
    TransformerEngine layer fuses a non-MLA model's input norm into QKV, which keeps its output (a review found both
    norms dropped). The executor keeps ln1 in each layer's block and rebuilds ln2 alone in the shared buffer."""
    from memo_exec.runner import Executor, RunOptions

    with time_limit(60):
        ex = Executor(plan_for({}, pol), RunOptions(device="cpu", dtype="fp32", steps=1))
        try:
            ex.allocate()
            p = ex.policy
            assert p.norms == ("ln2",)
            ln1 = storage_bytes(MOE, SEQ, torch.float32, ("ln1",))
            assert ex.estimate.terms["buffers"] - (p.moe_graph_part("eact") if pol == "recompute_norm_act" else 0) \
                == storage_bytes(MOE, SEQ, torch.float32, ("ln2",))
            for i, st in enumerate(p.storages):
                assert st.tensors["ln1"].untyped_storage().data_ptr() != st.tensors["ln2"].untyped_storage().data_ptr()
                assert p.blocks[i].numel() >= ln1  # ln1 in the layer's own block
            ex.forward_backward(0)
        finally:
            ex.close()


def test_the_report_says_where_the_rebuilt_moe_block_is_counted(tmp_path):
    """Under recompute_moe the simulator's buffers term holds the re-run block's tensors (its recompute buffer), the
    executor's does not (autograd allocates them in the backward): the report says so beside the two numbers."""
    from click.testing import CliRunner

    from memo_exec.cli import cli as exec_cli
    from memo_sim.plan.schema import write_plan

    # in this process (click's CliRunner): a process of its own imported torch and the executor again for each run
    write_plan(plan_for({}, "recompute_moe"), tmp_path / "plan.json")
    r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "plan.json"), "--device", "cpu", "--steps", "1", "--out",
                                      str(tmp_path / "run")])
    assert r.exit_code == 0, r.output[-2000:]
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Under recompute_moe the simulator's buffers term holds its recompute buffer" in report
    assert "dense-FFN layer (the first 1)" in report  # the mixed model's approximation named too
    # checkpoint offload re-runs the block with its layer: the same sentence (a review: its -12.6% unexplained)
    write_plan(plan_for({}, "checkpoint_offload"), tmp_path / "co.json")
    r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "co.json"), "--device", "cpu", "--steps", "1", "--out",
                                      str(tmp_path / "co")])
    assert r.exit_code == 0, r.output[-2000:]
    assert ("Under checkpoint_offload the simulator's buffers term holds its recompute buffer: the rebuilt layer's"
            in (tmp_path / "co" / "report.md").read_text())
