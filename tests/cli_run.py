"""memo-sim's command line run in-process for the tests (click's CliRunner), and its one-line refusals."""

from click.testing import CliRunner

from memo_sim.cli import cli


def run_sim(args, code: int = 0):
    """``memo-sim ARGS`` (paths and numbers as strings), its exit status checked against ``code``."""
    r = CliRunner().invoke(cli, [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


def one_line(r) -> str:
    """A refusal's output: one line naming the field and the fix, exit status 2, no traceback."""
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "Traceback" not in r.output, r.output
    return r.output
