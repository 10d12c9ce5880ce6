#!/usr/bin/env python
"""The GPU batch, in one command of at most 10 minutes on a lent H100/H200 with no registry:
install the carried wheels, record the environment, calibrate (quick), run the GPU-marked tests,
then predict a batch of plans with the calibrated profile and run `memo-exec validate` over them.

    python3 benchmarks/gpu/run_batch.py --out "$OUT"                     # on the GPU machine
    python3 benchmarks/gpu/run_batch.py --out "$OUT" --no-gpu-tests --seqs 128K --profile profile.yaml  # a second call
    python3 benchmarks/gpu/run_batch.py --dry-run --device cpu --out DIR  # the whole batch on CPU, tiny model

Steps (each a subprocess with a timeout from one budget, ``--budget``, default 540 s; a step that
fails is recorded and the batch goes on where it can):

1. install: ``pip install --no-index --no-deps --target SITE WHEELS/*.whl`` (``--wheels``, default
   ``.whl/`` at the repository root, filled here by ``benchmarks/gpu/fetch_wheels.py``), then SITE and
   the repository go first on ``sys.path`` and on every subprocess's PYTHONPATH, and the GPU entry
   points are imported once (a missing package stops the batch here, with the import error).
   ``--dry-run`` installs nothing (the carried wheels are for CPython 3.12 on x86-64) and uses this
   interpreter's packages.
2. environment: nvidia-smi, Python, torch and its CUDA/cuDNN/NCCL versions, the device, host RAM
   (/proc/meminfo), CPU count, the installed wheels, the git commit and the tree's digest (`tree_digest`: the
   device's copy can carry older git metadata than its files; ``--tree-digest`` prints a checkout's to compare).
3. calibrate: ``memo-exec calibrate --quick`` writes ``profile.yaml``; its host memory is this
   machine's (MemTotal), not the built-in profile's. ``--profile FILE`` (a first call's profile.yaml)
   skips it: a second call on the same machine keeps those minutes for the plans.
4. GPU tests: ``pytest -m gpu`` over the test files that have GPU-marked tests.
5. validate: ``memo-exec validate --profile profile.yaml`` over the batch's plans (GPU: 8 layers of
   GPT-7B, h=4096, bf16, at 32K/64K/128K tokens, store all, full recompute and MEMO at the
   simulator's alpha; dry run: a 3-layer h=64 fp32 model at 128/256 tokens, MEMO at alpha 0.5),
   each plan in its own process, under what is left of the budget but ``--moe-seconds``.
6. validate-moe: the same for a mixture of experts on one GPU (GPU: 4 layers of Qwen2-MoE-A2.7B, 60
   experts top 4, at 8K and 16K (32K's store all took 86 GiB on an H200: more than an H100 has), store all, full recompute, MEMO; dry run: 2 layers at h=64, 128
   tokens, store all), in the ``--moe-seconds`` kept for it (0: not run).

Files written to ``--out`` (8, the device tool's limit): summary.md (each step's exit, time
and key numbers), env.json, profile.yaml, pytest-gpu.log, validation.md, validation.json,
validation-moe.md and batch.tar.gz (every step's log, the calibration's raw measurements, the plans and each run's
report.md, measured.json, trace.json and figures). The exit code is 0 when every step that ran
succeeded, else 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUT_FILES = ("summary.md", "env.json", "profile.yaml", "pytest-gpu.log", "validation.md", "validation.json",
             "validation-moe.md", "batch.tar.gz")
# What `tree_digest` reads: the code and data a batch runs, as the files lie (the device's copy of the tree can
# carry older git metadata than its files: 2026-11-27 and 2026-11-30 batches named an earlier commit)
TREE_PARTS = ("pyproject.toml", "memo_sim", "memo_exec", "hardware_profiles", "benchmarks/gpu", "tests")
TREE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".toml", ".txt")
ARCHIVE_FILE_LIMIT = 4 * 2**20  # a file larger than this stays out of batch.tar.gz (listed in summary.md)
ENTRY_MODULES = ("memo_sim.api", "memo_sim.cli", "memo_exec.cli", "memo_exec.validate", "memo_exec.calibrate.command",
                 "memo_exec.runner", "memo_sim.memplan.planner", "mip", "highspy")
GPU = {"model": ["--model", "gpt-7b", "--layers", "8"], "seqs": "32K,64K,128K",
       "policies": "store_all,full_recompute,memo,offload_attn", "alphas": "sim", "steps": 3}
DRY = {"model": ["--layers", "3", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128",
                 "--dtype", "fp32"], "seqs": "128,256", "policies": "store_all,full_recompute,memo,offload_attn",
       "alphas": "0.5", "steps": 2}
GPU_MOE = {"model": ["--model", "qwen2-moe-a2.7b", "--layers", "4"], "seqs": "8K,16K",  # 32K store all: 86 GiB
           "policies": "store_all,full_recompute,memo", "alphas": "sim", "steps": 3}
DRY_MOE = {"model": ["--model", "qwen2-moe-a2.7b", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128",
                     "--dtype", "fp32"], "seqs": "128", "policies": "store_all", "alphas": "0.5", "steps": 2}
ENV_PROBE = r"""
import json, os, platform, sys
out = {"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform(),
       "cpus": os.cpu_count()}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda_runtime"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out["device"] = {"name": p.name, "memory_bytes": p.total_memory, "sms": p.multi_processor_count,
                         "capability": f"{p.major}.{p.minor}", "count": torch.cuda.device_count()}
        out["cudnn"] = torch.backends.cudnn.version()
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:
            out["nccl"] = f"unknown ({e})"
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"
mods = {}
for m in ("numpy", "click", "yaml", "matplotlib", "pytest", "typing_extensions", "pydantic", "pydantic_core",
          "annotated_types", "typing_inspection", "simpy", "mip", "cffi", "pycparser", "highspy"):
    try:
        mod = __import__(m)
        mods[m] = {"version": getattr(mod, "__version__", "?"), "file": getattr(mod, "__file__", None)}
    except Exception as e:
        mods[m] = {"error": f"{type(e).__name__}: {e}"}
out["modules"] = mods
print(json.dumps(out))
"""


class Batch:
    def __init__(self, args):
        self.args = args
        self.t0 = time.monotonic()
        self.out = Path(args.out)
        self.work = Path(tempfile.mkdtemp(prefix="memo-gpu-batch-"))
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.steps: list[dict] = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.notes: list[str] = []

    # ------------------------------------------------------------------ helpers
    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.t0)

    def run(self, name: str, argv: list[str], timeout: float, log: Path | None = None) -> dict:
        """Run one step as a subprocess; its stdout+stderr go to ``log`` (default logs/NAME.log)."""
        log = log or self.logs / f"{name}.log"
        rec = {"step": name, "command": " ".join(argv), "timeout_s": round(timeout, 1)}
        t = time.monotonic()
        print(f"[{time.strftime('%H:%M:%S')}] {name} (timeout {timeout:.0f} s)", flush=True)
        if timeout < 5:
            rec.update(rc=None, status="skipped: out of the budget", wall_s=0.0)
            self.steps.append(rec)
            return rec
        with open(log, "w") as fh:
            try:
                p = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, cwd=REPO,
                                   env=self.env, text=True)
                rec["rc"] = p.returncode
                rec["status"] = "ok" if p.returncode == 0 else f"exit {p.returncode}"
            except subprocess.TimeoutExpired:
                rec["rc"], rec["status"] = 124, f"timed out after {timeout:.0f} s"
        rec["wall_s"] = round(time.monotonic() - t, 1)
        tail = log.read_text(errors="replace").strip().splitlines()
        rec["last_line"] = tail[-1][:300] if tail else ""
        print(f"    {rec['status']} in {rec['wall_s']} s: {rec['last_line']}", flush=True)
        self.steps.append(rec)
        return rec

    # ------------------------------------------------------------------ steps
    def install(self) -> bool:
        site = Path(self.args.site)
        wheels = sorted(Path(self.args.wheels).glob("*.whl"))
        if self.args.dry_run:
            self.notes.append("dry run: no wheels installed (they are for CPython 3.12 on x86-64); this "
                              "interpreter's packages are used")
            self.steps.append({"step": "install", "status": "skipped: dry run", "rc": None, "wall_s": 0.0})
        elif not wheels:
            self.steps.append({"step": "install", "status": f"skipped: no wheels in {self.args.wheels}", "rc": None,
                               "wall_s": 0.0})
            self.notes.append(f"no wheels in {self.args.wheels}: run benchmarks/gpu/fetch_wheels.py where PyPI is "
                              "reachable and carry .whl")
        else:
            self.run("install", [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                 "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
                                 *map(str, wheels)], min(120.0, self.left()))
        paths = ([str(site)] if site.exists() else []) + [str(REPO)]
        for p in reversed(paths):
            sys.path.insert(0, p)
        self.env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
        rec = self.run("imports", [sys.executable, "-c", "import importlib, sys\nfor m in sys.argv[1:]: "
                                   "importlib.import_module(m)\nprint('imported', len(sys.argv) - 1, 'modules')",
                                   *ENTRY_MODULES], min(120.0, self.left()))
        return rec["rc"] == 0

    def environment(self) -> dict:
        env: dict = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
                     "dry_run": self.args.dry_run, "device_arg": self.args.device}
        env["meminfo"] = meminfo()
        try:
            env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                               timeout=10).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            env["git_commit"] = None
        env["tree_digest"] = tree_digest()
        smi = shutil.which("nvidia-smi")
        if smi:
            try:
                env["nvidia_smi"] = subprocess.run([smi], capture_output=True, text=True, timeout=30).stdout
            except subprocess.TimeoutExpired:
                env["nvidia_smi"] = "timed out"
        else:
            env["nvidia_smi"] = None
        rec = self.run("environment", [sys.executable, "-c", ENV_PROBE], min(60.0, self.left()))
        lines = (self.logs / "environment.log").read_text(errors="replace").strip().splitlines()
        try:
            env["python_env"] = json.loads(lines[-1]) if rec["rc"] == 0 and lines else None
        except json.JSONDecodeError:
            env["python_env"] = None
        site = Path(self.args.site)
        env["installed_wheels"] = sorted(p.name for p in site.glob("*.dist-info")) if site.exists() else []
        return env

    def calibrate(self) -> Path | None:
        name = self.profile_name()
        pdir = self.work / "profile"
        if self.args.profile:  # calibrated earlier: a copy (validate records its errors in the file it predicts with)
            pdir.mkdir(parents=True, exist_ok=True)
            path = pdir / Path(self.args.profile).name
            shutil.copyfile(self.args.profile, path)
            self.steps.append({"step": "calibrate", "status": f"skipped: --profile {self.args.profile}", "rc": None,
                               "wall_s": 0.0, "command": ""})
            return path
        rec = self.run("calibrate", [sys.executable, "-m", "memo_exec.calibrate", "--name", name, "--device",
                                     self.args.device, "--quick", "--out-dir", str(pdir), "--raw-out",
                                     str(self.logs / "calibrate-raw.json"), "--force"],
                       min(self.args.calibrate_timeout, self.left()))
        path = pdir / f"{name}.yaml"
        return path if rec["rc"] == 0 and path.exists() else None

    def profile_name(self) -> str:
        if not self.args.device.startswith("cuda"):
            return "cpu-dry-run"
        dev = ((self.env_doc.get("python_env") or {}).get("device") or {}).get("name", "gpu")
        return re.sub(r"[^a-z0-9]+", "-", dev.lower().replace("nvidia", "")).strip("-") + "-calibrated"

    def gpu_tests(self) -> dict:
        files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")
                       if "mark.gpu" in p.read_text(errors="replace"))
        return self.run("gpu-tests", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                      "-rs", *files],
                        min(self.args.tests_timeout, self.left() - self.args.min_validate - self.args.moe_seconds),
                        log=self.work / "pytest-gpu.log")

    def validate(self, profile: Path) -> dict:
        spec = DRY if self.args.dry_run else GPU
        budget = self.left() - 20.0 - self.args.moe_seconds  # kept back: the report, the archive, the MoE plans
        return self._validate("validate", profile, spec, self.work / "validate", budget, overrides=True)  # recorded

    def validate_moe(self, profile: Path) -> dict:
        spec = DRY_MOE if self.args.dry_run else GPU_MOE
        return self._validate("validate-moe", profile, spec, self.work / "validate-moe", self.left() - 20.0)

    def _validate(self, step: str, profile: Path, spec: dict, vdir: Path, budget: float, overrides: bool = False):
        """One ``memo-exec validate``; ``overrides``: the command line's --seqs/--policies/--alphas/--steps
        apply, and the errors are recorded in the profile (the MoE plans' are not)."""
        a = self.args if overrides else argparse.Namespace(seqs=None, policies=None, alphas=None, steps=None)
        argv = [sys.executable, "-m", "memo_exec", "validate", "--profile", str(profile), *spec["model"],
                "--seqs", a.seqs or spec["seqs"], "--policies", a.policies or spec["policies"],
                "--alphas", a.alphas or spec["alphas"], "--device", self.args.device,
                "--steps", str(a.steps or spec["steps"]), "--out", str(vdir), "--no-progress",
                *([] if overrides else ["--no-record"]), "--budget", f"{max(budget - 15.0, 1.0):.0f}"]
        return self.run(step, argv, budget)

    # ------------------------------------------------------------------ outputs
    def finish(self, env: dict, profile: Path | None) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        from memo_sim.fileio import atomic_write_json, atomic_write_text  # noqa: PLC0415

        vdir = self.work / "validate"
        copies = {"profile.yaml": profile, "pytest-gpu.log": self.work / "pytest-gpu.log",
                  "validation.md": vdir / "validation.md", "validation.json": vdir / "validation.json",
                  "validation-moe.md": self.work / "validate-moe" / "validation.md"}
        for dst, src in copies.items():
            if src is not None and Path(src).exists():
                shutil.copyfile(src, self.out / dst)
            elif dst == "validation-moe.md" and self.args.moe_seconds <= 0:
                atomic_write_text(self.out / dst, "not run: --moe-seconds 0\n")
            else:
                atomic_write_text(self.out / dst, "not written: the step that writes it did not finish "
                                                  "(see summary.md)\n")
        env["steps"] = self.steps
        atomic_write_json(self.out / "env.json", env)
        left_out = self.archive()
        text = self.summary(env, profile, left_out)
        atomic_write_text(self.out / "summary.md", text)
        print(text, flush=True)
        failed = [s for s in self.steps if s.get("rc") not in (0, None) or str(s.get("status", "")).startswith(
            "skipped: out")]
        return 1 if failed or profile is None else 0

    def archive(self) -> list[str]:
        left_out = []
        tmp = self.out / "batch.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for p in sorted(self.work.rglob("*")):
                if not p.is_file():
                    continue
                if p.stat().st_size > ARCHIVE_FILE_LIMIT:
                    left_out.append(f"{p.relative_to(self.work)} ({p.stat().st_size / 2**20:.1f} MiB)")
                    continue
                tar.add(p, arcname=str(Path("batch") / p.relative_to(self.work)))
        os.replace(tmp, self.out / "batch.tar.gz")
        return left_out

    def summary(self, env: dict, profile: Path | None, left_out: list[str]) -> str:
        pe = env.get("python_env") or {}
        mem = env.get("meminfo") or {}
        L = [f"# GPU batch {'(dry run) ' if self.args.dry_run else ''}{env['date_utc']}", "",
             f"- command: `{' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}`; git {env.get('git_commit')}; "
             f"tree digest {env.get('tree_digest')} (`run_batch.py --tree-digest` prints a checkout's)",
             f"- device: {(pe.get('device') or {}).get('name', self.args.device)}; torch {pe.get('torch')} "
             f"(CUDA {pe.get('cuda_runtime')}, cuDNN {pe.get('cudnn')}, NCCL {pe.get('nccl')}); Python "
             f"{pe.get('python')}; {pe.get('cpus')} CPUs; host RAM {mem.get('MemTotal', 0) / 2**30:.1f} GiB "
             f"(available {mem.get('MemAvailable', 0) / 2**30:.1f} GiB)",
             f"- wall time {time.monotonic() - self.t0:.0f} s of the {self.args.budget:.0f} s budget", ""]
        L += ["| step | status | wall s | last line |", "|---|---|---:|---|"]
        for s in self.steps:
            L.append(f"| {s['step']} | {s.get('status')} | {s.get('wall_s', 0)} | "
                     f"{str(s.get('last_line', '')).replace('|', '/')[:160]} |")
        if profile is not None:
            try:
                from memo_sim.profile.loader import load_profile  # noqa: PLC0415

                p = load_profile(profile)
                L += ["", f"Calibrated profile {p.name}: GPU memory {p.gpu_memory / 2**30:.1f} GiB, host memory "
                          f"{float(p.host.memory_bytes) / 2**30:.1f} GiB (this machine's MemTotal: "
                          f"{mem.get('MemTotal', 0) / 2**30:.1f} GiB), usable fraction "
                          f"{float(p.host.usable_fraction):.3f}, d2h {float(p.host_link.d2h_bandwidth) / 1e9:.1f} / "
                          f"h2d {float(p.host_link.h2d_bandwidth) / 1e9:.1f} GB/s"]
            except Exception as e:  # noqa: BLE001 - the summary reports it
                L += ["", f"Calibrated profile {profile.name} does not load: {type(e).__name__}: {e}"]
        for what, sub, rows in (("Validation", "validate", "validation.md"),
                                ("MoE validation", "validate-moe", "validation-moe.md")):
            vj = self.work / sub / "validation.json"
            if vj.exists():
                s = json.loads(vj.read_text())["summary"]
                e = s["errors"]["step_s"]
                L += ["", f"{what}: {s['ran']} of {s['plans']} plans ran ({s['oom']} out of memory, {s['failed']} "
                          f"failed); step-time |error| mean {_pct(e['mean_abs_error_pct'])}, max "
                          f"{_pct(e['max_abs_error_pct'])}; peak-memory |error| mean "
                          f"{_pct(s['errors']['peak_memory_bytes']['mean_abs_error_pct'])}; Kendall tau "
                          f"{s['kendall_tau_step_time']}. Rows: {rows}."]
        if self.notes:
            L += [""] + [f"- note: {n}" for n in self.notes]
        if left_out:
            L += ["", "Left out of batch.tar.gz (over 4 MiB): " + ", ".join(left_out)]
        L += ["", "Files: " + ", ".join(OUT_FILES) + " (batch.tar.gz: logs/, profile/, validate/plans, "
              "validate/runs/plan-NN/, the same under validate-moe/)"]
        return "\n".join(L) + "\n"


def tree_digest(root: Path = REPO) -> str:
    """The first 16 hex digits of a sha256 over the relative path and the bytes of every file under `TREE_PARTS`
    with a `TREE_SUFFIXES` suffix (caches left out), in path order: it names the tree a batch ran where the copied
    tree's git commit cannot (compare with ``run_batch.py --tree-digest`` on a checkout)."""
    files = []
    for part in TREE_PARTS:
        p = root / part
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files += [f for f in p.rglob("*") if f.is_file() and f.suffix in TREE_SUFFIXES
                      and not any(d in ("__pycache__", ".pytest_cache") for d in f.relative_to(root).parts)]
    h = hashlib.sha256()
    for rel, f in sorted((f.relative_to(root).as_posix(), f) for f in files):
        h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _pct(v) -> str:
    return "—" if v is None else f"{v:.1f}%"


def meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, _, v = line.partition(":")
            parts = v.split()
            if parts and parts[0].isdigit():
                out[k] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"), help="output folder (default $OUT)")
    ap.add_argument("--dry-run", action="store_true", help="a tiny model, no wheels installed (tests the batch)")
    ap.add_argument("--device", default=None, help="cuda (default) or cpu (default with --dry-run)")
    ap.add_argument("--wheels", default=str(REPO / ".whl"), help="folder of the carried wheels")
    ap.add_argument("--site", default="/tmp/memo-site", help="where the wheels are installed (pip --target)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for the whole batch")
    ap.add_argument("--seqs", default=None, help="override the batch's sequence lengths (e.g. 128K)")
    ap.add_argument("--policies", default=None)
    ap.add_argument("--alphas", default=None, help="MEMO alphas for validate ('sim': the simulator's)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--no-gpu-tests", action="store_true", help="skip the GPU-marked tests (a second call)")
    ap.add_argument("--calibrate-timeout", type=float, default=150.0)
    ap.add_argument("--profile", default=None,
                    help="a profile calibrated earlier on this machine (a first call's profile.yaml): no calibrate "
                         "step, validate predicts with a copy of it (a second call keeps its budget for the plans)")
    ap.add_argument("--tests-timeout", type=float, default=150.0)
    ap.add_argument("--moe-seconds", type=float, default=130.0,
                    help="seconds kept for the MoE plans after the dense ones (0: no MoE plans)")
    ap.add_argument("--min-validate", type=float, default=200.0,
                    help="seconds kept for validate when the GPU tests' timeout is set")
    ap.add_argument("--tree-digest", action="store_true",
                    help="print this checkout's tree digest (the one summary.md names) and exit")
    args = ap.parse_args(argv)
    if args.tree_digest:
        print(tree_digest())
        return 0
    if not args.out:
        print("error: no --out and no $OUT", file=sys.stderr)
        return 2
    if args.moe_seconds < 0:
        print(f"error: --moe-seconds ({args.moe_seconds}) must be 0 (no MoE plans) or more", file=sys.stderr)
        return 2
    if args.profile and not Path(args.profile).is_file():
        print(f"error: --profile {args.profile}: no such file; give a profile.yaml a calibration wrote", file=sys.stderr)
        return 2
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    b = Batch(args)
    try:
        ok = b.install()
        b.env_doc = b.environment()
        profile = b.calibrate() if ok else None
        if ok and not args.no_gpu_tests:
            b.gpu_tests()
        if profile is not None:
            b.validate(profile)
            if args.moe_seconds > 0:
                b.validate_moe(profile)
        return b.finish(b.env_doc, profile)
    finally:
        shutil.rmtree(b.work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
