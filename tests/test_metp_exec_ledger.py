"""The METP ledger on the layer's scratch: the rings' double buffers and per-step blocks are
scratch tensors under the simulator's names (so a memory plan can place them), the tensors handed
to the caller are not, and a planned name lands at its planned offset."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memo_exec.arena import AllocRecorder, ArenaPlan, ArenaScratch, CachingScratch  # noqa: E402
from memo_exec.metp.ledger import Ledger  # noqa: E402


def test_ring_tensors_come_from_the_scratch():
    rec = AllocRecorder()
    X = CachingScratch(torch.device("cpu"), rec)
    led = Ledger(X)
    w0, w1 = led.halves("metp_ffn_w_double_buffer", (8,), torch.float32, "cpu", "w_buffer")
    blk = led.alloc("metp_fc1_block0", (4, 3), torch.float32, "cpu", "block", zero=True)
    out = led.alloc("fc2", (4, 2), torch.float32, "cpu", "out", zero=True)
    assert float(blk.abs().sum()) == 0.0
    assert set(X._live) == {"metp_ffn_w_double_buffer", "metp_fc1_block0"}  # "fc2" is handed to the caller
    assert led.live_bytes() == 2 * 8 * 4 + 12 * 4 + 8 * 4
    led.free("metp_fc1_block0", "metp_ffn_w_double_buffer", "fc2")
    assert not X._live and led.live_bytes() == 0
    assert led.peak(["w_buffer", "block"]) == 2 * 8 * 4 + 12 * 4
    names = [e[2] for e in rec.events if e[0] == "malloc"]
    assert names == ["metp_ffn_w_double_buffer", "metp_fc1_block0"]
    X.set_phase("bwd")  # nothing left live in the scratch
    del w0, w1, out


def test_a_planned_ring_buffer_sits_at_its_offset():
    plan = ArenaPlan(256, {"fwd": {"metp_ffn_w_double_buffer": 64}})
    X = ArenaScratch(torch.device("cpu"), plan)
    led = Ledger(X)
    w0, w1 = led.halves("metp_ffn_w_double_buffer", (8,), torch.float32, "cpu", "w_buffer")
    assert w0.data_ptr() == X.arena.data_ptr() + 64 and w1.data_ptr() == w0.data_ptr() + 32
    blk = led.alloc("metp_fc1_block0", (4,), torch.float32, "cpu", "block")  # not planned: caching allocator
    assert "fwd:metp_fc1_block0" in X.unplanned
    led.free("metp_ffn_w_double_buffer", "metp_fc1_block0")
    del blk
