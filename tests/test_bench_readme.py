"""benchmarks/run.py rewrites only the generated section of docs/performance.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture()
def readme_module():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    try:
        import _readme

        yield _readme
    finally:
        sys.path.remove(str(BENCH))


def test_splice_replaces_only_the_section(tmp_path: Path, readme_module) -> None:  # type: ignore[no-untyped-def]
    readme = tmp_path / "README.md"
    readme.write_text(
        f"# title\n\nbefore\n{readme_module.BEGIN}\nold table\n{readme_module.END}\nafter\n"
    )
    readme_module.splice(["| new | table |", "|---|---|"], readme)
    text = readme.read_text()
    assert "old table" not in text
    assert text.startswith("# title\n\nbefore\n")
    assert text.endswith(f"| new | table |\n|---|---|\n{readme_module.END}\nafter\n")


def test_splice_without_markers_is_an_error(tmp_path: Path, readme_module) -> None:  # type: ignore[no-untyped-def]
    readme = tmp_path / "README.md"
    readme.write_text("# title\n\nno markers\n")
    with pytest.raises(readme_module.ReadmeError, match="markers"):
        readme_module.splice(["x"], readme)
    assert readme.read_text() == "# title\n\nno markers\n"


def test_the_readme_has_the_markers(readme_module) -> None:  # type: ignore[no-untyped-def]
    text = readme_module.README.read_text()
    assert text.count(readme_module.BEGIN) == 1 and text.count(readme_module.END) == 1
    assert text.index(readme_module.BEGIN) < text.index(readme_module.END)


def test_readme_from_a_missing_file_is_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "--readme-from", str(tmp_path / "missing.md")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "missing.md" in done.stderr
