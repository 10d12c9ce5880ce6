"""Dependencies point one way, as the data flows (a lower layer never imports a higher one).

memo_sim, lowest first:
  shared utilities: errors; units, fileio, mip_util; timeline (the predicted/measured format) and
  request_trace (the malloc/free trace format), which the executor writes too
  the vocabulary: profile, model; layout (parallel degrees of a model)
  cost (pure formulas)
  policy (what each activation policy keeps, offloads, recomputes)
  memplan (request traces, DSA solvers, allocator model, memory footprint), plan (the contract),
  frameworks (each framework version's layouts, policies and mechanisms, as data)
  engine (the SimPy simulator)
  search (analytic estimate, what-if ranking)
  report (tables, traces, figures), export (plans as other frameworks' files)
  cli, api
A module may import its own package and any lower layer; modules of the same layer in different
packages do not import each other. memo_sim never imports torch or memo_exec.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEVELS = {
    "errors": 0, "__init__": 0,
    "units": 1, "fileio": 1, "mip_util": 1,
    "timeline": 2, "request_trace": 2,
    "profile": 3, "model": 3,
    "layout": 4,
    "cost": 5,
    "policy": 6,
    "memplan": 7, "plan": 7, "frameworks": 7,
    "engine": 8,
    "search": 9,
    "report": 10, "export": 10,
    "cli": 11, "api": 11,
}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def _modules(pkg: str):
    for path in sorted((ROOT / pkg).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        yield ".".join(rel.parts).removesuffix(".__init__"), path


def test_every_memo_sim_package_has_a_level():
    pkgs = {_package(m) for m, _ in _modules("memo_sim")}
    assert pkgs <= set(LEVELS), f"give these a level in this test: {sorted(pkgs - set(LEVELS))}"


@pytest.mark.parametrize("module,path", list(_modules("memo_sim")), ids=lambda v: str(v))
def test_memo_sim_imports_point_down(module, path):
    mine = _package(module)
    for imp in _imports(path):
        root = imp.split(".")[0]
        assert root not in ("torch", "memo_exec"), f"{module} imports {imp}: memo_sim must run without torch"
        if root != "memo_sim" or imp == "memo_sim":
            continue
        theirs = _package(imp)
        if theirs == mine:
            continue
        assert LEVELS[theirs] < LEVELS[mine], (
            f"{module} (layer {LEVELS[mine]}, {mine}) imports {imp} (layer {LEVELS[theirs]}, {theirs})")


def test_memo_sim_imports_without_torch():
    code = ("import sys, importlib, pkgutil, memo_sim\n"
            "sys.modules['torch'] = None\n"
            "for m in pkgutil.walk_packages(memo_sim.__path__, 'memo_sim.'):\n"
            "    importlib.import_module(m.name)\n"
            "assert 'memo_exec' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------------------- memo_exec
# The executor reads plans through the contract: its run path imports from memo_sim only the plan,
# the vocabulary (profile, model, layout, the policy registry) and shared utilities. The commands
# that close the loop (validate, calibrate, trace, the report's re-prediction) may also use the
# simulator's public API (memo_sim.api) and its report writers.
SHARED = {"plan", "profile", "model", "layout", "policy", "errors", "units", "fileio", "timeline", "request_trace"}
LOOP_CLOSING = {"memo_exec.validate", "memo_exec.trace", "memo_exec.report", "memo_exec.compare", "memo_exec.figures",
                "memo_exec.cli", "memo_exec.calibrate", "memo_exec.pipeline.report", "memo_exec.sppo.report"}
RUN_PATH = {"memo_exec", "memo_exec.runner", "memo_exec.layer", "memo_exec.activations", "memo_exec.arena",
            "memo_exec.streams", "memo_exec.measure", "memo_exec.device", "memo_exec.attention", "memo_exec.model",
            "memo_exec.data", "memo_exec.optim", "memo_exec.errors", "memo_exec.happens_before",
            "memo_exec.memory_estimate"}


def _exec_group(module: str) -> str:
    for prefix in sorted(LOOP_CLOSING | RUN_PATH, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return "loop" if prefix in LOOP_CLOSING else "run"
    return "unclassified"


@pytest.mark.parametrize("module,path", list(_modules("memo_exec")), ids=lambda v: str(v))
def test_memo_exec_reads_the_simulator_through_the_contract(module, path):
    group = _exec_group(module)
    assert group != "unclassified", f"classify {module} in this test: run path or loop-closing command"
    allowed = SHARED | ({"api", "report"} if group == "loop" else set())
    for imp in _imports(path):
        if imp.split(".")[0] != "memo_sim" or imp == "memo_sim":
            continue
        assert _package(imp) in allowed, f"{module} ({group}) imports {imp}; allowed: {sorted(allowed)}"
