"""[robust-ux] Files and outputs at the boundary: UTF-8 (a BOM is fine, anything else one line and
exit 2), outputs that honour the umask, `-h` on both CLIs."""

import os
import stat

from click.testing import CliRunner

from memo_sim.cli import cli as sim_cli
from memo_sim.fileio import atomic_write_text
from memo_sim.request_trace import RequestTrace


def test_csv_with_a_byte_order_mark_reads(tmp_path):
    p = tmp_path / "bom.csv"
    p.write_bytes("\ufeffid,lower,upper,size\na,0,2,512\nb,1,3,512\n".encode("utf-8"))
    assert [b.id for b in RequestTrace.read_csv(p).buffers] == ["a", "b"]


def test_non_utf8_inputs_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"id,lower,upper,size\n\xff\xfe,0,1,512\n")
    r = CliRunner().invoke(sim_cli, ["memplan", "--csv", str(bad)])
    assert r.exit_code == 2 and "not UTF-8" in r.output and r.output.count("\n") == 1
    plan = tmp_path / "plan.json"
    plan.write_bytes(b'{"schema": "\xff"}')
    r = CliRunner().invoke(sim_cli, ["check-plan", str(plan)])
    assert r.exit_code == 2 and "not UTF-8" in r.output


def test_outputs_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "out.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644


def test_both_clis_take_dash_h():
    from memo_exec.cli import cli as exec_cli

    assert CliRunner().invoke(sim_cli, ["-h"]).exit_code == 0
    assert CliRunner().invoke(exec_cli, ["-h"]).exit_code == 0


def test_profiles_lists_an_invalid_profile_instead_of_crashing(tmp_path, monkeypatch):
    (tmp_path / "broken.yaml").write_bytes(b"\xff\xfe not utf-8")
    monkeypatch.setenv("MEMO_PROFILES", str(tmp_path))
    r = CliRunner().invoke(sim_cli, ["profiles"])
    assert r.exit_code == 0, r.output
    assert "INVALID" in r.output and "broken" in r.output


def test_memplan_csv_progress_on_stderr_only_when_asked(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text("id,lower,upper,size\na,0,2,512\nb,1,3,512\n", encoding="utf-8")
    r = CliRunner().invoke(sim_cli, ["memplan", "--csv", str(p), "--json", "--progress"])
    assert r.exit_code == 0, r.output
    assert "memplan" in r.stderr and "solving" in r.stderr and '"peak_bytes"' in r.stdout
    r = CliRunner().invoke(sim_cli, ["memplan", "--csv", str(p), "--json"])  # --json, not a terminal: quiet
    assert r.exit_code == 0 and r.stderr == ""


def test_flag_errors_are_one_line(tmp_path):
    for args in (["whatif", "--tp", "0"], ["whatif", "--gpus", "1e20"], ["whatif", "--layers", "1e30"],
                 ["whatif", "--seq", "99999999M"], ["no-such-command"]):
        r = CliRunner().invoke(sim_cli, args)
        assert r.exit_code == 2 and r.output.startswith("error:") and r.output.count("\n") == 1, (args, r.output)


def test_deeply_nested_files_are_one_line_errors(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    for args in (["check-plan", str(deep)], ["whatif", "--profile", str(deep), "--no-plan"],
                 ["whatif", "--model", str(deep), "--no-plan"], ["memplan", "--trace", str(deep)],
                 ["plot", str(deep), "--out", str(tmp_path / "figs")]):
        r = CliRunner().invoke(sim_cli, args)
        assert r.exit_code == 2 and "nested too deeply" in r.output and r.output.count("\n") == 1, (args, r.output)
    assert not (tmp_path / "figs").exists()


def test_a_global_batch_that_does_not_split_over_a_fixed_dp_is_named():
    """`--global-batch 12 --dp 8` said 'no factorisation of the GPU count matches the fixed degrees' (a user's
    review): the line names both numbers and the fix."""
    r = CliRunner().invoke(sim_cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "4K",
                                     "--global-batch", "12", "--dp", "8", "--no-plan", "--jobs", "1"])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "--global-batch 12 does not split over --dp 8" in r.output and "a multiple of 8" in r.output


def test_an_odd_sequence_length_is_written_as_itself():
    """--seq 100001 read '97.6572K tokens' in the what-if's header (a user's review)."""
    from memo_sim.units import fmt_count

    assert [fmt_count(n) for n in (100001, 131072, 49664, 1146880, 4096, 102464, 1049600)] == [
        "100001", "128K", "48.5K", "1.09375M", "4K", "102464", "1025K"]  # the text reads back as the count
