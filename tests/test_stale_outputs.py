"""What a renamed or removed action left: named by the next build, removed by
--prune only while it is still what kiln wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.in_process

MODULE = """
NAME = "{name}"

@entrypoint
def model():
    return run_command(name=NAME, command=["sh", "-c", 'echo built > "$0"', "{{out}}"])

@entrypoint
def other():
    {other}
    return run_command(name="o.txt", command=["sh", "-c", 'echo o > "$0"', "{{out}}"])
"""


def _module(write_module, name: str, other: str = "pass") -> Path:
    return write_module(MODULE.format(name=name, other=other))


def test_a_renamed_actions_output_is_named_then_pruned(write_module, kiln, tmp_path: Path) -> None:
    _module(write_module, "old.txt")
    assert kiln("build", "build.py", "--no-cache").returncode == 0
    old = tmp_path / "kiln-out/genfiles/model/old.txt"
    assert old.read_text() == "built\n"
    _module(write_module, "new.txt")
    r = kiln("build", "build.py", "--no-cache")
    assert r.returncode == 0, r.stderr
    assert "1 file(s) that earlier builds made are no longer declared" in r.stderr
    assert "genfiles/model/old.txt" in r.stderr and old.exists()  # named, kept
    pruned = kiln("build", "build.py", "--no-cache", "--prune")
    assert pruned.returncode == 0, pruned.stderr
    assert "removed 1 file(s)" in pruned.stderr
    assert not old.exists() and (tmp_path / "kiln-out/genfiles/model/new.txt").exists()
    again = kiln("build", "build.py", "--no-cache")
    assert "no longer declared" not in again.stderr


def test_prune_keeps_a_file_changed_since_kiln_wrote_it(write_module, kiln, tmp_path: Path):
    _module(write_module, "old.txt")
    assert kiln("build", "build.py", "--no-cache").returncode == 0
    old = tmp_path / "kiln-out/genfiles/model/old.txt"
    old.write_text("the user's notes\n")
    _module(write_module, "new.txt")
    r = kiln("build", "build.py", "--no-cache", "--prune")
    assert r.returncode == 0, r.stderr
    assert "kept 1 such file(s) changed since kiln wrote them" in r.stderr
    assert old.read_text() == "the user's notes\n"


def test_prune_never_reaches_through_a_link(write_module, kiln, tmp_path: Path) -> None:
    _module(write_module, "old.txt")
    assert kiln("build", "build.py", "--no-cache").returncode == 0
    model_dir = tmp_path / "kiln-out/genfiles/model"
    elsewhere = tmp_path / "elsewhere"
    model_dir.rename(elsewhere)
    model_dir.symlink_to(elsewhere)  # the old file now lies behind a link
    _module(write_module, "new.txt")
    kiln("build", "build.py", "--no-cache", "--prune")
    assert (elsewhere / "old.txt").read_text() == "built\n"


def test_nothing_is_judged_while_an_entrypoint_is_broken(write_module, kiln, tmp_path: Path):
    _module(write_module, "m.txt")
    assert kiln("build", "build.py", "--no-cache").returncode == 0
    _module(write_module, "m.txt", other="undefined_name")  # 'other' breaks: its files vanish
    r = kiln("build", "build.py", "model", "--no-cache", "--prune")
    assert r.returncode == 0, r.stderr
    assert "skipped the broken entrypoint 'other'" in r.stderr
    assert "no longer declared" not in r.stderr and "removed" not in r.stderr
    assert (tmp_path / "kiln-out/genfiles/other/o.txt").read_text() == "o\n"
