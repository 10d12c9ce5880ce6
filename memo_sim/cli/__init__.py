"""memo-sim: what-if planning for long-context LLM training (no GPU, no torch).

One module per family of commands (`info`, `whatif`, `maxseq`, `memplan`, `simulate`, `export`,
`explain`), imported when one of its commands runs (`COMMANDS`, `LazyMemoGroup`: a what-if does not
import the plots or the exporters); every user error is one line on stderr and exit code 2 (never
a traceback).
"""

from __future__ import annotations

import sys

import click

from memo_sim.cli.common import LazyMemoGroup
from memo_sim.errors import MemoError
from memo_sim.heap_freeze import freeze_heap

# every command: its name -> the module and attribute that define it
COMMANDS = {
    "profiles": "memo_sim.cli.info:profiles",
    "models": "memo_sim.cli.info:models",
    "frameworks": "memo_sim.cli.info:frameworks",
    "check-plan": "memo_sim.cli.info:check_plan",
    "whatif": "memo_sim.cli.whatif:whatif",
    "maxseq": "memo_sim.cli.maxseq:maxseq",
    "memplan": "memo_sim.cli.memplan:memplan",
    "simulate": "memo_sim.cli.simulate:simulate_cmd",
    "plot": "memo_sim.cli.simulate:plot_cmd",
    "sweep-alpha": "memo_sim.cli.simulate:sweep_alpha_cmd",
    "sweep-seq": "memo_sim.cli.simulate:sweep_seq_cmd",
    "sweep-subseqs": "memo_sim.cli.simulate:sweep_subseqs_cmd",
    "export": "memo_sim.cli.export:export",
    "explain": "memo_sim.cli.explain:explain",
}


@click.group(cls=LazyMemoGroup, lazy_commands=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="memo")
def cli():
    """Plan ultra-long-context LLM training: what-if, simulate, memory plans."""


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="memo-sim", standalone_mode=True)
    except MemoError as e:  # raised outside a command (e.g. while parsing)
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    finally:
        if argv is None:
            # run as the program (its arguments from the command line): the command's output is
            # written and the process exits next, so the interpreter's exit need not traverse its
            # heap (a cluster-scale what-if leaves a few hundred thousand objects; the collector's
            # passes over them at exit cost a second or more). A caller that passes ``argv`` keeps
            # its process, and its collector as it was.
            freeze_heap()


if __name__ == "__main__":
    main()
