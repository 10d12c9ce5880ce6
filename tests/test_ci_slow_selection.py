"""CI's slow selection collects only the test files that say ``mark.slow`` (.ci/run); tests/conftest.py refuses a
test marked slow in a file that does not, which that selection would silently leave out."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest

ROOT = Path(__file__).resolve().parents[1]


def _item(path: Path, slow: bool):
    return SimpleNamespace(path=path, nodeid=f"{path.name}::t",
                           get_closest_marker=lambda name: object() if slow and name == "slow" else None)


def test_a_slow_test_in_a_file_without_the_marks_text_is_refused(tmp_path):
    said = tmp_path / "test_said.py"
    said.write_text("@pytest." + "mark.slow\ndef test_t(): pass\n")
    unsaid = tmp_path / "test_unsaid.py"
    unsaid.write_text("SLOW = getattr(pytest.mark, 'slow')\n")
    conftest.pytest_collection_modifyitems(None, [_item(said, True), _item(unsaid, False)])  # passes
    with pytest.raises(pytest.UsageError, match="test_unsaid.py::t is marked slow but its file does not say"):
        conftest.pytest_collection_modifyitems(None, [_item(said, True), _item(unsaid, True)])


def test_ci_greps_the_text_the_hook_checks():
    ci = (ROOT / ".ci" / "run").read_text()
    assert conftest.SLOW_MARK_TEXT == "mark.slow"
    assert "grep -l 'mark\\.slow' tests/test_*.py" in ci and '"${slow_files[@]}"' in ci
