"""The engine on small hand-built op graphs: bandwidth sharing, copy/compute slowdown,
cross-device events, OOM / OOHM as results."""

from __future__ import annotations

import pytest

from memo_sim.cost.transfer import host_bandwidth_per_gpu, host_copy_time
from memo_sim.engine import Device, Engine, MemAction, OpGraph
from memo_sim.profile import load_profile

PROFILE = load_profile("a800-80gb")  # own PCIe link 25.6 GB/s, switch uplink 25.6 GB/s, 2 GPUs per switch
LAT = float(PROFILE.host_link.latency)
OWN = float(PROFILE.host_link.d2h_bandwidth)
SWITCH = float(PROFILE.host_link.pcie_switch_bandwidth)
SLOW = float(PROFILE.gpu.copy_compute_slowdown)
GB = 1e9


def two_gpus_one_switch() -> OpGraph:
    return OpGraph([Device(0, node=0, switch=0, group=1, switch_group=1),
                    Device(1, node=0, switch=0, group=1, switch_group=1)])


def copy(g, dev, nbytes, direction="d2h", deps=(), **kw):
    return g.add("copy", device=dev, stream=direction, kind="copy", phase="offload", layer=0, work=nbytes,
                 nbytes=nbytes, direction=direction, deps=list(deps), **kw)


def test_two_copies_on_one_switch_share_it():
    g = two_gpus_one_switch()
    a, b = copy(g, 0, 4 * GB), copy(g, 1, 4 * GB)
    Engine(g, PROFILE).run()
    share = min(OWN, SWITCH / 2)
    assert a.end == pytest.approx(LAT + 4 * GB / share)
    assert b.end == pytest.approx(a.end)


def test_rates_are_recomputed_when_a_transfer_ends():
    g = two_gpus_one_switch()
    a, b = copy(g, 0, 2 * GB), copy(g, 1, 6 * GB)
    Engine(g, PROFILE).run()
    share = min(OWN, SWITCH / 2)
    t_a = LAT + 2 * GB / share
    assert a.end == pytest.approx(t_a)
    # b ran at the shared rate until a ended, then alone at the full rate for the rest
    assert b.end == pytest.approx(t_a + (6 * GB - 2 * GB) / min(OWN, SWITCH))


def test_copies_in_opposite_directions_do_not_share_pcie():
    g = two_gpus_one_switch()
    a, b = copy(g, 0, 4 * GB, "d2h"), copy(g, 1, 4 * GB, "h2d")
    Engine(g, PROFILE).run()
    assert a.end == pytest.approx(LAT + 4 * GB / min(OWN, SWITCH))
    assert b.end == pytest.approx(a.end)


def test_representative_sees_its_identical_neighbours():
    """One simulated GPU standing for 8 on the node (2 per switch) copies at the analytic per-GPU rate."""
    g = OpGraph([Device(0, group=8, switch_group=2)])
    a = copy(g, 0, 4 * GB)
    Engine(g, PROFILE).run()
    assert a.end == pytest.approx(host_copy_time(4 * GB, PROFILE, "d2h", 8))
    assert host_bandwidth_per_gpu(PROFILE, "d2h", 8) == pytest.approx(SWITCH / 2)


def test_host_memory_bandwidth_caps_the_node():
    """A node-wide group whose copies exceed the host-memory bandwidth is capped by it."""
    hostbw = float(PROFILE.host.memory_bandwidth)
    group = 64  # more identical flows than the DRAM can feed at the switch rate
    g = OpGraph([Device(0, group=group, switch_group=1)])
    a = copy(g, 0, 1 * GB)
    Engine(g, PROFILE).run()
    assert a.end == pytest.approx(LAT + 1 * GB / min(OWN, SWITCH, hostbw / group))


def test_without_contention_copies_do_not_share():
    g = two_gpus_one_switch()
    a, b = copy(g, 0, 4 * GB), copy(g, 1, 4 * GB)
    Engine(g, PROFILE, contention=False).run()
    assert a.end == pytest.approx(host_copy_time(4 * GB, PROFILE, "d2h", 1))
    assert b.end == pytest.approx(a.end)


def test_compute_slows_while_a_host_copy_runs():
    g = OpGraph([Device(0)])
    k = g.add("gemm", device=0, stream="compute", kind="compute", phase="fwd", layer=0, work=1.0)
    c = copy(g, 0, 0.5 * OWN)  # 0.5 s of copy after the launch latency
    Engine(g, PROFILE).run()
    t_copy = 0.5
    assert c.end == pytest.approx(LAT + t_copy)
    assert k.end == pytest.approx(1.0 + t_copy * (1 - 1 / (1 + SLOW)))
    g2 = OpGraph([Device(0)])
    k2 = g2.add("gemm", device=0, stream="compute", kind="compute", phase="fwd", layer=0, work=1.0)
    copy(g2, 0, 0.5 * OWN)
    Engine(g2, PROFILE, contention=False).run()
    assert k2.end == pytest.approx(1.0)


def test_collectives_on_one_link_share_it():
    g = OpGraph([Device(0)])
    a = g.add("allgather", device=0, stream="comm", kind="comm", phase="fwd", layer=0, work=1.0, link="nvlink")
    b = g.add("allreduce_grads", device=0, stream="dp_comm", kind="comm", phase="grad_sync", layer=0, work=1.0,
              link="nvlink")
    c = g.add("ib", device=0, stream="cp_comm", kind="comm", phase="fwd", layer=0, work=1.0, link="internode")
    Engine(g, PROFILE).run()
    assert a.end == pytest.approx(2.0) and b.end == pytest.approx(2.0)
    assert c.end == pytest.approx(1.0)


def test_streams_run_in_issue_order_and_wait_on_events_across_devices():
    """Two pipeline stages: stage 1 waits for stage 0's p2p send (an event on another device)."""
    g = OpGraph([Device(0), Device(1)])
    f0 = g.add("fwd", device=0, stream="compute", kind="compute", phase="fwd", layer=0, work=1.0)
    send = g.add("p2p_send", device=0, stream="p2p", kind="comm", phase="fwd", layer=0, work=0.25, deps=[f0],
                 link="nvlink")
    f0b = g.add("fwd", device=0, stream="compute", kind="compute", phase="fwd", layer=1, work=1.0)
    f1 = g.add("fwd", device=1, stream="compute", kind="compute", phase="fwd", layer=2, work=1.0, deps=[send])
    Engine(g, PROFILE).run()
    assert (f0.end, send.start, send.end) == pytest.approx((1.0, 1.0, 1.25))
    # the send's NCCL kernel holds 16 of the A800's 108 SMs for its 0.25 s: the kernel beside it does without them
    assert (float(PROFILE.gpu.comm_sms), float(PROFILE.gpu.sm_count)) == (16.0, 108.0)
    assert (f0b.start, f0b.end) == pytest.approx((1.0, 2.0 + 0.25 * 16 / 108))
    assert (f1.start, f1.end) == pytest.approx((1.25, 2.25))


def test_oom_is_a_result_with_when_what_and_how_much():
    g = OpGraph([Device(0)])
    g.add_static(0, MemAction("gpu", "model_states", 10 * GB))
    g.add("a", device=0, stream="compute", kind="compute", phase="fwd", layer=0, work=1.0,
          mem_start=(MemAction("gpu", "L0.skeletal", 5 * GB),))
    g.add("b", device=0, stream="compute", kind="compute", phase="fwd", layer=1, work=1.0,
          mem_start=(MemAction("gpu", "L1.skeletal", 6 * GB),))
    run = Engine(g, PROFILE, gpu_capacity=20 * GB).run()
    f = run.failure
    assert f is not None and f.status == "OOM"
    assert (f.tensor, f.requested_bytes, f.in_use_bytes, f.capacity_bytes) == ("L1.skeletal", 6 * GB, 15 * GB, 20 * GB)
    assert f.time_s == pytest.approx(1.0) and f.layer == 1
    assert "L1.skeletal" in f.message()


def test_oohm_counts_every_identical_gpu_of_the_node():
    g = OpGraph([Device(0, group=8, switch_group=2)])
    copy(g, 0, 1 * GB, mem_start=(MemAction("host", "L0.offload", 1 * GB),))
    copy(g, 0, 1 * GB, mem_start=(MemAction("host", "L1.offload", 1 * GB),))
    run = Engine(g, PROFILE, host_capacity=12 * GB).run()
    f = run.failure
    assert f is not None and f.status == "OOHM" and f.tensor == "L1.offload"
    assert (f.requested_bytes, f.in_use_bytes) == (8 * GB, 8 * GB)


def test_static_allocation_past_capacity_fails_at_time_zero():
    g = OpGraph([Device(0)])
    g.add_static(0, MemAction("gpu", "model_states", 100 * GB))
    g.add("a", device=0, stream="compute", kind="compute", phase="fwd", layer=0, work=1.0)
    run = Engine(g, PROFILE).run()
    assert run.failure.status == "OOM" and run.failure.time_s == 0.0 and run.failure.tensor == "model_states"
