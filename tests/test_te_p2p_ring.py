"""TransformerEngine's p2p context parallelism (Megatron-LM's default --cp-comm-type) runs one attention kernel per
ring step over the rank's two chunks (`memo_sim.layout.ring_merge` te_p2p, ``step_kernels``), where memo's executor
runs one per pair of zigzag chunks: the same FLOPs in cp kernels of 2·c² score elements, priced at each kernel's own
size. memo-exec, which runs its own blocks, refuses such a plan in one line."""

from __future__ import annotations

import pytest

from memo_sim.cost.kernel_time import attention_bwd_time, attention_fwd_time
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.cost.ring_attention import block_counts, ring_attention_time
from memo_sim.frameworks import load_frameworks, mechanism_changes
from memo_sim.layout.parallel import Layout
from memo_sim.layout.ring_merge import ring_merge
from memo_sim.model.config import PRESETS
from memo_sim.plan.executor_scope import ring_merge_why_not
from memo_sim.profile.loader import load_profile

H100 = load_profile("h100-sxm5-80gb")


def test_megatron_runs_transformer_engines_ring_and_says_so_on_export():
    fws = load_frameworks()
    lay = fws["megatron"].adapt(Layout(tp=2, cp=4))
    assert lay.ring_merge == "te_p2p" and ring_merge("te_p2p").step_kernels
    assert not ring_merge("none").step_kernels  # memo's executor: one kernel per pair of zigzag chunks
    assert ring_merge("torch_cp").step_kernels  # PyTorch's CP: one SDPA call per ring step too
    assert "ring_merge none -> te_p2p" in mechanism_changes(fws["any"].adapt(Layout(tp=2, cp=4)), lay, H100)


@pytest.mark.parametrize("cp", [2, 4, 16])
@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_one_kernel_per_step_of_the_same_flops(cp, phase):
    flops = 3e14
    full, causal = block_counts(cp)
    f_full = flops / (full + causal / 2)  # one c x c block's FLOPs; the rank's share is 2·cp of them
    price = attention_bwd_time if phase == "bwd" else attention_fwd_time
    # step 0: causal over the rank's 2c tokens (half of (2c)^2); steps 1..cp-1: 2c x c or c x 2c, full
    want = (price(2 * f_full, H100, "bf16", 128, "cudnn", "causal")
            + (cp - 1) * price(2 * f_full, H100, "bf16", 128, "cudnn", "full"))
    assert 2 * f_full + (cp - 1) * 2 * f_full == pytest.approx(flops)
    got = ring_attention_time(flops, H100, "bf16", 128, "cudnn", cp, phase, step_kernels=True)
    assert got == pytest.approx(want)
    assert got != pytest.approx(ring_attention_time(flops, H100, "bf16", 128, "cudnn", cp, phase))


def test_a_megatron_layer_prices_its_ring_as_te_kernels():
    model = PRESETS["llama-3.1-8b"]
    blocks = Layout(cp=8, attention="cudnn")
    te = Layout(cp=8, attention="cudnn", ring_merge="te_p2p")

    def attn(costs):
        return sum(c.seconds for c in costs if c.kind == "attention")

    for costs in (forward_costs, backward_costs):
        a, b = attn(costs(model, blocks, 1, 131072, H100)), attn(costs(model, te, 1, 131072, H100))
        assert a > 0 and b > 0 and b != pytest.approx(a)


def test_the_executor_refuses_a_te_ring_in_one_line():
    why = ring_merge_why_not(Layout(cp=4, ring_merge="te_p2p"))
    assert why and "\n" not in why and "ring_merge te_p2p" in why and "--framework any" in why
    assert ring_merge_why_not(Layout(cp=1, ring_merge="te_p2p")) is None
