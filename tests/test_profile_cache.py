"""A profile is parsed once per text (`memo_sim.profile.loader._parse_file`) and read again on every load: a file
written again is the new one at once, even at the same size within the file system's time stamp (a cache keyed on the
modification time would miss that), and the same text gives the same frozen object."""

from __future__ import annotations

from pathlib import Path

from memo_sim.profile.loader import load_profile

ROOT = Path(__file__).resolve().parents[1]


def test_a_rewritten_profile_is_read_again(tmp_path):
    text = (ROOT / "hardware_profiles" / "a100-sxm4-80gb.yaml").read_text()
    assert "name: a100-sxm4-80gb" in text
    f = tmp_path / "my.yaml"
    f.write_text(text.replace("name: a100-sxm4-80gb", "name: my-gpu-aaaa"))
    first = load_profile(f)
    assert first.name == "my-gpu-aaaa" and load_profile(f) is first  # parsed once
    f.write_text(text.replace("name: a100-sxm4-80gb", "name: my-gpu-bbbb"))  # same size, at once
    again = load_profile(f)
    assert again.name == "my-gpu-bbbb" and again is not first
    assert load_profile("a100-sxm4-80gb") is load_profile("a100-sxm4-80gb")
