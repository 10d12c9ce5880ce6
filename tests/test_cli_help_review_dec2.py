"""A review of memo-sim's command-line help and refusals (2026-12-02): each option's words against what it does,
and refusals that named a plan field or nothing where the user typed an option."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cli.whatif import Show
from memo_sim.errors import MemoError
from memo_sim.fileio import check_output_file
from tests.cli_run import one_error_line

TOY = ["--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "256", "--seq", "1K", "--gpus", "1"]


def _one_line(r, *words):
    line = one_error_line(r)
    for w in words:
        assert w in line, line


def test_memplan_help_says_a_file_plan_uses_the_profile_only_where_given():
    """The help said `[default: a800-80gb]` of a --csv plan, which without --profile replays on a device large
    enough for the plan (five 20 GiB buffers live at once: no out-of-memory) and with it says it does not fit."""
    text = CliRunner().invoke(cli, ["memplan", "-h"]).output
    flat = " ".join(text.split())
    assert "only where --profile is given" in flat
    for words in ("Tensor-parallel degree of the layout planned", "Ring context-parallel degree",
                  "Ulysses sequence-parallel degree", "Activation policy whose tensors are planned",
                  "DSA solver: greedy", "Sequence length in tokens (32768, 32K"):  # each option says what it is
        assert words in flat, words


def test_memplan_layout_refusal_names_the_options():
    r = CliRunner().invoke(cli, ["memplan", "--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "256"])
    _one_line(r, "--tp", "heads (4)")


@pytest.mark.parametrize("args, words", [
    (["--alloc-conf", "bogus:1"], ("--alloc-conf:", "unknown key 'bogus'")),
    (["--layers", "-2"], ("'--layers'",)),
    (["--hidden", "0"], ("'--hidden'",)),
])
def test_model_and_allocator_flags_are_refused_naming_the_option(args, words):
    r = CliRunner().invoke(cli, ["whatif", *TOY, "--no-plan", *args])
    _one_line(r, *words)
    assert "alloc_conf:" not in r.output and "model flags" not in r.output


def test_ep_on_a_dense_model_says_the_fix():
    r = CliRunner().invoke(cli, ["whatif", *TOY, "--no-plan", "--ep", "2"])
    _one_line(r, "--ep / --etp", "drop them")


@pytest.mark.parametrize("fmt, quiet", [("table", False), ("csv", True), ("md", True), ("json", True)])
def test_whatif_progress_is_off_under_every_machine_format(fmt, quiet):
    """whatif kept its bar under --format csv / md while maxseq and memplan dropped it: one rule now."""
    show = Show.from_options({"top": 5, "as_json": False, "out_dir": ".", "no_plan": True, "sweep_alpha": False,
                              "progress": None, "out_format": fmt})
    assert show.quiet is quiet
    forced = Show.from_options({"top": 5, "as_json": False, "out_dir": ".", "no_plan": True, "sweep_alpha": False,
                                "progress": True, "out_format": fmt})
    assert forced.quiet is False


def test_whatif_format_help_matches_the_other_commands():
    text = " ".join(CliRunner().invoke(cli, ["whatif", "-h"]).output.split())
    assert "Print the answer as JSON (same as --format json)" in text
    assert "aligned text (table), JSON, CSV or Markdown (md)" in text


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX only")
def test_an_output_under_proc_is_refused_before_the_work_even_as_root(monkeypatch, tmp_path):
    """os.access answers yes to root for /proc, where no file can be made: the check now creates (and removes) one
    empty file there when it runs as root."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    if os.path.isdir("/proc"):
        with pytest.raises(MemoError, match="--report /proc/nope/x.md: cannot write there"):
            check_output_file("/proc/nope/x.md", "--report")
    assert check_output_file(tmp_path / "a" / "x.md", "--report") == tmp_path / "a" / "x.md"
    assert list(tmp_path.iterdir()) == []  # the probe left nothing behind


@pytest.mark.parametrize("cmd, key", [("models", "active_params"), ("profiles", "usable_gpu_memory_bytes")])
def test_models_and_profiles_answer_in_every_format(cmd, key):
    """`frameworks` had --json, `models` and `profiles` no machine format at all (a review): a script read a table."""
    import json

    table = CliRunner().invoke(cli, [cmd])
    assert table.exit_code == 0, table.output
    data = json.loads(CliRunner().invoke(cli, [cmd, "--json"]).stdout)
    assert data and all("name" in row for row in data) and any(key in row for row in data)
    assert {row["name"] for row in data} <= set(table.stdout.split())  # the same rows as the table
    csv = CliRunner().invoke(cli, [cmd, "--format", "csv"]).stdout
    head, *rows = [line.split(",") for line in csv.splitlines() if line and not line.startswith("#")]
    assert head[0] == "name"
    if cmd == "models":  # exact parameter counts, never "6.65" under a "(bytes)" header (a review)
        assert "params" in head and not any("bytes" in h for h in head), head
        by_name = {r[0]: r for r in rows}
        assert int(by_name["gpt-7b"][head.index("params")]) == next(r["params"] for r in data if r["name"] == "gpt-7b")
    else:
        assert int(float([r for r in rows if r[0] == "a800-80gb"][0][head.index("gpus/node")])) == 8


def test_check_plan_warns_of_a_memo_plan_without_its_memory_plan(tmp_path):
    """A MEMO plan with ``memory_plan`` deleted: check-plan said nothing (and named its transients a static plan)
    where memo-exec warned that it ran on the caching allocator; both say it now, in one set of words
    (`memo_sim.plan.executor_scope.memory_plan_missing`)."""
    import json

    r = CliRunner().invoke(cli, ["whatif", *TOY, "--policy", "memo", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    plain = CliRunner().invoke(cli, ["check-plan", str(tmp_path / "p" / "plan.json")])
    assert plain.exit_code == 0 and "memory_plan is missing" not in plain.output, plain.output
    assert doc.pop("memory_plan") is not None
    (tmp_path / "nomp.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(cli, ["check-plan", str(tmp_path / "nomp.json")])
    assert r.exit_code == 0, r.output
    assert "warning: memory_plan is missing: memo-exec runs the memo(" in r.output and "--no-memory-plan" in r.output
    j = json.loads(CliRunner().invoke(cli, ["check-plan", str(tmp_path / "nomp.json"), "--json"]).stdout)
    assert j["memory_plan_missing"].startswith("memory_plan is missing")


def test_an_sppo_plan_reads_and_writes_back_byte_for_byte(tmp_path):
    """SPPO plans wrote a layer's offload / prefetch time as the integer 0 where no piece copies, which a read and
    write gave back as 0.0: the one plan kind whose round trip was not byte-identical (a review, 2026-12-02)."""
    from memo_sim.plan.schema import read_plan, write_plan

    r = CliRunner().invoke(cli, ["whatif", "--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "256",
                                 "--seq", "4K", "--gpus", "2", "--policy", "sppo", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    src = tmp_path / "p" / "plan.json"
    plan = read_plan(src)
    assert plan.schedule == "sppo"
    assert all(isinstance(v, float) for v in plan.layer_timings_s.values()), plan.layer_timings_s
    write_plan(plan, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == src.read_bytes()
