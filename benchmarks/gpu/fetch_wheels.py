#!/usr/bin/env python
"""Download, on a machine that reaches PyPI, the pinned wheels the GPU image lacks (wheels.txt)
for CPython 3.12 on manylinux x86-64, into ``.whl/`` at the repository root (ignored by git;
the device tool carries it with ``carry: [".whl"]``).

    python benchmarks/gpu/fetch_wheels.py            # -> .whl/*.whl, and prints their total size
    python benchmarks/gpu/fetch_wheels.py --dest DIR

Each wheel is fetched with ``pip download --no-deps --only-binary=:all:`` for that platform;
afterwards every wheel's ``Requires-Dist`` (environment markers evaluated for Python 3.12 on
Linux) must be met by another pinned wheel or by the image (image_packages.txt), except the
ones wheels.txt names as deliberately not carried (cbcbox). A missing dependency, a second
version of one package or more than ``--max-mib`` in total is a one-line error (exit 2).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PINS = HERE / "wheels.txt"
IMAGE = HERE / "image_packages.txt"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
NOT_CARRIED = {"cbcbox": "CBC's 191 MB binary; memo solves its MIPs with HiGHS (highspy)"}
# In the image, but at a version older than the lock's dependents need: carried all the same.
CARRIED_OVER_IMAGE = {"typing-extensions": "the image's is older than pydantic needs (>= 4.14.1)"}
# Top-level modules where they are not the distribution's name with '-' -> '_'.
MODULES = {"cffi": ["cffi", "_cffi_backend"]}
CARRY_LIMIT_MIB = 64  # the device tool's working-tree limit, carried paths included
LOCK = REPO / "constraints.txt"
PYPROJECT = REPO / "pyproject.toml"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lines(path: Path) -> list[list[str]]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line.split())
    return out


def pins() -> dict[str, tuple[str, list[str]]]:
    """canonical name -> (version, top-level modules) from wheels.txt."""
    out = {}
    for fields in read_lines(PINS):
        name, _, version = fields[0].partition("==")
        if not version or len(fields) != 2:
            raise SystemExit(f"error: {PINS}: expected 'NAME==VERSION MODULES', got {' '.join(fields)!r}")
        out[canonical(name)] = (version, fields[1].split(","))
    return out


def parse_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """canonical name -> (version, the packages it is required by) from a pip-compile lock's
    ``NAME==VERSION`` lines and their ``# via`` annotations."""
    out: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if m:
            current = canonical(m.group(1))
            out[current] = (m.group(2), [])
            continue
        m = re.match(r"^\s+#\s+(?:via\s+)?(\S.*?)\s*$", line)
        if current and m and m.group(1) != "via":
            out[current][1].append(m.group(1))
    return out


def runtime_roots(pyproject: Path = PYPROJECT) -> list[str]:
    """pyproject.toml's runtime dependencies (no extras), canonical names."""
    import tomllib  # noqa: PLC0415

    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [canonical(re.split(r"[\s<>=!~\[;(]", d.strip(), maxsplit=1)[0]) for d in deps]


def wheels_text(lock_text: str, pyproject: Path = PYPROJECT) -> str:
    """wheels.txt as the lock gives it: every package of the runtime closure (pyproject's dependencies
    and what the lock says they pull in) that the image lacks, at the lock's version, minus NOT_CARRIED,
    plus CARRIED_OVER_IMAGE. Pure: the same lock, pyproject and image list give the same text."""
    lock, image = parse_lock(lock_text), image_packages()
    roots = runtime_roots(pyproject)
    missing = [r for r in roots if r not in lock]
    if missing:
        raise SystemExit(f"error: {LOCK.name} lacks {', '.join(missing)}; fix: python benchmarks/lock_deps.py")
    def carried_here(n: str) -> bool:
        return n not in NOT_CARRIED and (n not in image or n in CARRIED_OVER_IMAGE)

    needed = set(roots)
    while True:  # needed: what a carried package requires (its "via" names one); the image's own bring theirs
        more = {n for n, (_, via) in lock.items()
                if n not in needed and any(canonical(v) in needed and carried_here(canonical(v)) for v in via)}
        if not more:
            break
        needed |= more
    carried = [n for n in lock if n in needed and carried_here(n)]
    head = [
        "# The wheels the GPU image lacks: carried to the device machine (CPython 3.12, manylinux x86-64).",
        f"# GENERATED by benchmarks/lock_deps.py from {LOCK.name} (the tested versions); do not edit by hand.",
        "# One line per wheel: REQUIREMENT  TOP-LEVEL-MODULES(comma-separated).",
        "# fetch_wheels.py downloads exactly these (--no-deps) and checks every wheel's Requires-Dist;",
        "# tests/test_gpu_batch_imports.py allows only these modules beside the standard library,",
        "# image_packages.txt and memo's own packages.",
        *[f"# not carried: {n} ({why})" for n, why in sorted(NOT_CARRIED.items())],
        *[f"# carried although in the image: {n} ({why})" for n, why in sorted(CARRIED_OVER_IMAGE.items())],
    ]
    rows = [(f"{n}=={lock[n][0]}", ",".join(MODULES.get(n, [n.replace('-', '_')]))) for n in sorted(carried)]
    width = max(len(r) for r, _ in rows) + 2
    return "\n".join(head + [f"{r:<{width}}{m}" for r, m in rows]) + "\n"


def image_packages() -> dict[str, list[str]]:
    """canonical distribution name -> top-level modules, from image_packages.txt."""
    out = {}
    for fields in read_lines(IMAGE):
        mods = fields[1].split(",") if len(fields) > 1 else [fields[0].replace("-", "_")]
        out[canonical(fields[0])] = mods
    return out


def carried_modules() -> set[str]:
    return {m for _, mods in pins().values() for m in mods}


def image_modules() -> set[str]:
    return {m for mods in image_packages().values() for m in mods}


def requires(wheel: Path) -> list[str]:
    """The wheel's unconditional requirements for CPython 3.12 on Linux (extras left out)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    env = {"python_version": "3.12", "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "sys_platform": "linux", "os_name": "posix", "platform_system": "Linux", "platform_machine": "x86_64"}
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req, _, marker = line[len("Requires-Dist:"):].partition(";")
        if marker and not marker_holds(marker.strip(), env):
            continue
        out.append(canonical(re.split(r"[\s<>=!~\[(]", req.strip(), maxsplit=1)[0]))
    return out


def marker_holds(marker: str, env: dict[str, str]) -> bool:
    """Evaluate a PEP 508 marker for ``env`` (packaging's evaluator; packaging ships with pip)."""
    try:
        from packaging.markers import Marker  # noqa: PLC0415
    except ImportError:
        from pip._vendor.packaging.markers import Marker  # noqa: PLC0415
    return Marker(marker).evaluate({**env, "extra": ""})


def check_closure(dest: Path) -> list[Path]:
    p, img = pins(), image_packages()
    wheels = sorted(dest.glob("*.whl"))
    have: dict[str, list[Path]] = {}
    for w in wheels:
        have.setdefault(canonical(w.name.split("-")[0]), []).append(w)
    for name, ws in have.items():
        if len(ws) > 1:
            raise SystemExit(f"error: {dest}: two wheels of {name} ({', '.join(x.name for x in ws)}); keep one")
        if name not in p:
            raise SystemExit(f"error: {ws[0]} is not pinned in {PINS}; remove it")
    for name, (version, _) in p.items():
        if name not in have or f"-{version}-" not in have[name][0].name:
            raise SystemExit(f"error: {dest} lacks {name}=={version}; run without --check-only")
        for dep in requires(have[name][0]):
            if dep not in p and dep not in img and dep not in NOT_CARRIED:
                raise SystemExit(f"error: {name} needs {dep}, which neither {PINS.name} nor {IMAGE.name} holds; "
                                 f"pin it in {PINS}")
    return [have[n][0] for n in p]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", default=str(REPO / ".whl"))
    ap.add_argument("--max-mib", type=float, default=32.0, help="refuse a set larger than this (the carry limit "
                    f"is {CARRY_LIMIT_MIB} MiB with the working tree)")
    ap.add_argument("--check-only", action="store_true", help="check what is in --dest; download nothing")
    args = ap.parse_args()
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    if not args.check_only:
        p = pins()
        for w in dest.glob("*.whl"):  # one version of each: stale wheels of a pinned package go
            name = canonical(w.name.split("-")[0])
            if name in p and f"-{p[name][0]}-" not in w.name:
                w.unlink()
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
                "--abi", "none", *[a for plat in PLATFORMS for a in ("--platform", plat)], "-d", str(dest),
                *[f"{n}=={v}" for n, (v, _) in p.items()]]
        rc = subprocess.run(argv).returncode
        if rc:
            print(f"error: pip download failed (exit {rc})", file=sys.stderr)
            return 2
    wheels = check_closure(dest)
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:8.2f} MiB  {w.name}")
    print(f"{total / 2**20:8.2f} MiB  total, {len(wheels)} wheels in {dest}")
    if total > args.max_mib * 2**20:
        print(f"error: {total / 2**20:.1f} MiB is more than --max-mib {args.max_mib}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
