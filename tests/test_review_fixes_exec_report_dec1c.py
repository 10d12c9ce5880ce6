"""Review fixes (2026-12-01) in memo-exec's report:

1. a hand-edited plan was compared with without a warning unless the edit moved its step time, status or peak:
   every ``layer_timings_s`` value x 10, or ``predicted.mfu`` set to 0.9, read as the predictions beside the run
   (`memo_sim.plan.stale` now compares every number the report sets beside a measurement);
2. ``--layers N`` priced the layer rows from the plan's stored ``layer_timings_s`` (another layer count's: a 2-layer
   run of a 4-layer MEMO plan read an offload the 2-layer re-simulation, whose stream and per-layer tables it showed,
   does not make);
3. report.md's title gave one sequence's tokens, not the iteration's (batch 4 of 256 read "256 tokens");
4. its header called the steady state "the median of each quantity", where a memory peak is the steps' maximum
   (`memo_exec.measure.steady_state`).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import torch
from click.testing import CliRunner

from memo_exec.cli import cli as exec_cli
from memo_exec.compare import resimulate, stale_prediction
from memo_sim.plan.schema import read_plan
from tests.exec_helpers import time_limit

torch.set_num_threads(1)

PROFILE = str(Path(__file__).parent / "data" / "profiles" / "cpu-quick-vm.yaml")
SMALL = ["--hidden", "128", "--heads", "4", "--vocab", "512", "--dtype", "fp32", "--seq", "256", "--gpus", "1",
         "--profile", PROFILE]


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(240):
        yield


@pytest.fixture
def no_figures(monkeypatch):
    """The runs' PNGs undrawn (matplotlib took 3 of a run's 5 s here): these tests read the rows and report.md."""
    import memo_exec.report as R  # noqa: PLC0415

    for name in ("gantt_figure", "memory_figure", "overlay_gantt", "layer_figure"):
        monkeypatch.setattr(R, name, lambda *a, **kw: None)


def whatif(out: Path, *args: str) -> Path:
    from memo_sim.cli import cli as sim_cli  # noqa: PLC0415

    r = CliRunner().invoke(sim_cli, ["whatif", *SMALL, *args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


@pytest.fixture(scope="module")
def store_all(tmp_path_factory) -> Path:
    """A 2-layer store_all plan of two sequences a step, as the what-if writes it (its prediction simulated)."""
    return whatif(tmp_path_factory.mktemp("sa"), "--layers", "2", "--policy", "store_all", "--batch", "2")


def edited(plan_file: Path, out: Path, edit) -> Path:
    doc = json.loads(plan_file.read_text())
    edit(doc)
    out.write_text(json.dumps(doc))
    return out


EDITS = {
    "layer timings x 10": lambda d: d.update(layer_timings_s={k: 10 * v for k, v in d["layer_timings_s"].items()}),
    "mfu 0.9": lambda d: d["predicted"].update(mfu=0.9),
    "tokens/s x 2": lambda d: d["predicted"].update(tgs_tokens_per_gpu_s=2 * d["predicted"]["tgs_tokens_per_gpu_s"]),
    "exposed copy 1 ms": lambda d: d["predicted"].update(exposed_copy_s=1e-3),
    "host peak 1 MiB": lambda d: d["predicted"].update(peak_host_bytes_per_node=2.0**20),
    "offload 0.26 ms": lambda d: d["layer_timings_s"].update(offload=2.6e-4),
}
WORDS = {"layer timings x 10": "layer forward", "mfu 0.9": "MFU 0.900", "tokens/s x 2": "tokens/GPU/s",
         "exposed copy 1 ms": "exposed copy 1.00 ms", "host peak 1 MiB": "peak host 1.00 MiB",
         "offload 0.26 ms": "layer offload"}


# --- 1. every number the report compares is checked against the re-simulation ------------------------------------

@pytest.mark.parametrize("name", list(EDITS))
def test_an_edit_that_keeps_the_step_time_is_stale(store_all, tmp_path, name):
    """A review: layer timings x 10 or MFU 0.9 kept the step time and no `warning:` line came."""
    plan = read_plan(edited(store_all, tmp_path / "e.json", EDITS[name]))
    sim, _ = resimulate(plan, plan.model.layers)
    assert sim.iteration_s == pytest.approx(plan.predicted.iteration_s, rel=1e-6)  # the step time is unchanged
    words = stale_prediction(plan, sim)
    assert words is not None and WORDS[name] in words and "re-simulated now" in words, words


def test_an_unedited_plan_is_not_stale(store_all):
    plan = read_plan(store_all)
    assert stale_prediction(plan, resimulate(plan, plan.model.layers)[0]) is None


def test_the_rule_compares_zero_with_zero_and_skips_what_a_side_lacks():
    """A stored 0 against the simulator's float residue agrees; a number one side lacks (None) is not compared."""
    from memo_sim.plan.stale import stale_prediction as rule

    pred = NS(status="OK", source="simulated", iteration_s=0.1, mfu=None, tgs_tokens_per_gpu_s=10.0,
              exposed_copy_s=0.0, peak_host_bytes_per_node=0.0, peak_gpu_bytes=None)
    now = {"mfu": 0.3, "tgs_tokens_per_gpu_s": 10.05, "exposed_copy_s": 1e-19, "peak_host_bytes_per_node": 0.0,
           "layer_timings_s": {"forward": 1e-3, "offload": 1e-20}}
    assert rule(pred, "OK", 0.1, resimulated=now, layer_timings_s={"forward": 1.005e-3, "offload": 0.0}) is None
    assert "layer offload" in rule(pred, "OK", 0.1, resimulated=now, layer_timings_s={"offload": 2e-4})


def test_run_warns_and_compares_an_edited_plan_with_the_re_simulation(store_all, tmp_path, no_figures):
    """`memo-exec run` of the plan with its layer timings x 10: one warning line (stderr and report.md) and the layer
    rows from the re-simulation, not the edited 10x."""
    bad = edited(store_all, tmp_path / "e_lt.json", EDITS["layer timings x 10"])
    r = CliRunner().invoke(exec_cli, ["run", str(bad), "--device", "cpu", "--steps", "1", "--out",
                                      str(tmp_path / "o"), "--json"])
    assert r.exit_code == 0, r.output
    assert "warning: the plan's stored prediction layer forward" in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert doc["stale_prediction"]
    rows = {row["quantity"]: row for row in doc["totals"]}
    plan = read_plan(store_all)
    assert rows["layer forward"]["predicted"] == pytest.approx(plan.layer_timings_s["forward"])  # not the edit's
    assert rows["layer forward"]["predicted_from"] == "the re-simulation's layer timings"
    report = (tmp_path / "o" / "report.md").read_text()
    assert "warning: the plan's stored prediction layer forward" in report
    # 3. and 4.: the title counts the iteration's two sequences; the header says how memory peaks are taken
    assert report.splitlines()[0].endswith("512 tokens an iteration (2 sequences of 256)"), report.splitlines()[0]
    assert "the median of each time, the maximum of each memory peak" in report


# --- 2. --layers N: the layer rows from the N-layer re-simulation ------------------------------------------------

def test_a_shorter_run_prices_the_layer_rows_from_its_re_simulation(tmp_path, no_figures):
    """A review: the README's 4-layer MEMO toy run with `--layers 2` read offload and prefetch 0.264 ms "from
    plan.layer_timings_s" beside stream and per-layer tables of a 2-layer re-simulation that offloads nothing."""
    plan_file = whatif(tmp_path / "m4", "--layers", "4", "--policy", "memo", "--alpha", "0.3")
    plan = read_plan(plan_file)
    assert plan.layer_timings_s["offload"] > 0  # the 4-layer plan offloads
    sim, _ = resimulate(plan, 2)
    r = CliRunner().invoke(exec_cli, ["run", str(plan_file), "--device", "cpu", "--steps", "1", "--layers", "2",
                                      "--out", str(tmp_path / "o"), "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["quantity"]: row for row in json.loads(r.stdout)["totals"]}
    for q, k in (("layer forward", "forward"), ("layer recompute", "recompute"), ("layer offload (d2h)", "offload"),
                 ("layer prefetch (h2d)", "prefetch")):
        assert rows[q]["predicted"] == pytest.approx(sim.layer_timings[k]), q
        assert rows[q]["predicted_from"].startswith("the re-simulation's layer timings (2 layers)"), rows[q]
    assert rows["layer offload (d2h)"]["predicted"] == 0 and rows["layer recompute"]["predicted"] == 0
    report = (tmp_path / "o" / "report.md").read_text()
    assert "per-layer ones from the re-simulation's layer timings (2 layers)" in report


def test_a_shorter_run_whose_re_simulation_failed_shows_no_layer_predictions():
    """Without the N-layer re-simulation, the plan's stored times (another layer count's) do not stand in."""
    from memo_exec.report import predicted_layer_timings

    plan = NS(layer_timings_s={"forward": 1.0, "offload": 2.0}, profile="p", model=NS(layers=4))
    lt, said = predicted_layer_timings(plan, {}, None, False, "the simulator refused the plan (x)", layers=2)
    assert lt == {} and said.startswith("not predicted for 2 of the plan's 4 layers"), said
    assert predicted_layer_timings(plan, {}, None, False, "", layers=4) == (plan.layer_timings_s,
                                                                           "plan.layer_timings_s")


# --- 3. the title: the tokens an iteration trains --------------------------------------------------------------

def test_the_title_states_the_tokens_an_iteration_trains():
    """A review: a pp 2 run of batch 4 x 256 tokens was titled "256 tokens"; ``meta["tokens"]`` is the iteration's
    (a multi-rank run's, dp replicas included)."""
    from memo_exec.report import iteration_tokens_words

    assert iteration_tokens_words({"seq_tokens": 256, "tokens": 1024}) == "1,024 tokens an iteration (4 sequences " \
                                                                          "of 256)"
    assert iteration_tokens_words({"seq_tokens": 2048, "tokens": 2048}) == "2,048 tokens an iteration (one sequence)"

