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
