"""Honest endings: every way a build ends gives a truthful status and message,
leaves no temporary file, and leaves no process behind.

Real ``kiln`` subprocesses, real signals, real daemonizing shell scripts; the
processes of a test carry ``$KILN_TEST_TAG`` so that any survivor is found.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import tagged_processes, wait_for

# -- sys.exit / KeyboardInterrupt in the build module --------------------------

EXITS = {"exit-0": "sys.exit(0)", "exit-3": "sys.exit(3)", "keyboard": "raise KeyboardInterrupt"}


@pytest.mark.parametrize("where", ["import", "entrypoint"])
@pytest.mark.parametrize("stmt", list(EXITS.values()), ids=list(EXITS))
def test_exit_in_the_build_module_is_a_definition_error(
    write_module, kiln, tmp_path: Path, where: str, stmt: str
) -> None:
    if where == "import":
        text = f"import sys\n{stmt}  # HERE\n"
    else:
        text = f"import sys\n@entrypoint\ndef ep():\n    {stmt}  # HERE\n"
    module = write_module(text)
    line = (
        module.read_text()
        .splitlines()
        .index(next(x for x in module.read_text().splitlines() if x.endswith("# HERE")))
        + 1
    )
    r = kiln("build", "build.py")
    assert r.returncode == 2, r.stderr
    assert f"{module}:{line}:" in r.stderr
    assert "sys.exit" in r.stderr or "KeyboardInterrupt" in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""


def test_sys_exit_in_a_cl_arg_type_is_a_definition_error(write_module, kiln) -> None:
    module = write_module(
        "import sys\n"
        "@entrypoint\n"
        "def ep(n=cl_arg('n', type=lambda s: sys.exit(0))):  # HERE\n"
        "    return None\n"
    )
    r = kiln("build", "build.py", "--n", "1")
    assert r.returncode == 2, r.stderr
    assert f"{module}:5:" in r.stderr and "sys.exit(0)" in r.stderr
    assert kiln("build", "build.py", "--help").returncode == 0  # --help still exits 0


LOADS_SLOWLY = """
import time
from pathlib import Path

(Path(__file__).parent / "loading").touch()
time.sleep(1000)
"""


def test_ctrl_c_while_the_module_loads_is_still_an_interruption(
    write_module, tmp_path: Path, tag: str
) -> None:
    write_module(LOADS_SLOWLY)
    kiln = _start(tmp_path, tag)
    try:
        wait_for(lambda: (tmp_path / "loading").exists(), 60, "the module to load")
        os.killpg(kiln.pid, signal.SIGINT)
        _, err = kiln.communicate(timeout=30)
    finally:
        _stop(kiln)
    assert kiln.returncode == 130, err
    assert "interrupted by SIGINT" in err and "Traceback" not in err


# -- signals mid-build, and daemonized grandchildren ---------------------------

# `hang` starts three daemons (setsid, a subshell's background job, a double
# fork), records its pid, then hangs; `done` finishes first.
DAEMONS = "setsid sleep 1000 & (sleep 1000 &); sh -c 'sleep 1000 &' &"
SIGNALLED = f"""
@entrypoint
def work():
    done = run_command(name="done.txt", command=["sh", "-c", "echo done > {{out}}"])
    hang = run_command(name="hang.txt", inputs=[done], command=[
        "sh", "-c", "{DAEMONS} echo $$ > ../marks/hang; sleep 1000; echo hang > {{out}}"])
    return [done, hang]
"""


def _start(tmp_path: Path, tag: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kiln", "build", "build.py", "--action-env", "KILN_TEST_TAG", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1", "KILN_TEST_TAG": tag},
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _sleepers(tag: str) -> list[int]:
    found = []
    for pid in tagged_processes(tag):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                found.append(pid)
        except OSError:
            continue
    return found


def _files(out_dir: Path) -> list[str]:
    return sorted(p.name for p in out_dir.rglob("*") if p.is_file() and ".kiln" not in p.parts)


# Every signal whose default action ends a process stops the build this way, among
# them those less often sent: SIGPWR, SIGSYS, a real-time signal.
SIGNALS = {
    "SIGHUP": signal.SIGHUP,
    "SIGTERM": signal.SIGTERM,
    "SIGQUIT": signal.SIGQUIT,
    "SIGUSR1": signal.SIGUSR1,
    "SIGPWR": signal.SIGPWR,
    "SIGSYS": signal.SIGSYS,
    "SIGRTMIN+2": signal.SIGRTMIN + 2,
}


@pytest.mark.parametrize("name", list(SIGNALS))
def test_signal_mid_build_cleans_up_and_kills_daemons(
    write_module, tmp_path: Path, tag: str, name: str
) -> None:
    signum = SIGNALS[name]
    write_module(SIGNALLED)
    (tmp_path / "marks").mkdir()
    kiln = _start(tmp_path, tag)
    try:
        wait_for(lambda: (tmp_path / "marks/hang").exists(), 60, "the command to start")
        wait_for(lambda: len(_sleepers(tag)) >= 4, 10, "the daemons to start")
        os.kill(kiln.pid, signum)
        out, err = kiln.communicate(timeout=30)
    finally:
        _stop(kiln)
    assert kiln.returncode == 128 + signum, err
    assert f"interrupted by {name}" in err
    assert "Traceback" not in err
    wait_for(lambda: not tagged_processes(tag), 10, "every process of the build to end")
    assert _files(tmp_path / "kiln-out") == ["done.txt"]  # no temporary, no partial output


BROKEN_SOCKETS = """
import socket
from pathlib import Path

HERE = Path(__file__).parent


class Writes(BuildAction):
    \"\"\"Writes to a socket whose other end is closed (as to a Dask worker or a cache
    server that went away), then waits for the flag file and writes its output.\"\"\"

    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out

    def _invoke(self):
        a, b = socket.socketpair()
        b.close()
        try:
            a.sendall(b"x" * 100000)
        except BrokenPipeError:
            result = "EPIPE"
        else:
            result = "sent"
        finally:
            a.close()
        (HERE / "marks" / self.out.path.replace("/", "_")).touch()
        while not (HERE / "flag").exists():
            time.sleep(0.01)
        self.out.get_fs_path().write_text(result)


@entrypoint
def sockets():
    ctx = BuildContext.current()
    outs = []
    for name, concurrency in (("thread.txt", ActionConcurrency.THREAD),
                              ("inline.txt", ActionConcurrency.NONE)):
        out = ctx.allocate_file(name)
        out.deps.add(Writes(out, desc=name, executor=ctx.executor, concurrency=concurrency))
        outs.append(out)
    return outs
"""


def test_a_broken_socket_or_kill_pipe_does_not_stop_the_build(
    write_module, tmp_path: Path, tag: str
) -> None:
    """SIGPIPE from an action's write to a closed socket (on a worker thread and on
    kiln's own) or from ``kill -PIPE`` is no interruption: the write fails with EPIPE
    and the build goes on. (Only a closed stderr stops a build: the test below.)"""
    write_module("import time\n" + BROKEN_SOCKETS)
    (tmp_path / "marks").mkdir()
    kiln = _start(tmp_path, tag, "-j", "2")
    try:
        wait_for(
            lambda: kiln.poll() is not None or len(list((tmp_path / "marks").iterdir())) >= 2,
            60,
            "the writes",
        )
        time.sleep(0.3)
        assert kiln.poll() is None, "a write to a closed socket stopped the build"
        os.kill(kiln.pid, signal.SIGPIPE)
        time.sleep(0.3)
        assert kiln.poll() is None, "kill -PIPE stopped the build"
        (tmp_path / "flag").touch()
        out, err = kiln.communicate(timeout=60)
    finally:
        _stop(kiln)
    assert kiln.returncode == 0, err
    assert "interrupted" not in err
    gen = tmp_path / "kiln-out/genfiles/sockets"
    assert (gen / "thread.txt").read_text() == "EPIPE"
    assert (gen / "inline.txt").read_text() == "EPIPE"


AT_EXIT = """
import atexit
import socket
import sys


def _close_a_connection():
    \"\"\"What a library's exit handler does (Dask's client closes from atexit): a
    write to a connection its peer closed.\"\"\"
    a, b = socket.socketpair()
    b.close()
    try:
        a.sendall(b"x" * 100000)
    except OSError as e:
        sys.stderr.write(f"at exit: {type(e).__name__}\\n")
    a.close()


atexit.register(_close_a_connection)


@entrypoint
def one():
    ctx = BuildContext.current()
    out = ctx.allocate_file("one.txt")
    out.deps.add(Writes(out, desc="one", executor=ctx.executor))
    return [out]
"""


def test_a_write_to_a_closed_socket_at_exit_keeps_the_build_status(
    write_module, tmp_path: Path
) -> None:
    """After the command ran, a write to a closed socket (an exit handler's) fails
    with EPIPE instead of killing kiln by SIGPIPE: the status is the build's."""
    write_module("import time\n" + BROKEN_SOCKETS + AT_EXIT)
    (tmp_path / "marks").mkdir()
    (tmp_path / "flag").touch()
    r = subprocess.run(
        [sys.executable, "-m", "kiln", "build", "build.py", "one"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "kiln: done: 1 built" in r.stderr
    assert "at exit: BrokenPipeError" in r.stderr


LEAKY = """
import subprocess


class Leak(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out

    def _invoke(self):
        subprocess.Popen(["setsid", "sleep", "1000"])
        self.out.get_fs_path().write_text("leak")


@entrypoint
def leaky():
    ctx = BuildContext.current()
    leak = ctx.allocate_file("leak.txt")
    leak.deps.add(Leak(leak, desc="leak", executor=ctx.executor))
    return [
        leak,
        run_command(name="bg.txt", command=["sh", "-c", "(sleep 1000 &); echo bg > {out}"]),
        run_command(name="setsid.txt",
                    command=["sh", "-c", "setsid sleep 1000 & echo s > {out}"]),
        run_command(name="fork2.txt",
                    command=["sh", "-c", "sh -c 'sleep 1000 &' & echo f > {out}"]),
    ]
"""


def test_processes_left_by_a_build_are_reported_and_killed(
    write_module, kiln, tmp_path: Path, tag: str
) -> None:
    write_module(LEAKY)
    started = time.monotonic()
    r = kiln(
        "build", "build.py", "--action-env", "KILN_TEST_TAG", env={"KILN_TEST_TAG": tag}, timeout=60
    )
    elapsed = time.monotonic() - started
    assert r.returncode == 0, r.stderr
    assert elapsed < 30, "kiln waited for the daemons"
    for name in ("bg.txt", "setsid.txt", "fork2.txt"):
        assert f"warning: 'Running leaky/{name}' left " in r.stderr, r.stderr
    assert "still running when it ended; killed:" in r.stderr and "sleep 1000" in r.stderr
    assert not tagged_processes(tag), "a process of the build survived it"
    out = tmp_path / "kiln-out/genfiles/leaky"
    assert sorted(r.stdout.split()) == sorted(
        str(out / n) for n in ("leak.txt", "bg.txt", "setsid.txt", "fork2.txt")
    )


# -- the manifest tells the truth ----------------------------------------------

MANIFESTED = """
@entrypoint
def a():
    return run_command(name="a.txt", command=["sh", "-c", "echo a > {out}"])


@entrypoint
def b():
    mid = run_command(name="mid.txt", inputs=[source_file("b.txt")],
                      command=["cp", "{inputs[0]}", "{out}"])
    return run_command(name="b.out", inputs=[mid], command=["cp", "{inputs[0]}", "{out}"])


@entrypoint
def broken():
    bad = run_command(name="bad.txt", command=["sh", "-c", "exit 1"])
    after = run_command(name="after.txt", inputs=[bad], command=["cp", "{inputs[0]}", "{out}"])
    return [bad, after]
"""


def _manifest(tmp_path: Path) -> dict[str, dict[str, object]]:
    data = json.loads((tmp_path / "kiln-out/manifest.json").read_text())
    assert data["format"] == "kiln-manifest/2"
    return {
        Path(str(o["path"])).name: o for ep in data["entrypoints"].values() for o in ep["outputs"]
    }


def _assert_built(entry: dict[str, object], path: Path) -> None:
    assert entry["status"] == "built" and entry["built"] is True
    assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert entry["size"] == path.stat().st_size


def _assert_not_built(entry: dict[str, object], status: str) -> None:
    assert entry["status"] == status, entry
    assert entry["built"] is False and "sha256" not in entry and "size" not in entry


def test_manifest_statuses_follow_the_build(write_module, kiln, tmp_path: Path) -> None:
    write_module(MANIFESTED)
    (tmp_path / "b.txt").write_text("b1\n")
    gen = tmp_path / "kiln-out/genfiles"

    assert kiln("build", "build.py", "a").returncode == 0
    m = _manifest(tmp_path)
    _assert_built(m["a.txt"], gen / "a/a.txt")
    for name in ("b.out", "bad.txt", "after.txt"):
        _assert_not_built(m[name], "not built")

    assert kiln("build", "build.py", "a", "b").returncode == 0
    m = _manifest(tmp_path)
    _assert_built(m["b.out"], gen / "b/b.out")

    assert kiln("build", "build.py", "a").returncode == 0  # nothing changed
    _assert_not_built(_manifest(tmp_path)["b.out"], "not built")

    (tmp_path / "b.txt").write_text("b2, changed\n")
    assert kiln("build", "build.py", "a").returncode == 0
    m = _manifest(tmp_path)
    _assert_not_built(m["b.out"], "stale")  # its input changed: the old copy is stale
    _assert_built(m["a.txt"], gen / "a/a.txt")

    r = kiln("build", "build.py", "broken")
    assert r.returncode == 1
    m = _manifest(tmp_path)
    _assert_not_built(m["bad.txt"], "failed")
    _assert_not_built(m["after.txt"], "not run")
    _assert_not_built(m["b.out"], "stale")

    (gen / "a/a.txt").write_text("edited by hand\n")
    assert kiln("build", "build.py", "b").returncode == 0
    m = _manifest(tmp_path)
    _assert_not_built(m["a.txt"], "stale")  # modified since it was built
    _assert_built(m["b.out"], gen / "b/b.out")
    assert (gen / "b/b.out").read_text() == "b2, changed\n"


MANY = """
@entrypoint
def many():
    return [run_command(name=f"o{i}.txt", command=["sh", "-c", f"echo {i} > {{out}}"])
            for i in range(3)] + [source_file("src.txt")]

@entrypoint
def none():
    return []
"""


def test_manifest_has_one_line_per_output_and_reads_back(
    write_module, kiln, tmp_path: Path
) -> None:
    """The manifest is JSON with one line per output (the C encoder writes it), and
    the path of a source file returned by an entrypoint is relative to the output dir."""
    write_module(MANY)
    (tmp_path / "src.txt").write_text("source\n")
    assert kiln("build", "build.py", "many", "none").returncode == 0
    text = (tmp_path / "kiln-out/manifest.json").read_text()
    data = json.loads(text)
    assert data["entrypoints"]["none"] == {"outputs": []}
    outputs = data["entrypoints"]["many"]["outputs"]
    assert [o["path"] for o in outputs] == [
        "genfiles/many/o0.txt",
        "genfiles/many/o1.txt",
        "genfiles/many/o2.txt",
        "../src.txt",
    ]
    assert all(o["built"] and o["sha256"] for o in outputs), outputs
    lines = text.splitlines()
    for o in outputs:  # each entry whole on its own line
        assert sum(f'"path": "{o["path"]}"' in line for line in lines) == 1
        (line,) = [line for line in lines if f'"path": "{o["path"]}"' in line]
        assert json.loads(line.strip().rstrip(",")) == o


# -- the command line ------------------------------------------------------------

CMD = """
@entrypoint
def ep(value=cl_arg("{name}", default="x")):
    return run_command(name="ep.txt", command=["sh", "-c", "echo ep > {{out}}"])
"""
ECHO = """
@entrypoint
def ep(value=cl_arg("{name}", default="x")):
    return run_command(name="ep.txt", command=["sh", "-c", "echo " + value + " > {{out}}"])
"""


@pytest.mark.parametrize("name", ["targets", "dry_run", "output_dir", "all", "jobs", "target"])
def test_cl_arg_named_as_kilns_own_wins_and_kilns_stays_reachable(
    write_module, kiln, tmp_path: Path, name: str
) -> None:
    """A module's option that shares a name (or a destination) with one of kiln's
    loads, takes its own value, and leaves kiln's reachable as --kiln-<name>."""
    write_module(ECHO.format(name=name))
    flag = f"--{name}"
    r = kiln("build", "build.py", flag, "mine", "-j", "1", "--output-dir", "o")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o" / "genfiles" / "ep" / "ep.txt").read_text() == "mine\n"
    assert kiln("list", "build.py").returncode == 0
    command = "list" if name == "all" else "build"
    shown = " ".join(kiln(command, "build.py", "--help").stdout.split())
    assert f" {flag} " in shown.split("options of the build module")[1]
    if name in ("jobs", "target", "all"):  # kiln's own spelling, handed over
        assert f"--kiln-{name}" in shown and f"({flag} is the build module's option)" in shown


def test_kilns_option_under_its_kiln_spelling_when_a_module_takes_it(write_module, kiln) -> None:
    write_module(ECHO.format(name="jobs"))
    r = kiln("build", "build.py", "--jobs", "many", "--kiln-jobs", "0")
    assert r.returncode == 2
    assert "argument -j/--kiln-jobs: must be at least 1, got 0" in r.stderr


@pytest.mark.parametrize("name", ["kiln-targets", "kiln_x"])
def test_cl_arg_named_kiln_is_a_definition_error(write_module, kiln, name: str) -> None:
    module = write_module(CMD.format(name=name))
    r = kiln("build", "build.py")
    assert r.returncode == 2, r.stderr
    assert f"cl_arg '{name}' at {module}:5: names starting with 'kiln-' are kiln's own" in (
        r.stderr
    )


def test_cl_arg_flag_clash_names_both(write_module, kiln) -> None:
    module = write_module(CMD.format(name="output-dir"))
    r = kiln("build", "build.py")
    assert r.returncode == 2
    assert (
        f"cl_arg 'output-dir' at {module}:5 clashes with --output-dir, an option of kiln's "
        "that iree.build has too" in r.stderr
    )


@pytest.mark.parametrize(
    "argv",
    [
        ("build", "build.py", ""),
        ("build", "build.py", "/"),
        ("build", "build.py", " "),
        ("list", "build.py", "bogus"),
        ("list", "build.py", "ep"),
        ("graph", "build.py", ""),
    ],
    ids=["empty", "slash", "blank", "list-bogus", "list-known", "graph-empty"],
)
def test_bad_target_words_are_usage_errors(
    write_module, kiln, tmp_path: Path, argv: tuple[str, ...]
) -> None:
    write_module(CMD.format(name="value"))
    r = kiln(*argv)
    assert r.returncode == 2, r.stderr
    assert ("empty target" in r.stderr) or ("kiln list takes no TARGET" in r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (tmp_path / "kiln-out/genfiles").exists()


NOISY = """
import functools
from pathlib import Path

print("noise at import")


def shout(path):
    print("noise from a process action", flush=True)
    Path(path).write_text("p")


class Noisy(BuildAction):
    def __init__(self, out, process=False, **kw):
        if process:
            kw["concurrency"] = ActionConcurrency.PROCESS
        super().__init__(**kw)
        self.out = out

    def _invoke(self):
        print("noise from a thread action")
        self.out.get_fs_path().write_text("t")

    def _remotable_thunk(self):
        return functools.partial(shout, str(self.out.get_fs_path()))


@entrypoint
def noisy():
    ctx = BuildContext.current()
    thread, proc = ctx.allocate_file("thread.txt"), ctx.allocate_file("proc.txt")
    thread.deps.add(Noisy(thread, desc="thread", executor=ctx.executor))
    proc.deps.add(Noisy(proc, process=True, desc="proc", executor=ctx.executor))
    print("noise in the entrypoint")
    cmd = run_command(name="cmd.txt", command=["sh", "-c", "echo noise; echo c > {out}"])
    return [thread, proc, cmd]
"""


def test_prints_of_actions_never_reach_kiln_stdout(write_module, kiln, tmp_path: Path) -> None:
    write_module(NOISY)
    r = kiln("build", "build.py", "-j", "3")
    assert r.returncode == 0, r.stderr
    gen = tmp_path / "kiln-out/genfiles/noisy"
    assert r.stdout.splitlines() == [str(gen / n) for n in ("thread.txt", "proc.txt", "cmd.txt")]
    for noise in (
        "at import",
        "from a thread action",
        "in the entrypoint",
        "from a process action",
    ):
        assert f"noise {noise}" in r.stderr
    assert "warning" not in r.stderr  # kiln's own workers are no leak


def test_prints_of_actions_in_process_go_to_the_given_stderr(write_module, tmp_path: Path) -> None:
    from kiln.cli.main import run_cli

    module = write_module(NOISY)
    out, err = io.StringIO(), io.StringIO()
    code = run_cli(
        ["build", str(module), "--output-dir", str(tmp_path / "out")], stdout=out, stderr=err
    )
    assert code == 0, err.getvalue()
    gen = tmp_path / "out/genfiles/noisy"
    assert out.getvalue().splitlines() == [
        str(gen / n) for n in ("thread.txt", "proc.txt", "cmd.txt")
    ]
    assert "noise from a thread action" in err.getvalue()


BIG = """
@entrypoint
def big():
    return [run_command(name=f"f{i}.txt", command=["sh", "-c", "echo > {out}"])
            for i in range(3000)]
"""


@pytest.mark.parametrize("command", [("graph",), ("list", "--all")], ids=["graph", "list-all"])
def test_closed_stdout_ends_quietly(write_module, tmp_path: Path, command: tuple[str, ...]) -> None:
    write_module(BIG)
    line = " ".join([sys.executable, "-m", "kiln", command[0], "build.py", *command[1:]])
    r = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {line} | head -1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert r.returncode == 141, r.stderr
    assert r.stderr == ""
    assert len(r.stdout.splitlines()) == 1


def _pipeline(tmp_path: Path, line: str, tag: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {line}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", "KILN_TEST_TAG": tag},
    )


@pytest.mark.slow
def test_closed_stdout_after_a_build_ends_quietly(write_module, tmp_path: Path) -> None:
    write_module(BIG.replace("3000", "1000"))
    r = _pipeline(tmp_path, f"{sys.executable} -m kiln build build.py | head -1")
    assert r.returncode == 141, r.stderr
    assert "1000 built" in r.stderr  # the build itself finished and was recorded
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr


def test_closed_stderr_stops_the_build_cleanly(write_module, tmp_path: Path, tag: str) -> None:
    write_module(BIG.replace("3000", "1000"))
    line = f"{sys.executable} -m kiln build build.py -j 2 --action-env KILN_TEST_TAG 2>&1 | head -1"
    r = _pipeline(tmp_path, line, tag)
    assert r.returncode == 141, r.stdout
    assert len(r.stdout.splitlines()) == 1
    wait_for(lambda: not tagged_processes(tag), 10, "every process of the build to end")
    leftovers = [p.name for p in (tmp_path / "kiln-out").rglob("*") if "kiln-tmp" in p.name]
    assert leftovers == []
    built = list((tmp_path / "kiln-out/genfiles/big").iterdir())
    assert len(built) < 1000, "the build went on after its stderr closed"
