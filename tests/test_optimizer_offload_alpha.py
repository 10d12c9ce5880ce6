"""MEMO's alpha under optimizer offload leaves the host memory the optimizer states take: the cap on the offloaded
rows counts them (before, a plan with the optimizer on the host solved alpha against the whole host and came out
over it, so fitting MEMO plans read as "nothing fits")."""

from __future__ import annotations

from dataclasses import replace

from memo_sim.cost.optimizer_offload import host_state_bytes
from memo_sim.cost.param_split import model_gpu_params
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS
from memo_sim.profile.loader import load_profile
from memo_sim.search.estimate import memo_alpha
from memo_sim.search.whatif import make_candidate


def test_alpha_leaves_room_for_the_optimizer_states_on_the_host():
    model, prof = PRESETS["gpt-7b"], load_profile("h100-sxm5-80gb")
    on_gpu = Layout(cp=8, zero=3)
    on_host = replace(on_gpu, optimizer_offload=True)
    a_gpu, a_host = memo_alpha(model, on_gpu, 1, 1 << 20, prof), memo_alpha(model, on_host, 1, 1 << 20, prof)
    assert a_gpu.binding == "host_memory" and a_host.alpha < a_gpu.alpha
    assert host_state_bytes(model, on_host, model_gpu_params(model, on_host)) > 0
    c = make_candidate(model, on_host, "memo", 1, 1 << 20, prof, a_host.alpha)
    assert c.memory.host_bytes_per_node <= c.memory.host_capacity_bytes
    assert c.status == "OK", c.status
