"""``timeout`` on THREAD and in-line (NONE) actions: a thread action past its
timeout fails with ActionTimeout and its thread is abandoned, and the rest of the
build goes on; an in-line action with a timeout is refused before anything runs."""

from __future__ import annotations

import time
from pathlib import Path

ACTIONS = """
import threading, time
from pathlib import Path

class Sleepy(BuildAction):
    def __init__(self, out, seconds, **kw):
        super().__init__(desc=f"sleepy {out.path}", executor=out.executor, **kw)
        self.out, self.seconds = out, seconds
        out.deps.add(self)

    def _invoke(self):
        time.sleep(self.seconds)
        Path(self.out.get_fs_path()).write_text(threading.current_thread().name)

def sleepy(name, seconds, timeout=None, concurrency=ActionConcurrency.THREAD):
    out = BuildContext.current().allocate_file(name)
    action = Sleepy(out, seconds, concurrency=concurrency)
    action.timeout = timeout
    return out
"""


def test_a_thread_action_past_its_timeout_fails_and_is_abandoned(
    write_module, kiln, tmp_path: Path
) -> None:
    write_module(
        ACTIONS
        + """
@entrypoint
def slow():
    return [sleepy("hang.txt", 30, timeout=0.5), sleepy("fine.txt", 0, timeout=10),
            sleepy("free.txt", 0)]
"""
    )
    start = time.monotonic()
    r = kiln("build", "build.py")

    assert r.returncode == 1, r.stderr
    assert time.monotonic() - start < 20  # not the 30 s the action sleeps
    assert "'sleepy slow/hang.txt' ran past its timeout of 0.5 s" in r.stderr
    assert "abandoned" in r.stderr
    assert "2 built, 0 up to date, 1 failed" in r.stderr
    gen = tmp_path / "kiln-out" / "genfiles" / "slow"
    assert not (gen / "hang.txt").exists()
    assert (gen / "fine.txt").exists() and (gen / "free.txt").exists()


def test_a_thread_action_within_its_timeout_builds_and_is_up_to_date_next_time(
    write_module, tmp_path: Path, monkeypatch
) -> None:
    import io

    from kiln.cli.main import run_cli

    write_module(
        ACTIONS
        + """
@entrypoint
def quick():
    return sleepy("quick.txt", 0.05, timeout=30)
"""
    )
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    assert run_cli(["build", "build.py", "--no-cache"], stdout=io.StringIO(), stderr=err) == 0
    assert "1 built" in err.getvalue()
    assert (tmp_path / "kiln-out" / "genfiles" / "quick" / "quick.txt").exists()
    err = io.StringIO()
    assert run_cli(["build", "build.py", "--no-cache"], stdout=io.StringIO(), stderr=err) == 0
    assert "0 built, 1 up to date" in err.getvalue()


def test_a_timeout_on_an_in_line_action_is_refused_before_anything_runs(
    write_module, tmp_path: Path, monkeypatch
) -> None:
    import io

    from kiln.cli.main import run_cli

    path = write_module(
        ACTIONS
        + """
@entrypoint
def inline():
    first = sleepy("first.txt", 0)
    return [first, sleepy("late.txt", 0, timeout=1, concurrency=ActionConcurrency.NONE)]
"""
    )
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()

    assert run_cli(["build", "build.py"], stdout=out, stderr=err) == 2
    message = err.getvalue()
    assert "'sleepy inline/late.txt' is an in-line (ActionConcurrency.NONE) action" in message
    assert "use ActionConcurrency.THREAD or PROCESS, or drop the timeout" in message
    assert f"{path}:" in message  # names the line that defined the action
    assert not (tmp_path / "kiln-out" / "genfiles" / "inline" / "first.txt").exists()
    # Listing the graph needs no runnable actions.
    assert run_cli(["list", "build.py"], stdout=io.StringIO(), stderr=io.StringIO()) == 0


def test_a_timeout_that_is_not_a_positive_number_is_refused(
    write_module, tmp_path: Path, monkeypatch
) -> None:
    import io

    from kiln.cli.main import run_cli

    write_module(
        ACTIONS
        + """
@entrypoint
def bad():
    return sleepy("x.txt", 0, timeout="10")
"""
    )
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    assert run_cli(["build", "build.py"], stdout=io.StringIO(), stderr=err) == 2
    assert "timeout must be a positive number of seconds or None, got '10'" in err.getvalue()
