"""Dependencies point one way, as the data flows (a lower layer never imports a higher one).

memo_sim, lowest first:
  shared utilities: errors, heap_freeze (the collector's frozen heap); units, fileio, forked (work in a forked
  child), mip_util, registry (parts registered by name); timeline
  (the predicted/measured format) and request_trace (the malloc/free trace format), which the
  executor writes too; tp and dp (the tensor- and data-parallel flavours: data and rules the layers
  above ask for)
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

Neither memo_sim nor memo_exec has an import cycle (`test_no_import_cycles`), counting imports
inside functions too: two modules that need each other are one module, or a third holds what both
need.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEVELS = {
    "errors": 0, "__init__": 0,
    "heap_freeze": 0,
    "units": 1, "fileio": 1, "forked": 1, "mip_util": 1, "registry": 1,
    "timeline": 2, "request_trace": 2, "tp": 2, "dp": 2,
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
SHARED = {"plan", "profile", "model", "layout", "tp", "policy", "errors", "units", "fileio", "timeline", "request_trace",
          "registry"}
LOOP_CLOSING = {"memo_exec.validate", "memo_exec.trace", "memo_exec.report", "memo_exec.compare", "memo_exec.figures",
                "memo_exec.cli", "memo_exec.calibrate", "memo_exec.pipeline.report", "memo_exec.sppo.report",
                "memo_exec.plan_check"}
RUN_PATH = {"memo_exec", "memo_exec.runner", "memo_exec.layer", "memo_exec.activations", "memo_exec.arena",
            "memo_exec.streams", "memo_exec.measure", "memo_exec.device", "memo_exec.attention", "memo_exec.model",
            "memo_exec.data", "memo_exec.optim", "memo_exec.errors", "memo_exec.happens_before",
            "memo_exec.memory_estimate", "memo_exec.allocator_counters"}


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


# ------------------------------------------------------------------------------------------- cycles
# Cycles the test still finds, each with the reason it is left (drop an entry when it is fixed):
KNOWN_CYCLES: set[frozenset[str]] = set()  # none: a cycle found is a failure


def _import_graph(pkg: str) -> dict[str, set[str]]:
    """Module -> the modules of ``pkg`` it imports (anywhere in the file, functions included); an
    import of a package's name resolves to its ``__init__`` (the package's module name), ``from
    a.b import c`` to ``a.b.c`` when that is a module, else to ``a.b``."""
    mods = dict(_modules(pkg))
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.split(".")[: len(mod.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            graph[mod] |= {t for t in targets if t in mods and t != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("pkg", ["memo_sim", "memo_exec"])
def test_no_import_cycles(pkg):
    found = [c for c in _cycles(_import_graph(pkg)) if c not in KNOWN_CYCLES]
    assert not found, "import cycles (modules that import each other, directly or round a loop): " + "; ".join(
        " <-> ".join(sorted(c)) for c in found)


def test_the_cycle_check_finds_a_function_local_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]
    assert _cycles({"a": {"b"}, "b": set()}) == []
