"""A user review's CLI findings: memplan planned what the what-if and the simulator refuse; the up-front --out check
tested the folder beside --out, not --out; a what-if that found nothing left the previous run's plans in --out."""

import errno
import json
import os
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli

TOY = ["--layers", "2", "--hidden", "256", "--heads", "4", "--ffn", "512", "--vocab", "512"]
QUICK = ["--seq", "4K", "--time-limit", "1", "--solver", "greedy"]  # an old memplan that planned: a second


def _one_line(r, code: int) -> str:
    assert r.exit_code == code and r.output.count("\n") == 1 and "Traceback" not in r.output, r.output
    return r.output


# ---------------------------------------------------------------------------------------------------- 1. memplan
@pytest.mark.parametrize("args, needle", [
    (["--model", "gpt-7b", "--policy", "recompute_moe"],
     "error: --policy recompute_moe acts on a mixture of experts' tensors: model gpt-7b has no experts; fix: choose "
     "another --policy"),
    (["--model", "mixtral-8x7b", "--layers", "2", "--policy", "recompute_mlp"],
     "error: --policy recompute_mlp: recompute_mlp is priced for dense models"),
    (["--model", "gpt-7b", "--layers", "2", "--tp", "8", "--tp-mode", "metp", "--policy", "recompute_mlp"],
     "error: --policy recompute_mlp on layout tp8+metp: Megatron-LM's --recompute-modules"),
    (TOY + ["--tp", "1", "--policy", "full_recompute", "--alpha", "0.3"],
     "error: --alpha 0.3 sets MEMO's offloaded fraction, but --policy full_recompute takes none: drop --alpha"),
])
def test_memplan_refuses_what_the_whatif_and_the_simulator_refuse(args, needle):
    """A review: memplan planned recompute_moe for a dense model (a 117.88 GiB arena), recompute_mlp for a mixture
    of experts and on METP, and dropped --alpha under full_recompute; the policy's own answers now refuse them."""
    r = CliRunner().invoke(cli, ["memplan", *args, *QUICK])
    assert _one_line(r, 2).startswith(needle), r.output


def test_memplan_alpha_is_memos_and_defaults_to_half():
    for extra, label in (([], "memo(a=0.500)"), (["--alpha", "0.25"], "memo(a=0.250)")):
        r = CliRunner().invoke(cli, ["memplan", *TOY, "--tp", "1", *QUICK, "--json", *extra])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["policy"] == label
    r = CliRunner().invoke(cli, ["memplan", *TOY, "--tp", "1", *QUICK, "--json", "--policy", "full_recompute"])
    assert r.exit_code == 0 and json.loads(r.stdout)["policy"] == "full_recompute", r.output


# ---------------------------------------------------------------------------------------------------- 2. --out
def _read_only(monkeypatch, *folders: Path) -> None:
    """Make ``folders`` read-only for `memo_sim.fileio` (the tests run as root: chmod cannot): a folder or file
    created in one, or a file moved into one, fails with EROFS as on a read-only mount."""
    import memo_sim.fileio as fileio

    ro = {str(f.resolve()) for f in folders}
    real_mkdtemp, real_mkstemp, real_replace = tempfile.mkdtemp, tempfile.mkstemp, os.replace

    def refused(where) -> bool:
        return str(Path(where).resolve()) in ro

    def erofs(path):
        return OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def mkdtemp(suffix=None, prefix=None, dir=None):
        if refused(dir):
            raise erofs(Path(dir) / f"{prefix}xxxxxxxx{suffix}")
        return real_mkdtemp(suffix, prefix, dir)

    def mkstemp(suffix=None, prefix=None, dir=None, text=False):
        if refused(dir):
            raise erofs(Path(dir) / f"{prefix}xxxxxxxx{suffix}")
        return real_mkstemp(suffix, prefix, dir, text)

    def replace(src, dst):
        if refused(Path(dst).parent):
            raise erofs(src)
        return real_replace(src, dst)

    monkeypatch.setattr(fileio.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(fileio.tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(fileio.os, "replace", replace)


def _whatif(out, *extra):
    return CliRunner().invoke(cli, ["whatif", *TOY, "--seq", "2K", "--gpus", "1", "--policy", "store_all", "--jobs",
                                    "1", "--out", str(out), *extra])


def test_a_read_only_out_is_refused_before_the_search(monkeypatch, tmp_path):
    """A review: a read-only --out in a writable folder passed the check (its stage went beside it), the search
    ran, and the run ended with exit 1 naming .manifest.json.XXXX.tmp."""
    import memo_sim.cli.whatif as whatif

    out = tmp_path / "ro"
    out.mkdir()
    _read_only(monkeypatch, out)
    monkeypatch.setattr(whatif, "answer_whatif", lambda *a, **k: pytest.fail("searched although --out is read-only"))
    line = _one_line(_whatif(out), 2)
    assert line.startswith(f"error: --out {out}: cannot write there (Read-only file system); choose a folder"), line
    assert not list(out.iterdir()) and sorted(p.name for p in tmp_path.iterdir()) == ["ro"]


def test_sweep_seq_into_a_read_only_out_is_refused_before_the_sweep(monkeypatch, tmp_path):
    """A review: sweep-seq into a read-only --out printed 'wrote .../mfu_vs_seq.json' it had not written."""
    import memo_sim.search.seq_sweep as seq_sweep

    assert _whatif(tmp_path / "p").exit_code == 0
    out = tmp_path / "ro"
    out.mkdir()
    _read_only(monkeypatch, out)
    monkeypatch.setattr(seq_sweep, "in_order", lambda *a, **k: pytest.fail("swept although --out is read-only"))
    r = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "p" / "plan.json"), "--seqs", "2K", "--jobs", "1",
                                 "--out", str(out)])
    assert _one_line(r, 2).startswith(f"error: --out {out}: cannot write there (Read-only file system)"), r.output
    assert "wrote" not in r.output and not list(out.iterdir())


def test_a_writable_out_in_a_read_only_folder_is_written(monkeypatch, tmp_path):
    """A review: a writable --out whose parent is read-only (a mount) was refused: the stage went beside it."""
    out = tmp_path / "out"
    out.mkdir()
    _read_only(monkeypatch, tmp_path)
    r = _whatif(out)
    assert r.exit_code == 0, r.output
    assert {"plan.json", "manifest.json"} <= {p.name for p in out.iterdir()}
    assert not [p for p in [*out.iterdir(), *tmp_path.iterdir()] if p.name.endswith(".partial")]
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    # a --out not there yet is created in its folder: a read-only one is refused before the search
    line = _one_line(_whatif(tmp_path / "new"), 2)
    assert line.startswith(f"error: --out {tmp_path / 'new'}: cannot write there (Read-only file system)"), line


def test_a_folder_named_as_an_output_is_one_line_naming_it(tmp_path):
    """A review: an --out holding a folder named plan.json failed with exit 1 naming .blk.XXXX.partial/plan.json;
    now exit 2 naming --out's plan.json, before anything moved in (no plan-sppo.json, no manifest)."""
    out = tmp_path / "blk"
    (out / "plan.json").mkdir(parents=True)
    line = _one_line(_whatif(out), 2)
    assert line.startswith(f"error: --out {out}: cannot write {out / 'plan.json'} (Is a directory); a folder has "
                           f"that name: move it away or choose another --out"), line
    assert [p.name for p in out.iterdir()] == ["plan.json"] and (out / "plan.json").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blk"]


def test_an_os_error_while_staging_names_the_users_file(monkeypatch, tmp_path):
    """A full disk while the outputs are written: the line names --out's file, not the stage's or a temporary one
    (an environment error: exit status 1, as before)."""
    import memo_sim.fileio as fileio

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(fileio.os, "fsync", full)
    out = tmp_path / "out"
    line = _one_line(_whatif(out), 1)
    assert line.startswith(f"error: {out / 'plan.json'}: No space left on device"), line
    assert ".partial" not in line and ".tmp" not in line and not out.exists()


# ---------------------------------------------------------------------------------------------------- 3. exit 3
def test_a_whatif_that_finds_nothing_removes_the_earlier_plans(tmp_path):
    """A review: a what-if that found nothing (exit 3, 'no plan.json') left the previous run's plan.json in --out,
    and `simulate` of it answered the earlier question. The manifest's own mechanism removes it, and says so."""
    out = tmp_path / "nf"
    assert _whatif(out).exit_code == 0 and (out / "plan.json").exists()
    (out / "notes.txt").write_text("mine")  # no manifest lists it: left as it is
    r = CliRunner().invoke(cli, ["whatif", "--seq", "32K", "--gpus", "1", "--model", "gpt-175b", "--jobs", "1",
                                 "--out", str(out)])
    assert r.exit_code == 3, r.output
    assert f"removed the earlier plan.json from --out {out}: an earlier what-if's plans" in r.output, r.output
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.txt"]
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] is True and m["files"] == [] and m["removed_stale"] == ["plan.json"]
    # --json says it in the document; a folder with nothing of the what-if's is left untouched (not created)
    assert _whatif(out).exit_code == 0
    j = CliRunner().invoke(cli, ["whatif", "--seq", "32K", "--gpus", "1", "--model", "gpt-175b", "--jobs", "1",
                                 "--json", "--out", str(out)])
    assert j.exit_code == 3 and json.loads(j.output)["removed_stale"] == ["plan.json"], j.output
    r = CliRunner().invoke(cli, ["whatif", "--seq", "32K", "--gpus", "1", "--model", "gpt-175b", "--jobs", "1",
                                 "--out", str(tmp_path / "fresh")])
    assert r.exit_code == 3 and "removed" not in r.output and not (tmp_path / "fresh").exists(), r.output


def test_nothing_built_removes_the_earlier_plans_too(monkeypatch, tmp_path):
    """The other exit-3 answer (no layout's model states fit, so nothing was ranked) removes them as well; a plan
    edited since it was written stays (the manifest's rule)."""
    import memo_sim.cli.whatif as whatif
    from memo_sim.errors import NothingFits

    out, kept = tmp_path / "nf", tmp_path / "kept"
    for folder in (out, kept):
        assert _whatif(folder).exit_code == 0
    plan = kept / "plan.json"
    plan.write_text(plan.read_text() + " ")  # edited by hand
    monkeypatch.setattr(whatif, "answer_whatif", lambda *a, **k: (_ for _ in ()).throw(NothingFits("too big")))
    r = _whatif(out)
    assert r.exit_code == 3 and "removed the earlier plan.json" in r.output, r.output
    assert not (out / "plan.json").exists()
    r = _whatif(kept)
    assert r.exit_code == 3 and "removed" not in r.output and plan.exists(), r.output


def test_memplan_of_a_file_refuses_the_model_options_it_would_ignore():
    # --csv / --trace plan the file's own tensors: --alpha, --tp and the model's options beside them were ignored.
    csv = str(Path(__file__).parent / "data" / "dsa" / "A.1048576.csv")
    r = CliRunner().invoke(cli, ["memplan", "--csv", csv, "--alpha", "0.3", "--tp", "2"])
    assert r.exit_code == 2
    assert "--tp, --alpha: --csv plans the file's own tensors, which these options do not change" in r.output
