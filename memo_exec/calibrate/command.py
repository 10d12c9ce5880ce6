"""``memo-exec calibrate``: measure this machine and write ``OUT_DIR/NAME.yaml`` (default ``hardware_profiles/``).

    memo-exec calibrate --name NAME [--device auto|cuda|cuda:N|cpu] [--quick] [--out-dir DIR]
                        [--base PROFILE] [--peak-tflops T] [--attention-backend B] [--gpu-memory SIZE]
                        [--threads N] [--node-from-base] [--no-collectives] [--raw-out FILE] [--force]

Progress goes to stderr; the last stdout line names the file written. A bad option is one
``error:`` line on stderr and exit code 2, before any benchmark runs. Register it with
``cli.add_command(calibrate_cmd)``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click

from memo_exec.errors import user_errors
from memo_sim.errors import MemoError, usage_line
from memo_sim.fileio import check_output_file, check_output_folder

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
DEFAULT_OUT = "hardware_profiles"


# What the suites took where they were timed (announced before a run starts)
DURATION_QUICK = ("about 90 s on an idle 2-core CPU (90 s measured on 2026-11-27; 149 s at a load of 1), "
                  "longer on a loaded one; not yet timed on a GPU")
DURATION_FULL = ("several minutes: over 400 s measured on the 2-core CPU; use --quick for a first profile; "
                 "not yet timed on a GPU")


def calibrate(name: str, device: str = "auto", quick: bool = False, out_dir: str | Path = DEFAULT_OUT,
              base: str | None = None, peak_tflops: float | None = None, attention_backend: str = "auto",
              gpu_memory: str | None = None, threads: int | None = None, node_from_base: bool = False,
              collectives: bool = True, raw_out: str | Path | None = None, force: bool = False,
              command: str = "", progress=None, attention_shapes: str | None = None) -> tuple[Path, dict]:
    """Run the calibration and write the profile; return ``(path, profile dict)``.

    Raises `MemoError` (one line) for a bad option before anything runs.
    """
    from memo_exec.calibrate.datasheet import default_base  # noqa: PLC0415
    from memo_exec.calibrate.microbench import Progress  # noqa: PLC0415
    from memo_exec.calibrate.suite import (  # noqa: PLC0415
        CalibrateOptions, check_options, parse_attention_shapes, parse_bytes, remeasure, run_suite,
    )
    from memo_exec.calibrate.writer import build_profile, load_base, write_profile  # noqa: PLC0415
    from memo_exec.host_share import CpuShareMeter  # noqa: PLC0415

    if not name or not NAME_RE.match(name):
        raise MemoError(f"--name must be letters, digits, '.', '_' or '-' (a file name), got {name!r}")
    path = Path(out_dir) / f"{name}.yaml"
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise MemoError(f"--out-dir {out_dir} is not a folder")
    # every output path before any measurement, writing nothing (a review: --out-dir afile/sub and --raw-out in a
    # folder that could not be written failed after minutes of measuring)
    check_output_folder(out_dir, "--out-dir")
    check_output_file(path, "--out-dir")
    if raw_out:
        check_output_file(raw_out, "--raw-out")
    if path.exists() and not force:
        raise MemoError(f"{path} exists; pass --force to overwrite it or choose another --name")
    opts = CalibrateOptions(name=name, device=device, quick=quick, peak_tflops=peak_tflops,
                            attention_backend=attention_backend,
                            cpu_budget_bytes=parse_bytes(gpu_memory, "--gpu-memory") if gpu_memory else None,
                            threads=threads, collectives=collectives, command=command,
                            attention_shapes=parse_attention_shapes(attention_shapes))
    spec, _peak = check_options(opts)
    if node_from_base and not spec.is_cuda:
        raise MemoError("--node-from-base is for CUDA; a CPU profile describes this host")
    base_prof = None
    if base is not None:
        base_prof = load_base(base)
    elif spec.is_cuda:
        import torch  # noqa: PLC0415

        base_prof = load_base(default_base(torch.cuda.get_device_name(spec.index)))
    elif not collectives:
        raise MemoError("--no-collectives on CPU needs --base PROFILE for the nvlink/internode fields")
    opts.have_base = base_prof is not None
    prog = progress if progress is not None else Progress()
    prog.note(f"calibrating ({'quick' if quick else 'full'} suite) on {spec.describe()}: "
              + (DURATION_QUICK if quick else DURATION_FULL))
    with CpuShareMeter() as share:
        raw = run_suite(opts, prog)
    if share.result is not None:  # what other processes took of the cores while this measured
        raw.setdefault("env", {})["cpu_share"] = share.result.to_dict()
        prog.note(f"while calibrating, {share.result.line()}")
    prof = build_profile(name, raw, base_prof, node_from_base=node_from_base)
    found = implausible(prof, raw, str(path))
    if found:
        parts = tuple(sorted({f.part for f in found}))
        for f in found:
            prog.note(f"implausible fit: {f.line()}")
        prog.note(f"re-measuring {', '.join(parts)} once")
        raw = remeasure(opts, raw, parts, prog)
        prof = build_profile(name, raw, base_prof, node_from_base=node_from_base)
        found = implausible(prof, raw, str(path))
    record_sanity(prof, raw, found, prog)
    if raw_out:
        from memo_sim.fileio import atomic_write_json  # noqa: PLC0415

        atomic_write_json(raw_out, raw)
    write_profile(prof, path)
    prog.note(f"wrote {path} in {prog.elapsed():.1f} s")
    return path, prof


def implausible(prof: dict, raw: dict, source: str) -> list:
    """The physically implausible fits of a profile dict (`memo_exec.calibrate.sanity`)."""
    from memo_exec.calibrate.sanity import check  # noqa: PLC0415
    from memo_exec.calibrate.quantities import plain  # noqa: PLC0415
    from memo_sim.profile.loader import parse_profile  # noqa: PLC0415

    return check(parse_profile(plain(prof), source), raw, raw["dtype"])


def record_sanity(prof: dict, raw: dict, found: list, prog) -> None:
    """``provenance.sanity`` of the profile, and a ``warning:`` line on stderr per finding left."""
    from memo_exec.calibrate.sanity import CHECKS  # noqa: PLC0415

    for f in found:
        prog.note(f"warning: implausible calibration: {f.line()}")
    if found:
        prog.note("warning: the profile records these under provenance.sanity; re-run the calibration on an idle "
                  "machine to replace them")
    prof["provenance"]["sanity"] = {"checks": list(CHECKS), "remeasured": list(raw.get("remeasured", [])),
                                    "warnings": [f.line() for f in found]}


class _OneLineErrors(click.Command):
    """Usage errors (unknown option, bad value) as one ``error:`` line and exit code 2."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            click.echo(usage_line(e), err=True)
            raise click.exceptions.Exit(2) from None


def _command_line(ctx: click.Context) -> str:
    parts = [ctx.command_path if " " in ctx.command_path else f"memo-exec {ctx.command_path}"]
    for p in ctx.command.params:
        v = ctx.params.get(p.name)
        src = ctx.get_parameter_source(p.name)
        if src is None or src.name == "DEFAULT":
            continue
        flag = p.opts[0]
        if isinstance(p, click.Option) and p.is_flag:
            if p.secondary_opts and not v:
                parts.append(p.secondary_opts[0])
            elif v:
                parts.append(flag)
        else:
            parts += [flag, str(v)]
    return " ".join(shlex.quote(x) if i and " " in x else x for i, x in enumerate(parts))


# -h of its own: click keeps a command's help option from the first group that shows it (a test's plain group first
# left memo-exec's `calibrate -h` unknown in the full suite)
@click.command("calibrate", cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]},
               help="Measure GEMM, attention, memory-bound ops, host copies, copy/compute overlap, memory, "
                    "allocator calls and collectives on this machine and write the profile OUT_DIR/NAME.yaml for "
                    "memo-sim (--out-dir, default hardware_profiles).")
@click.option("--name", required=True, help="profile name (the file is OUT_DIR/NAME.yaml)")
@click.option("--device", default="auto", show_default=True,
              help="auto (cuda if available, else cpu), cpu, cuda or cuda:N (N: a GPU index, 0, 1, ...)")
@click.option("--quick", is_flag=True,
              help="fewer sizes (~90 s measured on an idle 2-core CPU, longer on a busy one, plus the re-measured "
                   "part when a fit is implausible; not yet timed on a GPU)")
@click.option("--out-dir", default=DEFAULT_OUT, show_default=True, help="folder for NAME.yaml")
@click.option("--base", default=None,
              help="profile for what this machine cannot measure (inter-node link, NVLink on one GPU, PCIe "
                   "topology); default on CUDA: the builtin closest to the GPU (h100-sxm5-80gb otherwise)")
@click.option("--peak-tflops", default=None, type=float,
              help="dense bf16 peak TFLOP/s of the GPU (default: datasheet value of a known GPU)")
@click.option("--attention-backend", default="auto", show_default=True,
              help="attention kernel to measure: auto, flash_attn, sdpa_flash, sdpa_efficient, sdpa_cudnn, math")
@click.option("--attention-shapes", default=None, metavar="HxD[,HxD...]",
              help="also time attention (and ring CP's blocks, where they run another kernel) at these query heads "
                   "per rank x head size, e.g. 8x32: the simulator prices a layer at a measured shape from those "
                   "times instead of the fitted curves (memo-exec validate's model on 1 and 2 ranks: 8x32,4x32)")
@click.option("--gpu-memory", default=None,
              help="CPU only: the device-memory budget to write, e.g. 8GiB (default min(8 GiB, half the RAM))")
@click.option("--threads", default=None, type=int,
              help="torch CPU threads for the benchmarks (CPU default: the cores not busy, from the 1-minute load; "
                   "memo-exec validate runs its CPU plans with the same count)")
@click.option("--node-from-base", is_flag=True,
              help="CUDA: take gpus_per_node and host memory from --base (this box is a slice of a bigger node)")
@click.option("--collectives/--no-collectives", default=True, show_default=True,
              help="measure NCCL (several GPUs) or gloo (CPU) send/recv and all-reduce")
@click.option("--raw-out", default=None, help="also write every raw measurement to this JSON file")
@click.option("--force", is_flag=True, help="overwrite OUT_DIR/NAME.yaml if it exists")
@click.pass_context
@user_errors("during calibration")
def calibrate_cmd(ctx, name, device, quick, out_dir, base, peak_tflops, attention_backend, attention_shapes,
                  gpu_memory, threads, node_from_base, collectives, raw_out, force) -> None:
    path, prof = calibrate(name, device=device, quick=quick, out_dir=out_dir, base=base, peak_tflops=peak_tflops,
                           attention_backend=attention_backend, gpu_memory=gpu_memory, threads=threads,
                           node_from_base=node_from_base, collectives=collectives, raw_out=raw_out, force=force,
                           command=_command_line(ctx), attention_shapes=attention_shapes)
    g, hl = prof["gpu"], prof["host_link"]
    peak = next(iter(g["peak_flops"].items()))
    click.echo(f"{prof['name']}: {g['model']}, peak {peak[0]} {peak[1]['value']} {peak[1]['unit']}, "
               f"memory bandwidth {g['hbm_bandwidth']['value']} GB/s, host link d2h "
               f"{hl['d2h_bandwidth']['value']} / h2d {hl['h2d_bandwidth']['value']} GB/s")
    click.echo(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    """Run the command on its own (``python -m memo_exec.calibrate``)."""
    calibrate_cmd.main(args=argv, prog_name="memo-exec calibrate")

