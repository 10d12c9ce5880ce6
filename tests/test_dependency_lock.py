"""[fresh-install] One source of truth for versions: ``constraints.txt`` (pip-compile's lock of
pyproject.toml's ranges) from which the README's install, CI and the GPU wheel set take theirs.

Nothing here depends on the day: the repository's files are checked against each other (the lock
against the ranges, the wheel set against the lock, the README and CI against the lock's torch),
and the environment only against pyproject.toml's ranges, never against a pin.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "constraints.txt"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fw = _load("fetch_wheels", REPO / "benchmarks" / "gpu" / "fetch_wheels.py")
lock_deps = _load("lock_deps", REPO / "benchmarks" / "lock_deps.py")
readme_setup = _load("readme_setup", REPO / ".ci" / "readme_setup.py")


def _requirements(extras: tuple[str, ...] = ("exec", "test")) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


def test_the_wheel_set_is_the_one_the_lock_gives():
    assert fw.PINS.read_text() == fw.wheels_text(LOCK.read_text()), (
        "benchmarks/gpu/wheels.txt is not generated from constraints.txt: run python benchmarks/lock_deps.py")
    lock = fw.parse_lock(LOCK.read_text())
    for name, (pinned, _) in fw.pins().items():
        assert lock[name][0] == pinned, (name, pinned, lock[name][0])


def test_every_dependency_is_locked_within_its_range():
    lock = fw.parse_lock(LOCK.read_text())
    for req in _requirements():
        name = fw.canonical(req.name)
        assert name in lock, f"{name} ({req}) is not in constraints.txt: run python benchmarks/lock_deps.py"
        assert req.specifier.contains(lock[name][0], prereleases=True), (
            f"constraints.txt pins {name}=={lock[name][0]}, outside pyproject.toml's {req}")
    assert all("+" not in v for v, _ in lock.values()), "a local label (+cpu) would refuse PyPI's build"


def test_the_environment_meets_the_ranges_only():
    """What is installed here is held to pyproject.toml's ranges: any version they allow passes."""
    for req in _requirements(("test",)):
        try:
            have = version(req.name)
        except PackageNotFoundError:
            pytest.fail(f"{req.name} is a dependency but is not installed")
        assert req.specifier.contains(Version(have).public, prereleases=True), f"{req.name} {have} outside {req}"


def test_readme_and_ci_install_the_locked_torch_and_the_lock():
    install, tests = readme_setup.setup_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert tests == "python -m pytest -q"
    pins = re.findall(r"pip install (torch==\S+)", install)
    assert pins == [lock_deps.TORCH_PIN], (pins, lock_deps.TORCH_PIN)
    torch_locked = fw.parse_lock(LOCK.read_text())["torch"][0]
    assert lock_deps.TORCH_PIN == f"torch=={torch_locked}"
    assert "-c constraints.txt" in install and '-e ".[exec,test]"' in install
    ci = (REPO / ".ci" / "run").read_text()
    assert "python3 -m venv" in ci and ".ci/readme_setup.py" in ci and "pytest -q -m slow" in ci
    r = subprocess.run([sys.executable, str(REPO / ".ci" / "readme_setup.py")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines() == [install, tests]


def test_readme_setup_refuses_a_readme_without_the_block():
    with pytest.raises(SystemExit, match="no ```bash block under '## Set up and run'"):
        readme_setup.setup_commands("# memo\n\n## Set up and run\n\nno block\n\n## Next\n")


LOCK_SAMPLE = """\
#    python benchmarks/lock_deps.py
alpha==1.0
    # via memo (pyproject.toml)
beta==2.0
    # via
    #   alpha
    #   numpy
gamma==3.0
    # via numpy
numpy==2.0
    # via
    #   alpha
    #   memo (pyproject.toml)
"""


def test_the_closure_follows_what_a_carried_package_needs(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["alpha>=1", "numpy>=1.24"]\n')
    assert fw.parse_lock(LOCK_SAMPLE)["beta"] == ("2.0", ["alpha", "numpy"])
    rows = [ln.split()[0] for ln in fw.wheels_text(LOCK_SAMPLE, pyproject).splitlines() if not ln.startswith("#")]
    # alpha is not in the image: carried with beta, which it needs; numpy is the image's, and so is
    # what only numpy needs (gamma)
    assert rows == ["alpha==1.0", "beta==2.0"]
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["alpha>=1", "delta"]\n')
    with pytest.raises(SystemExit, match="lacks delta"):
        fw.wheels_text(LOCK_SAMPLE, pyproject)


def test_local_labels_are_stripped():
    assert lock_deps.strip_local_labels("torch==2.13.0+cpu\n    # via x\nnumpy==2.4.6\n") == (
        "torch==2.13.0\n    # via x\nnumpy==2.4.6\n")


def test_lock_check_agrees():
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "lock_deps.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
