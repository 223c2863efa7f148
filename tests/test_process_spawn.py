"""``run_command`` without a thread per command: commands started with
``posix_spawn`` and reaped by one reaper thread (``kiln.execution.process.commands``).

Through the real CLI: many commands at once, a failure's tail, a timeout, a
signal in the middle of many running commands, a command that cannot start,
what a command inherits (environment, directory, no stray descriptors). Each
runs with the shared cache (commands started from worker threads) and without
(started from the scheduler's thread).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import tagged_processes, wait_for

CACHE = pytest.mark.parametrize("cache", [[], ["--no-cache"]], ids=["cache", "no-cache"])

MANY = """
@entrypoint
def many():
    return [
        run_command(name=f"o{i}.txt", command=["sh", "-c", f"echo line {i}; echo {i} > {{out}}"])
        for i in range(120)
    ]
"""


@CACHE
def test_many_commands_build_log_and_leave_nothing(
    write_module, kiln, tmp_path: Path, tag: str, cache: list[str]
) -> None:
    write_module(MANY)
    r = kiln(
        "build",
        "build.py",
        "-j",
        "6",
        *cache,
        "--action-env",
        "KILN_TEST_TAG",
        env={"KILN_TEST_TAG": tag},
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "kiln-out/genfiles/many"
    logs = tmp_path / "kiln-out/.kiln/logs/many"
    for i in range(120):
        assert (out / f"o{i}.txt").read_text() == f"{i}\n"
        log = (logs / f"o{i}.txt.log").read_text()
        assert log.startswith("$ sh -c ") and log.endswith(f"line {i}\n"), log
    assert sorted(p.name for p in out.iterdir()) == sorted(f"o{i}.txt" for i in range(120))
    assert not tagged_processes(tag)
    args = ("build", "build.py", "-j", "6", *cache, "--action-env", "KILN_TEST_TAG")
    again = kiln(*args, env={"KILN_TEST_TAG": tag})
    assert again.returncode == 0 and "0 built, 120 up to date" in again.stderr, again.stderr


FAILING = """
@entrypoint
def mixed():
    ok = [run_command(name=f"ok{i}.txt", command=["sh", "-c", "sleep 0.2; echo ok > {out}"])
          for i in range(8)]
    bad = run_command(name="bad.txt", command=[
        "sh", "-c", "i=0; while [ $i -lt 3000 ]; do echo noise $i; i=$((i+1)); done; "
                    "echo the real reason >&2; exit 7"])
    return [*ok, bad]
"""


@CACHE
def test_a_failing_command_shows_a_bounded_tail_and_the_rest_builds(
    write_module, kiln, tmp_path: Path, cache: list[str]
) -> None:
    write_module(FAILING)
    r = kiln("build", "build.py", "-j", "4", *cache)
    assert r.returncode == 1, r.stderr
    assert "'Running mixed/bad.txt': command exited with status 7" in r.stderr
    assert "the real reason" in r.stderr and "noise 2999" in r.stderr
    assert "noise 5\n" not in r.stderr and "earlier bytes not shown" in r.stderr
    assert len(r.stderr.encode()) < 40_000
    assert "Traceback" not in r.stderr
    out = tmp_path / "kiln-out/genfiles/mixed"
    assert sorted(p.name for p in out.iterdir()) == [f"ok{i}.txt" for i in range(8)]
    log = tmp_path / "kiln-out/.kiln/logs/mixed/bad.txt.log"
    assert "noise 0\n" in log.read_text()  # the whole output stays in the log


TIMEOUT = """
@entrypoint
def slow():
    return [
        run_command(name="hung.txt", timeout=1,
                    command=["sh", "-c", "sleep 60 & sleep 60; echo late > {out}"]),
        run_command(name="quick.txt", command=["sh", "-c", "echo q > {out}"]),
    ]
"""


@CACHE
def test_a_timeout_kills_the_command_and_its_group(
    write_module, kiln, tmp_path: Path, tag: str, cache: list[str]
) -> None:
    write_module(TIMEOUT)
    started = time.monotonic()
    r = kiln(
        "build",
        "build.py",
        *cache,
        "--action-env",
        "KILN_TEST_TAG",
        env={"KILN_TEST_TAG": tag},
        timeout=60,
    )
    assert time.monotonic() - started < 30
    assert r.returncode == 1, r.stderr
    assert "'Running slow/hung.txt' ran past its timeout of 1 s and was killed" in r.stderr
    assert not tagged_processes(tag), "a process of the timed-out command survived"
    out = tmp_path / "kiln-out/genfiles/slow"
    assert sorted(p.name for p in out.iterdir()) == ["quick.txt"]  # no temporary left


RUNNING = """
@entrypoint
def busy():
    return [
        run_command(name=f"b{i}.txt",
                    command=["sh", "-c", f"touch ../marks/{i}; sleep 60; echo {i} > {{out}}"])
        for i in range(6)
    ]
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@CACHE
def test_a_signal_kills_every_running_command(
    write_module, tmp_path: Path, tag: str, signum: int, cache: list[str]
) -> None:
    write_module(RUNNING)
    (tmp_path / "marks").mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kiln",
            "build",
            "build.py",
            "-j",
            "6",
            *cache,
            "--action-env",
            "KILN_TEST_TAG",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1", "KILN_TEST_TAG": tag},
        start_new_session=True,
    )
    try:
        wait_for(lambda: len(list((tmp_path / "marks").iterdir())) == 6, 60, "six commands")
        os.kill(proc.pid, signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err
    wait_for(lambda: not tagged_processes(tag), 10, "every command to end")
    out = tmp_path / "kiln-out/genfiles/busy"
    assert not out.exists() or list(out.iterdir()) == []  # no partial output, no temporary


def test_a_command_that_cannot_start_fails_naming_it(write_module, kiln) -> None:
    write_module("""
        @entrypoint
        def missing():
            return run_command(name="m.txt", command=["no-such-program-kiln", "{out}"])
        """)
    r = kiln("build", "build.py")
    assert r.returncode == 1, r.stderr
    assert "cannot run 'no-such-program-kiln': No such file or directory" in r.stderr
    assert "Traceback" not in r.stderr


INHERIT = """
@entrypoint
def env():
    return run_command(name="e.txt", command=[
        "sh", "-c", 'echo "$KILN_SPAWN_PROBE $(pwd)" > {out}; ls /proc/self/fd >> {out}'])
"""


def test_a_command_gets_the_declared_environment_and_the_output_directory_no_stray_descriptor(
    write_module, tmp_path: Path
) -> None:
    """As with ``subprocess``: a descriptor kiln inherited is not passed on."""
    write_module(INHERIT)
    read, write = os.pipe()
    os.set_inheritable(write, True)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "kiln", "build", "build.py", "--action-env", "KILN_SPAWN_PROBE"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            pass_fds=(write,),
            env={**os.environ, "KILN_SPAWN_PROBE": "probe-value"},
        )
    finally:
        os.close(read)
        os.close(write)
    assert r.returncode == 0, r.stderr
    first, *fds = (tmp_path / "kiln-out/genfiles/env/e.txt").read_text().split("\n")
    assert first == f"probe-value {tmp_path / 'kiln-out'}"
    # 0-2, and the one ls opened on /proc/self/fd: nothing kiln had open.
    assert str(write) not in fds and len([f for f in fds if f]) <= 4, fds


@pytest.mark.parametrize("cache", [["--no-cache"], ["--cache-dir", "cache"]])
def test_commands_are_started_by_the_worker_threads_within_jobs(
    tmp_path: Path, kiln_in_process, monkeypatch: pytest.MonkeyPatch, cache: list[str]
) -> None:
    """Every command is started by a worker thread, which hands it to the reaper and
    returns (the scheduler's thread starting them was 1.7x slower on 10,000 trivial
    commands), with or without the cache; no more than -j of them run at once."""
    from kiln.execution.threads import ThreadWorkers

    handed: list[object] = []
    submit = ThreadWorkers.submit

    def counted(self: ThreadWorkers, task: object) -> None:
        handed.append(task)
        submit(self, task)  # type: ignore[arg-type]

    monkeypatch.setattr(ThreadWorkers, "submit", counted)
    (tmp_path / "build.py").write_text(
        "from kiln import entrypoint, run_command\n"
        "@entrypoint\n"
        "def b():\n"
        "    script = 'mkdir running.{i} && sleep 0.2 && ls -d running.* | wc -l > {out}"
        " && rmdir running.{i}'\n"
        "    run = lambda i: ['sh', '-c', script.replace('{i}', str(i))]\n"
        "    return [run_command(name=f'o{i}', command=run(i)) for i in range(6)]\n"
    )
    r = kiln_in_process("build", "build.py", "-j", "2", *cache)
    assert r.returncode == 0, r.stderr
    assert len(handed) == 6
    seen = [int((tmp_path / f"kiln-out/genfiles/b/o{i}").read_text()) for i in range(6)]
    assert max(seen) <= 2, seen


READS_STDIN = """
@entrypoint
def reads():
    return run_command(name="r.txt", command=["sh", "-c", "cat > {out}"])
"""


def test_a_command_reads_nothing_from_kilns_stdin(write_module, tmp_path: Path) -> None:
    """What a command would read from kiln's terminal or pipe is in no key: a command
    that reads its stdin gets end of file at once, never kiln's input, never a wait."""
    write_module(READS_STDIN)
    with open(tmp_path / "err.txt", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kiln", "build", "build.py", "--no-cache"],
            cwd=tmp_path,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        assert proc.stdin is not None
        proc.stdin.write(b"typed by the user\n")
        proc.stdin.flush()  # and kept open, as a terminal is
        try:
            assert proc.wait(timeout=60) == 0, (tmp_path / "err.txt").read_text()
        finally:
            proc.kill()
            proc.stdin.close()
    assert (tmp_path / "kiln-out/genfiles/reads/r.txt").read_bytes() == b""


SPAWN_READER = """
import os, sys
from kiln.execution.process import posix_spawn

if sys.argv[1] == "through-sh":
    posix_spawn._libc = lambda signals: None
pid = posix_spawn.spawn("/bin/sh", ["sh", "-c", "readlink /proc/self/fd/0; cat"],
                        [b"PATH=/usr/bin:/bin"], cwd=".", out_fd=1, close_fds=())
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("way", ["posix_spawn", "through-sh"])
def test_spawn_gives_a_command_dev_null_for_stdin(tmp_path: Path, way: str) -> None:
    """Both ways of starting a command (the C library's, and ``sh`` where it has no
    ``addchdir_np``) open ``/dev/null`` as its stdin, whatever the caller's is."""
    r = subprocess.run(
        [sys.executable, "-c", SPAWN_READER, way],
        cwd=tmp_path,
        input=b"the caller's input\n",
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"/dev/null\n"  # and cat read nothing
