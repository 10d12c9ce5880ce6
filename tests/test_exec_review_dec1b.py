"""Review fixes of the executor (2026-12-01, h3): a multi-device plan's memory plan that the ranks do not follow is
said on the console (run and validate); the distributed memory check counts the transient terms; Megatron SP's
all-gather holds one full-length buffer; SPPO's host buffers come from the exact-size registered pool."""

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from memo_sim.plan.schema import read_plan  # noqa: E402

TOY = ["--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "512", "--dtype", "fp32", "--seq", "512"]


@pytest.fixture(scope="module")
def tp2_plan(tmp_path_factory):
    """The review's repro plan: MEMO on tp 2 (its level 1 the TP rank's layer, which the ranks follow since h4)."""
    from memo_sim.cli import cli as sim

    out = tmp_path_factory.mktemp("tp2toy")
    r = CliRunner().invoke(sim, ["whatif", *TOY, "--gpus", "2", "--tp", "2", "--policy", "memo", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


@pytest.fixture(scope="module")
def metp_plan(tmp_path_factory):
    """MEMO on METP tp 2: a split layer whose memory plan the ranks do not follow (`split_layer_why`: METP's rings
    have no meta-device dry run; the review's plan was ring CP 2, followed since h1 (2026-12-02,
    tests/test_dist_exec_cp_ulysses_arena.py), as the review's tp-2 plan is since h4,
    tests/test_dist_exec_split_arena.py)."""
    from memo_sim.cli import cli as sim

    out = tmp_path_factory.mktemp("metp2toy")
    r = CliRunner().invoke(sim, ["whatif", *TOY, "--gpus", "2", "--tp", "2", "--tp-mode", "metp", "--policy", "memo",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


# ---------------------------------------------------------------- 1. the memory plan not followed, said at start
def test_a_split_layers_memory_plan_not_followed_is_said_at_the_start_of_run(metp_plan, monkeypatch):
    from memo_exec import cli
    from memo_exec.distributed import launch
    from memo_exec.distributed.runner import memory_plan_not_followed

    plan = read_plan(metp_plan)
    line = memory_plan_not_followed(plan)
    assert line and "tp 2 (tp_mode metp)" in line and "not followed" in line and "no fragmentation" in line
    assert "\n" not in line and "may exceed" in line
    assert memory_plan_not_followed(plan, use_memory_plan=False) is None
    started = []

    def launched(nproc, argv, out, progress, shown_out=None):  # the note must come before the ranks start
        started.append(nproc)
        return 1, ""

    monkeypatch.setattr(launch, "launch_nproc", launched)
    r = CliRunner().invoke(cli.cli, ["run", str(metp_plan), "--nproc", "2", "--device", "cpu", "--steps", "1",
                                      "--out", str(metp_plan.parent / "run")])
    assert started == [2]
    said = [x for x in r.output.splitlines() if "not followed" in x]
    assert len(said) == 1 and "tp 2 (tp_mode metp)" in said[0], r.output


def test_validate_names_the_memory_plan_not_followed_beside_the_memory_row(tmp_path):
    from memo_exec import validate as V
    from memo_sim.layout.parallel import Layout
    from memo_sim.model.config import ModelConfig
    from memo_sim.profile.loader import load_profile

    prof = load_profile("h100-sxm5-80gb")
    model = ModelConfig("toy", 2, 256, 8, 1024, vocab=512, dtype="fp32")
    specs = V.plan_set([512], ["memo"], [0.5])
    said = []

    def runner(plan_file, run_dir, device, steps, timeout, threads):
        return "failed: not run here", {}

    rows = V.run_validation(model, prof, specs, device="cpu", steps=1, out_dir=tmp_path, runner=runner,
                            layout=Layout(ulysses=2), say=said.append)  # tp 2 is followed since h4, cp 2 since h1
    # (2026-12-02); a Ulysses that keeps its head-sharded tensors for the backward (the layout's default) is not
    assert rows[0].memory_plan_note and "ulysses 2" in rows[0].memory_plan_note
    assert len(said) == 1 and said[0].startswith(f"note: {rows[0].label}: ") and "no fragmentation" in said[0]
    text = V.render_report(rows, V.summarize(rows), model, prof, "cpu", "memo-exec validate", None, Layout(ulysses=2))
    table_end = text.index("## Summary")
    assert f"- peak memory of {rows[0].label}: the plan's static memory plan is not followed" in text[:table_end]
    assert rows[0].to_dict()["memory_plan_note"] == rows[0].memory_plan_note


# ---------------------------------------------------------------- 2. the distributed estimate's transient terms
def _rank_estimate(rank: int, world: int, plan_file: str) -> dict:
    """This rank's estimate of the plan, or the line refusing it (built before anything is allocated)."""
    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor
    from memo_exec.errors import ExecError, FitError
    from memo_exec.runner import RunOptions

    plan = read_plan(plan_file)
    ctx = build_context(plan.layout, torch.device("cpu"))
    try:
        ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp32", steps=1), ctx, DeviceSpec("cpu"))
    except FitError as e:
        return {"refused": str(e), "fit_error": True}
    except ExecError as e:
        return {"refused": str(e), "fit_error": False}
    out = {"terms": dict(ex.estimate.terms), "not_estimated": list(ex.estimate.not_estimated)}
    ex.close()
    return out


def test_the_distributed_estimate_counts_the_plans_transients_and_refuses_when_over(tp2_plan, tmp_path):
    """A rank's estimate holds the plan's transient, boundary and classifier terms (the simulator's for one GPU of the
    layout; this fp32 plan runs in fp32, so as they are) and its total is the simulator's formula (a review: 0, 0, 0 and
    a 35.2 MiB total against the simulator's 38.64 MiB); a plan whose transients alone exceed the device is refused in
    one line on every rank before anything is allocated."""
    import json

    from tests.dist_harness import spawn

    bd = read_plan(tp2_plan).predicted.memory_breakdown_bytes
    ok, doc = spawn(_rank_estimate, 2, str(tp2_plan))
    t = ok["terms"]
    assert (t["transient_peak"], t["layer_boundary"], t["classifier_peak"]) == (
        bd["transient_peak_bytes"], bd["layer_boundary_bytes"], bd["classifier_peak_bytes"])
    static = sum(t[k] for k in ("model_states", "skeletal_resident", "buffers", "lse", "norm_stats"))
    assert t["peak_total"] == static + max(t["transient_peak"] + t["layer_boundary"], t["classifier_peak"])
    assert "peak_total" not in ok["not_estimated"] and "transient_peak" not in ok["not_estimated"]
    assert abs(t["peak_total"] - bd["peak_gpu_bytes"]) < 0.01 * bd["peak_gpu_bytes"]
    big = json.loads(tp2_plan.read_text())
    big["predicted"]["memory_breakdown_bytes"]["transient_peak_bytes"] = float(1 << 60)  # an exabyte of transients
    (tmp_path / "plan.json").write_text(json.dumps(big))
    refused = spawn(_rank_estimate, 2, str(tmp_path / "plan.json"))
    assert all(r.get("fit_error") and "does not fit" in r["refused"] and "\n" not in r["refused"] for r in refused)
    assert all("transient_peak" in r["refused"] for r in refused), refused


# ---------------------------------------------------------------- 3. the SP all-gather holds one full-length buffer
@pytest.mark.parametrize("n,p", [(1, 2), (2, 2), (5, 2), (7, 3), (16, 4), (13, 8)])
def test_sp_gather_interleaves_inside_its_one_output(monkeypatch, n, p):
    """`gather_interleaved` with p simulated ranks equals the rank-major gather then reorder it replaced, bit for
    bit, and writes only inside its output."""
    from memo_exec.distributed import collectives as C

    w = 3
    ranks = [torch.randn(n, w, dtype=torch.float64) for _ in range(p)]

    def fake_gather(out, t, group=None):  # rank j's rows of the piece this rank gives (same rows on every rank)
        k = t.shape[0]
        start = next(i for i in range(n - k + 1) if torch.equal(ranks[0][i:i + k], t))
        out.copy_(torch.cat([r[start:start + k] for r in ranks], 0))

    monkeypatch.setattr(C, "all_gather_single", fake_gather)
    out = torch.full((n * p, w), float("nan"), dtype=torch.float64)
    C.gather_interleaved(out, ranks[0], p, None)
    want = torch.cat(ranks, 0).view(p, n, w).transpose(0, 1).reshape(n * p, w)
    assert torch.equal(out, want)


def test_sp_gather_asks_for_no_rank_major_buffer():
    """The scratch requests of one SP gather (the meta-device trace's `SizesOnlyComm` and the real `MegatronComm`):
    the gathered tensor alone (a review: ``*_rank_major`` beside it, 9.69 + 9.69 GiB at 1240K on tp 8)."""
    from memo_exec.distributed.tp import megatron as M

    class X:
        def __init__(self):
            self.asked = []

        def get(self, name, shape, dtype):
            self.asked.append(name)
            return torch.empty(shape, dtype=dtype)

        def free(self, name):
            pass

    x = X()
    M.SizesOnlyComm(None, 4, True).gather(torch.zeros(8, 2), x, "ln1_gathered")
    assert x.asked == ["ln1_gathered"]


# ---------------------------------------------------------------- 4. SPPO's host rows in exact-size registered blocks
def _sppo_host(rank: int, world: int, plan_file: str) -> dict:
    """Two steps of the plan's one stage with page-locking as on CUDA (``cudaHostRegister`` recorded, not called):
    the bytes the offload holds and every registration's size."""
    from memo_exec.activations.host_pool import HostPool
    from memo_exec.data import TokenSource
    from memo_exec.model import GPT
    from memo_exec.sppo.pipeline import StageRunner

    registered = []

    def page_lock(self):  # what `HostPool._page_lock` does where cudaHostRegister succeeds
        registered.append(self.nbytes)
        self.method = "registered"

    HostPool._page_lock = page_lock
    plan = read_plan(plan_file)
    m = plan.model
    gpt = GPT(m, m.layers, torch.device("cpu"), torch.float32)
    gpt.init_(0)
    seq = plan.policy.bounds[-1]
    runner = StageRunner(gpt, 0, plan.policy.stage_pieces(m, plan.layout, plan.batch), plan.batch, seq,
                         list(plan.policy.alphas), [0], torch.device("cpu"))
    runner.offload.pin = True  # a CUDA stage's
    inputs, targets = TokenSource(m.vocab, plan.batch, seq, seed=0).batch_at(0)
    try:
        for _ in range(2):
            runner.step(inputs, targets)
    finally:
        runner.close()
    return {"pool_bytes": runner.offload.pool_bytes(), "registered": registered,
            "describe": runner.offload.host_pool_describe()}


def test_sppo_pins_the_simulators_exact_size_blocks(tmp_path):
    """The bytes an SPPO stage pins are the simulator's (`sppo_host_stages`, the ``registered_pool`` layout): one
    exact-size block per offloaded unit, registered once and reused by the next step (a review: a pin_memory tensor per
    unit and tensor, each rounded up to a power of two by PyTorch's pinned allocator). Widths of 40 and 160 fp32
    elements and the plan's rows make tensors of sizes that are not multiples of the 256-byte alignment."""
    import json

    from memo_sim.cli import cli as sim
    from memo_sim.memplan.footprint import sppo_host_stages
    from memo_sim.profile.loader import load_profile
    from tests.dist_harness import spawn

    r = CliRunner().invoke(sim, ["whatif", "--layers", "2", "--hidden", "40", "--heads", "4", "--vocab", "128",
                                 "--dtype", "fp32", "--seq", "200", "--gpus", "1", "--policy", "sppo", "--subseqs", "4",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "plan.json").read_text())
    doc["policy"]["alphas"] = [0.7, 0.55, 0.3, 0.9]  # the what-if needed none: every piece offloads some rows
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    plan = read_plan(tmp_path / "plan.json")
    [(_layers, _pieces, units, words)] = sppo_host_stages(plan.model, plan.layout, plan.batch, plan.policy,
                                                          load_profile(plan.profile))
    [got] = spawn(_sppo_host, 1, str(tmp_path / "plan.json"))
    assert got["pool_bytes"] == words > 0
    assert len(got["registered"]) == units and sum(got["registered"]) == words  # once each, not again at step 2
    assert got["describe"]["method"] == "registered" and got["describe"]["warning"] is None
