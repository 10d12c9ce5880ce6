"""Tensor-parallel flavours as registered modules (`memo_sim.tp`) and the one registry helper
(`memo_sim.registry`) every plug-in table uses."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.layer_time import backward_costs, forward_costs, recompute_costs
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import layer_tensors
from memo_sim.policy.registry import POLICIES, policy_class
from memo_sim.profile.loader import load_profile
from memo_sim.registry import Registry
from memo_sim.tp import FLAVOURS, TP_MODES, comm_buffer_prefixes, tp_flavour
from memo_sim.tp.metp_ffn import MetpFfn

GPT = ModelConfig("gpt-toy", layers=4, hidden=1024, heads=16, ffn=4096)
K = 1024


def test_registry_lists_the_known_names_and_refuses_a_second_object():
    reg = Registry("widget")
    a, b = object(), object()
    reg.add("a", a)
    reg.add("a", a)  # the same object again: nothing happens
    with pytest.raises(ValueError, match="widget 'a' registered twice"):
        reg.add("a", b)
    reg.add("c", b)
    assert reg.names() == ("a", "c") and "c" in reg and reg.get("c") is b
    with pytest.raises(MemoError, match=r"^widget 'z' unknown; choose one of a, c$"):
        reg.get("z")
    only = Registry("mode", allowed=("x",))
    with pytest.raises(ValueError, match="not one of x"):
        only.add("y", a)


def test_registry_decorator_names_a_class():
    reg = Registry("part", sort=True)

    @reg.register("zeta")
    class Z:
        pass

    @reg.register("alpha")
    class A:
        pass

    assert Z.name == "zeta" and reg.names() == ("alpha", "zeta")


def test_policies_and_flavours_use_the_registry():
    assert policy_class("memo") is POLICIES.get("memo")
    with pytest.raises(MemoError, match="policy 'nope' unknown; choose one of"):
        policy_class("nope")
    assert TP_MODES == ("megatron", "metp_ffn", "metp", "async_tp") == FLAVOURS.names()
    with pytest.raises(MemoError, match=r"tp_mode must be one of megatron, metp_ffn, metp, async_tp, got .x."):
        tp_flavour("x")
    assert "metp_ffn_w" in comm_buffer_prefixes() and "metp_wproj" in comm_buffer_prefixes()


def test_each_flavour_owns_its_rules_and_label():
    assert Layout(tp=4).label().startswith("tp4+sp") and Layout(tp=4, sp=False).label().startswith("tp4")
    assert Layout(tp=4, tp_mode="metp").label().startswith("tp4+metp")
    assert not Layout(tp=4).metp and Layout(tp=4, tp_mode="metp_ffn").metp
    metp = Layout(tp=2, tp_mode="metp", cp=2)
    assert "not combined with ring CP" in check_layout(metp, GPT, 4, 8, 64 * K)
    assert "sp must be on" in check_layout(Layout(tp=2, tp_mode="metp_ffn", sp=False), GPT, 2, 8, 64 * K)
    assert "at least 2" in check_layout(Layout(tp=1, tp_mode="metp_ffn"), GPT, 1, 8, 64 * K)
    assert "tp_mode must be one of" in check_layout(Layout(tp=2, tp_mode="ring"), GPT, 2, 8, 64 * K)
    assert tp_flavour("metp").seq_chunk_factor == 2 and tp_flavour("megatron").applies(1, False)
    assert not tp_flavour("metp_ffn").applies(2, False)


def test_a_new_flavour_is_its_module_alone():
    """A flavour registered here, and nowhere else, is priced and traced by the layers above
    from its data: a twin of ``metp_ffn`` gives metp_ffn's costs and level-1 traces."""
    class Twin(MetpFfn):
        name = "metp_ffn_twin"

    FLAVOURS.add(Twin.name, Twin())
    try:
        prof = load_profile("a100-sxm4-80gb")
        mine, ref = Layout(tp=4, tp_mode="metp_ffn_twin"), Layout(tp=4, tp_mode="metp_ffn")
        assert check_layout(mine, GPT, 4, 8, 64 * K) is None
        assert mine.label() == ref.label().replace("metp_ffn", "metp_ffn_twin")
        assert {n for n, t in layer_tensors(GPT, mine.tp_mode).items() if not t.saved} >= {"fc1", "act"}
        for fn in (forward_costs, backward_costs):
            assert fn(GPT, mine, 1, 64 * K, prof) == fn(GPT, ref, 1, 64 * K, prof)
        assert recompute_costs(GPT, mine, 1, 64 * K, prof, 0.5) == recompute_costs(GPT, ref, 1, 64 * K, prof, 0.5)
        for trace in (layer_forward_trace, layer_backward_trace):
            a, b = trace(GPT, mine, 1, 64 * K), trace(GPT, ref, 1, 64 * K)
            assert [(x.id, x.size, x.lower, x.upper) for x in a.buffers] == \
                   [(x.id, x.size, x.lower, x.upper) for x in b.buffers]
        assert replace(mine, sp=False).flavour.check(replace(mine, sp=False), GPT)
    finally:
        FLAVOURS._items.pop(Twin.name)


def test_the_executor_runs_the_simulators_flavours_by_name():
    pytest.importorskip("torch")
    from memo_exec.distributed import tp
    from memo_exec.errors import ExecError

    runs = {m for m in TP_MODES if tp_flavour(m).executor}
    assert set(tp.registered()) == runs and runs >= {"megatron", "metp_ffn", "metp"}
    for m in set(TP_MODES) - runs:  # simulator only (async TP): refused in one line, naming the field
        with pytest.raises(ExecError, match=rf"^layout.tp_mode '{m}': the executor runs megatron, metp, metp_ffn"):
            tp.flavour_for(m)
    with pytest.raises(ExecError, match=r"^layout.tp_mode 'ring': the executor runs megatron, metp, metp_ffn"):
        tp.flavour_for("ring")
