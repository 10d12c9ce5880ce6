"""memo-sim's command line run in-process for the tests (click's CliRunner), its one-line refusals, and one what-if
search shared by several runs of the same request."""

import contextlib

import pytest
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


def one_error_line(r) -> str:
    """A refusal's error line (memo-sim's or memo-exec's): exit status 2, one non-blank line starting ``error: ``,
    no traceback."""
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "Traceback" not in r.output
    return lines[0]


def one_error(call) -> str:
    """The one-line `MemoError` ``call()`` raises (a library call's refusal, `memo_sim.api`)."""
    from memo_sim.errors import MemoError

    with pytest.raises(MemoError) as e:
        call()
    text = str(e.value)
    assert "\n" not in text, text
    return text


@contextlib.contextmanager
def one_search():
    """Within it the CLI's what-if runs `memo_sim.cli.whatif.answer_whatif` once, and every later run of the same
    request prints from that answer, as a second run would print it (the output format is no part of the request,
    which is checked alike). Yields the MonkeyPatch for a caller's own patches."""
    import memo_sim.cli.whatif as cli_whatif

    search, done = cli_whatif.answer_whatif, []

    def once(req, **kw):
        if not done:
            done.append((req, search(req, **kw)))
        assert done[0][0] == req, "the shared search serves one request"
        return done[0][1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli_whatif, "answer_whatif", once)
        yield mp


def text_and_json(args, **kw):
    """(``args``' text answer, ``args + ["--json"]``'s), CliRunner results of the what-if printed both ways from one
    search (`one_search`; the JSON runs first, so no rendering ran before it); ``kw`` go to ``CliRunner.invoke``."""
    with one_search():
        js = CliRunner().invoke(cli, [*args, "--json"], **kw)
        return CliRunner().invoke(cli, args, **kw), js
