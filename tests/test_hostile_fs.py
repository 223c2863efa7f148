"""The trust model's file-system invariants, tried as a hostile or careless user would:
through the CLI, on real files, real symlinks, FIFOs and sockets.

Ownership: kiln uses only a new, empty or kiln-made output directory and deletes
only what it wrote. Confinement: no write follows a link out of the output root.
Regular files only: an output of another kind is rebuilt, never read. Output
names: refused when the graph is defined. (CI runs these as root: nothing here
relies on permissions.)
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from kiln.base.errors import ConfinementError
from kiln.executor import BuildContext, Executor

pytestmark = pytest.mark.in_process


HEADER = "from kiln import *\nfrom kiln.executor import *\n"
# ``ep`` writes x.txt and notes each run in runs.log (beside the module, outside kiln-out:
# commands run in the output directory).
MODULE = (
    HEADER
    + """
@entrypoint
def ep():
    return run_command(name="x.txt",
                       command=["sh", "-c", "echo run >> ../runs.log; echo fresh > {out}"])

@entrypoint
def other():
    return run_command(name="y.txt", command=["sh", "-c", "echo other > {out}"])
"""
)
FIFO_TIMEOUT = 60


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "build.py").write_text(MODULE)
    return tmp_path


def runs(tmp: Path) -> int:
    log = tmp / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def remade(tmp: Path, r: Any) -> int:
    """How many times the action made its output: ran it, or (in build ``r``) had it
    restored, verified, from the shared cache."""
    return runs(tmp) + r.stderr.count("] cached: ")


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry below ``root`` (links not followed) with its size and mtime."""
    found = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(here, name))
            found[os.path.relpath(os.path.join(here, name), root)] = (st.st_size, st.st_mtime_ns)
    return found


def built(kiln, project: Path) -> Path:
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    return project / "kiln-out"


def user_files(root: Path) -> dict[str, str]:
    files = {
        "bin/tool.sh": "#!/bin/sh\necho mine\n",
        "params/weights.txt": "precious\n",
        "platform/notes.md": "mine\n",
        "manifest.json": '{"mine": true}\n',
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return files


# -- ownership -------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("build", "build.py"),
        ("build", "build.py", "--dry-run"),
        ("explain", "build.py"),
        ("clean",),
    ],
    ids=["build", "dry-run", "explain", "clean"],
)
def test_a_project_directory_is_refused_as_output_dir(kiln, project: Path, argv) -> None:
    files = user_files(project)
    before = tree(project)
    r = kiln(*argv, "--output-dir", ".")
    assert r.returncode == 2, r.stderr
    assert f"refusing to use {project} as the output directory" in r.stderr
    assert "--output-dir" in r.stderr and "Traceback" not in r.stderr
    assert tree(project) == before  # nothing created, nothing removed
    for rel, text in files.items():
        assert (project / rel).read_text() == text


@pytest.mark.parametrize("command", ["build", "clean"])
def test_root_directory_is_refused_before_anything(kiln, project: Path, command: str) -> None:
    assert not os.path.lexists("/.kiln")
    argv = ("build", "build.py") if command == "build" else ("clean",)
    r = kiln(*argv, "--output-dir", "/", "--no-wait")
    assert r.returncode == 2, r.stderr
    assert "refusing to use / as the output directory" in r.stderr and "--output-dir" in r.stderr
    assert not os.path.lexists("/.kiln") and os.path.isdir("/bin")


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("build", "--output-dir"),
        ("clean", "--output-dir"),
        ("explain", "--output-dir"),
        ("report", "--output-dir"),
        ("build", "--cache-dir"),
        ("cache clear", "--cache-dir"),
    ],
)
def test_an_empty_directory_option_is_a_usage_error(
    kiln, project: Path, command: str, option: str
) -> None:
    """An empty directory would silently mean the working directory: the project."""
    argv = (
        command.split() if command in ("clean", "report", "cache clear") else [command, "build.py"]
    )
    r = kiln(*argv, option, "")
    assert r.returncode == 2
    assert option in r.stderr and "got an empty string" in r.stderr, r.stderr
    assert not (project / ".kiln").exists() and not (project / "v1").exists()


def test_marker_is_written_and_a_newer_format_is_refused(kiln, project: Path) -> None:
    out = built(kiln, project)
    marker = out / ".kiln" / "format"
    assert marker.read_text() == "kiln-output/1\n"
    marker.write_text("kiln-output/7\n")
    r = kiln("build", "build.py")
    assert r.returncode == 2
    assert "made by a newer kiln (format 7)" in r.stderr


def test_empty_existing_directory_is_used(kiln, project: Path) -> None:
    (project / "empty").mkdir()
    r = kiln("build", "build.py", "--output-dir", "empty")
    assert r.returncode == 0, r.stderr
    assert (project / "empty" / "genfiles" / "ep" / "x.txt").read_text() == "fresh\n"


@pytest.mark.parametrize(
    "argv",
    [
        ("explain", "build.py"),
        ("list", "build.py", "--all"),
        ("graph", "build.py"),
        ("build", "build.py", "--dry-run"),
    ],
    ids=["explain", "list", "graph", "dry-run"],
)
def test_read_only_commands_create_nothing(kiln, project: Path, argv) -> None:
    r = kiln(*argv)
    assert r.returncode == 0, r.stderr
    assert not (project / "kiln-out").exists()
    out = built(kiln, project)
    (out / "genfiles" / "ep" / "x.txt").write_text("edited\n")  # something to explain
    before = tree(out)
    r = kiln(*argv)
    assert r.returncode == 0, r.stderr
    assert tree(out) == before  # not even SQLite's -wal or -shm


def test_explain_reads_the_state_without_writing_it(kiln, project: Path) -> None:
    out = built(kiln, project)
    (out / "genfiles" / "ep" / "x.txt").write_text("edited\n")
    r = kiln("explain", "build.py")
    assert r.returncode == 0, r.stderr
    assert "output ep/x.txt was modified" in r.stdout
    assert "Running other/y.txt" not in r.stdout  # its record was read: up to date


def test_clean_keeps_what_kiln_did_not_write(kiln, project: Path) -> None:
    out = built(kiln, project)
    (out / "genfiles" / "ep" / "mine.txt").write_text("mine\n")
    (out / "notes.txt").write_text("mine too\n")
    r = kiln("clean")
    assert r.returncode == 0, r.stderr
    assert (out / "genfiles" / "ep" / "mine.txt").read_text() == "mine\n"
    assert (out / "notes.txt").read_text() == "mine too\n"
    assert not (out / "genfiles" / "ep" / "x.txt").exists()
    assert not (out / "genfiles" / "other").exists()  # left empty: removed
    assert not (out / "manifest.json").exists()
    assert not (out / ".kiln" / "state.db").exists()
    assert "kept what kiln did not write: genfiles, notes.txt" in r.stderr
    again = kiln("build", "build.py")  # still kiln's directory
    assert again.returncode == 0, again.stderr


def test_clean_of_a_kiln_directory_leaves_it_empty(kiln, project: Path) -> None:
    out = built(kiln, project)
    r = kiln("clean")
    assert r.returncode == 0, r.stderr
    assert list(out.iterdir()) == []


def test_clean_removes_the_output_of_a_failed_rebuild(kiln, project: Path) -> None:
    out = built(kiln, project)
    (project / "build.py").write_text(MODULE.replace("echo fresh > {out}", "exit 3"))
    assert kiln("build", "build.py", "ep").returncode == 1
    assert (out / "genfiles" / "ep" / "x.txt").exists()  # the old output; its record is gone
    assert kiln("clean").returncode == 0
    assert not (out / "genfiles" / "ep" / "x.txt").exists()


def test_clean_removes_a_symlinked_genfiles_as_a_link(kiln, project: Path) -> None:
    out = built(kiln, project)
    elsewhere = project / "elsewhere"
    (out / "genfiles").rename(elsewhere)
    (out / "genfiles").symlink_to(elsewhere)
    r = kiln("clean")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert not os.path.lexists(out / "genfiles")
    assert (elsewhere / "ep" / "x.txt").read_text() == "fresh\n"  # the link's target is untouched


def test_clean_of_a_missing_directory_does_nothing(kiln, project: Path) -> None:
    r = kiln("clean")
    assert r.returncode == 0
    assert "nothing to clean" in r.stderr and not (project / "kiln-out").exists()


# -- the files a user names for kiln to write: never kiln's own ----------------------

# ``kiln report -o``, ``kiln build --events`` and ``--profile``, each naming PATH.
WRITERS = {
    "report": ("report", "-o"),
    "events": ("build", "build.py", "--events"),
    "profile": ("build", "build.py", "--profile"),
}
KILNS_OWN = [
    "kiln-out/.kiln/format",
    "kiln-out/.kiln/lock",
    "kiln-out/.kiln/state.db",
    "kiln-out/.kiln/last-events.jsonl",
    "kiln-out/manifest.json",
    "kiln-out/genfiles/ep/x.txt",  # the build's output
    "kiln-out/genfiles/other/y.txt",  # an output of an entrypoint not built (events)
    "kiln-out/genfiles/ep/../../.kiln/format",
    "through/../.kiln/lock",  # through a link to kiln-out/genfiles: kiln-out/.kiln/lock
    "through/../manifest.json",
    "through/ep/x.txt",
]


def assert_refused(r: Any, path: str) -> None:
    assert r.returncode == 2, r.stderr
    assert path in r.stderr and "choose another path" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("path", KILNS_OWN)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_file_named_to_write_is_never_one_of_kilns_own(
    kiln, project: Path, writer: str, path: str
) -> None:
    out = built(kiln, project)
    (project / "through").symlink_to(out / "genfiles")
    before = tree(out)
    target = "ep" if writer != "report" else None
    r = kiln(*WRITERS[writer], path, *([target] if target else []))
    assert_refused(r, path)
    assert tree(out) == before  # refused before anything was written
    again = kiln("build", "build.py")  # the directory is still kiln's, and up to date
    assert again.returncode == 0, again.stderr
    assert runs(project) == 1
    assert kiln("clean").returncode == 0


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_file_named_to_write_is_never_in_the_cache(
    kiln, project: Path, writer: str, _private_cache: Path
) -> None:
    r = kiln("build", "build.py", "--cache-dir", "cache")
    assert r.returncode == 0, r.stderr
    assert (project / "cache" / ".kiln" / "format").is_file()
    for path in ("cache/.kiln/format", "cache/v1/mine.json", f"{_private_cache}/mine.json"):
        r = kiln(*WRITERS[writer], path)
        assert_refused(r, path)
    assert not (project / "cache" / "v1" / "mine.json").exists()
    assert not (_private_cache / "mine.json").exists()


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_file_named_to_write_beside_the_outputs_is_written(
    kiln, project: Path, writer: str
) -> None:
    built(kiln, project)
    for path in ("kiln-out/mine.txt", "kiln-out/genfiles/ep/mine.txt", "mine.txt"):
        r = kiln(*WRITERS[writer], path)
        assert r.returncode == 0, r.stderr
        assert (project / path).stat().st_size > 0
    again = kiln("build", "build.py")
    assert again.returncode == 0, again.stderr
    assert runs(project) == 1


def _plant(project: Path, kind: str) -> tuple[str, Any]:
    """A path of ``kind`` in ``project`` (or ``/dev/null``) and a look at it, which
    must not change when kiln refuses to write it."""
    outside = project / "outside.txt"
    outside.write_text("the user's\n")
    if kind == "device":
        return "/dev/null", lambda: stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    path = project / "planted"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        _socket(path)
    elif kind == "link-out":
        path.symlink_to(outside)
    elif kind == "dangling-link":
        path.symlink_to(project / "nowhere")
    else:
        path.mkdir()
    return "planted", lambda: (
        stat.S_IFMT(os.lstat(path).st_mode),
        outside.read_text(),
        os.path.lexists(project / "nowhere"),
    )


@pytest.mark.parametrize(
    "kind", ["fifo", "device", "socket", "link-out", "dangling-link", "directory"]
)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_file_named_to_write_that_is_no_regular_file_is_refused(
    kiln, project: Path, writer: str, kind: str
) -> None:
    """A FIFO, ``/dev/null``, a socket, a link (out, or to nothing) is never replaced
    by a regular file, nor written through, nor waited on."""
    built(kiln, project)
    path, look = _plant(project, kind)
    before = look()
    r = kiln(*WRITERS[writer], path, timeout=FIFO_TIMEOUT)
    assert r.returncode == 2, r.stderr
    assert path in r.stderr and "choose another path" in r.stderr, r.stderr
    assert look() == before


SOURCES = (
    HEADER
    + """
@entrypoint
def ep():
    return run_command(name="x.txt", inputs=[source_file("model.txt"), source_file("data")],
                       command=["sh", "-c", "cat {inputs[0]} > {out}"])
"""
)


# ``kiln report`` loads no module: it knows the module it is given, not the sources.
INPUTS = [
    "build.py",
    "here/build.py",
    "hard.py",
    "model.txt",
    "data/part.txt",
    "data/new.txt",
    "data",
]


@pytest.mark.parametrize(
    ("writer", "path"),
    [(w, p) for w in ("events", "profile") for p in INPUTS] + [("report", p) for p in INPUTS[:3]],
)
def test_a_file_named_to_write_is_never_an_input_of_the_build(
    kiln, tmp_path: Path, writer: str, path: str
) -> None:
    """The build module, a declared source file, anything in a declared source
    directory (a new file too), through a link to the directory or a hard link."""
    (tmp_path / "build.py").write_text(SOURCES)
    (tmp_path / "model.txt").write_text("weights\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part.txt").write_text("part\n")
    (tmp_path / "here").symlink_to(tmp_path)
    os.link(tmp_path / "build.py", tmp_path / "hard.py")
    assert kiln("build", "build.py").returncode == 0
    before = tree(tmp_path)
    argv = ("report", "build.py", "-o") if writer == "report" else WRITERS[writer]
    r = kiln(*argv, path)
    assert r.returncode == 2, r.stderr
    assert path in r.stderr and "choose another path" in r.stderr, r.stderr
    assert tree(tmp_path) == before
    assert (tmp_path / "build.py").read_text() == SOURCES


@pytest.mark.parametrize("second", ["e.json", "./sub/../e.json", "link/e.json", "hard.json"])
def test_two_options_never_name_the_same_file(kiln, project: Path, second: str) -> None:
    (project / "sub").mkdir()
    (project / "link").symlink_to(project)
    (project / "e.json").write_text("old\n")
    os.link(project / "e.json", project / "hard.json")
    r = kiln("build", "build.py", "--events", "e.json", "--profile", second)
    assert r.returncode == 2, r.stderr
    assert "--events" in r.stderr and "--profile" in r.stderr and "choose another path" in r.stderr
    assert (project / "e.json").read_text() == "old\n"
    assert not (project / "kiln-out").exists()  # refused before anything was written
    ok = kiln("build", "build.py", "--events", "e.json", "--profile", "p.json")
    assert ok.returncode == 0, ok.stderr
    assert (project / "p.json").read_text().startswith('{"traceEvents"')


# -- confinement: kiln's own files -------------------------------------------------


@pytest.mark.parametrize("name", ["lock", "state.db", "state.db-wal"])
def test_planted_link_at_kilns_own_file_fails_the_build(kiln, project: Path, name: str) -> None:
    out = built(kiln, project)
    victim = project / "victim.txt"
    victim.write_text("precious\n")
    link = out / ".kiln" / name
    link.unlink(missing_ok=True)
    link.symlink_to(victim)
    r = kiln("build", "build.py")
    assert r.returncode == 2, r.stderr
    assert f"{link} (a symbolic link to {victim})" in r.stderr and "Traceback" not in r.stderr
    assert victim.read_text() == "precious\n"


def test_symlinked_kiln_dir_is_refused(kiln, project: Path) -> None:
    out = built(kiln, project)
    (out / ".kiln").rename(project / "stolen")
    (out / ".kiln").symlink_to(project / "stolen")
    before = tree(project / "stolen")
    r = kiln("build", "build.py")
    assert r.returncode == 2
    assert f"{out / '.kiln'} (a symbolic link" in r.stderr and "--output-dir" in r.stderr
    assert tree(project / "stolen") == before


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_manifest_of_the_wrong_kind_is_replaced(kiln, project: Path, kind: str) -> None:
    out = built(kiln, project)
    victim = project / "victim.json"
    victim.write_text("precious\n")
    manifest = out / "manifest.json"
    manifest.unlink()
    if kind == "symlink":
        manifest.symlink_to(victim)
    else:
        os.mkfifo(manifest)
    r = kiln("build", "build.py", timeout=FIFO_TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISREG(os.lstat(manifest).st_mode)
    assert '"format": "kiln-manifest/2"' in manifest.read_text()
    assert victim.read_text() == "precious\n"


def test_manifest_temporary_of_a_killed_build_is_swept(kiln, project: Path) -> None:
    """A build killed while it wrote the manifest leaves its temporary beside it; the
    next build, a no-op included, removes it (and nothing else)."""
    from kiln.output_dir.writing import temporary_for

    out = built(kiln, project)
    left = temporary_for(out / "manifest.json")
    left.write_text('{"half": ')
    mine = out / "notes.json"
    mine.write_text("mine\n")
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    assert not left.exists()
    assert mine.read_text() == "mine\n"
    assert '"format": "kiln-manifest/2"' in (out / "manifest.json").read_text()


def test_manifest_turned_into_a_directory_of_user_files_is_kept(kiln, project: Path) -> None:
    out = built(kiln, project)
    (out / "manifest.json").unlink()
    (out / "manifest.json").mkdir()
    (out / "manifest.json" / "mine.txt").write_text("mine\n")
    r = kiln("build", "build.py")
    assert r.returncode == 2
    assert f"{out / 'manifest.json'} is a directory" in r.stderr and "Traceback" not in r.stderr
    assert (out / "manifest.json" / "mine.txt").read_text() == "mine\n"


def test_log_directory_through_a_link_is_refused(tmp_path: Path) -> None:
    executor = Executor(tmp_path / "out")
    with executor.get_context(""):
        f = BuildContext.current().allocate_file("m/a.vmfb")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with executor.lock():
        (tmp_path / "out" / ".kiln" / "logs").symlink_to(elsewhere)
        with pytest.raises(ConfinementError, match="a symbolic link to"):
            executor.log_path(f)
    assert list(elsewhere.iterdir()) == []


# -- confinement: outputs and their directories -----------------------------------


def _empty_ep_dir(out: Path) -> Path:
    ep_dir = out / "genfiles" / "ep"
    for p in ep_dir.iterdir():
        p.unlink()
    ep_dir.rmdir()
    return ep_dir


def test_planted_link_at_an_entrypoint_dir_is_not_written_through(kiln, project: Path) -> None:
    out = built(kiln, project)
    victim = project / "victim"
    victim.mkdir()
    (victim / "x.txt").write_text("fresh\n")  # what kiln would write: a stale match
    ep_dir = _empty_ep_dir(out)
    ep_dir.symlink_to(victim)
    explained = kiln("explain", "build.py")
    assert "output ep/x.txt was modified: its directory genfiles/ep is a symbolic link" in (
        explained.stdout
    )
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    assert f"removed {ep_dir} (a symbolic link to {victim})" in r.stderr
    assert remade(project, r) == 2  # rebuilt (or restored), not taken through the link
    assert not ep_dir.is_symlink() and (ep_dir / "x.txt").read_text() == "fresh\n"
    assert (victim / "x.txt").read_text() == "fresh\n" and len(list(victim.iterdir())) == 1


def test_entrypoint_dir_turned_into_a_fifo_is_rebuilt(kiln, project: Path) -> None:
    out = built(kiln, project)
    os.mkfifo(_empty_ep_dir(out))
    r = kiln("build", "build.py", timeout=FIFO_TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert remade(project, r) == 2
    assert (out / "genfiles" / "ep" / "x.txt").read_text() == "fresh\n"


def test_user_file_where_an_entrypoint_dir_goes_is_kept(kiln, project: Path) -> None:
    out = built(kiln, project)
    ep_dir = _empty_ep_dir(out)
    ep_dir.write_text("mine\n")
    r = kiln("build", "build.py")
    assert r.returncode == 1
    assert f"{ep_dir} (a regular file) is where kiln needs a directory" in r.stderr
    assert ep_dir.read_text() == "mine\n" and "Traceback" not in r.stderr


def test_output_link_to_a_matching_file_is_rebuilt_not_followed(kiln, project: Path) -> None:
    out = built(kiln, project)
    x = out / "genfiles" / "ep" / "x.txt"
    victim = project / "victim.txt"
    victim.write_text(x.read_text())  # same content: following the link would look fresh
    x.unlink()
    x.symlink_to(victim)
    explained = kiln("explain", "build.py")
    assert "output ep/x.txt was modified: it is a symbolic link" in explained.stdout
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    assert remade(project, r) == 2
    assert stat.S_ISREG(os.lstat(x).st_mode)
    assert victim.read_text() == "fresh\n"


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()


@pytest.mark.parametrize("kind", ["fifo", "socket", "empty-dir"])
def test_output_of_the_wrong_kind_is_rebuilt_without_hanging(kiln, project, kind: str) -> None:
    out = built(kiln, project)
    x = out / "genfiles" / "ep" / "x.txt"
    x.unlink()
    {"fifo": os.mkfifo, "socket": _socket, "empty-dir": Path.mkdir}[kind](x)  # type: ignore[operator]
    explained = kiln("explain", "build.py", timeout=FIFO_TIMEOUT)
    assert explained.returncode == 0
    assert "output ep/x.txt was modified: it is a" in explained.stdout
    r = kiln("build", "build.py", timeout=FIFO_TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert remade(project, r) == 2 and x.read_text() == "fresh\n"
    assert "Traceback" not in r.stderr


def test_output_turned_into_a_directory_of_user_files_fails_naming_it(kiln, project: Path) -> None:
    out = built(kiln, project)
    x = out / "genfiles" / "ep" / "x.txt"
    x.unlink()
    x.mkdir()
    (x / "mine.txt").write_text("mine\n")
    r = kiln("build", "build.py")
    assert r.returncode == 1
    mine = x / "mine.txt"
    assert f"output {x} is a directory holding {mine}, which kiln did not write" in r.stderr
    assert (x / "mine.txt").read_text() == "mine\n" and "Traceback" not in r.stderr


def test_command_writing_a_link_as_its_output_fails(kiln, project: Path) -> None:
    victim = project / "victim.txt"
    victim.write_text("precious\n")
    (project / "build.py").write_text(
        HEADER
        + f"""
@entrypoint
def ln():
    return run_command(name="l.txt", command=["ln", "-s", "{victim}", "{{out}}"])
"""
    )
    r = kiln("build", "build.py")
    assert r.returncode == 1
    assert "was not a regular file" in r.stderr and "Traceback" not in r.stderr
    assert victim.read_text() == "precious\n"
    assert list((project / "kiln-out" / "genfiles" / "ln").iterdir()) == []


# -- output names ------------------------------------------------------------------


def _line(text: str, mark: str = "# HERE") -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if ln.endswith(mark))


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        ("a\\x00b", "control character '\\x00'"),
        ("a\\x1bb", "control character '\\x1b'"),
        ("d/" + "n" * 256, "component of 256 bytes"),
        (".kiln-tmp-0123456789-abcdef01", "reserves for its temporaries"),
        ("a\\udcffb", "byte 0xff, which is not UTF-8"),
    ],
    ids=["nul", "escape", "too-long", "temporary", "not-utf8"],
)
def test_bad_output_name_is_a_definition_error(kiln, project: Path, name: str, expect: str) -> None:
    text = (
        MODULE
        + f"""
@entrypoint
def bad():
    return run_command(name="{name}", command=["true"])  # HERE
"""
    )
    (project / "build.py").write_text(text)
    r = kiln("build", "build.py")
    assert r.returncode == 2, r.stderr
    assert f"(at {project / 'build.py'}:{_line(text)})" in r.stderr
    assert expect in r.stderr and "Traceback" not in r.stderr


def test_longest_name_builds(kiln, project: Path) -> None:
    name = "n" * 251 + ".txt"  # 255 bytes: its temporary must still fit
    (project / "build.py").write_text(
        HEADER
        + f"""
@entrypoint
def long():
    return run_command(name="{name}", command=["sh", "-c", "echo ok > {{out}}"])
"""
    )
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    assert (project / "kiln-out" / "genfiles" / "long" / name).read_text() == "ok\n"


@pytest.mark.parametrize("order", ["file-first", "dir-first"])
def test_name_that_is_both_a_file_and_a_directory(kiln, project: Path, order: str) -> None:
    first, second = ("a", "a/b") if order == "file-first" else ("a/b", "a")
    text = (
        HEADER
        + f"""
@entrypoint
def clash():
    run_command(name="{first}", command=["true"])  # FIRST
    return run_command(name="{second}", command=["true"])  # HERE
"""
    )
    (project / "build.py").write_text(text)
    r = kiln("build", "build.py")
    assert r.returncode == 2, r.stderr
    module = project / "build.py"
    assert "would be both a file and a directory" in r.stderr
    assert f"{module}:{_line(text, '# FIRST')}" in r.stderr
    assert f"{module}:{_line(text)}" in r.stderr


# ``ep`` names its output after an argument: ``--model`` given a byte that is not
# UTF-8 reaches it as the lone surrogate ``os.fsdecode`` makes of it.
NAMED_BY_ARGUMENT = (
    HEADER
    + """
@entrypoint
def ep(model=cl_arg("model", default="m", help="the model")):
    return run_command(name=f"{model}.txt",
                       command=["sh", "-c", "echo run >> ../runs.log; echo fresh > {out}"])
"""
)


def test_an_output_name_from_an_argument_that_is_not_utf8_is_refused(
    kiln_subprocess, project: Path
) -> None:
    (project / "build.py").write_text(NAMED_BY_ARGUMENT)
    for _ in range(2):  # and again: nothing was left half-recorded
        r = kiln_subprocess("build", "build.py", "--model", "\udcff")  # the byte 0xff
        assert r.returncode == 2, r.stderr
        assert "holds the byte 0xff, which is not UTF-8" in r.stderr
        assert "Traceback" not in r.stderr
    assert runs(project) == 0
    assert kiln_subprocess("build", "build.py", "--model", "caf\u00e9").returncode == 0


@pytest.mark.parametrize(
    "argv",
    [("build",), ("build", "--dry-run"), ("explain",), ("clean",)],
    ids=["build", "dry-run", "explain", "clean"],
)
def test_an_output_dir_that_is_not_utf8_is_refused(kiln_subprocess, project: Path, argv) -> None:
    before = sorted(os.listdir(project))
    files = () if argv == ("clean",) else ("build.py",)
    for _ in range(2):
        r = kiln_subprocess(*argv, *files, "--output-dir", "out\udcff")  # out, byte 0xff
        assert r.returncode == 2, r.stderr
        assert "as the output directory: its path holds the byte 0xff" in r.stderr
        assert "choose another with --output-dir" in r.stderr and "Traceback" not in r.stderr
    assert sorted(os.listdir(project)) == before  # nothing made, nothing run


# A checkout whose directory's name is not UTF-8 (as Python decodes it), holding a
# source tree with such a name in it and a source file named so.
CHECKOUT = "co\udce9"
NOT_UTF8_SOURCES = (
    HEADER
    + """
import os

@entrypoint
def ep():
    tree, one = source_file("data"), source_file(os.fsdecode(b"g\\xff.txt"))
    return run_command(name="x.txt", inputs=[tree, one],
                       command=["sh", "-c", "echo run >> ../runs.log; cat {inputs[1]} > {out}"])
"""
)


def test_a_checkout_and_sources_whose_names_are_not_utf8_build(kiln, project: Path) -> None:
    checkout = project / CHECKOUT
    (checkout / "data").mkdir(parents=True)
    (checkout / "build.py").write_text(NOT_UTF8_SOURCES)
    in_tree = checkout / "data" / "f\udcff.txt"
    one = checkout / "g\udcff.txt"
    in_tree.write_text("1")
    one.write_text("one")

    def build() -> int:
        r = kiln("build", f"{CHECKOUT}/build.py")
        assert r.returncode == 0, r.stderr
        return runs(project)

    assert build() == 1
    assert build() == 1  # keyed: an unchanged tree and file run nothing
    in_tree.write_text("2")
    assert build() == 2
    one.write_text("two")
    assert build() == 3
    assert (project / "kiln-out" / "genfiles" / "ep" / "x.txt").read_text() == "two"
    r = kiln("explain", f"{CHECKOUT}/build.py")
    assert r.returncode == 0 and "up to date" in r.stdout, r.stderr
    # Its own kiln-out is under a name that is not UTF-8: refused, saying what to do.
    r = kiln("build", f"{CHECKOUT}/build.py", "--output-dir", f"{CHECKOUT}/kiln-out")
    assert r.returncode == 2 and "choose another with --output-dir" in r.stderr, r.stderr


BROKEN = (
    MODULE
    + """
@entrypoint
def bad():
    raise RuntimeError("bad is broken")  # HERE

@entrypoint
def badname():
    return run_command(name="a\\x00b", command=["true"])
"""
)


def test_one_broken_entrypoint_does_not_stop_a_healthy_target(kiln, project: Path) -> None:
    (project / "build.py").write_text(BROKEN)
    r = kiln("build", "build.py", "ep")
    assert r.returncode == 0, r.stderr
    assert (project / "kiln-out" / "genfiles" / "ep" / "x.txt").read_text() == "fresh\n"
    assert "skipped the broken entrypoint 'bad'" in r.stderr
    for argv in (
        ("build", "build.py"),
        ("build", "build.py", "bad"),
        ("build", "build.py", "badname"),
    ):
        r = kiln(*argv)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr
    assert f"{project / 'build.py'}:{_line(BROKEN)}" in kiln("build", "build.py", "bad").stderr


def test_an_old_output_where_a_directory_now_goes_is_replaced(kiln, project: Path) -> None:
    text = (
        HEADER
        + """
@entrypoint
def ep():
    return run_command(name="NAME", command=["sh", "-c", "echo ok > {out}"])
"""
    )
    (project / "build.py").write_text(text.replace("NAME", "d"))
    assert kiln("build", "build.py").returncode == 0
    (project / "build.py").write_text(text.replace("NAME", "d/e"))
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr  # genfiles/ep/d was kiln's own output: replaced
    assert (project / "kiln-out" / "genfiles" / "ep" / "d" / "e").read_text() == "ok\n"
    (project / "build.py").write_text(text.replace("NAME", "d"))
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr  # and back: the directory held only kiln's files
    assert (project / "kiln-out" / "genfiles" / "ep" / "d").read_text() == "ok\n"


def test_command_that_writes_nothing_says_so(kiln, project: Path) -> None:
    (project / "build.py").write_text(
        HEADER
        + """
@entrypoint
def lazy():
    return run_command(name="l.txt", command=["true"])
"""
    )
    r = kiln("build", "build.py")
    assert r.returncode == 1
    out = project / "kiln-out" / "genfiles" / "lazy" / "l.txt"
    assert f"finished without writing its output {out}" in r.stderr
    assert "Traceback" not in r.stderr and "FileNotFoundError" not in r.stderr
