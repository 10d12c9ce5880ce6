"""The calibration run: which microbenchmarks, at which sizes, in what order; raw results as a dict.

`CalibrateOptions` says what to run; `run_suite` runs it and returns every raw measurement
(JSON-serialisable) plus the fitted values that `memo_exec.calibrate.writer` puts in a profile.
Sizes differ for CUDA and CPU and for ``quick`` runs (CPU quick: about 90 s on two cores, 90 s measured on an
idle 2-core VM on 2026-11-27, its attention and ring CP blocks timed in three rounds and gloo's collectives between
kernels; CPU full: over 400 s measured on the 2-core CPU; CUDA, quick or full: not yet timed on a GPU, as
`memo_exec.calibrate.command.DURATION_QUICK` / ``DURATION_FULL`` say).
`remeasure` runs the GEMM, attention or copy part again when `memo_exec.calibrate.sanity` finds
its fit implausible.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field

import torch

from memo_exec.calibrate import allocator as alloc_bench
from memo_exec.calibrate import attention as attn_bench
from memo_exec.calibrate import collectives as coll_bench
from memo_exec.calibrate import copies as copy_bench
from memo_exec.calibrate import elementwise as ew_bench
from memo_exec.calibrate import gemm as gemm_bench
from memo_exec.calibrate import memory as mem
from memo_exec.calibrate.datasheet import known_peak
from memo_exec.calibrate.fit import fit_call_latency, fit_copy_model, fit_efficiency_curve, fit_score_time
from memo_exec.calibrate.microbench import Bench, Progress, cold_write_text, measure_cold_write
from memo_exec.device import DeviceSpec, resolve_device
from memo_exec.host_malloc import keep_freed_memory
from memo_exec.speed_probe import SPEED_DRIFT_LIMIT, SpeedProbe
from memo_exec.errors import ExecError
from memo_sim.model.flops import attention_score_elements

KiB, MiB, GiB = 2**10, 2**20, 2**30


@dataclass(frozen=True)
class Grid:
    """Sizes of one calibration run."""

    gemm_hiddens: list[int]
    gemm_tps: list[int]
    gemm_tokens: list[int]
    attn_seqs: list[int]
    attn_heads_dims: list[tuple[int, int]]
    ew_tokens: int  # memory-bound ops on [T, h] and [T, 4h]
    ew_hidden: int
    ew_small: tuple[int, int]  # (T, h) of the same ops timed small: their per-call latency
    hbm_bytes: int
    copy_sizes: list[int]
    copy_fit_from: int  # copy bandwidth is fitted on the sizes >= this (beyond the caches)
    duplex_bytes: int
    duplex_count: int
    cc_gemm_n: int  # copy/compute overlap: square GEMM size, GEMM-loop seconds, copy chunk
    cc_compute_s: float
    cc_chunk: int
    coll_sizes: list[int]
    bench_target_s: float
    bench_min_repeats: int
    bench_max_repeats: int


def _pow4(lo: int, hi: int) -> list[int]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 4
    return out


def grid_for(kind: str, quick: bool) -> Grid:
    if kind == "cuda":
        if quick:
            return Grid(gemm_hiddens=[1024, 4096, 8192], gemm_tps=[1, 8], gemm_tokens=[2048, 8192],
                        attn_seqs=[1024, 4096, 16384, 32768], attn_heads_dims=[(8, 64), (8, 128), (32, 128)],
                        ew_tokens=8192, ew_hidden=4096, ew_small=(256, 256), hbm_bytes=512 * MiB,
                        copy_sizes=_pow4(4 * KiB, 256 * MiB), copy_fit_from=8 * MiB,
                        duplex_bytes=256 * MiB, duplex_count=4, cc_gemm_n=8192, cc_compute_s=0.2, cc_chunk=256 * MiB,
                        coll_sizes=_pow4(4 * KiB, 256 * MiB)[::2], bench_target_s=0.01, bench_min_repeats=3,
                        bench_max_repeats=30)
        return Grid(gemm_hiddens=[1024, 2048, 4096, 8192], gemm_tps=[1, 2, 8], gemm_tokens=[1024, 4096, 16384],
                    attn_seqs=[1024, 2048, 4096, 8192, 16384, 32768, 65536],
                    attn_heads_dims=[(8, 64), (8, 128), (32, 128), (16, 64)],
                    ew_tokens=16384, ew_hidden=4096, ew_small=(256, 256), hbm_bytes=GiB,
                    copy_sizes=_pow4(4 * KiB, GiB), copy_fit_from=8 * MiB,
                    duplex_bytes=256 * MiB, duplex_count=8, cc_gemm_n=8192, cc_compute_s=0.5, cc_chunk=256 * MiB,
                    coll_sizes=_pow4(4 * KiB, GiB), bench_target_s=0.03, bench_min_repeats=3, bench_max_repeats=50)
    if quick:
        return Grid(gemm_hiddens=[64, 256, 512], gemm_tps=[1], gemm_tokens=[256, 1024],
                    # up to validate's default 2K: a CPU attention kernel's time does not grow as its FLOPs past
                    # the lengths measured (2026-11-25, 2-core Intel VM: with the curve from <= 1K the one-process
                    # 2K plans ran 16-24% faster than predicted, with 2K measured within 4%; reports/cpu-loop.md)
                    attn_seqs=[128, 512, 1024, 2048], attn_heads_dims=[(4, 32), (4, 64)],
                    ew_tokens=4096, ew_hidden=1024, ew_small=(256, 128), hbm_bytes=128 * MiB,
                    copy_sizes=[4 * KiB, 64 * KiB, MiB, 64 * MiB, 128 * MiB], copy_fit_from=64 * MiB,
                    duplex_bytes=64 * MiB, duplex_count=4, cc_gemm_n=512, cc_compute_s=0.15, cc_chunk=64 * MiB,
                    coll_sizes=[4 * KiB, 64 * KiB, 512 * KiB, 2 * MiB], bench_target_s=0.01, bench_min_repeats=5,
                    bench_max_repeats=10)
    return Grid(gemm_hiddens=[64, 128, 256, 512, 1024], gemm_tps=[1], gemm_tokens=[128, 512, 2048],
                attn_seqs=[128, 256, 512, 1024, 2048, 4096], attn_heads_dims=[(4, 32), (4, 64), (8, 64)],
                ew_tokens=16384, ew_hidden=1024, ew_small=(256, 128), hbm_bytes=256 * MiB,
                copy_sizes=_pow4(4 * KiB, 256 * MiB), copy_fit_from=64 * MiB,
                duplex_bytes=64 * MiB, duplex_count=8, cc_gemm_n=1024, cc_compute_s=0.5, cc_chunk=64 * MiB,
                coll_sizes=_pow4(4 * KiB, 64 * MiB), bench_target_s=0.05, bench_min_repeats=5, bench_max_repeats=20)


@dataclass
class CalibrateOptions:
    name: str
    device: str = "auto"
    quick: bool = False
    peak_tflops: float | None = None
    attention_backend: str = "auto"
    attention_shapes: tuple[tuple[int, int], ...] = ()  # (heads, head_dim) timed beside the grid's (--attention-shapes)
    cpu_budget_bytes: int | None = None
    threads: int | None = None
    collectives: bool = True
    have_base: bool = False  # a --base profile can fill what is not measured
    command: str = ""
    extra: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------ environment
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    first = r.stdout.strip().splitlines()
    return first[0].strip() if r.returncode == 0 and first else None


def environment(spec: DeviceSpec) -> dict:
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "hostname": mem.hostname(),
        "torch": str(torch.__version__),
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "argv": " ".join(sys.argv),
    }
    if spec.is_cuda:
        p = torch.cuda.get_device_properties(spec.index)
        env.update({
            "device": torch.cuda.get_device_name(spec.index),
            "device_kind": "cuda",
            "cuda_runtime": torch.version.cuda,
            "driver": _nvidia_driver() or "unknown (nvidia-smi not found)",
            "compute_capability": f"{p.major}.{p.minor}",
            "multiprocessors": p.multi_processor_count,
            "visible_gpus": torch.cuda.device_count(),
            "cudnn": torch.backends.cudnn.version(),
        })
    else:
        env.update({"device": f"CPU {_cpu_model()}", "device_kind": "cpu", "visible_gpus": 0})
    return env


def check_options(opts: CalibrateOptions) -> tuple[DeviceSpec, dict]:
    """Resolve the device and the peak before anything runs; raise `ExecError` on a bad combination."""
    spec = resolve_device(opts.device)
    if opts.threads is not None and opts.threads <= 0:
        raise ExecError(f"--threads must be a positive integer, got {opts.threads}")
    peak: dict = {}
    if spec.is_cuda:
        if opts.cpu_budget_bytes is not None:
            raise ExecError("--gpu-memory is for --device cpu; a GPU's memory is measured")
        name = torch.cuda.get_device_name(spec.index)
        if opts.peak_tflops is not None:
            if not opts.peak_tflops > 0:
                raise ExecError(f"--peak-tflops must be positive, got {opts.peak_tflops}")
            peak = {"bf16": opts.peak_tflops * 1e12,
                    "source": f"--peak-tflops {opts.peak_tflops:g} (dense bf16 peak given on the command line)"}
        else:
            ks = known_peak(name)
            if ks is None:
                raise ExecError(f"no datasheet peak is known for GPU {name!r}; pass --peak-tflops with its dense "
                                "bf16 TFLOP/s from the datasheet")
            peak = {"bf16": ks.bf16_tflops * 1e12, "fp32": ks.fp32_tflops * 1e12, "source": ks.source}
    else:
        if opts.peak_tflops is not None:
            raise ExecError("--peak-tflops is for CUDA devices; on CPU the peak is the best measured fp32 GEMM")
        if opts.cpu_budget_bytes is not None and opts.cpu_budget_bytes <= 0:
            raise ExecError("--gpu-memory must be positive")
        total, avail = mem.host_memory()
        ranks = cpu_ranks(opts)
        budget = opts.cpu_budget_bytes if opts.cpu_budget_bytes is not None else mem.default_cpu_budget(total, ranks)
        if ranks * budget >= avail:
            each = f"{ranks} ranks x " if ranks > 1 else ""
            raise ExecError(f"--gpu-memory: {each}{budget / GiB:.2f} GiB is not below the host's available memory "
                            f"({avail / GiB:.2f} GiB); give a smaller --gpu-memory")
    if opts.attention_backend not in attn_bench_backends():
        raise ExecError(f"--attention-backend must be one of {', '.join(attn_bench_backends())}, "
                        f"got {opts.attention_backend!r}")
    from memo_exec.attention import CUDA_ONLY, ON_CPU  # noqa: PLC0415

    if not spec.is_cuda and opts.attention_backend in CUDA_ONLY:  # refused before any benchmark, not after the GEMMs
        on = ", ".join(("auto",) + ON_CPU[:-1]) + f" or {ON_CPU[-1]}"
        raise ExecError(f"--attention-backend {opts.attention_backend} needs a CUDA device, and this calibration "
                        f"runs on the CPU; give --attention-backend {on} on a CPU, or calibrate a GPU with --device "
                        f"cuda")
    return spec, peak


def attn_bench_backends() -> tuple[str, ...]:
    from memo_exec.attention import BACKENDS  # noqa: PLC0415

    return BACKENDS


COPY_STREAM_CORES = 1  # cores a CPU calibration leaves to the executor's copy threads
# gloo processes a CPU calibration measures the collectives between: the executor ranks the profile's machine runs
# (its gpus_per_node), each with its own device budget in the machine's RAM
CPU_RANKS = 2


def cpu_ranks(opts: CalibrateOptions) -> int:
    """The executor ranks a CPU profile's machine is checked for before anything runs: `CPU_RANKS` where the
    collectives are to be measured between that many processes, else 1 (the links then come from --base); the
    profile records the ranks they were measured between (1 where the gloo run failed)."""
    return CPU_RANKS if opts.collectives else 1


def measured_ranks(collectives: dict) -> int:
    """The ranks a CPU profile's machine runs, as recorded: the processes its gloo collectives were measured between,
    1 where they were not (a failed or skipped run, whose links come from --base)."""
    return int(collectives.get("world", CPU_RANKS)) if collectives.get("measured") else 1


def cpu_threads(asked: int | None, cuda: bool) -> tuple[int | None, str]:
    """(torch CPU threads for the benchmarks, or None to keep torch's, and why).

    ``--threads`` wins. On a CPU device the default is the cores not already busy, less one for the
    executor's copy streams: the cores less the rounded 1-minute load less `COPY_STREAM_CORES`, at
    least 1 and at most torch's default. An OpenMP kernel splits its work evenly over its threads
    and waits for the slowest; a thread that shares its core with another process, or with the
    executor's own copy threads (a GPU's copy engines run beside its compute, a CPU's copy streams
    are threads that need a core), makes every kernel wait for it, so more threads than free cores
    run slower and far more erratically than fewer (measured 2026-11-23 on the idle 2-core VM: a
    MEMO plan calibrated and run with 2 threads took +16% and +79% over its prediction, with 1
    thread -3% to +18%). The profile records the count (``provenance.torch_threads``) and
    `memo_exec.validate` runs its plans with it, so the rates hold for the runs."""
    if asked is not None:
        return asked, f"--threads {asked}"
    if cuda:
        return None, "torch's default (CUDA run)"
    cores = torch.get_num_threads()
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None, f"torch's default ({cores}; the load average is not readable)"
    n = max(1, min(cores, (os.cpu_count() or cores) - round(load) - COPY_STREAM_CORES))
    return n, (f"the free cores less {COPY_STREAM_CORES} for the copy streams: {os.cpu_count()} cores less the "
               f"1-minute load {load:.2f} before calibrating, at least 1 and at most torch's default {cores}")


def _measure_collectives(opts: CalibrateOptions, spec: DeviceSpec, grid, progress: Progress) -> dict:
    """NCCL between the visible GPUs, gloo between two CPU processes, or why not measured."""
    if not opts.collectives:
        res = {"measured": False, "reason": "--no-collectives"}
    elif spec.is_cuda:
        n = torch.cuda.device_count()
        res = (coll_bench.run_collectives("nccl", n, grid.coll_sizes, progress, timeout_s=120 if opts.quick else 240)
               if n > 1 else {"measured": False, "reason": "one GPU visible: no NVLink to measure"})
    else:
        res = coll_bench.run_collectives("gloo", CPU_RANKS, grid.coll_sizes, progress,
                                         timeout_s=120 if opts.quick else 240, target_s=0.02)
    if not res["measured"]:
        progress.note(f"collectives not measured: {res['reason']}")
        if not spec.is_cuda and not opts.have_base:
            raise ExecError(f"collectives not measured ({res['reason']}); pass --base PROFILE to take "
                            "the nvlink/internode fields from it")
    return res


# ------------------------------------------------------------------------------------------- run
def run_suite(opts: CalibrateOptions, progress: Progress) -> dict:
    """Run every microbenchmark; return raw results and fitted values (see the module docs)."""
    spec, peak = check_options(opts)
    threads, why = cpu_threads(opts.threads, spec.is_cuda)
    if threads is not None:
        torch.set_num_threads(threads)
    malloc = None if spec.is_cuda else keep_freed_memory()  # as every CPU run of the executor (`host_malloc`)
    torch.manual_seed(0)
    dev = spec.torch_device
    kind = spec.kind
    grid = grid_for(kind, opts.quick)
    dtype = torch.bfloat16 if spec.is_cuda else torch.float32
    dtype_name = "bf16" if spec.is_cuda else "fp32"
    env = environment(spec)
    env["torch_threads_reason"] = why
    if malloc is not None:
        env["host_malloc"] = malloc
    load = env.get("load_average_1min")
    if not spec.is_cuda and load is not None and load > 0.5 * (os.cpu_count() or 1):
        progress.note(f"warning: this host is busy (1-minute load {load:.2f} on {os.cpu_count()} cores): CPU timings "
                      "will be slower and noisier than the machine can do")
    out: dict = {"options": {k: v for k, v in asdict(opts).items() if k != "extra"}, "env": env,
                 "grid": asdict(grid), "dtype": dtype_name}
    progress.note(f"calibrating {env['device']} ({'quick' if opts.quick else 'full'} run, {dtype_name}, "
                  f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads)")

    if spec.is_cuda:
        torch.cuda.set_device(spec.index)
        # the pinned-allocator probe goes first, before any pinned block is cached in this process
        progress.stage("pinned allocation rounding", 1)
        out["pinned"] = mem.probe_pinned_rounding(dev)
        progress.step(out["pinned"].get("mode", "not measured") + ": " +
                      out["pinned"].get("detail", out["pinned"].get("reason", "")))
        out["memory_start"] = mem.gpu_memory(dev)
    else:
        out["framework_rss"] = mem.framework_rss()
        progress.stage("host allocation rounding", 1)
        out["pinned"] = mem.probe_host_rounding()
        progress.step(out["pinned"].get("mode", "not measured") + ": " +
                      out["pinned"].get("detail", out["pinned"].get("reason", "")))
    host_total, host_avail = mem.host_memory()
    out["host_memory"] = {"total": host_total, "available": host_avail}

    # collectives first: a failure shows before the long benchmarks, and the ranks get the GPUs
    # before this process's caching allocator holds their memory
    out["collectives"] = _measure_collectives(opts, spec, grid, progress)
    flush = None
    if not spec.is_cuda:  # how much a repeat writes to start with cold caches (`microbench.measure_cold_write`)
        progress.stage("cold-cache write", 1)
        env["cold_write"] = measure_cold_write()
        progress.step(cold_write_text(env["cold_write"]))
        flush = env["cold_write"]["bytes"]
    bench = Bench(dev, target_s=grid.bench_target_s, min_repeats=grid.bench_min_repeats,
                  max_repeats=grid.bench_max_repeats, flush_bytes=flush)
    probe = None if spec.is_cuda else SpeedProbe(flush_bytes=flush)  # the machine's speed between the parts (CPU)

    def speed_sample(where: str) -> None:
        if probe is not None:
            progress.note(f"machine speed {where}: reference GEMM {probe.sample():.1f} GFLOP/s")

    speed_sample("before the GEMMs")
    _measure_gemms(out, bench, grid, dtype, dtype_name, spec, peak, progress)
    speed_sample("after the GEMMs")
    if probe is not None and probe.moved(2) > SPEED_DRIFT_LIMIT:  # the GEMMs measured two machines: once more
        progress.note(f"the machine's speed moved {probe.moved(2):.0%} while the GEMMs were measured: measuring "
                      "them again (the first attempt's samples stay in provenance.speed_probe.discarded)")
        probe.discard(2)
        speed_sample("before the GEMMs (again)")
        _measure_gemms(out, bench, grid, dtype, dtype_name, spec, peak, progress)
        speed_sample("after the GEMMs (again)")
    _measure_attention(out, bench, grid, dtype, opts.attention_backend, progress, opts.attention_shapes)
    speed_sample("after attention")

    # memory bandwidth, elementwise ------------------------------------------------------------
    progress.stage("memory bandwidth and memory-bound ops", 13)
    hbm = ew_bench.measure_copy_bandwidth(bench, grid.hbm_bytes, dtype, progress)
    hbm_bw = max(hbm["copy_bytes_per_s"], hbm["add_bytes_per_s"])
    ew = ew_bench.measure_elementwise(bench, grid.ew_tokens, grid.ew_hidden, 4 * grid.ew_hidden, dtype, progress)
    small_t, small_h = grid.ew_small
    ew_small = ew_bench.measure_elementwise(bench, small_t, small_h, 4 * small_h, dtype, progress)
    latency = fit_call_latency({k: (r["sim_bytes"], r["seconds"]) for k, r in ew_small["ops"].items()},
                               {k: (r["sim_bytes"], r["seconds"]) for k, r in ew["ops"].items()},
                               {k: ew_bench.OPS_PER_LAYER[r["kind"]] for k, r in ew["ops"].items()})
    progress.note(f"  memory-bound ops: {ew['layer_bytes_per_s'] / 1e9:.1f} GB/s at T={grid.ew_tokens}, "
                  f"{latency * 1e6:.1f} us per call beyond their bytes (from T={small_t}, h={small_h})")
    out["hbm"] = dict(hbm, bandwidth=hbm_bw)
    out["elementwise"] = dict(ew, fraction_raw=ew["layer_bytes_per_s"] / hbm_bw,
                              fraction=min(1.0, ew["layer_bytes_per_s"] / hbm_bw), small=ew_small,
                              call_latency_s=latency)

    _measure_copies(out, bench, grid, dtype, progress)

    # allocator calls (CUDA; on CPU: not measured) -----------------------------------------------
    out["allocator"] = alloc_bench.run(dev, opts.quick, progress)

    # memory capacity ------------------------------------------------------------------------------
    if spec.is_cuda:
        out["memory_end"] = mem.gpu_memory(dev)
    else:
        ranks = measured_ranks(out["collectives"])
        out["cpu_budget"] = {"bytes": opts.cpu_budget_bytes if opts.cpu_budget_bytes is not None
                             else mem.default_cpu_budget(host_total, ranks),
                             "default": opts.cpu_budget_bytes is None, "ranks": ranks}

    speed_sample("at the end")
    if probe is not None:
        env["speed_probe"] = probe.summary()
    out["duration_s"] = progress.elapsed()
    if hasattr(os, "getloadavg"):
        env["load_average_1min_end"] = round(os.getloadavg()[0], 2)
    return out


# ------------------------------------------------------------------------------------ the parts
# Each part measures into ``out`` and fits what it measured; `remeasure` runs a part again.
def _measure_gemms(out: dict, bench: Bench, grid: Grid, dtype, dtype_name: str, spec: DeviceSpec, peak: dict,
                   progress: Progress) -> None:
    shapes = gemm_bench.model_gemm_shapes(grid.gemm_hiddens, grid.gemm_tps, grid.gemm_tokens)
    gemm_rows = gemm_bench.run_gemms(bench, shapes, dtype, progress)
    best = max(r["flops_per_s"] for r in gemm_rows)
    if spec.is_cuda:
        peak_value, peak_source = peak["bf16"], peak["source"]
    else:
        peak_value = best
        peak_source = "measured: best fp32 GEMM throughput of this run (CPU: no datasheet peak; efficiencies are " \
                      "relative to it)"
    out["peak"] = {"dtype": dtype_name, "value": peak_value, "source": peak_source, "best_measured": best,
                   "datasheet": {k: v for k, v in peak.items() if k != "source"}}
    clipped = sum(1 for r in gemm_rows if r["flops_per_s"] > peak_value)
    if clipped:
        progress.note(f"warning: {clipped} GEMM(s) ran faster than the peak {peak_value / 1e12:.1f} TFLOP/s; "
                      "their efficiency is clipped to 1 (is the peak right?)")
    out["gemm"] = {"rows": gemm_rows, "clipped": clipped,
                   "curve": fit_efficiency_curve([(r["flops"], r["flops_per_s"] / peak_value) for r in gemm_rows])}


def _measure_attention(out: dict, bench: Bench, grid: Grid, dtype, backend_name: str, progress: Progress,
                       extra_shapes: tuple[tuple[int, int], ...] = (), ring_blocks: dict | None = None) -> None:
    """The grid's attention cases, fitted; ``extra_shapes`` (``--attention-shapes``: (heads, head_dim)
    pairs a model needs) timed at the grid's lengths too and kept apart (``extra_rows``): the profile's
    measured times hold them (`memo_sim.cost.attention_measured`), the curves stay the grid's. ``ring_blocks``
    (a re-measurement's: the ring's blocks as measured before) is re-fitted to the peak, not timed again."""
    extra_shapes = [hd for hd in extra_shapes if hd not in grid.attn_heads_dims]
    cases = attn_bench.attention_cases(grid.attn_seqs, grid.attn_heads_dims)
    extra = attn_bench.attention_cases(grid.attn_seqs, extra_shapes)
    backend, attn_rows = attn_bench.run_attention(bench, cases + extra, dtype, backend_name, progress)
    fitted = [r for r, c in zip(attn_rows, cases + extra) if c in cases]
    out["attention"] = dict(_fit_attention(fitted, out["peak"]["value"]), backend=backend,
                            extra_rows=[r for r in attn_rows if r not in fitted])
    a = out["attention"]
    progress.note(f"  attention per score element beyond its FLOPs: forward {a['fwd_score_time'] * 1e9:.3f} ns, "
                  f"backward {a['bwd_score_time'] * 1e9:.3f} ns "
                  f"({len(a['score_fit']['fwd'])} (seq, heads) cases at two head sizes)")
    if ring_blocks is not None:
        a["ring_blocks"] = attn_bench.fit_ring_blocks(ring_blocks, out["peak"]["value"])
        return
    # ring CP's block kernel where it is not this backend's (`attention.measure_ring_blocks`)
    a["ring_blocks"] = attn_bench.measure_ring_blocks(bench, grid.attn_seqs, grid.attn_heads_dims, dtype, backend,
                                                      out["peak"]["value"], progress, extra_shapes)


def _fit_attention(rows: list[dict], peak_value: float) -> dict:
    """Attention's per-score-element times (`fit_score_time`, from cases at two head sizes) and
    its efficiency curves over the rest of each case's time."""
    out: dict = {"rows": rows, "score_fit": {}, "clipped": 0}
    for ph in ("fwd", "bwd"):
        cases = [((r["seq"], r["heads"], r["batch"]), r[f"{ph}_flops"],
                  attention_score_elements(r["fwd_flops"], r["head_dim"]), r[f"{ph}_s"]) for r in rows]
        c, per_group = fit_score_time(cases)
        eff = [(f, f / (t - e * c) / peak_value) for _k, f, e, t in cases]
        out[f"{ph}_score_time"], out["score_fit"][ph] = c, per_group
        out[f"{ph}_curve"] = fit_efficiency_curve(eff)
        out["clipped"] += sum(1 for _f, x in eff if x > 1)
    return out


def _measure_copies(out: dict, bench: Bench, grid: Grid, dtype, progress: Progress) -> None:
    sweep = copy_bench.copy_sweep(bench, grid.copy_sizes, progress)
    fits = {}
    for d, rows in sweep.items():
        bw, lat = fit_copy_model([r["bytes"] for r in rows], [r["seconds"] for r in rows],
                                 large_from=grid.copy_fit_from)
        fits[d] = {"bandwidth": bw, "latency": lat}
    progress.note("  fit: " + ", ".join(f"{d} {f['bandwidth'] / 1e9:.2f} GB/s + {f['latency'] * 1e6:.1f} us"
                                        for d, f in fits.items()))
    dup = copy_bench.duplex(bench, grid.duplex_bytes, grid.duplex_count, progress)
    cc = copy_bench.copy_compute(bench, dtype, grid.cc_gemm_n, grid.cc_compute_s,
                                 {d: f["bandwidth"] for d, f in fits.items()}, grid.cc_chunk, progress)
    single = [cc[d]["compute_slowdown"] for d in ("d2h", "h2d")]
    out["copies"] = {"sweep": sweep, "fit": fits, "duplex": dup, "copy_compute": cc,
                     "compute_slowdown": sum(single) / len(single)}


REMEASURABLE = ("gemm", "attention", "copies")


def remeasure(opts: CalibrateOptions, raw: dict, parts: tuple[str, ...], progress: Progress) -> dict:
    """A copy of ``raw`` (a `run_suite` result) with ``parts`` (of `REMEASURABLE`) measured and
    fitted again, on the same device, sizes and options. On CPU the GEMMs set the peak the
    attention efficiencies are relative to, so re-measuring them re-fits attention too. The ring's
    blocks are not timed again with attention: no plausibility check reads them
    (`memo_exec.calibrate.sanity`), so their measurements stay, re-fitted to the peak (on a 2-core CPU
    their 48 timings are about 22 s of a quick calibration's re-measured attention)."""
    spec, peak = check_options(opts)
    dev = spec.torch_device
    grid = grid_for(spec.kind, opts.quick)
    dtype = torch.bfloat16 if spec.is_cuda else torch.float32
    bench = Bench(dev, target_s=grid.bench_target_s, min_repeats=grid.bench_min_repeats,
                  max_repeats=grid.bench_max_repeats, flush_bytes=(raw["env"].get("cold_write") or {}).get("bytes"))
    out = dict(raw)
    if "gemm" in parts:
        _measure_gemms(out, bench, grid, dtype, raw["dtype"], spec, peak, progress)
    if "attention" in parts:
        _measure_attention(out, bench, grid, dtype, opts.attention_backend, progress, opts.attention_shapes,
                           ring_blocks=(raw.get("attention") or {}).get("ring_blocks"))
    elif "gemm" in parts and not spec.is_cuda:  # the same attention measurements, relative to the new peak
        a = out["attention"]
        out["attention"] = dict(_fit_attention(a["rows"], out["peak"]["value"]), backend=a["backend"],
                                extra_rows=a.get("extra_rows", []))
        if "ring_blocks" in a:
            out["attention"]["ring_blocks"] = attn_bench.fit_ring_blocks(a["ring_blocks"], out["peak"]["value"])
    if "copies" in parts:
        _measure_copies(out, bench, grid, dtype, progress)
    out["remeasured"] = sorted(set(raw.get("remeasured", [])) | set(parts))
    return out


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?\s*$")


def parse_bytes(text: str, option: str) -> int:
    """``8GiB``, ``512 MiB``, ``4e9`` -> bytes; `ExecError` naming the option otherwise."""
    from memo_sim.units import BYTES  # noqa: PLC0415

    m = _SIZE.match(str(text))
    if not m:
        raise ExecError(f"{option}: expected a size like 8GiB or 512MiB, got {text!r}")
    value = float(m.group(1)) * BYTES[m.group(2) or "B"]
    if value < 1:
        raise ExecError(f"{option}: must be positive, got {text!r}")
    return int(value)


_SHAPE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")
MAX_SHAPE = 4096  # heads or head size past this is a typo


def parse_attention_shapes(text: str | None, option: str = "--attention-shapes") -> tuple[tuple[int, int], ...]:
    """``8x32,4x64`` -> ((8, 32), (4, 64)): (query heads per rank, head size) pairs; `ExecError` naming
    the option otherwise."""
    if not text:
        return ()
    out = []
    for part in str(text).split(","):
        m = _SHAPE.match(part)
        if not m or not all(1 <= int(x) <= MAX_SHAPE for x in m.groups()):
            raise ExecError(f"{option}: expected HEADSxHEAD_DIM pairs separated by commas, each in 1..{MAX_SHAPE} "
                            f"(e.g. 8x32,4x64: the query heads one rank runs and their size), got {part.strip()!r}")
        shape = (int(m.group(1)), int(m.group(2)))
        if shape not in out:
            out.append(shape)
    return tuple(out)
