"""kiln's own actions are keyed by kiln's code, not only its version: a result made by
other kiln code is another result (``kiln.planning.code_key.kiln_code_digest``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kiln as kiln_package
from kiln.planning.code_key import kiln_code_digest as code_digest

BUILD = """
from kiln import *


@entrypoint
def echo():
    return run_command(name="hello.txt", command=["sh", "-c", "echo hello > {out}"])
"""


def _copy(root: Path) -> Path:
    """A copy of the kiln under test (same version): a PYTHONPATH entry."""
    here = Path(kiln_package.__file__).parent
    shutil.copytree(here, root / "kiln", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _run(copy: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(copy), "NO_COLOR": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _digest(copy: Path) -> str:
    code = "import kiln, kiln.planning.code_key as k; print(kiln.__file__, k.kiln_code_digest())"
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0].startswith(str(copy)), out  # the copy, not the installed kiln
    return out[1]


def test_the_digest_follows_the_code_that_makes_outputs(tmp_path: Path) -> None:
    assert re.fullmatch(r"[0-9a-f]{64}", code_digest()) and code_digest() == code_digest()
    copy = _copy(tmp_path / "copy")
    first = _digest(copy)
    assert first == code_digest()  # the same code in another directory: the same digest
    shown = copy / "kiln" / "cli" / "main.py"  # the command line makes no action's output
    shown.write_text(shown.read_text() + "\n# a comment\n")
    assert _digest(copy) == first
    worker = copy / "kiln" / "actions" / "_tensors.py"
    worker.write_text(worker.read_text() + "\n# a comment\n")
    assert _digest(copy) != first


def test_a_kiln_action_reruns_when_kilns_code_changed(tmp_path: Path) -> None:
    """An output built by one kiln is not up to date for a kiln whose action code
    differs under the same version: the action runs again, and explain says why."""
    copy = _copy(tmp_path / "copy")
    project = tmp_path / "project"
    project.mkdir()
    (project / "build.py").write_text(BUILD)
    args = ("build", "build.py", "--output-dir", "out", "--no-cache")
    first = _run(copy, *args, cwd=project)
    assert first.returncode == 0, first.stderr
    again = _run(copy, *args, cwd=project)
    assert again.returncode == 0 and "0 built, 1 up to date" in again.stderr, again.stderr
    action = copy / "kiln" / "actions" / "process.py"
    action.write_text(action.read_text() + "\n# kiln changed under the same version\n")
    explain = _run(copy, "explain", "build.py", "--output-dir", "out", cwd=project)
    assert "the action's code changed" in explain.stdout, explain.stdout
    third = _run(copy, *args, cwd=project)
    assert third.returncode == 0 and "1 built, 0 up to date" in third.stderr, third.stderr


def test_an_editors_lock_file_or_an_unreadable_module_never_freezes_the_digest(
    tmp_path: Path,
) -> None:
    """A dangling ``.#x.py`` link (what an editor leaves while a file is edited) made
    the whole digest a constant, and every later edit of kiln kept its actions' keys:
    dot files are left out, and an unreadable file counts by its name, so the digest
    still follows every other file."""
    copy = _copy(tmp_path / "copy")
    first = _digest(copy)
    (copy / "kiln" / "engine" / ".#scheduler.py").symlink_to("root@host.1234")
    assert _digest(copy) == first
    odd = copy / "kiln" / "engine" / "odd.py"
    odd.mkdir()  # a directory named like a module: not a source file
    assert _digest(copy) == first
    odd.rmdir()
    worker = copy / "kiln" / "actions" / "_tensors.py"
    worker.write_text(worker.read_text() + "\n# a comment\n")
    edited = _digest(copy)
    assert edited != first and not edited.startswith("unread")
    # one module that cannot be read (as root, no mode makes it so: its read fails here)
    code = (
        "import kiln.planning.code_key as k\n"
        "real = k.hash_file\n"
        "def failing(path, *a, **kw):\n"
        "    if path.endswith('scheduler.py'): raise PermissionError(13, 'denied')\n"
        "    return real(path, *a, **kw)\n"
        "k.hash_file = failing\n"
        "print(k.kiln_code_digest())"
    )
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}

    def unreadable() -> str:
        return subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()

    without = unreadable()
    assert re.fullmatch(r"[0-9a-f]{64}", without) and without != edited
    worker.write_text(worker.read_text() + "\n# another\n")  # still followed
    assert unreadable() != without


def test_a_source_tree_of_links_has_the_digest_of_its_files(tmp_path: Path) -> None:
    """An editable or a runfiles install links each source file: the digest follows
    the files through the links (it skipped every link, and became a constant)."""
    copy = _copy(tmp_path / "copy")
    linked = tmp_path / "linked" / "kiln"
    linked.mkdir(parents=True)
    for path in sorted((copy / "kiln").rglob("*")):
        target = linked / path.relative_to(copy / "kiln")
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.symlink_to(path)
    first = _digest(tmp_path / "linked")
    assert first == _digest(copy)
    worker = copy / "kiln" / "actions" / "_tensors.py"  # edited through its link
    worker.write_text(worker.read_text() + "\n# a comment\n")
    assert _digest(tmp_path / "linked") != first


def test_without_source_to_read_each_process_has_its_own_digest(tmp_path: Path) -> None:
    """No module source to read (every .py unreadable as a file here, as in a zipped
    install): the digest is new in each process, so that nothing kiln made is taken
    for an earlier process's result, never one constant that every kiln shares."""
    copy = _copy(tmp_path / "copy")
    code = (
        "import pathlib, kiln.planning.code_key as k\n"
        "pathlib.Path.is_file = lambda self: False\n"
        "print(k.kiln_code_digest())"
    )
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    seen = {
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(seen) == 2 and all(d.startswith("unread ") for d in seen), seen


def test_a_users_function_that_calls_kiln_is_keyed_by_kilns_code() -> None:
    """A user's action that calls a kiln helper or uses a kiln class depends on kiln's
    code, not only its version string."""
    from kiln.actions import verify
    from kiln.planning.code_key import CodeDigests

    shown = CodeDigests().of_value(verify.verify)
    assert code_digest() in shown, shown
    assert code_digest() not in CodeDigests().of_value(shutil.copyfile)
