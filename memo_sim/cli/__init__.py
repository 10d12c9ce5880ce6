"""memo-sim: what-if planning for long-context LLM training (no GPU, no torch).

One module per family of commands (`info`, `whatif`, `maxseq`, `memplan`, `simulate`, `export`); every user error is
one line on stderr and exit code 2 (never a traceback).
"""

from __future__ import annotations

import sys

import click

from memo_sim.cli import explain, export, info, maxseq, memplan, simulate, whatif
from memo_sim.cli.common import MemoGroup
from memo_sim.errors import MemoError


@click.group(cls=MemoGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="memo")
def cli():
    """Plan ultra-long-context LLM training: what-if, simulate, memory plans."""


for _command in (*info.COMMANDS, whatif.whatif, *maxseq.COMMANDS, memplan.memplan, *simulate.COMMANDS, export.export, *explain.COMMANDS):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="memo-sim", standalone_mode=True)
    except MemoError as e:  # raised outside a command (e.g. while parsing)
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
