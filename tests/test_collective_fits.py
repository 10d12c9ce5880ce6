"""[#47 item 4] Each collective priced from its own measured fit where the profile has one
(`memo_sim.profile.schema.Link.collectives`, written by ``memo-exec calibrate``), and sequence
parallelism's backward re-gather of a column-parallel GEMM's input priced (`layer_graph.sp_regathered`):
before the GEMM (memo's executor) or beside it (``sp_regather_overlap``, Megatron-LM)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from memo_exec.calibrate.collectives import collective_fits
from memo_sim.cost import collectives as coll
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.cost.opcost import critical_time
from memo_sim.errors import ProfileError
from memo_sim.frameworks import load_frameworks
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.model.layer_graph import sp_regathered
from memo_sim.profile.loader import REPO_PROFILES, load_profile
from memo_sim.profile.schema import COLLECTIVES, CollectiveFit, Quantity


def _with_fits(profile, **fits):
    lk = dataclasses.replace(profile.nvlink, collectives={
        k: CollectiveFit(Quantity(bw, "test"), Quantity(lat, "test")) for k, (bw, lat) in fits.items()})
    return dataclasses.replace(profile, nvlink=lk)


@pytest.mark.parametrize("kind", COLLECTIVES)
@pytest.mark.parametrize("g", [2, 4, 8])
def test_fit_params_reproduce_the_measured_line(kind, g):
    intercept, slope = 3e-4, 1 / 2e9
    bw, lat = coll.fit_params(kind, g, intercept, slope)
    price = coll.RING_FORMULAS[kind]
    for size in (1e5, 1e6, 1e8):
        assert math.isclose(price(size, g, bw, lat), intercept + slope * size, rel_tol=1e-12)


def test_link_params_take_the_collectives_own_fit_else_the_links():
    p = _with_fits(load_profile("a800-80gb"), reduce_scatter=(1e9, 1e-3))
    assert coll.link_params(p.nvlink, "reduce_scatter") == (1e9, 1e-3)
    own = (float(p.nvlink.bandwidth), float(p.nvlink.latency))
    assert coll.link_params(p.nvlink, "all_gather") == own and coll.link_params(p.nvlink) == own


def test_calibrated_rows_give_each_collective_its_line():
    # times a line per collective at 2 ranks over the formula's size; the small size off the line (a
    # library's small-message path) must not move the fit, which comes from the sizes >= 256 KiB per rank
    lines = {"allgather_s": (4e-4, 1 / 1.5e9), "reducescatter_s": (2e-3, 1 / 0.4e9),
             "allreduce_s": (3e-4, 1 / 1.2e9), "alltoall_s": (2e-4, 1 / 3e9)}
    size = {"allgather_s": 2, "reducescatter_s": 2, "allreduce_s": 1, "alltoall_s": 1}
    rows = []
    for n in (4096, 512 * 1024, 2 * 1024 * 1024, 8 * 1024 * 1024):
        row = {"bytes": n, "sendrecv_s": 1e-4 + n / 5e9}
        for col, (a, b) in lines.items():
            row[col] = a + b * size[col] * n if n >= 256 * 1024 else 5e-3
        rows.append(row)
    fits = collective_fits(rows, 2)
    assert set(fits) == set(COLLECTIVES)
    for kind, col in (("all_gather", "allgather_s"), ("reduce_scatter", "reducescatter_s"),
                      ("all_reduce", "allreduce_s"), ("all_to_all", "alltoall_s")):
        a, b = lines[col]
        bw, lat = fits[kind]["bandwidth"], fits[kind]["latency"]
        s = size[col] * 2 * 1024 * 1024
        t = {"all_reduce": coll.allreduce_time}.get(kind, coll.ring_allgather_time)(s, 2, bw, lat)
        assert math.isclose(t, a + b * s, rel_tol=1e-6), kind


def test_profile_collectives_section_loads_and_refuses_unknown_names(tmp_path):
    raw = yaml.safe_load((REPO_PROFILES / "a800-80gb.yaml").read_text())
    q = {"bandwidth": {"value": 50, "unit": "GB/s", "source": "t"}, "latency": {"value": 30, "unit": "us", "source": "t"}}
    raw["nvlink"]["collectives"] = {"reduce_scatter": q}
    path = tmp_path / "fits.yaml"
    path.write_text(yaml.safe_dump(raw))
    p = load_profile(str(path))
    assert coll.link_params(p.nvlink, "reduce_scatter") == pytest.approx((50e9, 30e-6), rel=1e-12)
    raw["nvlink"]["collectives"] = {"reducescatter": q}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError, match="reducescatter"):
        load_profile(str(path))


def test_a_measured_reduce_scatter_prices_the_tp_reduce_scatters_only():
    m, base = get_model("gpt-7b"), load_profile("a800-80gb")
    lay = Layout(tp=8, sp=True)
    slow = _with_fits(base, reduce_scatter=(1e9, 1e-3))
    before = {c.name: c.seconds for c in forward_costs(m, lay, 1, 65536, base)}
    after = {c.name: c.seconds for c in forward_costs(m, lay, 1, 65536, slow)}
    moved = {k for k in before if not math.isclose(before[k], after[k])}
    assert moved == {"reducescatter_out_proj", "reducescatter_fc2"}
    assert all(after[k] > before[k] for k in moved)


def test_sp_backward_regathers_each_column_parallel_input():
    m, p = get_model("gpt-7b"), load_profile("a800-80gb")
    assert sp_regathered(m) == {"qkv", "fc1"}
    names = [c.name for c in backward_costs(m, Layout(tp=8, sp=True), 1, 65536, p)]
    assert names.count("allgather_qkv_input") == 1 and names.count("allgather_fc1_input") == 1
    # each before its GEMM's backward, which needs it for the weight gradient
    assert names.index("allgather_qkv_input") < names.index("qkv") and names.index("allgather_fc1_input") < names.index("fc1")
    for lay in (Layout(tp=8, sp=False), Layout(tp=1)):
        assert not [n for n in (c.name for c in backward_costs(m, lay, 1, 65536, p)) if n.endswith("_input")]


def test_megatron_hides_the_regather_beside_the_gemm_memos_executor_does_not():
    m, p = get_model("gpt-7b"), load_profile("a800-80gb")
    serial = Layout(tp=8, sp=True)
    assert load_frameworks()["megatron"].adapt(serial).sp_regather_overlap
    assert not load_frameworks()["any"].adapt(serial).sp_regather_overlap  # memo's executor
    overlapped = dataclasses.replace(serial, sp_regather_overlap=True)
    assert "ag-overlap" in overlapped.label() and "sp_regather_overlap" not in serial.to_dict()
    s, o = backward_costs(m, serial, 1, 65536, p), backward_costs(m, overlapped, 1, 65536, p)
    gathers = sum(c.seconds for c in s if c.name.endswith("_input"))
    scatters = sum(c.seconds for c in s if c.name in ("reducescatter_ln1", "reducescatter_ln2"))
    assert gathers > 0 and scatters > 0
    # each re-gather hides under its GEMM's data gradient, each norm's reduce-scatter under the weight gradient
    # (tests/test_sp_backward_overlap.py: the GEMMs at 64K are long enough to hide both)
    assert math.isclose(critical_time(s) - critical_time(o), gathers + scatters, rel_tol=1e-9)
    assert Layout.from_dict(overlapped.to_dict()) == overlapped
