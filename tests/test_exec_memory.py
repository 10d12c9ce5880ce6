"""The executor's memory estimate in the simulator's terms, the arena sized to one layer, the fit
check against a (faked) device, and host capacity from /proc/meminfo and the cgroup limit.

The headline case is the issue's: GPT-7B cut to 8 layers, 128K tokens, MEMO on one H100 80 GB
(``memo-sim whatif ... --profile h100-sxm5-80gb --policy memo``). Nothing is allocated: the layer
is traced on the meta device with the backend CUDA will run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from memo_exec.model import vocab_padding_params
from memo_exec import device as device_mod
from memo_exec.attention import AttnDims, auto_backend_for, meta_stand_in
from memo_exec.compare import sim_memory_breakdown
from memo_exec.device import cgroup_available_bytes, host_available_bytes
from memo_exec.errors import FitError
from memo_exec.memory_estimate import check_fit
from memo_exec.runner import Executor, RunOptions, size_plan
from tests.exec_helpers import make_plan, policy, time_limit
from memo_sim.model.config import ModelConfig
from memo_sim.plan.schema import read_plan

torch.set_num_threads(1)
GB = 10**9


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(120):
        yield


def _whatif(out, *extra):
    args = ["whatif", "--model", "gpt-7b", "--layers", "8", "--seq", "128K", "--gpus", "1", "--profile",
            "h100-sxm5-80gb", "--policy", "memo", "--out", str(out), *extra]
    p = subprocess.run([sys.executable, "-c", "import sys; from memo_sim.cli import main; main(sys.argv[1:])", *args],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return read_plan(out / "plan.json")


@pytest.fixture(scope="module")
def h100_plan(tmp_path_factory):
    """The what-if's own plan (its default precision recipe for bf16)."""
    return _whatif(tmp_path_factory.mktemp("h100"))


@pytest.fixture(scope="module")
def h100_plan_zero(tmp_path_factory):
    """The same with the model-state recipe the executor trains with (bf16 weights and gradients,
    fp32 master weights and Adam moments: 16 bytes per parameter)."""
    return _whatif(tmp_path_factory.mktemp("h100zero"), "--precision", "zero")


def _cuda_sizes(plan):
    m = plan.model
    dims = AttnDims(plan.batch, plan.seq_tokens, m.heads, m.n_kv_heads, m.qk_head_dim)
    backend = meta_stand_in(auto_backend_for("cuda", torch.bfloat16, dims))
    return size_plan(plan, m, torch.bfloat16, backend), backend, dims


def test_h100_memo_128k_estimate_is_within_5_percent_and_fits_80gb(h100_plan):
    plan = h100_plan
    assert plan.policy.name == "memo" and plan.model.layers == 8 and plan.seq_tokens == 131072
    assert plan.memory_plan and plan.memory_plan.phases
    sz, backend, dims = _cuda_sizes(plan)
    # the arena is one layer's largest phase peak, not the plan's whole-model (level-2) arena
    peaks = [ph.peak_bytes for ph in plan.memory_plan.phases.values()]
    assert sz.arena_plan.arena_bytes == max(peaks) < plan.memory_plan.arena_bytes
    predicted = plan.predicted.peak_gpu_bytes
    assert abs(sz.estimate.total - predicted) / predicted <= 0.05, (sz.estimate.total, predicted)
    # model states as the plan's (Megatron) recipe counts them: fp32 main gradients, 18 bytes per parameter
    sim = sim_memory_breakdown(plan, plan.model.layers)
    # (+ the executor's vocabulary padding rows, memo_exec.model.padded_vocab, which the simulator does not hold)
    assert sim["model_states_bytes"] == 18 * plan.model.params()
    assert sz.estimate.terms["model_states"] == 18 * (plan.model.params() + vocab_padding_params(plan.model))
    # an H100 80GB HBM3 has 81559 MiB (nvidia-smi), about 79 GiB of it free under a CUDA context
    check_fit(sz.estimate, device_free=79 * 2**30, host_available=2000 * GB, on_cuda=True, what="plan",
              where="fake")
    # the pinned pool is laid out exactly as the simulator sizes host memory (one GPU on the node)
    assert sz.estimate.host == plan.predicted.peak_host_bytes_per_node


def test_h100_estimate_term_by_term(h100_plan_zero):
    """With the executor's precision recipe every term the simulator counts agrees exactly (model states
    plus the executor's vocabulary padding rows), except
    the ones the executor knows more about: the transient peak (the SDPA backward kernel's dq, dk,
    dv and its workspace are allocated outside the arena while the whole arena is reserved) and the
    classifier (the executor's chunked head)."""
    plan = h100_plan_zero
    sz, backend, dims = _cuda_sizes(plan)
    sim = sim_memory_breakdown(plan, plan.model.layers)
    rows = {r["term"]: r for r in sz.estimate.compare(sim)}
    for term in ("skeletal_resident", "buffers", "lse", "layer_boundary"):
        assert rows[term]["executor_bytes"] == rows[term]["simulator_bytes"], rows[term]
    per_param = rows["model_states"]["simulator_bytes"] / plan.model.params()  # + the vocabulary padding rows
    assert rows["model_states"]["executor_bytes"] == (rows["model_states"]["simulator_bytes"]
                                                      + per_param * vocab_padding_params(plan.model))
    extra = rows["transient_peak"]["executor_bytes"] - rows["transient_peak"]["simulator_bytes"]
    assert rows["peak_total"]["simulator_bytes"] == plan.predicted.peak_gpu_bytes
    predicted = plan.predicted.peak_gpu_bytes
    # The transient difference is at most the fused kernel's own dq, dk, dv: PyTorch's SDPA backward
    # returns new tensors where FlashAttention writes into the layer's gradient buffers, which the
    # simulator models; the kernel's workspace (fp32 dQ accumulator, lse vectors) is outside the
    # arena on both sides. The executor-only terms add < 0.1%.
    T = dims.batch * dims.seq
    kernel_grads = T * (dims.heads + 2 * dims.kv_heads) * dims.head_dim * 2
    assert 0 < extra <= kernel_grads, (extra, kernel_grads)
    assert 0 <= sz.estimate.total - predicted - extra <= 0.001 * predicted


@pytest.mark.parametrize("kv_heads", [32, 8])
def test_kernel_backward_workspace_is_the_simulators(kv_heads):
    """The fused kernels' backward outside-the-arena bytes hold their dq, dk, dv and the kernel's
    own workspace, FlashAttention's fp32 dQ accumulator plus two fp32 lse vectors, byte for byte
    the simulator's ``attention_bwd_workspace`` of the same layer (GQA or not)."""
    from memo_exec.attention import SDPAEfficient, SDPAFlash
    from memo_sim.cost.activations import tensor_bytes
    from memo_sim.layout.parallel import Layout
    from memo_sim.memplan.trace_gen import attention_buffers
    from memo_sim.model.layer_graph import layer_tensors

    m = ModelConfig("ws", 2, 4096, 32, 11008, vocab=1024, kv_heads=kv_heads)
    batch, seq, esize = 1, 131072, 2
    lay = Layout()
    tb = {n: tensor_bytes(t, lay, batch, seq) for n, t in layer_tensors(m, lay.tp_mode).items()}
    sim = dict(attention_buffers(m, lay, tb, "bwd"))["attention_bwd_workspace"]
    T, h, kv = batch * seq, m.hidden, m.n_kv_heads * m.qk_head_dim
    assert sim == 2 * T * m.heads * 4 + T * h * 4  # the fp32 dQ accumulator is q in fp32: 2 GiB here
    dims = AttnDims(batch, seq, m.heads, m.n_kv_heads, m.qk_head_dim)
    expanded = 2 * T * h * esize if kv_heads < m.heads else 0
    for backend in (SDPAFlash(), SDPAEfficient()):
        assert backend.outside_bytes(dims, esize, "bwd") == T * (h + 2 * kv) * esize + 2 * expanded + sim


def test_a_device_too_small_is_refused_with_the_biggest_terms(h100_plan):
    sz, _, _ = _cuda_sizes(h100_plan)
    with pytest.raises(FitError, match=r"does not fit: .* \(buffers 32\.00 GiB, model_states 30\.46 GiB"):
        check_fit(sz.estimate, device_free=60 * GB, host_available=2000 * GB, on_cuda=True, what="plan",
                  where="cuda:0")
    with pytest.raises(FitError, match="pinned host memory"):
        check_fit(sz.estimate, device_free=79 * 2**30, host_available=10 * GB, on_cuda=True, what="plan",
                  where="cuda:0")


def test_estimate_terms_for_each_policy():
    m = ModelConfig("s", 6, 64, 4, 256, vocab=128)
    T, e = 128, 4
    skel = T * (64 * 8 + 256 * 2) * e  # x ln1 q k v attn h1 ln2 (h wide) + fc1 act (ffn wide), fp32
    want = {"store_all": (6 * skel, 0), "full_recompute": (6 * T * 64 * e, skel - T * 64 * e),
            "full_offload": (0, 2 * skel), "memo": (0, 2 * skel),
            "checkpoint_offload": (0, 2 * T * 64 * e + skel - T * 64 * e),
            # Megatron's core_attn attn_proj: q, k, v and attn (h wide) through two buffers, the rest kept
            "offload_attn": (6 * (skel - 4 * T * 64 * e), 2 * 4 * T * 64 * e)}
    for name, (resident, buffers) in want.items():
        ex = Executor(make_plan(m, T, policy(name, 0.5 if name == "memo" else None)), RunOptions(device="cpu"))
        t = ex.estimate.terms
        assert (t["skeletal_resident"], t["buffers"]) == (resident, buffers), name
        assert t["lse"] == (1 if name in ("full_recompute", "checkpoint_offload") else 6) * 4 * T * 4
        static = sum(t[k] for k in ("model_states", "skeletal_resident", "buffers", "lse", "norm_stats"))
        assert t["peak_total"] == static + max(t["transient_peak"] + t["layer_boundary"], t["classifier_peak"],
                                               t["optimizer_step_peak"])


# -- host capacity ---------------------------------------------------------------------------------
def _tree(tmp_path, cgroup: str, files: dict[str, str]):
    (tmp_path / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        f = tmp_path / "sys" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path / "cgroup", tmp_path / "sys"


@pytest.mark.parametrize("cgroup,files,want", [
    ("0::/job\n", {"job/memory.max": "8000\n", "job/memory.current": "3000\n"}, 5000),
    ("0::/job\n", {"job/memory.max": "max\n", "job/memory.current": "3000\n"}, None),
    ("0::/a/b\n", {"a/b/memory.max": "max\n", "a/b/memory.current": "1\n", "a/memory.max": "900\n",
                   "a/memory.current": "400\n"}, 500),  # a tighter ancestor limit wins
    ("4:memory:/job\n1:cpu:/\n", {"memory/job/memory.limit_in_bytes": "10000\n",
                                  "memory/job/memory.usage_in_bytes": "2500\n"}, 7500),
    ("4:memory:/job\n", {"memory/job/memory.limit_in_bytes": "9223372036854771712\n",
                         "memory/job/memory.usage_in_bytes": "2500\n"}, None),  # v1 without a limit
    ("0::/\n", {}, None),
], ids=["v2", "v2-max", "v2-ancestor", "v1", "v1-unlimited", "none"])
def test_cgroup_available_bytes(tmp_path, cgroup, files, want):
    proc, root = _tree(tmp_path, cgroup, files)
    assert cgroup_available_bytes(proc, root) == want


def test_host_available_is_the_smaller_of_meminfo_and_cgroup(monkeypatch):
    meminfo = device_mod._meminfo("MemAvailable")
    monkeypatch.setattr(device_mod, "cgroup_available_bytes", lambda: 12345)
    assert host_available_bytes() == min(12345, meminfo)
    monkeypatch.setattr(device_mod, "cgroup_available_bytes", lambda: None)
    assert host_available_bytes() == meminfo


def test_cpu_fit_check_uses_the_cgroup_limit(monkeypatch):
    monkeypatch.setattr(device_mod, "cgroup_available_bytes", lambda: 10**6)
    with pytest.raises(FitError, match="does not fit"):
        Executor(make_plan(ModelConfig("s", 4, 64, 4, 256, vocab=128), 256, policy("memo", 0.3)),
                 RunOptions(device="cpu"))
