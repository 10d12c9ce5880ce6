"""memo-sim's commands are imported when used (`memo_sim.cli.COMMANDS`, `LazyMemoGroup`): --help
still lists every one with its short help, each command's --help works, and a what-if does not
import the other commands' modules."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from memo_sim.cli import COMMANDS, cli


def test_every_command_module_is_in_the_table():
    for module in sorted({spec.split(":")[0] for spec in COMMANDS.values()}):
        mod = importlib.import_module(module)
        for cmd in getattr(mod, "COMMANDS", ()):
            assert cmd.name in COMMANDS, f"{module} defines {cmd.name}, which memo_sim.cli.COMMANDS lacks"
            assert getattr(mod, COMMANDS[cmd.name].split(":")[1]) is cmd


def test_help_lists_every_command_with_its_short_help():
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0, r.output
    listed = r.output.split("Commands:", 1)[1]
    for name, spec in COMMANDS.items():
        module, attr = spec.split(":")
        short = getattr(importlib.import_module(module), attr).get_short_help_str(limit=30).rstrip(".")
        line = next((ln for ln in listed.splitlines() if ln.split()[:1] == [name]), None)
        assert line is not None, f"{name} missing from --help"
        assert short[:20] in line


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_help_works(name):
    r = CliRunner().invoke(cli, [name, "--help"])
    assert r.exit_code == 0, r.output
    assert f"Usage: cli {name}" in r.output or f"{name} [OPTIONS]" in r.output


def test_unknown_command_is_one_line_exit_2():
    r = CliRunner().invoke(cli, ["no-such-command"])
    assert r.exit_code == 2
    assert "No such command" in r.output


@pytest.mark.parametrize("tool", ["memo-sim", "memo-exec"])
def test_a_bad_option_of_the_tool_itself_is_one_line_exit_2(tool):
    """``memo-sim --bogus``: click printed its usage, a hint and "Error: ..." on four lines, where
    every command's bad option is one "error:" line; no arguments at all still shows the help."""
    from memo_exec.cli import cli as exec_cli
    group = cli if tool == "memo-sim" else exec_cli
    r = CliRunner().invoke(group, ["--bogus"], prog_name=tool)
    text = r.output.strip()
    assert r.exit_code == 2 and text.startswith("error: No such option '--bogus'") and "\n" not in text, r.output
    assert f"`{tool} -h`" in text
    assert "Usage:" in CliRunner().invoke(group, [], prog_name=tool).output


def test_whatif_imports_only_its_own_command_module():
    code = ("import sys; from memo_sim.cli import cli; cli.get_command(None, 'whatif'); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('memo_sim.cli.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    loaded = set(out.split())
    assert "memo_sim.cli.whatif" in loaded
    assert not loaded & {"memo_sim.cli.explain", "memo_sim.cli.simulate", "memo_sim.cli.export",
                         "memo_sim.cli.memplan", "memo_sim.cli.maxseq", "memo_sim.cli.info"}


def test_whatif_without_a_plan_imports_no_memory_planner():
    """The memory planner (and numpy with it) is imported only where a plan is built."""
    code = ("import sys; import memo_sim.cli.whatif; "
            "print('numpy' in sys.modules, 'memo_sim.memplan.planner' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == ["False", "False"]


def test_main_called_with_arguments_leaves_the_collector_as_it_was():
    """`main` freezes the heap only when it runs as the program (no ``argv``: the process exits
    next); a caller that passes its arguments keeps its process, and every object it frees later
    is still collectable."""
    import gc

    from memo_sim.cli import main

    frozen = gc.get_freeze_count()
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert gc.get_freeze_count() == frozen
    assert gc.isenabled()


def test_main_as_the_program_freezes_the_heap_before_exit():
    """Run as the program (``main()`` with no arguments, as the console script and ``python -m
    memo_sim.cli`` call it): the heap is frozen once the output is written (the exit
    then skips the collector's pass over it), and the output and exit code are the command's."""
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, file=sys.stderr))\n"
            "sys.argv = ['memo-sim', '--version']\n"
            "from memo_sim.cli import main\n"
            "main()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "version" in p.stdout
    assert "frozen True" in p.stderr


def test_memo_exec_cli_imports_no_torch_until_a_command_runs():
    """``memo-exec -h`` or a bad flag imported torch (2.7 s on this VM) for the attention backends'
    names; they come from the plan contract now, and torch is imported by the commands that run."""
    code = "import sys, memo_exec.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "False"
