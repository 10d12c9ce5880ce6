"""``memo-exec``: run a plan.json on a device and report measured vs predicted; record a layer trace.

    memo-exec run plan.json [--device cuda|cpu] [--steps N] [--out DIR] [--layers N]
                            [--attention-backend auto|flash_attn|sdpa_flash|sdpa_efficient|sdpa_cudnn|math]
                            [--tokens FILE] [--dtype fp32|fp64|bf16] [--seed S] [--lr LR] [--no-memory-plan]
    memo-exec trace plan.json [--device cpu|cuda|meta] [--out trace.json] [--cuda-history FILE]
                              [--write-plan PLAN_WITH_MEMORY_PLAN.json]

User errors (unknown plan schema, a layout this executor does not run, a missing backend, a run
that does not fit by the executor's own estimate, a bad memory plan) print one ``error:`` line
on stderr and exit with code 2, before anything large is allocated.
"""

from __future__ import annotations

import functools
import sys

import click

from memo_exec.attention import BACKENDS
from memo_sim.errors import MemoError


def _user_errors(fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except MemoError as e:
            click.echo(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", err=True)
            sys.exit(2)
        except MemoryError as e:
            click.echo(f"error: out of host memory ({e})", err=True)
            sys.exit(2)
        except RuntimeError as e:
            import torch  # noqa: PLC0415

            if isinstance(e, torch.OutOfMemoryError):
                first = str(e).strip().splitlines()[0]
                click.echo(f"error: the device ran out of memory although the executor's estimate fit ({first})",
                           err=True)
                sys.exit(2)
            raise

    return wrapper


@click.group(help="Run a memo plan on real hardware and compare with the simulator's prediction.")
def cli() -> None:
    pass


@cli.command("run", help="Train STEPS steps with the plan and write measured.json, trace.json, report.md.")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available)")
@click.option("--steps", default=3, show_default=True, type=int, help="training steps (step 0 is a warm-up)")
@click.option("--out", "out_dir", default="exec_out", show_default=True, type=click.Path(file_okay=False))
@click.option("--layers", default=None, type=int, help="run only N layers of the plan's model")
@click.option("--attention-backend", default=None, type=click.Choice(BACKENDS),
              help="override the plan's attention_backend")
@click.option("--tokens", "tokens_file", default=None, type=click.Path(dir_okay=False),
              help=".npy or .bin (uint16) token ids; default synthetic")
@click.option("--dtype", default=None, type=click.Choice(["bf16", "fp32", "fp64"]),
              help="compute dtype (default bf16 on CUDA, fp32 on CPU)")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--lr", default=3e-4, show_default=True, type=float)
@click.option("--no-memory-plan", is_flag=True, help="ignore plan.memory_plan (caching allocator only)")
@_user_errors
def run_cmd(plan_file, device, steps, out_dir, layers, attention_backend, tokens_file, dtype, seed, lr,
            no_memory_plan) -> None:
    from memo_exec.report import write_outputs  # noqa: PLC0415
    from memo_exec.runner import Executor, RunOptions  # noqa: PLC0415
    from memo_sim.plan.schema import read_plan  # noqa: PLC0415

    plan = read_plan(plan_file)
    opts = RunOptions(device=device, steps=steps, layers=layers, attention_backend=attention_backend, dtype=dtype,
                      tokens_file=tokens_file, seed=seed, lr=lr, use_memory_plan=not no_memory_plan)
    ex = Executor(plan, opts)
    try:
        res = ex.run()
    finally:
        ex.close()
    paths = write_outputs(res, out_dir, plan_file)
    st = res.steady
    click.echo(f"{res.meta['model']} {res.meta['policy']} on {res.meta['device']}: "
               f"{st['iteration_s']:.4f} s/iteration, {res.meta['tokens'] / st['iteration_s']:,.0f} tokens/s, "
               f"loss {res.summaries[-1]['loss']:.4f}")
    click.echo(f"wrote {paths['report']}, {paths['measured']}, {paths['trace']}")


@cli.command("trace", help="Record one layer's malloc/free sequence (memo-trace JSON).")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--device", default="meta", show_default=True, help="meta (no memory), cpu, cuda or cuda:N")
@click.option("--out", "out_file", default="layer_trace.json", show_default=True, type=click.Path(dir_okay=False))
@click.option("--dtype", default=None, type=click.Choice(["bf16", "fp32", "fp64"]),
              help="default: the plan's dtype on meta and CUDA, fp32 on CPU")
@click.option("--attention-backend", default=None, type=click.Choice(BACKENDS))
@click.option("--cuda-history", default=None, type=click.Path(dir_okay=False),
              help="also write what the CUDA caching allocator saw (torch.cuda.memory._record_memory_history)")
@click.option("--write-plan", default=None, type=click.Path(dir_okay=False),
              help="write a copy of the plan whose memory_plan is the greedy placement of this trace")
@_user_errors
def trace_cmd(plan_file, device, out_file, dtype, attention_backend, cuda_history, write_plan) -> None:
    from memo_exec.trace import memory_plan_from_trace, record_cuda_history, record_layer_trace  # noqa: PLC0415
    from memo_sim.plan.schema import read_plan  # noqa: PLC0415
    from memo_sim.plan.schema import write_plan as _write_plan  # noqa: PLC0415

    plan = read_plan(plan_file)
    tr = record_layer_trace(plan, device, dtype, attention_backend)
    tr.write_json(out_file)
    click.echo(f"wrote {out_file}: {len(tr)} buffers, max live {tr.max_live_bytes() / 2**20:.1f} MiB")
    if cuda_history:
        ct = record_cuda_history(plan, device if device != "meta" else "cuda", dtype, attention_backend)
        ct.write_json(cuda_history)
        click.echo(f"wrote {cuda_history}: {len(ct)} caching-allocator blocks")
    if write_plan:
        plan.memory_plan = memory_plan_from_trace(tr)
        _write_plan(plan, write_plan)
        click.echo(f"wrote {write_plan}: arena {plan.memory_plan['arena_bytes'] / 2**20:.1f} MiB")


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="memo-exec")


if __name__ == "__main__":
    main()
