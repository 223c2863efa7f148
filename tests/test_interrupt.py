"""Ctrl-C (SIGINT) and SIGTERM during a real ``kiln build``.

No new action starts; worker processes and subprocesses are killed with their
children; partial outputs (and temporary files) are removed; what finished is
kept; kiln exits 128+N within seconds and leaves no process behind. The next
build runs only what was missing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import dead as _dead
from procs import tagged_processes, wait_for

# Every action records its start in marks/. Unless marks/fast exists, `cmd`, `proc`
# and `stuck` hang: `cmd` and `proc` in killable processes (each with a
# `sleep 1000` child), `stuck` in a thread kiln cannot cancel. `finisher` ends
# when marks/release appears, which the test creates after sending the signal;
# `late` needs it, so must not start.
MODULE = """
import functools
import os
import subprocess
import time
from pathlib import Path

from kiln.output_dir.writing import atomic_output

MARKS = Path(__file__).parent / "marks"
# Commands run in the output directory: marks/ is ../marks there.
HANG = (
    'echo $$ > ../marks/cmd; '
    '[ -e ../marks/fast ] || {{ sleep 1000 & echo $! > ../marks/cmd_child; wait; }}'
)


def record(name, pid=None):
    (MARKS / name).write_text(str(pid or os.getpid()))


def hang_in_worker(out):
    record("proc")
    with atomic_output(out) as tmp:
        tmp.write_text("partial")
        if not (MARKS / "fast").exists():
            record("proc_child", subprocess.Popen(["sleep", "1000"]).pid)
            time.sleep(1000)
        tmp.write_text("proc")


class Proc(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kw)
        self.out = out

    def _remotable_thunk(self):
        return functools.partial(hang_in_worker, str(self.out.get_fs_path()))


class Stuck(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out

    def _invoke(self):
        self.out.get_fs_path().write_text("partial")
        record("stuck")
        deadline = time.monotonic() + 1000
        while not (MARKS / "fast").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.out.get_fs_path().write_text("stuck")


class Finisher(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out

    def _invoke(self):
        record("finisher")
        while not (MARKS / "fast").exists() and not (MARKS / "release").exists():
            time.sleep(0.05)
        self.out.get_fs_path().write_text("finisher")


def custom(cls, name):
    ctx = BuildContext.current()
    out = ctx.allocate_file(name)
    out.deps.add(cls(out, desc=f"{cls.__name__.lower()} {name}", executor=ctx.executor))
    return out


@entrypoint
def work():
    done = run_command(name="done.txt", command=["sh", "-c", "echo done > {out}"])
    cmd = run_command(name="cmd.txt", command=["sh", "-c", HANG + "; echo cmd > {out}"],
                      inputs=[done])
    finisher = custom(Finisher, "finisher.txt")
    late = run_command(name="late.txt", inputs=[finisher],
                       command=["sh", "-c", "echo $$ > ../marks/late; cp {inputs[0]} {out}"])
    return [done, cmd, custom(Proc, "proc.txt"), custom(Stuck, "stuck.txt"), finisher, late]
"""

STARTED = ("cmd", "cmd_child", "proc", "proc_child", "stuck", "finisher")


def start_kiln(tmp_path: Path, tag: str, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kiln", "build", "build.py", "--action-env", "KILN_TEST_TAG", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1", "KILN_TEST_TAG": tag, **env},
        start_new_session=True,  # its own process group, like a shell job
    )


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_the_build_cleanly(
    write_module, tmp_path: Path, tag: str, signum: int
) -> None:
    write_module(MODULE)
    marks = tmp_path / "marks"
    marks.mkdir()
    kiln = start_kiln(tmp_path, tag, "-j", "5")
    try:
        wait_for(lambda: all((marks / m).exists() for m in STARTED), 60, "every action to start")
        time.sleep(0.2)  # let the recorded pids' files be complete
        if signum == signal.SIGINT:
            os.killpg(kiln.pid, signum)  # a terminal's Ctrl-C reaches the whole job
        else:
            os.kill(kiln.pid, signum)
        sent = time.monotonic()
        time.sleep(0.5)
        (marks / "release").touch()  # `finisher` now ends, while kiln is stopping
        out, err = kiln.communicate(timeout=30)
    finally:
        if kiln.poll() is None:
            kiln.kill()
            kiln.wait()
    elapsed = time.monotonic() - sent

    assert kiln.returncode == 128 + signum, err
    assert elapsed < 15, f"kiln took {elapsed:.1f}s to stop"
    assert f"interrupted by {signal.Signals(signum).name}" in err
    assert "Traceback" not in err
    pids = {m: int((marks / m).read_text()) for m in ("cmd", "cmd_child", "proc", "proc_child")}
    wait_for(lambda: all(_dead(p) for p in pids.values()), 5, f"{pids} to be killed")
    wait_for(lambda: not tagged_processes(tag), 5, "every process of the build to end")
    assert not (marks / "late").exists(), "an action started after the signal"

    out_dir = tmp_path / "kiln-out"
    gen = out_dir / "genfiles" / "work"
    assert sorted(p.name for p in gen.iterdir()) == ["done.txt", "finisher.txt"]
    leftovers = [p for p in out_dir.rglob("*") if p.is_file() and ".kiln" not in p.parts]
    assert sorted(p.name for p in leftovers) == ["done.txt", "finisher.txt"]

    (marks / "fast").touch()
    fast = {**os.environ, "NO_COLOR": "1", "KILN_TEST_TAG": tag}
    again = subprocess.run(
        [sys.executable, "-m", "kiln", "build", "build.py", "--action-env", "KILN_TEST_TAG"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=fast,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert "4 built, 2 up to date, 0 failed, 0 not run" in again.stderr
    texts = {"cmd": "cmd\n", "proc": "proc", "stuck": "stuck", "late": "finisher"}
    assert {name: (gen / f"{name}.txt").read_text() for name in texts} == texts
    third = subprocess.run(
        [sys.executable, "-m", "kiln", "build", "build.py", "--action-env", "KILN_TEST_TAG"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=fast,
        timeout=120,
    )
    assert "0 built, 6 up to date" in third.stderr


# `inline` runs on kiln's main thread, where the signal lands, once `gate` has
# started (`pre` waits for that); `gate` ends while `inline` runs, which must not
# start `late`.
INLINE = """
import os
import time
from pathlib import Path

MARKS = Path(__file__).parent / "marks"


class Inline(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(concurrency=ActionConcurrency.NONE, **kw)
        self.out = out

    def _invoke(self):
        self.out.get_fs_path().write_text("partial")
        (MARKS / "inline").touch()
        deadline = time.monotonic() + 1000
        while not os.environ.get("FAST") and time.monotonic() < deadline:
            time.sleep(0.05)
        self.out.get_fs_path().write_text("inline")


class Gate(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out

    def _invoke(self):
        (MARKS / "gate").touch()
        while not os.environ.get("FAST") and not (MARKS / "inline").exists():
            time.sleep(0.05)
        self.out.get_fs_path().write_text("gate")


class Pre(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out

    def _invoke(self):
        while not (MARKS / "gate").exists():
            time.sleep(0.05)
        self.out.get_fs_path().write_text("pre")


@entrypoint
def work():
    ctx = BuildContext.current()
    inline, gate = ctx.allocate_file("inline.txt"), ctx.allocate_file("gate.txt")
    pre = ctx.allocate_file("pre.txt")
    pre.deps.add(Pre(pre, desc="pre", executor=ctx.executor))
    inline.deps.add(Inline(inline, desc="inline", executor=ctx.executor, deps=[pre]))
    gate.deps.add(Gate(gate, desc="gate", executor=ctx.executor))
    late = run_command(name="late.txt", inputs=[gate],
                       command=["sh", "-c", "echo $$ > ../marks/late; cp {inputs[0]} {out}"])
    return [inline, late]
"""


def test_signal_during_an_inline_action_stops_the_build(
    write_module, tmp_path: Path, tag: str
) -> None:
    write_module(INLINE)
    marks = tmp_path / "marks"
    marks.mkdir()
    kiln = start_kiln(tmp_path, tag, "-j", "2")
    try:
        wait_for(lambda: (marks / "inline").exists(), 60, "the in-line action to start")
        out_dir = tmp_path / "kiln-out" / "genfiles" / "work"
        wait_for(lambda: (out_dir / "gate.txt").exists(), 30, "the gate to open")
        time.sleep(0.3)
        os.killpg(kiln.pid, signal.SIGINT)
        _, err = kiln.communicate(timeout=30)
    finally:
        if kiln.poll() is None:
            kiln.kill()
            kiln.wait()

    assert kiln.returncode == 130, err
    assert "Traceback" not in err
    assert not (marks / "late").exists(), "an action started after the signal"
    assert sorted(p.name for p in out_dir.iterdir()) == ["gate.txt", "pre.txt"]
    fast = {**os.environ, "NO_COLOR": "1", "FAST": "1"}
    again = subprocess.run(
        [sys.executable, "-m", "kiln", "build", "build.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=fast,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert "2 built, 2 up to date, 0 failed, 0 not run" in again.stderr


def test_signal_inside_a_state_write_leaves_no_transaction_open(tmp_path: Path) -> None:
    """Ctrl-C can land between BEGIN and COMMIT; the clean-up that follows (which
    records actions that finished) must still be able to write."""
    from kiln.state import ActionRecord, StateStore

    store = StateStore(tmp_path, warn=lambda message: None)
    real = store.database.connection

    class Interrupted:
        """The database, but Ctrl-C arrives in the middle of a write."""

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def executemany(self, *args: object) -> None:
            raise KeyboardInterrupt

    store.database.connection = Interrupted()  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        store.record("lost", ActionRecord("k1", {}, {}, {"gen/lost": "d1"}))
    store.database.connection = real
    store.record("kept", ActionRecord("k2", {}, {}, {"gen/kept": "d2"}))
    store.close()
    assert set(StateStore(tmp_path, warn=lambda message: None).records()) == {"kept"}
