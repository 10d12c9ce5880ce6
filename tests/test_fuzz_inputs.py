"""[robust-ux] Property-based fuzz of every input file and a few flags, driving the CLIs in-process.

Real inputs (the A800 profile, a plan, a model file, an id,lower,upper,size CSV, a memo-trace and
a timeline) get one mutation each, drawn by hypothesis: a leaf set to NaN, infinity, a word, a
container, a negative, zero or a huge number, a key deleted or an unknown key added. Whatever the
mutation, the command must end with exit 0 or exit 2, never a traceback; exit 2 is exactly one
line (``error: ...``) and leaves no output file behind. Mutations that are invalid whatever the
field (a non-finite number, a word or a container where a number is, an unknown key) must be
refused: exit 2. Free-form parts (a profile's provenance, a trace's or timeline's meta, a plan's
timeline reference and prediction breakdowns) are not mutated.

The issue's cases are explicit examples: a profile with ``gpu.memory.value: .nan`` driving
``whatif --seq 1M --policy store_all``, ``--tp 0``, ``--gpus 1e20``, ``model.layers=1e30`` in a
model file and a plan, a non-UTF-8 profile in ``hardware_profiles/`` and a CSV with a BOM.
Hypothesis runs derandomized (the same cases every run) without deadlines.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memo_sim.cli import cli as sim_cli
from memo_sim.layout import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.plan import Plan
from memo_sim.policy import get_policy
from memo_sim.profile.loader import REPO_PROFILES

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# -- seeds: real inputs ---------------------------------------------------------------------------
PROFILE = yaml.safe_load((REPO_PROFILES / "a800-80gb.yaml").read_text(encoding="utf-8"))
TOY = ModelConfig("toy", 2, 64, 4, 256, vocab=128)
MODEL = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 128}
PLAN = Plan(model=TOY, batch=1, seq_tokens=1024, gpus=1, layout=Layout(), policy=get_policy("memo", 0.5),
            profile="a800-80gb", predicted={"status": "OK", "iteration_s": 0.01, "mfu": 0.3},
            layer_timings_s={"forward": 0.001, "backward": 0.002}).to_dict()
TRACE = {"format": "memo-trace", "version": 1, "name": "fuzz", "meta": {},
         "buffers": [{"id": "a", "size": 4096, "lower": 0, "upper": 2, "phase": "fwd", "layer": 0,
                      "kind": "transient", "name": "a"},
                     {"id": "b", "size": 8192, "lower": 1, "upper": 3},
                     {"id": "c", "size": 4096, "lower": 2, "upper": 4, "kind": "skeletal"}]}
CSV_ROWS = [["id", "lower", "upper", "size"], ["a", "0", "2", "4096"], ["b", "1", "3", "8192"],
            ["c", "2", "4", "4096"]]
TIMELINE = {"format": "memo-timeline", "version": 1, "meta": {"layers": 2},
            "events": [{"op": "fc1", "layer": 0, "phase": "fwd", "stream": "compute", "device": 0,
                        "start": 0.0, "end": 0.001, "nbytes": 0.0, "flops": 1e9},
                       {"op": "offload", "layer": 0, "phase": "offload", "stream": "d2h", "device": 0,
                        "start": 0.0005, "end": 0.002, "nbytes": 1e6, "flops": 0.0}],
            "memory": [{"time": 0.0, "device": 0, "kind": "gpu", "nbytes": 1e9},
                       {"time": 0.001, "device": -1, "kind": "host", "nbytes": 2e9}]}
FREE_FORM = {("provenance",), ("meta",), ("timeline",), ("created",), ("memo_version",),
             ("predicted", "memory_breakdown_bytes"), ("predicted", "allocator"), ("predicted", "source"),
             ("name",), ("description",),
             # the memory plan's level-2 placement: recorded for reports, not read by the executor
             ("memory_plan", "layer_block_offsets"), ("memory_plan", "model_offsets"),
             ("memory_plan", "lower_bound_bytes"), ("method",), ("solve_time_s",)}

# a mutation: (kind, replacement); "bad" kinds are invalid wherever a number or a mapping is
BAD_VALUES = [float("nan"), float("inf"), float("-inf"), "abc", "12", [], {}]
MAYBE_VALUES = [-1, 0, 1, 0.5, 1e30, 10**30, True, None, "", 2**63]


def _paths(obj, prefix=()):
    """Every mutable place of a JSON-like object: (path, kind of leaf)."""
    if prefix in FREE_FORM or prefix[-1:] in FREE_FORM:
        return
    if isinstance(obj, dict):
        yield prefix, "dict"
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        yield prefix, "list"
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))
    elif isinstance(obj, bool) or isinstance(obj, (int, float)):
        yield prefix, "number"
    else:
        yield prefix, "str"


def _mutations(seed, only_bad: bool = False):
    """A hypothesis strategy of (path, op, value, must_refuse) for one seed object; ``only_bad``:
    only the mutations that must be refused."""
    every = list(_paths(seed))
    paths = [(p, k) for p, k in every if p]
    numbers = [p for p, k in paths if k == "number"]
    dicts = [p for p, k in every if k == "dict"]  # the top level too
    anything = [p for p, _ in paths]
    bad = [st.tuples(st.sampled_from(numbers), st.just("set"), st.sampled_from(BAD_VALUES), st.just(True)),
           st.tuples(st.sampled_from(dicts), st.just("add"), st.just(1), st.just(True))]
    maybe = [st.tuples(st.sampled_from(anything), st.just("set"), st.sampled_from(MAYBE_VALUES), st.just(False)),
             st.tuples(st.sampled_from(anything), st.just("delete"), st.none(), st.just(False))]
    return st.one_of(*bad) if only_bad else st.one_of(*bad, *maybe)


def _apply(seed, mutation):
    path, op, value, _ = mutation
    out = copy.deepcopy(seed)
    if not path:  # "add" at the top level
        out["zz_unknown_field"] = value
        return out
    parent = out
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    if op == "add":
        parent[last]["zz_unknown_field"] = value
    elif op == "delete":
        del parent[last]
    else:
        parent[last] = value
    return out


def _dump_json(obj) -> str:
    # Python's json writes NaN / Infinity tokens, as a careless tool would; huge ints stay exact
    return json.dumps(obj)


@contextmanager
def scratch():
    with tempfile.TemporaryDirectory(prefix="memo-fuzz-") as d:
        yield Path(d)


def drive(cli, args, folder: Path, inputs: set[str], must_refuse: bool = False):
    """Run a command in-process; check the boundary's promises; return the exit code."""
    r = CliRunner().invoke(cli, args, catch_exceptions=True)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        import traceback

        tb = "".join(traceback.format_exception(type(r.exception), r.exception, r.exception.__traceback__))
        pytest.fail(f"traceback from {args}:\n{tb[-3000:]}")
    ran = (0, 3) if args[0] == "whatif" else (0,)  # whatif: 3 = ran, nothing fits (documented)
    assert r.exit_code in (*ran, 2), (args, r.exit_code, r.output[-500:])
    if r.exit_code == 2:
        text = r.output.strip()
        assert text.startswith("error:") and "\n" not in text, (args, r.output[-1000:])
        left = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - inputs
        assert not left, f"{args} failed but left {sorted(left)} behind"
    if must_refuse:
        assert r.exit_code == 2, f"bad input accepted: {args}\n{r.output[-500:]}"
    return r.exit_code


# -- profiles -------------------------------------------------------------------------------------
NAN_PROFILE = ((("gpu", "memory", "value"), "set", float("nan"), True))
PROFILE_NAMED = dict(PROFILE, name="fuzz", description="A800 (réplica for the fuzz test: a non-ASCII character)")


@contextmanager
def cwd(folder: Path):
    old = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)


@settings(max_examples=520, **SETTINGS)
@example(mutation=NAN_PROFILE, encoding="utf-8")
@example(mutation=((("host", "memory", "value"), "set", float("inf"), True)), encoding="utf-8")
@example(mutation=((("node", "gpus_per_node", "value"), "set", 1e20, False)), encoding="utf-8")
@example(mutation=((("gpu", "model"), "set", "A800", False)), encoding="latin-1")
@example(mutation=((("gpu", "model"), "set", "A800", False)), encoding="utf-8-sig")
@given(mutation=_mutations(PROFILE_NAMED), encoding=st.sampled_from(["utf-8", "utf-8", "utf-8-sig", "latin-1"]))
def test_fuzz_profiles(mutation, encoding):
    """A mutated profile in ./hardware_profiles/, looked up by name, in UTF-8 (with or without a
    byte-order mark) or in Latin-1 (not UTF-8: refused when it holds a non-ASCII character)."""
    with scratch() as d:
        text = json.dumps(_apply(PROFILE_NAMED, mutation), ensure_ascii=False)
        (d / "hardware_profiles").mkdir()
        (d / "hardware_profiles" / "fuzz.json").write_bytes(text.encode(encoding))
        (d / "m.json").write_text(json.dumps(MODEL), encoding="utf-8")
        not_utf8 = encoding == "latin-1" and not text.isascii()
        with cwd(d):
            code = drive(sim_cli, ["whatif", "--profile", "fuzz", "--model", "m.json", "--gpus", "1", "--seq", "1K",
                                   "--simulate-top", "0", "--no-plan"], d, {"hardware_profiles/fuzz.json", "m.json"},
                         must_refuse=mutation[3] or not_utf8)
        if mutation == NAN_PROFILE or not_utf8:
            assert code == 2


def test_nan_profile_is_refused_for_the_issues_command(tmp_path):
    """The issue's worst case, as written in YAML: `.nan` GPU memory, then the 1M store_all what-if."""
    text = (REPO_PROFILES / "a800-80gb.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    raw["gpu"]["memory"]["value"] = float("nan")
    (tmp_path / "nan.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert ".nan" in (tmp_path / "nan.yaml").read_text()
    r = CliRunner().invoke(sim_cli, ["whatif", "--seq", "1M", "--policy", "store_all", "--profile",
                                     str(tmp_path / "nan.yaml"), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "gpu.memory" in r.output and "finite" in r.output
    assert not (tmp_path / "out").exists()


def test_non_utf8_profile_in_hardware_profiles(tmp_path, monkeypatch):
    (tmp_path / "hardware_profiles").mkdir()
    (tmp_path / "hardware_profiles" / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(sim_cli, ["profiles"])
    assert r.exit_code == 0 and "INVALID" in r.output and "a800-80gb" in r.output
    r = CliRunner().invoke(sim_cli, ["whatif", "--profile", "latin1", "--no-plan"])
    assert r.exit_code == 2 and "not UTF-8" in r.output and r.output.count("\n") == 1


# -- flags ----------------------------------------------------------------------------------------
FLAG_VALUES = ["0", "-1", "1e20", "99999999999999999999", "abc", "nan", "inf", "1.5", "", "8M", "1e30"]


@settings(max_examples=250, **SETTINGS)
@example(flag="--tp", value="0")
@example(flag="--gpus", value="1e20")
@example(flag="--layers", value="1e30")
@given(flag=st.sampled_from(["--tp", "--cp", "--ulysses", "--dp", "--gpus", "--layers", "--hidden", "--heads",
                             "--ffn", "--vocab", "--seq", "--batch", "--alpha", "--zero", "--pp", "--subseqs"]),
       value=st.sampled_from(FLAG_VALUES))
def test_fuzz_whatif_flags(flag, value):
    with scratch() as d:
        (d / "m.json").write_text(json.dumps(MODEL), encoding="utf-8")
        args = ["whatif", "--model", str(d / "m.json"), "--gpus", "2", "--seq", "2K", "--simulate-top", "0",
                "--out", str(d / "out"), flag, value]
        if flag == "--gpus":
            args = args[:4] + args[6:]
        bad = value in ("-1", "1e20", "abc", "nan", "inf", "", "99999999999999999999", "1e30") or \
            (value == "0" and flag not in ("--alpha", "--zero"))
        drive(sim_cli, args, d, {"m.json"}, must_refuse=bad)


WHATIF_BATCH_HUGE = ("--batch", "99999999999999999999")


def test_whatif_huge_batch_is_refused():
    with scratch() as d:
        (d / "m.json").write_text(json.dumps(MODEL), encoding="utf-8")
        drive(sim_cli, ["whatif", "--model", str(d / "m.json"), "--gpus", "2", "--seq", "2K", "--simulate-top", "0",
                        "--no-plan", *WHATIF_BATCH_HUGE], d, {"m.json"}, must_refuse=True)


@settings(max_examples=100, **SETTINGS)
@example(flag="--tp", value="0")
@given(flag=st.sampled_from(["--tp", "--cp", "--ulysses", "--seq", "--batch", "--alpha", "--time-limit", "--layers"]),
       value=st.sampled_from(FLAG_VALUES))
def test_fuzz_memplan_flags(flag, value):
    with scratch() as d:
        args = ["memplan", "--layers", "2", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128",
                "--seq", "1K", "--tp", "1", "--time-limit", "1", "--json", "--out", str(d / "mp"), flag, value]
        bad = value in ("-1", "1e20", "abc", "nan", "inf", "", "99999999999999999999", "1e30") or \
            (value == "0" and flag != "--alpha")
        drive(sim_cli, args, d, set(), must_refuse=bad)


# -- model files ----------------------------------------------------------------------------------
@settings(max_examples=250, **SETTINGS)
@example(mutation=((("layers",), "set", 1e30, True)))
@example(mutation=((("layers",), "set", 10**30, True)))
@given(mutation=_mutations(MODEL))
def test_fuzz_model_files(mutation):
    with scratch() as d:
        (d / "m.json").write_text(_dump_json(_apply(MODEL, mutation)), encoding="utf-8")
        drive(sim_cli, ["whatif", "--model", str(d / "m.json"), "--gpus", "1", "--seq", "1K", "--simulate-top", "0",
                        "--no-plan"], d, {"m.json"}, must_refuse=mutation[3])


# -- plans ----------------------------------------------------------------------------------------
PLAN_BAD = [((("layout", "zero"), "set", -1, True)), ((("layout", "sp"), "set", "abc", True)),
            ((("layout", "cp"), "set", "12", True)), ((("model", "layers"), "set", 1e30, True))]


@settings(max_examples=520, **SETTINGS)
@example(mutation=PLAN_BAD[0])
@example(mutation=PLAN_BAD[1])
@example(mutation=PLAN_BAD[2])
@example(mutation=PLAN_BAD[3])
@given(mutation=_mutations(PLAN))
def test_fuzz_plans_check_plan(mutation):
    with scratch() as d:
        (d / "plan.json").write_text(_dump_json(_apply(PLAN, mutation)), encoding="utf-8")
        code = drive(sim_cli, ["check-plan", str(d / "plan.json")], d, {"plan.json"}, must_refuse=mutation[3])
        if mutation in PLAN_BAD:
            assert code == 2


@settings(max_examples=120, **SETTINGS)
@example(mutation=PLAN_BAD[0])
@example(mutation=PLAN_BAD[1])
@given(mutation=_mutations(PLAN))
def test_fuzz_plans_exec_trace(mutation):
    from memo_exec.cli import cli as exec_cli

    with scratch() as d:
        (d / "plan.json").write_text(_dump_json(_apply(PLAN, mutation)), encoding="utf-8")
        drive(exec_cli, ["trace", str(d / "plan.json"), "--out", str(d / "trace.json")], d, {"plan.json"},
              must_refuse=mutation[3])


# -- request traces and CSVs ----------------------------------------------------------------------
@settings(max_examples=250, **SETTINGS)
@given(mutation=_mutations(TRACE))
def test_fuzz_traces(mutation):
    with scratch() as d:
        (d / "t.json").write_text(_dump_json(_apply(TRACE, mutation)), encoding="utf-8")
        drive(sim_cli, ["memplan", "--trace", str(d / "t.json"), "--json", "--time-limit", "1"], d, {"t.json"},
              must_refuse=mutation[3])


CSV_BAD = ["nan", "inf", "abc", "1.5", "", "1e3", "0x10", "--1"]
CSV_MAYBE = ["-1", "0", "99999999999999999999999", "3", "id", "lower", " 7 ", "\ufeffid"]


@settings(max_examples=300, **SETTINGS)
@example(row=1, col=3, value="nan", bom=False)
@example(row=0, col=0, value="id", bom=True)
@given(row=st.integers(0, len(CSV_ROWS) - 1), col=st.integers(0, 3), value=st.sampled_from(CSV_BAD + CSV_MAYBE),
       bom=st.booleans())
def test_fuzz_csv(row, col, value, bom):
    rows = copy.deepcopy(CSV_ROWS)
    rows[row][col] = value
    must = row > 0 and col > 0 and value in CSV_BAD
    with scratch() as d:
        text = "\n".join(",".join(r) for r in rows) + "\n"
        (d / "p.csv").write_bytes(("\ufeff" if bom else "").encode() + text.encode("utf-8"))
        code = drive(sim_cli, ["memplan", "--csv", str(d / "p.csv"), "--json", "--time-limit", "1"], d, {"p.csv"},
                     must_refuse=must)
        if rows == CSV_ROWS:
            assert code == 0  # the unmutated CSV, with or without a byte-order mark, reads


# -- timelines ------------------------------------------------------------------------------------
@settings(max_examples=200, **SETTINGS)
@given(mutation=_mutations(TIMELINE, only_bad=True))
def test_fuzz_timelines(mutation):
    with scratch() as d:
        (d / "tl.json").write_text(_dump_json(_apply(TIMELINE, mutation)), encoding="utf-8")
        drive(sim_cli, ["plot", str(d / "tl.json"), "--out", str(d / "figs")], d, {"tl.json"}, must_refuse=True)


def test_the_seeds_are_accepted():
    """The unmutated inputs pass, so a refusal above is the mutation's doing."""
    with scratch() as d:
        for name, obj in (("p.json", PROFILE), ("plan.json", PLAN), ("m.json", MODEL), ("t.json", TRACE),
                          ("tl.json", TIMELINE)):
            (d / name).write_text(json.dumps(obj), encoding="utf-8")
        assert drive(sim_cli, ["whatif", "--profile", str(d / "p.json"), "--model", str(d / "m.json"), "--gpus", "1",
                               "--seq", "1K", "--simulate-top", "0", "--no-plan"], d, set()) == 0
        assert drive(sim_cli, ["check-plan", str(d / "plan.json")], d, set()) == 0
        assert drive(sim_cli, ["memplan", "--trace", str(d / "t.json"), "--json"], d, set()) == 0
        assert drive(sim_cli, ["plot", str(d / "tl.json"), "--out", str(d / "figs")], d, set()) == 0


def test_simulate_bad_layers_writes_nothing():
    with scratch() as d:
        (d / "plan.json").write_text(json.dumps(PLAN), encoding="utf-8")
        drive(sim_cli, ["simulate", str(d / "plan.json"), "--out", str(d / "sim"), "--layers", "5:2"], d,
              {"plan.json"}, must_refuse=True)


# -- memo-exec run: flags and plan fields, seeded by a plan the current what-if writes ------------
_RUN_PLANS: dict[str, dict] = {}
RUN_SEEDS = ("memo", "full_offload", "full_recompute")  # MEMO with its memory plan; the offload; the caching allocator


def _whatif_plan(policy: str = "memo") -> dict:
    """A plan of a 2-layer toy under ``policy`` (MEMO: with its memory plan), as `memo-sim whatif`
    writes it today."""
    if policy not in _RUN_PLANS:
        with scratch() as d:
            r = CliRunner().invoke(sim_cli, ["whatif", "--layers", "2", "--hidden", "64", "--heads", "4", "--ffn",
                                             "256", "--vocab", "128", "--dtype", "fp32", "--seq", "256", "--gpus", "1",
                                             "--policy", policy, "--jobs", "1", "--out", str(d)]
                                   + (["--alpha", "0.5"] if policy == "memo" else []))
            assert r.exit_code == 0, r.output
            _RUN_PLANS[policy] = json.loads((d / "plan.json").read_text())
    return copy.deepcopy(_RUN_PLANS[policy])


RUN_FLAG_VALUES = ["0", "1", "2", "-1", "1e30", "nan", "inf", "abc", "", "3", "0.5", "99999999999999999999"]


@settings(max_examples=40, **SETTINGS)
@example(flag="--lr", value="nan")
@example(flag="--lr", value="1e30")
@example(flag="--layers", value="3")
@example(flag="--steps", value="0")
@given(flag=st.sampled_from(["--steps", "--layers", "--lr", "--seed", "--dtype", "--attention-backend", "--device",
                             "--tokens"]),
       value=st.sampled_from(RUN_FLAG_VALUES + ["fp64", "bf16", "math", "sdpa_flash", "cpu", "cuda:7"]))
def test_fuzz_run_flags(flag, value):
    """[robust-runs] memo-exec run with one odd flag value: it trains (exit 0) or refuses in one line
    (exit 2) before training, never a traceback; a flag that cannot be finite or sensible is refused."""
    from memo_exec.cli import cli as exec_cli

    with scratch() as d:
        (d / "plan.json").write_text(json.dumps(_whatif_plan()), encoding="utf-8")
        args = ["run", str(d / "plan.json"), "--device", "cpu", "--steps", "1", "--out", str(d / "run"), flag, value]
        if flag == "--device":
            args = args[:2] + args[4:]
        bad = (flag in ("--steps", "--layers", "--lr") and value not in ("1", "2", "0.5")) or \
            (flag == "--steps" and value == "0.5") or (flag == "--layers" and value in ("0.5", "3")) or \
            (flag == "--lr" and value == "2")
        drive(exec_cli, args, d, {"plan.json"}, must_refuse=bad)


@settings(max_examples=60, **SETTINGS)
@given(seeded=st.sampled_from(RUN_SEEDS).flatmap(
    lambda pol: st.tuples(st.just(pol), st.deferred(lambda: _mutations(_whatif_plan(pol))))))
def test_fuzz_plans_run(seeded):
    """[robust-runs] a mutated plan (seeded by what the what-if writes for three policies, MEMO's
    memory plan included) runs one step (exit 0) or is refused in one line (exit 2), never a traceback."""
    from memo_exec.cli import cli as exec_cli

    policy, mutation = seeded
    with scratch() as d:
        (d / "plan.json").write_text(_dump_json(_apply(_whatif_plan(policy), mutation)), encoding="utf-8")
        drive(exec_cli, ["run", str(d / "plan.json"), "--device", "cpu", "--steps", "1", "--out", str(d / "run")], d,
              {"plan.json"}, must_refuse=mutation[3])


@pytest.mark.parametrize("name", ["tokens.bin", "tokens.npy"])
def test_run_with_an_empty_token_file_is_one_line(name):
    """[robust-runs] `memo-exec run --tokens <empty file>` (it could not mmap an empty file): one
    line naming --tokens and the fix, exit 2, nothing written."""
    from memo_exec.cli import cli as exec_cli

    with scratch() as d:
        (d / "plan.json").write_text(json.dumps(_whatif_plan()), encoding="utf-8")
        (d / name).write_bytes(b"")
        code = drive(exec_cli, ["run", str(d / "plan.json"), "--device", "cpu", "--steps", "1", "--tokens",
                                str(d / name), "--out", str(d / "run")], d, {"plan.json", name}, must_refuse=True)
        assert code == 2
