"""Worker crashes and timeouts, through real ``kiln build`` runs.

A process action whose worker dies (``os._exit``, a segfault, SIGKILL as from
the OOM killer) fails alone, with a message naming the action and the exit code
or signal; everything else builds, later process actions get healthy workers,
and what the dead worker started dies with it. An action that runs past its
``timeout`` is killed with its children and fails saying so.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from procs import assert_dead

# Helpers of the build modules below: process actions whose thunks record the
# pid of the process running them in MARKS, and a thread action that waits
# until a recorded process has died (so what follows it surely runs later).
ACTIONS = """
import ctypes
import functools
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

MARKS = Path(__file__).parent / "marks"
MARKS.mkdir(exist_ok=True)


def record(name, pid=None):
    (MARKS / name).write_text(str(pid or os.getpid()))


def healthy(name, out):
    record(name)
    Path(out).write_text(name)


def crash(how, out):
    record("crash_child", subprocess.Popen(["sleep", "1000"]).pid)
    record("crash")
    if how == "exit":
        os._exit(7)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if how == "segv":
        ctypes.string_at(0)
    os.kill(os.getpid(), signal.SIGKILL)


def hang(out):
    record("hang")
    record("hang_child", subprocess.Popen(["sleep", "1000"]).pid)
    time.sleep(1000)


class Proc(BuildAction):
    def __init__(self, thunk, **kw):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kw)
        self.thunk = thunk

    def _remotable_thunk(self):
        return self.thunk


class SlowProc(Proc):
    timeout = 4.0  # class attribute (room for the worker to record its pids under load)


def _dead(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:  # gone meanwhile (ESRCH while it is reaped, or ENOENT)
        return True


class AfterDeath(BuildAction):
    \"\"\"Writes its output once the process recorded as MARKS/<mark> has died.\"\"\"

    def __init__(self, mark, out, **kw):
        super().__init__(**kw)
        self.mark = mark
        self.out = out

    def _invoke(self):
        deadline = time.monotonic() + 60
        path = MARKS / self.mark
        while not (path.exists() and path.read_text() and _dead(int(path.read_text()))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path}'s process never died")
            time.sleep(0.05)
        self.out.get_fs_path().write_text("gate")


def proc(name, fn, *args, deps=(), cls=Proc, timeout=None):
    ctx = BuildContext.current()
    out = ctx.allocate_file(name)
    thunk = functools.partial(fn, *args, str(out.get_fs_path()))
    action = cls(thunk, desc=f"process {name}", executor=ctx.executor, deps=deps)
    if timeout is not None:
        action.timeout = timeout  # instance attribute
    out.deps.add(action)
    return out


def after_death(mark, name):
    ctx = BuildContext.current()
    out = ctx.allocate_file(name)
    out.deps.add(AfterDeath(mark, out, desc=f"after {mark} died", executor=ctx.executor))
    return out


def then_healthy(gate):
    first = proc("after1.txt", healthy, "after1", deps=[gate])
    return [first, proc("after2.txt", healthy, "after2", deps=[first])]
"""

CRASH = (
    ACTIONS
    + """
@entrypoint
def crashes(how=cl_arg("how", default="exit")):
    crashed = proc("crash.txt", crash, how)
    needs_crashed = run_command(name="dep.txt", command=["cp", "{inputs[0]}", "{out}"],
                                inputs=[crashed])
    cmd = run_command(name="cmd.txt", command=["sh", "-c", "echo cmd > {out}"])
    before = proc("before.txt", healthy, "before")
    return [crashed, needs_crashed, cmd, before, *then_healthy(after_death("crash", "gate"))]
"""
)


def marks(tmp_path: Path) -> dict[str, int]:
    return {p.name: int(p.read_text()) for p in (tmp_path / "marks").iterdir()}


@pytest.mark.parametrize(
    ("how", "status"),
    [("exit", "exit code 7"), ("segv", "signal SIGSEGV"), ("kill", "signal SIGKILL")],
)
def test_dead_worker_fails_its_action_alone(
    write_module, kiln, tmp_path: Path, how: str, status: str
) -> None:
    write_module(CRASH)
    r = kiln("build", "build.py", "--how", how, "-j", "2")

    assert r.returncode == 1, r.stderr
    assert f"the worker process running 'process crash.txt' died with {status}" in r.stderr
    assert "Traceback" not in r.stderr
    assert "5 built, 0 up to date, 1 failed, 1 not run" in r.stderr
    gen = tmp_path / "kiln-out" / "genfiles" / "crashes"
    assert (gen / "cmd.txt").read_text() == "cmd\n"
    assert not (gen / "dep.txt").exists()
    pids = marks(tmp_path)
    # Later process actions ran in workers started after the crash, not in the dead one.
    assert (gen / "after1.txt").read_text() == "after1"
    assert (gen / "after2.txt").read_text() == "after2"
    assert pids["crash"] not in (pids["after1"], pids["after2"])
    assert_dead(pids["crash_child"])  # what the dead worker started died with it

    again = kiln("build", "build.py", "--how", how, "-j", "2")
    assert again.returncode == 1
    assert "0 built, 5 up to date, 1 failed, 1 not run" in again.stderr


TIMEOUT = (
    ACTIONS
    + """
@entrypoint
def slow(how=cl_arg("how", default="class")):
    if how == "class":
        hung = proc("hang.txt", hang, cls=SlowProc)
    else:
        hung = proc("hang.txt", hang, timeout=4.5)
    return [hung, *then_healthy(after_death("hang", "gate"))]
"""
)


@pytest.mark.parametrize(("how", "limit"), [("class", "4 s"), ("instance", "4.5 s")])
def test_timed_out_process_action_is_killed_with_its_children(
    write_module, kiln, tmp_path: Path, how: str, limit: str
) -> None:
    write_module(TIMEOUT)
    start = time.monotonic()
    r = kiln("build", "build.py", "--how", how, "-j", "2")

    assert r.returncode == 1, r.stderr
    assert time.monotonic() - start < 60
    assert f"'process hang.txt' ran past its timeout of {limit} and was killed" in r.stderr
    assert "3 built, 0 up to date, 1 failed, 0 not run" in r.stderr
    pids = marks(tmp_path)
    assert_dead(pids["hang"], pids["hang_child"])
    assert pids["hang"] not in (pids["after1"], pids["after2"])
    assert not (tmp_path / "kiln-out" / "genfiles" / "slow" / "hang.txt").exists()


def test_timed_out_command_is_killed_with_its_children(write_module, kiln, tmp_path: Path) -> None:
    (tmp_path / "marks").mkdir()
    write_module(
        """
        @entrypoint
        def slow():
            script = "echo $$ > ../marks/sh; sleep 1000 & echo $! > ../marks/sleep; wait"
            hung = run_command(name="hang.txt", command=["sh", "-c", script], timeout=3)
            fine = run_command(name="fine.txt", command=["sh", "-c", "echo fine > {out}"])
            return [hung, fine]
        """
    )
    start = time.monotonic()
    r = kiln("build", "build.py")

    assert r.returncode == 1, r.stderr
    assert time.monotonic() - start < 60
    assert "'Running slow/hang.txt' ran past its timeout of 3 s and was killed" in r.stderr
    assert "1 built, 0 up to date, 1 failed, 0 not run" in r.stderr
    pids = marks(tmp_path)
    assert_dead(pids["sh"], pids["sleep"])
    gen = tmp_path / "kiln-out" / "genfiles" / "slow"
    assert sorted(p.name for p in gen.iterdir()) == ["fine.txt"]  # no temporary left
