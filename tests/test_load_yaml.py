"""`memo_sim.fileio.load_yaml` (libyaml's safe loader where PyYAML has it) reads every data file memo
ships exactly as ``yaml.safe_load`` does, and a broken file still fails as a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from memo_sim.errors import MemoError
from memo_sim.fileio import load_yaml

REPO = Path(__file__).resolve().parents[1]
DATA = sorted([*REPO.glob("hardware_profiles/*.yaml"), *REPO.glob("memo_sim/frameworks/data/*.yaml"),
               *REPO.glob("benchmarks/gpu/plans/*.yaml")])


def test_there_are_data_files():
    assert len(DATA) >= 10


@pytest.mark.parametrize("path", DATA, ids=lambda p: p.name)
def test_same_documents_as_safe_load(path):
    text = path.read_text(encoding="utf-8")
    assert load_yaml(text) == yaml.safe_load(text)


def test_safe_loader_only():
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object/apply:os.system ['true']")


def test_bad_framework_file_is_one_line(tmp_path):
    from memo_sim.frameworks import _read

    bad = tmp_path / "broken.yaml"
    bad.write_text("name: broken\nlayouts: [unclosed\n", encoding="utf-8")
    with pytest.raises(MemoError) as e:
        _read(bad)
    assert "cannot parse framework file" in str(e.value) and "\n" not in str(e.value)


def test_a_key_given_twice_is_refused_in_every_yaml_memo_reads():
    # YAML keeps the last of two equal keys silently (a review's profile gave hbm_bandwidth twice); memo's one YAML
    # reader refuses it for every file it reads (profiles, framework data, models, plans), naming both lines.
    import pytest
    import yaml

    from memo_sim.fileio import DuplicateKeyError, load_yaml

    with pytest.raises(DuplicateKeyError, match=r"gpu\.hbm is given twice \(lines 2 and 3\)"):
        load_yaml("gpu:\n  hbm: 1\n  hbm: 2\n")
    assert issubclass(DuplicateKeyError, yaml.YAMLError)  # callers' "not valid YAML" handling still applies
    assert load_yaml("a: &x {b: 1}\nc:\n  <<: *x\n  d: 2\n") == {"a": {"b": 1}, "c": {"b": 1, "d": 2}}
    assert load_yaml("") is None
