"""The suite's own ordering (``conftest.LONGEST``): every entry names a test that
exists, so that a renamed long test is not silently left to start last."""

from __future__ import annotations

from pathlib import Path

from conftest import LONGEST

HERE = Path(__file__).parent


def test_each_longest_entry_names_a_test_of_its_file() -> None:
    assert len(set(LONGEST)) == len(LONGEST)
    for entry in LONGEST:
        file, name = entry.split("::")
        assert f"def {name}(" in (HERE / file).read_text(), entry
