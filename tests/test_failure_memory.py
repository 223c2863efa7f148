"""A deterministic failure is remembered: an action that failed with the same key is
not run again by the next build (it counts as failed, unchanged, with the log of
the run that failed, and the build exits 1); ``--retry-failed`` runs it. What may
pass by itself (a signal, a timeout, the operating system, the network, the
cluster) is retried. Through the CLI and the API, on real files and processes;
``judge``, the one place that decides, case by case."""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import needs
import pytest
from cache_build import entries as cache_entries
from httpserver import HTTPTestServer

from kiln import (
    ActionFailed,
    ActionTimeout,
    ClusterFailure,
    ConfinementError,
    DependenceException,
    NotRegularFile,
    RemoteError,
    StateError,
    ToolError,
    ToolMissing,
    WorkerCrashed,
)
from kiln.engine.failures import Verdict, judge, retry_reason
from kiln.engine.incremental import Decision
from kiln.executor import BuildAction, BuildContext, Executor

# A command that counts its runs (``counter``, beside the build module) and fails
# as $FAIL says (default: exit 3, having printed why), and one that needs it.
COMMANDS = """
import os

FAIL = os.environ.get("FAIL", "echo broken input >&2; exit 3")

@entrypoint
def demo():
    data = source_file("data.txt")
    bad = run_command(name="bad.txt", inputs=[data], tools=["tool.sh"],
                      command=["sh", "{tools[0]}", "{inputs[0]}", "{out}",
                               os.environ.get("ARG", "a")],
                      timeout=float(os.environ.get("TIMEOUT", "60")))
    after = run_command(name="after.txt", inputs=[bad], command=["cp", "{inputs[0]}", "{out}"])
    fine = run_command(name="fine.txt", command=["sh", "-c", "echo fine > {out}"])
    return [after, fine]
"""
TOOL = """\
echo ran >> "{counter}"
{fail}
"""


# These tests need no process of their own: their commands are the processes that fail.
pytestmark = pytest.mark.in_process


@pytest.fixture
def commands(write_module: Callable[..., Path], tmp_path: Path) -> Callable[..., None]:
    """Write the build module, its data and its tool (failing as ``fail`` says)."""

    def write(fail: str = "echo broken input >&2; exit 3") -> None:
        write_module(COMMANDS)
        (tmp_path / "data.txt").write_text("data\n")
        (tmp_path / "tool.sh").write_text(tool(tmp_path, fail))

    return write


def tool(tmp_path: Path, fail: str) -> str:
    return TOOL.format(counter=tmp_path / "counter", fail=fail)


def runs(tmp_path: Path) -> int:
    counter = tmp_path / "counter"
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def log_of(tmp_path: Path, name: str) -> Path:
    return tmp_path / "kiln-out" / ".kiln" / "logs" / "demo" / f"{name}.log"


def test_a_failure_with_the_same_key_is_not_run_again(commands, kiln, tmp_path: Path) -> None:
    commands()
    first = kiln("build", "build.py")
    assert first.returncode == 1, first.stderr
    assert runs(tmp_path) == 1
    assert "1 built, 0 up to date, 1 failed, 1 not run" in first.stderr

    again = kiln("build", "build.py", "--events", "ev.jsonl")
    assert again.returncode == 1, again.stderr
    assert runs(tmp_path) == 1  # not run again
    log = log_of(tmp_path, "bad.txt")
    assert "broken input" in log.read_text()  # the log of the run that failed
    assert "kiln: 1 action(s) failed as in an earlier build" in again.stderr
    assert "kiln build --retry-failed runs them" in again.stderr
    assert "broken input" not in again.stderr  # one line, not the error again
    verbose = kiln("build", "build.py", "-v")  # as it failed then, traceback and all
    assert f"  * Running demo/bad.txt failed (unchanged; log: {log})" in verbose.stderr
    assert "broken input" in verbose.stderr and "Traceback" in verbose.stderr
    assert runs(tmp_path) == 1
    assert "0 built, 1 up to date, 0 failed, 1 failed (unchanged), 1 not run" in again.stderr
    ended = {e["desc"]: e for e in events(tmp_path / "ev.jsonl") if e.get("desc")}
    bad = ended["Running demo/bad.txt"]
    assert bad["event"] == "failed" and bad["unchanged"] is True
    assert bad["log"] == str(log) and "exited with status 3" in bad["error"]
    assert "lane" not in bad and "start" not in bad  # it did not run
    assert ended["Running demo/after.txt"]["event"] == "not_run"
    assert ended["Running demo/after.txt"]["root_cause"] == bad["action"]
    finished = events(tmp_path / "ev.jsonl")[-1]
    assert finished["counts"]["failed"] == 1 and finished["counts"]["failed_unchanged"] == 1


def test_retry_failed_runs_it_again_and_it_is_remembered_again(
    commands, kiln, tmp_path: Path
) -> None:
    commands()
    kiln("build", "build.py")
    retried = kiln("build", "build.py", "--retry-failed")
    assert retried.returncode == 1 and runs(tmp_path) == 2
    assert "broken input" in retried.stderr and "(unchanged)" not in retried.stderr
    assert kiln("build", "build.py").returncode == 1 and runs(tmp_path) == 2


@pytest.mark.parametrize("change", ["input", "tool", "parameter", "environment"])
def test_a_changed_key_runs_it_again(commands, kiln, tmp_path: Path, change: str) -> None:
    commands()
    kiln("build", "build.py")
    env, args = {}, []
    if change == "input":
        (tmp_path / "data.txt").write_text("other data\n")
    elif change == "tool":  # the program it runs: its code
        (tmp_path / "tool.sh").write_text(tool(tmp_path, "echo still >&2; exit 4"))
    elif change == "parameter":
        env = {"ARG": "b"}
    else:
        args = ["--action-env", "SOME_SETTING=1"]
    r = kiln("build", "build.py", *args, env=env)
    assert r.returncode == 1 and runs(tmp_path) == 2, r.stderr
    assert "(unchanged)" not in r.stderr


def test_a_success_forgets_the_failure(commands, kiln, tmp_path: Path) -> None:
    commands()
    kiln("build", "build.py")
    (tmp_path / "tool.sh").write_text(tool(tmp_path, 'cp "$1" "$2"'))
    assert kiln("build", "build.py").returncode == 0 and runs(tmp_path) == 2
    # Back to the failing tool: its key is the remembered failure's, but the run that
    # succeeded since forgot it.
    (tmp_path / "tool.sh").write_text(tool(tmp_path, "echo broken input >&2; exit 3"))
    assert kiln("build", "build.py").returncode == 1 and runs(tmp_path) == 3


def test_explain_says_why_it_would_not_run(commands, kiln, tmp_path: Path) -> None:
    commands()
    kiln("build", "build.py")
    r = kiln("explain", "build.py")
    assert r.returncode == 0, r.stderr
    log = log_of(tmp_path, "bad.txt")
    assert (
        "Running demo/bad.txt: would not run: it failed with this same key in the build of "
        in r.stdout
    )
    assert f"(its log is {log}); --retry-failed runs it" in r.stdout
    assert "Running demo/after.txt: would not run: it needs demo/bad.txt, which failed" in r.stdout
    line = "Running demo/bad.txt: not run: it failed with this same key in an earlier build; "
    dry = kiln("build", "build.py", "--dry-run")
    assert dry.returncode == 0 and f"{line}--retry-failed runs it" in dry.stderr
    assert "ERROR" not in dry.stderr and "1 failed (unchanged)" in dry.stderr
    explained = kiln("build", "build.py", "--explain")
    assert explained.returncode == 1 and f"{line}--retry-failed runs it" in explained.stderr
    retry = kiln("explain", "build.py", "--retry-failed")
    assert "Running demo/bad.txt: it failed with this same key in an earlier build" in retry.stdout
    assert "Running demo/after.txt: never built" in retry.stdout
    (tmp_path / "data.txt").write_text("edited\n")
    edited = kiln("explain", "build.py")
    assert (
        "Running demo/bad.txt: it failed in an earlier build; since then input data.txt changed"
        in edited.stdout
    )
    assert runs(tmp_path) == 1


def test_explain_reads_the_remembered_failure_as_untrusted(commands, kiln, tmp_path: Path) -> None:
    """state.db is read as untrusted: a remembered log path reaches stdout escaped on
    one line, and a time no clock shows (it overflowed the date: a traceback) makes
    the row damaged, so the action would run again."""
    commands()
    kiln("build", "build.py")
    db = tmp_path / "kiln-out" / ".kiln" / "state.db"
    log = "/tmp/x\x1b]0;pwned\x07\nkiln: done: 9 built"
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE failures SET log = ?", (log,))
    r = kiln("explain", "build.py")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "(its log is /tmp/x\\x1b]0;pwned\\x07\\nkiln: done: 9 built); --retry" in r.stdout
    assert not any(line.startswith("kiln: done") for line in r.stdout.splitlines())

    for damaged in (1e300, -1.0):
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE failures SET time = ?", (damaged,))
        r = kiln("explain", "build.py")
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert "Running demo/bad.txt: would not run" not in r.stdout, r.stdout
        assert "Running demo/bad.txt: never built" in r.stdout, r.stdout
    assert runs(tmp_path) == 1


def test_the_report_shows_a_failure_not_run_again(commands, kiln, tmp_path: Path) -> None:
    commands()
    kiln("build", "build.py")
    kiln("build", "build.py")
    assert kiln("report").returncode == 0
    page = (tmp_path / "kiln-out" / "report.html").read_text()
    failures = page[page.index("id='failures'") :]
    assert "Failures (1)" in failures and "Running demo/bad.txt" in failures
    assert "it failed with the same key in an earlier build" in failures
    assert "kiln build --retry-failed" in failures
    assert "broken input" in failures  # the error, and the log's tail


@pytest.mark.parametrize(
    "fail",
    [
        "kill -9 $$",  # the command itself killed by a signal
        'sh -c "kill -9 \\$\\$"; exit $?',  # a shell reporting its child's SIGKILL: 137
        "sleep 30",  # past its timeout
        "echo 'write error: No space left on device' >&2; exit 1",  # the OS's words
    ],
    ids=["signal", "sigkill-by-shell", "timeout", "disk-full"],
)
def test_what_may_pass_by_itself_is_retried(commands, kiln, tmp_path: Path, fail: str) -> None:
    commands(fail)
    env = {"TIMEOUT": "0.5"} if "sleep" in fail else {}
    for n in (1, 2):
        r = kiln("build", "build.py", env=env)
        assert r.returncode == 1 and runs(tmp_path) == n, r.stderr
        assert "(unchanged)" not in r.stderr


USER_ACTIONS = """
import errno, functools, os
from pathlib import Path

HERE = Path(__file__).parent


def _fail(kind, counter):
    with open(counter, "a") as f:
        f.write("ran\\n")
    if kind == "memory":
        raise MemoryError()
    if kind == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "scratch")
    if kind == "wrapped":
        try:
            open(HERE / "no" / "such" / "file")
        except OSError as e:
            raise ValueError("cannot read the calibration data") from e
    raise ValueError(f"bad value {kind}")


class Fails(BuildAction):
    def __init__(self, kind, out, **kw):
        super().__init__(**kw)
        self.kind, self.out = kind, out
        out.deps.add(self)

    def _invoke(self):
        _fail(self.kind, str(HERE / "counter"))

    def _remotable_thunk(self):
        return functools.partial(_fail, self.kind, str(HERE / "counter"))


@entrypoint
def user():
    ctx = BuildContext.current()
    out = ctx.allocate_file("u.txt")
    concurrency = ActionConcurrency[os.environ.get("WHERE", "THREAD")]
    Fails(os.environ["KIND"], out, desc="failing", executor=ctx.executor,
          concurrency=concurrency)
    return out
"""


@pytest.mark.parametrize("where", ["THREAD", "PROCESS"])
@pytest.mark.parametrize(
    ("kind", "remembered"),
    [("value", True), ("memory", False), ("enospc", False), ("wrapped", False)],
)
def test_a_user_action_out_of_resources_is_retried(
    write_module, kiln, tmp_path: Path, where: str, kind: str, remembered: bool
) -> None:
    write_module(USER_ACTIONS)
    env = {"KIND": kind, "WHERE": where}
    assert kiln("build", "build.py", env=env).returncode == 1 and runs(tmp_path) == 1
    r = kiln("build", "build.py", "-v", env=env)  # -v lists the failures met unchanged
    assert r.returncode == 1, r.stderr
    assert runs(tmp_path) == (1 if remembered else 2)
    assert ("failed (unchanged): ValueError: bad value value" in r.stderr) is remembered


FETCH = """
import os

@entrypoint
def net():
    return fetch_http(name="model.onnx", url=os.environ["URL"], retries=0)
"""


@pytest.mark.parametrize("status", [500, 404])
def test_a_download_that_failed_is_tried_again(
    write_module, kiln, tmp_path: Path, status: int
) -> None:
    write_module(FETCH)
    with HTTPTestServer() as server:
        env = {"URL": server.status("/m.onnx", status)}
        assert kiln("build", "build.py", env=env).returncode == 1
        tried = server.count("/m.onnx")
        assert tried >= 1
        r = kiln("build", "build.py", env=env)
        assert r.returncode == 1 and "(unchanged)" not in r.stderr
        assert server.count("/m.onnx") == 2 * tried


def test_two_output_directories_do_not_share_failures_nor_does_the_cache(
    commands, kiln, tmp_path: Path, _private_cache: Path
) -> None:
    commands()
    assert kiln("build", "build.py", "--output-dir", "one").returncode == 1
    assert kiln("build", "build.py", "--output-dir", "two").returncode == 1
    assert runs(tmp_path) == 2
    # The cache holds the one action that succeeded, nothing of the failure: not in
    # its index of entries, nor in any file.
    found = cache_entries(_private_cache)
    assert len(found) == 1, found
    key = events_key(tmp_path / "one", "Running demo/bad.txt")
    assert all(key not in name and key.encode() not in data for name, data in found.items())
    assert not any(key in p.name for p in _private_cache.rglob("*"))
    assert not any(key.encode() in p.read_bytes() for p in _private_cache.rglob("*") if p.is_file())
    # A third directory, served the succeeded action from the cache, runs the failure.
    assert kiln("build", "build.py", "--output-dir", "three").returncode == 1
    assert runs(tmp_path) == 3


def events_key(out: Path, desc: str) -> str:
    for event in events(out / ".kiln" / "last-events.jsonl"):
        if event.get("desc") == desc and event.get("key"):
            return str(event["key"])
    raise AssertionError(f"no key for {desc}")


def test_a_state_without_the_failures_table_opens_and_gains_it(
    commands, kiln, tmp_path: Path
) -> None:
    commands()
    assert kiln("build", "build.py").returncode == 1
    db = tmp_path / "kiln-out" / ".kiln" / "state.db"
    with sqlite3.connect(db) as conn:  # as an older kiln left it
        conn.execute("DROP TABLE failures")
    r = kiln("build", "build.py")
    assert r.returncode == 1 and runs(tmp_path) == 2, r.stderr  # nothing remembered
    assert "warning" not in r.stderr and "corrupt" not in r.stderr
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id, error, log FROM failures").fetchall()
    assert [(i, log) for i, _, log in rows] == [
        ("gen/demo/bad.txt", str(log_of(tmp_path, "bad.txt")))
    ]
    assert kiln("build", "build.py").returncode == 1 and runs(tmp_path) == 2


def test_a_damaged_failure_row_is_ignored_and_the_action_runs(
    commands, kiln, tmp_path: Path
) -> None:
    commands()
    kiln("build", "build.py")
    db = tmp_path / "kiln-out" / ".kiln" / "state.db"
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE failures SET key = 'not a digest'")
    r = kiln("build", "build.py")
    assert r.returncode == 1 and runs(tmp_path) == 2, r.stderr


# -- through the API ---------------------------------------------------------------


class _Failing(BuildAction):
    """Fails with ``ValueError`` (a deterministic failure); counts its runs."""

    def __init__(self, counter: Path, **kw: Any) -> None:
        super().__init__(**kw)
        self.counter = str(counter)

    def _invoke(self) -> None:
        with open(self.counter, "a") as f:
            f.write("ran\n")
        raise ValueError("no")


class _NotRemembered(_Failing):
    remember_failures = False


class _Unkeyed(_Failing):
    always_run = True


@pytest.mark.parametrize(
    ("action", "remembered"), [(_Failing, True), (_NotRemembered, False), (_Unkeyed, False)]
)
def test_the_api_result_says_it_and_an_action_may_opt_out(
    tmp_path: Path, action: type[_Failing], remembered: bool
) -> None:
    counter = tmp_path / "counter"

    def build(**options: Any) -> Any:
        executor = Executor(tmp_path / "out")
        try:
            with executor.get_context(""):
                ctx = BuildContext.current()
                out = ctx.allocate_file("x.txt")
                act = action(counter, desc="failing", executor=ctx.executor)
                out.deps.add(act)
            return act, executor.run([out], _options(**options))
        finally:
            executor.close()

    build()
    act, result = build()
    assert not result.ok and result.failed == [act]
    assert (result.unchanged() == [act]) is remembered
    assert len(counter.read_text().splitlines()) == (1 if remembered else 2)
    _, retried = build(retry_failed=True)
    assert retried.unchanged() == [] and len(counter.read_text().splitlines()) == (
        2 if remembered else 3
    )


def _options(**options: Any) -> Any:
    from kiln.engine.request import SchedulerOptions

    return SchedulerOptions(jobs=1, **options)


# -- retry_reason, case by case ----------------------------------------------------


def _keyed() -> Decision:
    return Decision("gen/x", "0" * 64, {"desc": "x"}, {}, "never built")


def _raised(error: BaseException, cause: BaseException, suppress: bool = False) -> BaseException:
    """``error`` raised from ``cause`` (``suppress``: ``from None`` while handling it)."""
    try:
        try:
            raise cause
        except BaseException as inner:
            if suppress:
                raise error from None
            raise error from inner
    except BaseException as outer:
        return outer


def _while_handling(error: BaseException, context: BaseException) -> BaseException:
    try:
        try:
            raise context
        except BaseException:
            raise error  # noqa: B904 - the implicit context is what is tested
    except BaseException as outer:
        return outer


REMEMBERED = [
    ValueError("a bug in the build module"),
    ActionFailed("'x' finished without writing its output"),
    ToolError("iree-compile failed (exit code 1)", 1),
    ToolError("the command exited with status 2", 2),
    subprocess.CalledProcessError(1, ["false"]),
    RecursionError("deep"),
    _raised(ActionFailed("without writing its output"), FileNotFoundError(2, "x"), True),
    ToolError("error: bad token", 125),
    ValueError("usage: --timeout must be positive; error 5001"),
    ToolError("error: 'x' op attribute not found (exit code 1)", 1),
]


class ConnectError(Exception):
    """As httpx names a refused connection: no ``OSError``."""


class OutOfMemoryError(RuntimeError):
    """As torch names a GPU out of memory."""


class _Unprintable(ValueError):
    def __str__(self) -> str:
        raise RuntimeError("no")


SURROUNDINGS_RETRIED = [
    *(ToolError("exited", code) for code in (126, 127, 128, 130, 143, 159, 200, 255, 256)),
    subprocess.CalledProcessError(129, ["tool"]),
    ConnectError("All connection attempts failed"),
    OutOfMemoryError("CUDA error"),
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    ValueError("HTTP Error 503: Service Unavailable"),
    ValueError("<Signals.SIGKILL: 9>"),
    _Unprintable(),
]
RETRIED = [
    ToolError("killed", -9),
    ToolError("killed by the OOM killer, through a shell", 137),
    subprocess.CalledProcessError(-11, ["crash"]),
    ActionTimeout("ran past its timeout"),
    WorkerCrashed("died with signal SIGKILL"),
    RemoteError("Weird", "cannot be pickled", "Traceback"),
    ClusterFailure("every Dask worker that ran it died"),
    ToolMissing("cannot find iree-compile"),
    ConfinementError("a link is in the way"),
    StateError("cannot write the build state"),
    DependenceException("not run: it needs y, which failed"),
    NotRegularFile("a FIFO"),
    KeyboardInterrupt(),
    SystemExit(1),
    MemoryError(),
    ModuleNotFoundError("No module named 'torch'"),
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EMFILE, "Too many open files"),
    ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
    TimeoutError("timed out"),
    PermissionError(errno.EACCES, "Permission denied"),
    http.client.IncompleteRead(b"partial"),
    subprocess.TimeoutExpired(["slow"], 5),
    _raised(ActionFailed("cannot write the log"), OSError(errno.ENOSPC, "full")),
    _while_handling(ValueError("fallback failed"), OSError(errno.EIO, "I/O error")),
    ToolError("iree-compile failed (exit code 1):\nerror: No space left on device", 1),
    ToolError("LLVM ERROR: out of memory", 1),
    ToolError("curl: Temporary failure in name resolution", 6),
]


@pytest.mark.parametrize("error", REMEMBERED, ids=lambda e: type(e).__name__)
def test_a_failure_of_the_action_itself_is_remembered(tmp_path: Path, error: Exception) -> None:
    assert retry_reason(_action(tmp_path, _Failing), _keyed(), error) is None


@pytest.mark.parametrize("error", RETRIED + SURROUNDINGS_RETRIED, ids=lambda e: type(e).__name__)
def test_a_failure_that_may_pass_by_itself_is_retried(tmp_path: Path, error: BaseException) -> None:
    why = retry_reason(_action(tmp_path, _Failing), _keyed(), error)
    assert why, error


def test_an_unkeyed_or_opted_out_action_is_always_retried(tmp_path: Path) -> None:
    error = ValueError("deterministic")
    unkeyed = Decision("gen/x", "0" * 64, None, {}, "marked always-run")
    assert retry_reason(_action(tmp_path, _Failing), unkeyed, error) == "kiln cannot key it"
    why = retry_reason(_action(tmp_path, _NotRemembered), _keyed(), error)
    assert why == "its type (_NotRemembered) sets remember_failures = False"
    from kiln.actions.net import FetchHttpAction

    assert FetchHttpAction.remember_failures is False


def _action(tmp_path: Path, cls: type[_Failing]) -> _Failing:
    executor = Executor(tmp_path / "out")
    with executor.get_context(""):
        return cls(tmp_path / "counter", desc="x", executor=BuildContext.current().executor)


def test_the_line_of_an_error_that_names_it() -> None:
    from kiln.observe.summary import error_line

    assert error_line("outputs do not match:\n  against shipped: 1 != 3\nmore") == (
        "outputs do not match: against shipped: 1 != 3"
    )
    traceback = 'Traceback (most recent call last):\n  File "b.py"\nValueError: bad\n'
    assert error_line(traceback) == "ValueError: bad"
    assert error_line("one\x1b[31m line") == "one\\x1b[31m line"  # escaped for a terminal
    assert len(error_line("x" * 1000)) == 240 and error_line("") == ""


def test_a_change_to_the_actions_code_runs_it_again(write_module, kiln, tmp_path: Path) -> None:
    module = write_module(USER_ACTIONS)
    env = {"KIND": "value", "WHERE": "THREAD"}
    kiln("build", "build.py", env=env)
    assert kiln("build", "build.py", env=env).returncode == 1 and runs(tmp_path) == 1
    module.write_text(module.read_text().replace("bad value {kind}", "still a bad value {kind}"))
    r = kiln("build", "build.py", env=env)
    assert r.returncode == 1 and runs(tmp_path) == 2, r.stderr
    assert "ValueError: still a bad value value" in r.stderr


def test_a_failures_table_of_other_columns_is_replaced(commands, kiln, tmp_path: Path) -> None:
    commands()
    kiln("build", "build.py")
    db = tmp_path / "kiln-out" / ".kiln" / "state.db"
    with sqlite3.connect(db) as conn:  # as another kiln (or a hand) might leave it
        conn.execute("DROP TABLE failures")
        conn.execute("CREATE TABLE failures(id TEXT PRIMARY KEY, key TEXT, why TEXT)")
        conn.execute("INSERT INTO failures VALUES ('gen/demo/bad.txt', 'k', 'w')")
    explained = kiln("explain", "build.py")  # reads a copy: changes nothing
    assert explained.returncode == 0 and "Running demo/bad.txt: never built" in explained.stdout
    r = kiln("build", "build.py")
    assert r.returncode == 1 and runs(tmp_path) == 2, r.stderr
    assert "warning" not in r.stderr and "cannot" not in r.stderr
    with sqlite3.connect(db) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(failures)")]
        assert "detail" in columns and conn.execute("SELECT id FROM failures").fetchall() == [
            ("gen/demo/bad.txt",)
        ]
    assert kiln("build", "build.py").returncode == 1 and runs(tmp_path) == 2


FILLS_THE_DISK = """
@entrypoint
def big():
    return run_command(name="big.bin", command=["sh", "-c", "head -c 3000000 /dev/zero > {out}"])
"""


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``mnt`` for the test (root only; CI runs as
    root, and there the test fails rather than skips)."""
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)]
    r = subprocess.run(mount, capture_output=True, text=True)
    if r.returncode != 0:
        needs.missing(f"cannot mount a tmpfs (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_failure_on_a_full_disk_is_retried_though_its_words_were_lost(
    write_module, kiln, tmp_path: Path
) -> None:
    """The command's "No space left on device" went to its log, on the same full disk:
    kiln read no such words. The disk being full at the failure is enough: once there
    is room the next build runs it (it is not "failed (unchanged)")."""
    write_module(FILLS_THE_DISK)
    with tmpfs(tmp_path / "fs", "2m") as mnt:
        failed = kiln("build", "build.py", "--output-dir", str(mnt / "out"))
        assert failed.returncode == 1, failed.stderr
        subprocess.run(["mount", "-o", "remount,size=16m", str(mnt)], check=True)
        again = kiln("build", "build.py", "--output-dir", str(mnt / "out"))
        assert again.returncode == 0, again.stderr
        assert "(unchanged)" not in again.stderr
        assert (mnt / "out/genfiles/big/big.bin").stat().st_size == 3_000_000


def test_any_failure_while_the_disk_is_nearly_full_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kiln.engine.failures as failures

    error = ValueError("deterministic")
    (tmp_path / "out").mkdir()
    assert retry_reason(_action(tmp_path, _Failing), _keyed(), error) is None
    monkeypatch.setattr(failures, "disk_full", lambda directory: f"the disk of {directory} is full")
    why = retry_reason(_action(tmp_path, _Failing), _keyed(), error)
    assert why == f"the disk of {tmp_path / 'out'} is full"


def test_a_deterministic_failure_on_a_small_disk_with_room_is_remembered(
    commands, kiln, tmp_path: Path
) -> None:
    """A small disk (a 16 MiB tmpfs, all of it under 64 MiB) that has room is not
    full: a failure of the action itself is remembered there as anywhere."""
    commands()
    with tmpfs(tmp_path / "fs", "16m") as mnt:
        for _ in range(2):
            r = kiln("build", "build.py", "--output-dir", str(mnt / "out"))
            assert r.returncode == 1
        assert runs(tmp_path) == 1 and "failed (unchanged)" in r.stderr, r.stderr


# -- failures of the surroundings, with real programs ------------------------------

# One command: $ARGV (PY: this Python, PROGRAM: prog.py's text), by default the
# program alone. The program counts its runs and, while the file ``cause`` is there
# (outside the key: the surroundings), fails as the test wrote it.
SURROUNDINGS = """
import json, os, sys
from pathlib import Path

HERE = Path(__file__).parent
PROGRAM = (HERE / "prog.py").read_text() if (HERE / "prog.py").exists() else ""
ARGV = json.loads(os.environ.get("ARGV", '["PY", "-c", "PROGRAM", "{out}"]'))


@entrypoint
def env():
    argv = [sys.executable if a == "PY" else PROGRAM if a == "PROGRAM" else a for a in ARGV]
    return run_command(name="out.txt", command=argv)
"""
PROGRAM = """\
import os, sys, time
HERE = {here!r}
with open(os.path.join(HERE, "counter"), "a") as f:
    f.write("ran\\n")
if os.path.exists(os.path.join(HERE, "cause")):
{fail}
{fetch}
with open(sys.argv[1], "w") as f:
    f.write("ok\\n")
"""
# Fetches the URL in the file ``url`` (outside the key), as a tool would.
FETCH_URL = """\
import urllib.request
with open(os.path.join(HERE, "url")) as f:
    urllib.request.urlopen(f.read(), timeout=30).read()
"""
WRAPPED = ["sh", "-c", '"$0" "$@"; exit $?', "PY", "-c", "PROGRAM", "{out}"]
LINE = "Running env/out.txt: it failed with this same key in an earlier build, and "
NOT_REMEMBERED = LINE + "that failure was not remembered: "


def surroundings(write_module: Callable[..., Path], tmp_path: Path, fail: str = "", fetch=False):
    """Write the build module and its program, failing with ``fail`` (lines of Python)
    while ``cause`` is there; create ``cause``."""
    write_module(SURROUNDINGS)
    body = "\n".join("    " + line for line in (fail or "pass").splitlines())
    program = PROGRAM.format(here=str(tmp_path), fail=body, fetch=FETCH_URL if fetch else "")
    (tmp_path / "prog.py").write_text(program)
    (tmp_path / "cause").touch()


def passes_once_the_cause_is_gone(kiln, tmp_path: Path, env=None, gone=None) -> str:
    """Build: it fails; the cause goes (``gone``, else the file ``cause``); the next
    plain build runs it again and it succeeds. Returns what ``kiln explain`` said in
    between."""
    first = kiln("build", "build.py", env=env)
    assert first.returncode == 1 and runs(tmp_path) == 1, first.stderr
    explained = kiln("explain", "build.py", env=env).stdout
    (gone or (tmp_path / "cause").unlink)()
    again = kiln("build", "build.py", env=env)
    assert "(unchanged)" not in again.stderr, again.stderr
    assert again.returncode == 0 and runs(tmp_path) == 2, again.stderr
    assert (tmp_path / "kiln-out/genfiles/env/out.txt").read_text() == "ok\n"
    return explained


def test_a_program_that_exits_127_is_retried(write_module, kiln, tmp_path: Path) -> None:
    surroundings(write_module, tmp_path, "print('cannot go on', file=sys.stderr)\nsys.exit(127)")
    explained = passes_once_the_cause_is_gone(kiln, tmp_path)
    assert (
        f"{NOT_REMEMBERED}the command exited with status 127 (a program it runs is not "
        "installed)" in explained
    ), explained


def test_a_program_out_of_memory_under_a_limit_is_retried(
    write_module, kiln, tmp_path: Path
) -> None:
    """Under RLIMIT_AS (``ulimit -v``) Python prints ``MemoryError`` and exits 1."""
    fail = """\
import resource
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
data = bytearray(1 << 33)
"""
    surroundings(write_module, tmp_path, fail)
    explained = passes_once_the_cause_is_gone(kiln, tmp_path)
    assert f"{NOT_REMEMBERED}its error says 'memoryerror' (it ran out of memory)" in explained


@pytest.mark.parametrize(
    "signum",
    [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGALRM],
    ids=lambda s: s.name,
)
def test_a_program_killed_from_outside_through_a_shell_is_retried(
    write_module, kiln, tmp_path: Path, signum: signal.Signals
) -> None:
    """The test sends the signal; the shell around the program reports 128 + N."""
    fail = "open(os.path.join(HERE, 'pid'), 'w').write(str(os.getpid()))\ntime.sleep(60)"
    surroundings(write_module, tmp_path, fail)
    killer = threading.Thread(target=_kill_when_started, args=(tmp_path / "pid", signum))
    killer.start()
    try:
        explained = passes_once_the_cause_is_gone(kiln, tmp_path, {"ARGV": json.dumps(WRAPPED)})
    finally:
        killer.join()
    assert (
        f"{NOT_REMEMBERED}the command exited with status {128 + signum} (128 + {int(signum)}: "
        f"a program it runs was killed by {signum.name})" in explained
    ), explained


def _kill_when_started(pid_file: Path, signum: int) -> None:
    for _ in range(600):
        if pid_file.exists() and pid_file.read_text():
            os.kill(int(pid_file.read_text()), signum)
            return
        time.sleep(0.05)


def test_a_server_that_answered_503_is_asked_again(write_module, kiln, tmp_path: Path) -> None:
    """The program reads the URL from a file (not its command line): what it printed
    (``HTTP Error 503``) is the sign."""
    surroundings(write_module, tmp_path, fetch=True)
    with HTTPTestServer() as server:
        (tmp_path / "url").write_text(server.flaky("/m", b"model", failures=1, status=503))
        explained = passes_once_the_cause_is_gone(kiln, tmp_path)
        assert server.count("/m") == 2
    assert NOT_REMEMBERED in explained and "(the network or a server failed)" in explained


@pytest.mark.parametrize("peer", ["refused", "hung-up"])
def test_a_connection_that_failed_is_tried_again(
    write_module, kiln, tmp_path: Path, peer: str
) -> None:
    """A refused connection, or a server that hung up without an answer (Python's
    ``RemoteDisconnected``); then the server answers."""
    surroundings(write_module, tmp_path, fetch=True)
    with HTTPTestServer() as server, _hangs_up() as hung_up:
        url = f"http://127.0.0.1:{_closed_port()}/m" if peer == "refused" else hung_up
        (tmp_path / "url").write_text(url)
        good = server.serve("/m", b"model")
        passes_once_the_cause_is_gone(
            kiln, tmp_path, gone=lambda: (tmp_path / "url").write_text(good)
        )


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
@pytest.mark.parametrize("how", ["url-in-argv", "config-file"])
def test_curl_that_failed_is_run_again(kiln, write_module, tmp_path: Path, how: str) -> None:
    """curl -f on a 503, silent (it prints nothing: its command line names the URL),
    and curl given the URL in a config file, refused ("Couldn't connect to server")."""
    surroundings(write_module, tmp_path)
    (tmp_path / "cause").unlink()
    with HTTPTestServer() as server:
        if how == "url-in-argv":
            argv = ["curl", "-s", "-f", "-o", "{out}", server.flaky("/m", b"ok\n", 1, 503)]
            gone = None
        else:
            config = tmp_path / "curl.cfg"
            config.write_text(f'url = "http://127.0.0.1:{_closed_port()}/m"\n')
            argv = ["curl", "-sS", "-f", "-K", str(config), "-o", "{out}"]
            url = server.serve("/m", b"ok\n")
            gone = lambda: config.write_text(f'url = "{url}"\n')  # noqa: E731
        env = {"ARGV": json.dumps(argv)}
        first = kiln("build", "build.py", env=env)
        assert first.returncode == 1, first.stderr
        explained = kiln("explain", "build.py", env=env).stdout
        if gone:
            gone()
        again = kiln("build", "build.py", env=env)
        assert again.returncode == 0 and "(unchanged)" not in again.stderr, again.stderr
    why = "its parameters name a http URL" if how == "url-in-argv" else "couldn't connect"
    assert NOT_REMEMBERED in explained and why in explained, explained


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (just released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _hangs_up() -> Iterator[str]:
    """A URL whose server accepts each connection and closes it without answering."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                conn.recv(1024)
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/m"
    finally:
        stop.set()
        thread.join()
        listener.close()


@pytest.mark.parametrize(
    "fail",
    [
        # The words, then more than the 20 lines kiln shows of a failure.
        "print('Connection refused')\nprint('x\\n' * 60)\nsys.exit(1)",
        # In colour, in capitals, with a tab and a carriage return.
        "print('\\x1b[1;31mOUT OF\\x1b[0m\\tMEMORY\\r')\nsys.exit(2)",
        # A shell's word that a program it runs is missing, its own status 1.
        "os.system('nosuch-tool-xyz; exit 1')\nsys.exit(1)",
        # A program it ran was killed, reported by make-like words.
        "print('make: *** [Makefile:3: all] Error 137')\nsys.exit(2)",
        # An HTTP client library's error type, by its name.
        "print('httpx.ConnectError: [Errno -2] Name does not resolve')\nsys.exit(1)",
    ],
    ids=["words-far-up", "colour-case-spaces", "shell-not-found", "make-137", "type-name"],
)
def test_the_signs_cannot_be_hidden_by_their_form(
    write_module, kiln, tmp_path: Path, fail: str
) -> None:
    surroundings(write_module, tmp_path, fail)
    explained = passes_once_the_cause_is_gone(kiln, tmp_path)
    assert NOT_REMEMBERED in explained, explained


@pytest.mark.parametrize(
    ("fail", "status"),
    [
        ("print('error: the input has a bad token at line 3', file=sys.stderr)\nsys.exit(1)", 1),
        ("raise ValueError('a bad value in the input')", 1),
        ("print('usage: --timeout must be a number; see error 5001')\nsys.exit(2)", 2),
        ("sys.exit(125)", 125),
    ],
    ids=["compiler-error", "exception", "words-that-are-not-signs", "status-125"],
)
def test_a_deterministic_failure_is_still_remembered(
    write_module, kiln, tmp_path: Path, fail: str, status: int
) -> None:
    """Its cause gone or not, the same key fails the same way: not run again, and
    explain says why it was remembered."""
    surroundings(write_module, tmp_path, fail)
    assert kiln("build", "build.py").returncode == 1
    (tmp_path / "cause").unlink()
    again = kiln("build", "build.py")
    assert again.returncode == 1 and runs(tmp_path) == 1, again.stderr
    assert "failed (unchanged" in again.stderr
    explained = kiln("explain", "build.py").stdout
    assert (
        f"--retry-failed runs it (remembered: the command exited with status {status}, and "
        "nothing it printed points at its surroundings)" in explained
    ), explained


def test_the_verdict_names_its_reason(tmp_path: Path) -> None:
    action = _action(tmp_path, _Failing)
    said = {
        127: "a program it ran exited with status 127 (a program it runs is not installed)",
        126: "a program it ran exited with status 126 (a program it runs could not be executed)",
        143: "a program it ran exited with status 143 (128 + 15: a program it runs was killed "
        "by SIGTERM)",
        -9: "a program it ran was killed by SIGKILL",
        250: "a program it ran exited with status 250 (above 125: not a status a program "
        "gives of itself)",
    }
    for code, why in said.items():
        assert judge(action, _keyed(), ToolError("failed", code)) == Verdict(False, why)
    own = " and nothing it printed points at its surroundings"
    assert judge(action, _keyed(), ToolError("failed", 3)) == Verdict(
        True, f"a program it ran exited with status 3,{own}"
    )
    assert judge(action, _keyed(), ValueError("bad")) == Verdict(
        True, "it raised ValueError itself, and nothing in its error points at its surroundings"
    )


def _with_log(tmp_path: Path, log: Path) -> _Failing:
    action = _action(tmp_path, _Failing)
    action.log_path = str(log)  # type: ignore[attr-defined]
    return action


def test_a_log_that_is_not_a_regular_file_is_not_read_and_rules_nothing_out(
    tmp_path: Path,
) -> None:
    """A FIFO where the log was (reading it would block), or a link (not followed):
    kiln cannot look for the signs, so the failure is retried."""
    fifo, link, target = tmp_path / "fifo.log", tmp_path / "link.log", tmp_path / "t.log"
    os.mkfifo(fifo)
    target.write_text("error: bad token\n")
    link.symlink_to(target)
    started = time.monotonic()
    for log in (fifo, link):
        why = retry_reason(_with_log(tmp_path, log), _keyed(), ToolError("failed", 1))
        assert why is not None and "its log" in why, why
    assert time.monotonic() - started < 5
    assert retry_reason(_with_log(tmp_path, target), _keyed(), ToolError("failed", 1)) is None
    gone = retry_reason(_with_log(tmp_path, tmp_path / "gone"), _keyed(), ToolError("f", 1))
    assert gone is not None and "cannot read its log" in gone


def test_only_a_bounded_tail_of_a_log_is_read(tmp_path: Path) -> None:
    """A log of a gigabyte (sparse) is judged by its tail at once: the words at its end
    count; what lies before the tail is not read."""
    from kiln.engine.failure_signs import LOG_TAIL_BYTES, sign_in

    huge = tmp_path / "huge.log"
    with open(huge, "wb") as f:
        f.write(b"Connection refused\n")  # before the tail: not read
        f.truncate(1 << 30)
    started = time.monotonic()
    assert retry_reason(_with_log(tmp_path, huge), _keyed(), ToolError("failed", 1)) is None
    with open(huge, "ab") as f:
        f.write(b"\nMemoryError\n")
    why = retry_reason(_with_log(tmp_path, huge), _keyed(), ToolError("failed", 1))
    assert why == "its output says 'memoryerror' (it ran out of memory)"
    # A message of many megabytes, one long word or many short lines, is read to its
    # bounded tail, in linear time.
    for text in ("x" * (20 << 20), "sh: " * (5 << 20), ("a" * 300 + "\n") * 100_000):
        assert sign_in(text + "\nKilled") is not None
    assert time.monotonic() - started < 10
    assert LOG_TAIL_BYTES <= 1 << 20


@pytest.mark.parametrize("remembered", ["yes", 2, 1.5, 0])
def test_a_failure_row_not_marked_remembered_runs_again(
    commands, kiln, tmp_path: Path, remembered: object
) -> None:
    """A row whose ``remembered`` is damaged is dropped; one marked 0 is explained."""
    commands()
    kiln("build", "build.py")
    db = tmp_path / "kiln-out" / ".kiln" / "state.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT remembered FROM failures").fetchall() == [(1,)]
        conn.execute("UPDATE failures SET remembered = ?", (remembered,))
    explained = kiln("explain", "build.py").stdout
    if remembered == 0:
        assert (
            "Running demo/bad.txt: it failed with this same key in an earlier build, and that "
            "failure was not remembered: the command exited with status 3" in explained
        ), explained
    else:
        assert "Running demo/bad.txt: never built" in explained, explained
    r = kiln("build", "build.py")
    assert r.returncode == 1 and runs(tmp_path) == 2, r.stderr


def test_a_retried_failure_is_written_down_and_forgotten_on_success(
    write_module, kiln, tmp_path: Path
) -> None:
    surroundings(write_module, tmp_path, "sys.exit(127)")
    kiln("build", "build.py")
    db = tmp_path / "kiln-out" / ".kiln" / "state.db"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id, remembered, why FROM failures").fetchall()
    assert rows == [
        (
            "gen/env/out.txt",
            0,
            "the command exited with status 127 (a program it runs is not installed)",
        )
    ]
    (tmp_path / "cause").unlink()
    assert kiln("build", "build.py").returncode == 0
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM failures").fetchone() == (0,)
