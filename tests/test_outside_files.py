"""Files outside the output directory, as iree.build modules name them, and
output directories a user filled first, tried as a hostile user would.

- An absolute path outside the output directory is an input, read and never
  written: a file keyed by its content, a directory by its tree (names, kinds,
  executable bits, contents; a link inside is keyed as a link, and one that
  leads out of it leaves its reader without a key: it runs on every build).
- An absolute path an action claims as its output (sharktank's ``export_model``)
  is that action's file: kiln runs the action, reruns it when the file is missing
  or changed, and never deletes it, claims it, or takes it from a cache. kiln's
  own actions never write outside the output directory.
- An output directory holding only kiln's namespace folders is taken over; the
  files that were there stay the user's: read, never written over, never cleaned.
"""

from __future__ import annotations

import contextlib
import enum
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import needs
import pytest

MODULE = """\
import functools
import os
from pathlib import Path

from iree.build import *
from iree.build.executor import ActionConcurrency, BuildAction, BuildContext
from kiln import source_file

HERE = Path(__file__).resolve().parent


def _log(what):
    with open(HERE / "ran.log", "a") as log:
        log.write(what + "\\n")


class Read(BuildAction):
    def __init__(self, sources, out, **kwargs):
        super().__init__(**kwargs)
        self.sources = sources
        self.out = out
        self.deps.update(sources)
        out.deps.add(self)

    def _invoke(self):
        _log(self.desc)
        parts = []
        for f in self.sources:
            p = f.get_fs_path()
            files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
            parts += [x.read_text().strip() for x in files]
        self.out.get_fs_path().write_text(",".join(parts))


def _export(path, text, fail):
    with open(Path(path).parent / "ran.log", "a") as log:
        log.write("export\\n")
    Path(path).write_text(text)
    if fail:
        raise RuntimeError("export failed after writing")


class Export(BuildAction):
    def __init__(self, path, text, fail, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.path = path
        self.text = text
        self.fail = fail

    def _remotable_thunk(self):
        return functools.partial(_export, self.path, self.text, self.fail)


def read(name, sources):
    ctx = BuildContext.current()
    out = ctx.allocate_file(name)
    Read(ctx.files(sources), out, desc=f"Reading {name}", executor=ctx.executor)
    return out


@entrypoint
def tree():
    return read("tree.txt", [source_file("data")])


@entrypoint
def absolute():
    ctx = BuildContext.current()
    data = ctx.allocate_file(str(HERE / "data"))
    one = ctx.allocate_file(str(HERE / "one.txt"))
    return read("abs.txt", [data, one])


@entrypoint
def exported(fail=cl_arg("fail", default="no")):
    ctx = BuildContext.current()
    out = ctx.allocate_file(os.path.abspath("model.mlir"))
    out.deps.add(Export(str(out.get_fs_path()), "program", fail == "yes", desc="Exporting",
                        executor=ctx.executor))
    return read("upper.txt", [os.path.abspath("model.mlir")])
"""


pytestmark = pytest.mark.in_process


@pytest.fixture
def module(tmp_path: Path) -> Path:
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "a.txt").write_text("a")
    (tmp_path / "data" / "sub" / "b.txt").write_text("b")
    (tmp_path / "one.txt").write_text("one")
    path = tmp_path / "build.py"
    path.write_text(MODULE)
    return path


def ran(tmp_path: Path) -> list[str]:
    """What ran since the last call (and forget it)."""
    log = tmp_path / "ran.log"
    lines = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return sorted(lines)


@pytest.mark.parametrize("entrypoint", ["tree", "absolute"])
def test_a_directory_input_is_keyed_by_its_tree(
    kiln: Callable[..., Any], module: Path, tmp_path: Path, entrypoint: str
) -> None:
    reader = "Reading tree.txt" if entrypoint == "tree" else "Reading abs.txt"

    def build() -> list[str]:
        r = kiln("build", "build.py", entrypoint)
        assert r.returncode == 0, r.stderr
        return ran(tmp_path)

    assert build() == [reader]
    assert build() == []
    data = tmp_path / "data"
    os.utime(data / "a.txt")  # touched, same content: no rerun
    assert build() == []
    changes: list[Callable[[], object]] = [
        lambda: (data / "sub" / "b.txt").write_text("B"),
        lambda: (data / "sub" / "c.txt").write_text("c"),
        lambda: (data / "a.txt").chmod(0o755),
        lambda: (data / "sub" / "c.txt").rename(data / "sub" / "d.txt"),
        lambda: (data / "inner").symlink_to(data / "sub" / "d.txt"),
    ]
    for change in changes:
        change()
        assert build() == [reader], change
    assert build() == []  # a link inside the tree: keyed as a link, its target as itself
    # A link out of the tree names what its digest does not cover: the reader has no
    # key, so it runs on every build (never stale, never cached), and explain says why.
    (data / "out").symlink_to(tmp_path / "one.txt")
    assert build() == [reader]
    assert build() == [reader]
    why = kiln("explain", "build.py", entrypoint).stdout
    assert "holds a symbolic link out of it (out), which kiln does not follow" in why, why


LISTS = """\
import os
from kiln import *

LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran.log")

@entrypoint
def lists():
    return run_command(name="ls.txt", inputs=[source_file("data")], command=[
        "sh", "-c", f"echo lists >> {LOG}; ls {{inputs[0]}} > {{out}}"])
"""


def test_a_directory_input_holding_the_output_directory_has_no_key(
    kiln: Callable[..., Any], tmp_path: Path
) -> None:
    """The output directory inside a directory input: what the action reads changes
    with every build (kiln's state, logs, outputs). It runs on every build, never
    stale, and explain names that, not kiln's own links there."""
    (tmp_path / "build.py").write_text(LISTS)
    (tmp_path / "data").mkdir()
    out = str(tmp_path / "data" / "kiln-out")
    for _ in range(2):
        r = kiln("build", "build.py", "--output-dir", out)
        assert r.returncode == 0, r.stderr
        assert ran(tmp_path) == ["lists"]
    why = kiln("explain", "build.py", "--output-dir", out).stdout
    assert "its input lists/data holds the output directory" in why, why
    assert "symbolic link" not in why, why


DEEP = """\
from kiln import *

@entrypoint
def deep():
    return run_command(name="deep.txt", inputs=[source_file("data")],
                       command=["sh", "-c", "echo deep >> ../ran.log; echo ok > {out}"])
"""


def deep_file(top: Path, depth: int, text: str) -> None:
    """Write ``text`` to ``top/a/a/.../a/f``, ``depth`` directories down, made as
    needed one at a time through descriptors (the whole path may pass PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            with contextlib.suppress(FileExistsError):
                os.mkdir("a", dir_fd=fd)
            below = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        out = os.open("f", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=fd)
        os.write(out, text.encode())
        os.close(out)
    finally:
        os.close(fd)


def remove_deep(top: Path) -> None:
    """Remove what ``deep_file`` made below ``top`` a level at a time, by short paths
    (``shutil.rmtree``, pytest's clean-up too, recurses once per level)."""
    a, held = top / "a", top / "held"
    while (a / "a").is_dir():
        (a / "a").rename(held)
        a.rmdir()
        held.rename(a)
    (a / "f").unlink()
    a.rmdir()


def test_a_directory_input_thousands_of_levels_deep_is_keyed(
    kiln: Callable[..., Any], tmp_path: Path
) -> None:
    (tmp_path / "build.py").write_text(DEEP)
    data = tmp_path / "data"
    data.mkdir()
    deep_file(data, 1500, "one")  # deeper than Python's recursion limit
    try:

        def build() -> list[str]:
            r = kiln("build", "build.py")
            assert r.returncode == 0, r.stderr
            return ran(tmp_path)

        assert build() == ["deep"]
        assert build() == []
        deep_file(data, 1500, "two")
        assert build() == ["deep"]
        r = kiln("explain", "build.py")
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    finally:
        remove_deep(data)


def test_a_directory_input_deeper_than_paths_can_name_is_refused(
    kiln: Callable[..., Any], tmp_path: Path
) -> None:
    (tmp_path / "build.py").write_text(DEEP)
    data = tmp_path / "data"
    data.mkdir()
    deep_file(data, 2100, "one")  # data/a/.../a passes PATH_MAX (4096 bytes)
    try:
        for command in ("build", "explain"):
            r = kiln(command, "build.py")
            assert r.returncode == 2, r.stderr
            assert f"in the directory input {data}: File name too long" in r.stderr
            assert "Traceback" not in r.stderr
        assert ran(tmp_path) == []
    finally:
        remove_deep(data)


def test_absolute_inputs_are_read_and_never_written(
    kiln: Callable[..., Any], module: Path, tmp_path: Path
) -> None:
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.rglob("*.txt")}
    r = kiln("build", "build.py", "absolute")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "kiln-out/genfiles/absolute/abs.txt").read_text() == "a,b,one"
    assert kiln("clean").returncode == 0
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in before}
    assert after == before


def test_an_actions_own_file_outside_the_output_directory(
    kiln: Callable[..., Any], module: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model.mlir"
    first = kiln("build", "build.py", "exported")
    assert first.returncode == 0, first.stderr
    assert ran(tmp_path) == ["Reading upper.txt", "export"]
    assert first.stderr.count(f"kiln: 'Exporting' writes {model}, outside the output") == 1
    assert kiln("build", "build.py", "exported").returncode == 0
    assert ran(tmp_path) == []
    model.write_text("edited")  # changed: the action runs again
    explained = kiln("explain", "build.py", "exported")
    assert f"Exporting: output {model} was modified" in explained.stdout, explained.stdout
    assert kiln("build", "build.py", "exported").returncode == 0
    assert ran(tmp_path) == ["export"] and model.read_text() == "program"
    model.unlink()  # missing: runs again
    assert kiln("build", "build.py", "exported").returncode == 0
    assert ran(tmp_path) == ["export"]
    # Never from a cache: a fresh output directory with the same cache runs it again.
    fresh = kiln("build", "build.py", "exported", "--output-dir", "fresh")
    assert fresh.returncode == 0, fresh.stderr
    assert ran(tmp_path) == ["export"]
    assert "1 cached" in fresh.stderr  # the keyed reader came from the cache
    assert kiln("clean").returncode == 0 and kiln("clean", "--output-dir", "fresh").returncode == 0
    assert model.read_text() == "program"  # never kiln's to delete
    state = (tmp_path / "kiln-out").exists()
    assert not state or not any((tmp_path / "kiln-out").rglob("*.mlir"))


def test_a_failed_action_leaves_its_outside_file_alone(
    kiln: Callable[..., Any], module: Path, tmp_path: Path
) -> None:
    r = kiln("build", "build.py", "exported", "--fail", "yes")
    assert r.returncode == 1, r.stderr
    assert "export failed after writing" in r.stderr
    assert (tmp_path / "model.mlir").read_text() == "program"  # written, failed: not removed


def test_kilns_own_actions_never_write_outside(
    kiln: Callable[..., Any], write_module: Callable[..., Path], tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere.txt"
    write_module(
        f"""
        @entrypoint
        def out():
            return run_command(name={str(target)!r}, command=["sh", "-c", "echo x > {{out}}"])
        """
    )
    r = kiln("build", "build.py")
    assert r.returncode == 2
    assert f"would write {target}, outside the output directory" in r.stderr
    assert not target.exists()


def test_iree_builds_file_namespace_is_taken_by_value() -> None:
    from kiln.graph import as_namespace
    from kiln.output_dir.layout import FileNamespace

    class Theirs(enum.Enum):  # as IREE's iree.build.executor.FileNamespace
        GEN = "gen"
        BIN = "bin"

    assert as_namespace(Theirs.BIN) is FileNamespace.BIN
    assert as_namespace(FileNamespace.GEN) is FileNamespace.GEN
    with pytest.raises(RuntimeError, match="unknown file namespace"):
        as_namespace("nowhere")


# -- an output directory the user filled first ------------------------------------

PREFILLED = """
import os

@entrypoint
def flux(overwrite=cl_arg("overwrite", default="no")):
    ctx = BuildContext.current()
    weights = ctx.allocate_file("weights.irpa")  # placed by hand: an input
    out = run_command(name="summary.txt", inputs=[weights],
                      command=["sh", "-c", "cat {inputs[0]} > {out}"])
    if overwrite == "yes":
        run_command(name="weights2.irpa", command=["sh", "-c", "echo kiln > {out}"])
        return [out, "weights2.irpa"]
    return out
"""


def fill(out: Path) -> dict[Path, str]:
    placed = {
        out / "genfiles/flux/weights.irpa": "user weights\n",
        out / "genfiles/flux/weights2.irpa": "more user weights\n",
        out / "params/shared.irpa": "shared\n",
    }
    for path, text in placed.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return placed


def test_a_prefilled_output_directory_is_taken_over_and_its_files_kept(
    kiln: Callable[..., Any], write_module: Callable[..., Path], tmp_path: Path
) -> None:
    write_module(PREFILLED)
    placed = fill(tmp_path / "kiln-out")
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "kiln-out/genfiles/flux/summary.txt").read_text() == "user weights\n"
    over = kiln("build", "build.py", "--overwrite", "yes")
    assert over.returncode == 1
    assert "weights2.irpa is a file that was in the output directory before kiln" in over.stderr
    assert kiln("clean").returncode == 0
    for path, text in placed.items():
        assert path.read_text() == text
    assert not (tmp_path / "kiln-out/genfiles/flux/summary.txt").exists()
    # Once the user removes a file, kiln may build there, and then it is kiln's.
    (tmp_path / "kiln-out/genfiles/flux/weights2.irpa").unlink()
    assert kiln("build", "build.py", "--overwrite", "yes").returncode == 0
    assert (tmp_path / "kiln-out/genfiles/flux/weights2.irpa").read_text() == "kiln\n"
    assert kiln("build", "build.py", "--overwrite", "yes").returncode == 0  # its own: kept
    assert kiln("clean").returncode == 0
    assert not (tmp_path / "kiln-out/genfiles/flux/weights2.irpa").exists()
    assert (tmp_path / "kiln-out/genfiles/flux/weights.irpa").read_text() == "user weights\n"


@pytest.mark.parametrize("extra", ["file", "link", "other-dir"])
def test_a_directory_with_more_than_namespace_folders_is_still_refused(
    kiln: Callable[..., Any], write_module: Callable[..., Path], tmp_path: Path, extra: str
) -> None:
    write_module(PREFILLED)
    out = tmp_path / "kiln-out"
    fill(out)
    if extra == "file":
        (out / "notes.txt").write_text("mine")
    elif extra == "link":
        (tmp_path / "elsewhere").mkdir()
        (out / "bin").symlink_to(tmp_path / "elsewhere")
    else:
        (out / "src").mkdir()
    r = kiln("build", "build.py")
    assert r.returncode == 2
    assert "refusing to use" in r.stderr and not (out / ".kiln").exists()


UPSTREAM_BUILT = """\
from iree.build import *
from iree.build.executor import *


class Write(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out

    def _invoke(self):
        self.out.get_fs_path().write_text("by iree.build\\n")


@entrypoint
def hello():
    ctx = BuildContext.current()
    out = ctx.allocate_file("w.txt")
    out.deps.add(Write(out, desc="write", executor=ctx.executor))
    return out


if __name__ == "__main__":
    iree_build_main()
"""


def test_a_directory_iree_build_built_is_refused_not_taken_over(tmp_path: Path) -> None:
    # iree.build leaves no .metadata.json when nothing is fetched: the directory
    # holds only genfiles/, like one a user filled with inputs by hand.
    needs.module("iree.build")
    (tmp_path / "up.py").write_text(UPSTREAM_BUILT)
    env = {**os.environ, "NO_COLOR": "1"}
    upstream = subprocess.run(
        [sys.executable, "up.py", "--output-dir", "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert upstream.returncode == 0, upstream.stderr
    before = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "out").rglob("*"))
    assert before == ["out/genfiles", "out/genfiles/hello", "out/genfiles/hello/w.txt"]
    r = subprocess.run(
        [sys.executable, "-m", "kiln", "build", "up.py", "--output-dir", "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 2
    assert "it holds genfiles/hello/w.txt, which this build writes" in r.stderr, r.stderr
    after = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "out").rglob("*"))
    assert after == before  # no .kiln/, nothing written
    assert (tmp_path / "out/genfiles/hello/w.txt").read_text() == "by iree.build\n"
