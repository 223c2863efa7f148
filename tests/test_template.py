"""The worker template of PROCESS actions (``kiln.execution.process.template``), through
``ProcessPool``: a fresh worker per thunk, libraries a thunk names imported once by the template,
timeouts that kill the worker's process group, a template that dies replaced,
and nothing left running after ``shutdown``."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import assert_dead, dead, wait_for

from kiln.base.errors import ActionTimeout, WorkerCrashed
from kiln.execution.process.pool import ProcessPool
from kiln.execution.process.template import template_modules

PROBE = "xml.dom.minidom"  # imported by neither kiln nor the template on its own


def write_pid(path: str) -> None:
    Path(path).write_text(f"{os.getpid()} {os.getppid()}")


def probe_loaded(path: str) -> None:
    Path(path).write_text(str(PROBE in sys.modules))


@template_modules(PROBE)
def probe_loaded_marked(path: str) -> None:
    probe_loaded(path)


def sleep_with_child(path: str) -> None:
    child = subprocess.Popen(["sleep", "1000"])
    Path(path).write_text(f"{os.getpid()} {child.pid}")
    time.sleep(1000)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[ProcessPool]:
    p = ProcessPool(dict(os.environ), str(tmp_path))
    yield p
    p.shutdown()


def test_each_thunk_runs_in_a_fresh_worker_of_one_template(
    pool: ProcessPool, tmp_path: Path
) -> None:
    seen = []
    for i in range(3):
        out = tmp_path / f"pid{i}"
        pool.run(functools.partial(write_pid, str(out)), f"pid {i}", None)
        seen.append(tuple(map(int, out.read_text().split())))
    pids, parents = {pid for pid, _ in seen}, {parent for _, parent in seen}
    assert len(pids) == 3 and os.getpid() not in pids
    assert len(parents) == 1 and os.getpid() not in parents  # forked by the template
    assert_dead(*pids)


def test_modules_a_thunk_names_are_imported_by_the_template(
    pool: ProcessPool, tmp_path: Path
) -> None:
    before, marked, after = (tmp_path / n for n in ("before", "marked", "after"))
    pool.run(functools.partial(probe_loaded, str(before)), "before", None)
    pool.run(functools.partial(probe_loaded_marked, str(marked)), "marked", None)
    pool.run(functools.partial(probe_loaded, str(after)), "after", None)
    # The thunk itself never imports it: the template did, before forking.
    assert [p.read_text() for p in (before, marked, after)] == ["False", "True", "True"]


def test_a_timeout_kills_the_worker_and_its_children(pool: ProcessPool, tmp_path: Path) -> None:
    out = tmp_path / "pids"
    started = time.monotonic()
    # The worker imports this test module (and pytest) before the thunk runs: under
    # CI's load that took over 1 s once, so the deadline leaves room to write the pids.
    with pytest.raises(ActionTimeout, match="ran past its timeout of 5 s"):
        pool.run(functools.partial(sleep_with_child, str(out)), "sleeper", 5.0)
    assert time.monotonic() - started < 30
    worker, child = map(int, out.read_text().split())
    assert dead(worker)  # gone before run() returned
    assert_dead(child)


def test_a_dead_template_fails_its_running_action_and_is_replaced(
    pool: ProcessPool, tmp_path: Path
) -> None:
    import threading

    out = tmp_path / "pids"
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pool.run(functools.partial(sleep_with_child, str(out)), "sleeper", 60)
        except BaseException as e:  # noqa: BLE001 - checked below
            failures.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: out.exists() and len(out.read_text().split()) == 2, 30, "the worker")
    worker, child = map(int, out.read_text().split())
    template = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(template, signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], WorkerCrashed), failures
    assert "worker template" in str(failures[0])
    assert_dead(worker)
    os.kill(child, signal.SIGKILL)  # orphaned to init here (no build reaper in this test)
    again = tmp_path / "again"
    pool.run(functools.partial(write_pid, str(again)), "again", None)
    assert int(again.read_text().split()[1]) != template


def test_shutdown_kills_running_workers_and_the_template(pool: ProcessPool, tmp_path: Path) -> None:
    import threading

    out = tmp_path / "pids"
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pool.run(functools.partial(sleep_with_child, str(out)), "sleeper", None)
        except BaseException as e:  # noqa: BLE001 - checked below
            failures.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: out.exists() and len(out.read_text().split()) == 2, 30, "the worker")
    worker, child = map(int, out.read_text().split())
    template = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])
    pool.shutdown()
    thread.join(30)
    assert len(failures) == 1 and "signal SIGKILL" in str(failures[0]), failures
    assert_dead(worker, child, template)


def write_cwd(path: str) -> None:
    Path(path).write_text(os.getcwd())


def test_a_worker_runs_in_its_own_directory_and_is_killed_alone(
    pool: ProcessPool, tmp_path: Path
) -> None:
    """``cwd`` moves one worker (the pool's other workers keep the pool's); the kill
    handed to ``started`` stops that worker and its children, not the template."""
    import threading

    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    pool.run(functools.partial(write_cwd, "where"), "where", None, cwd=str(sandbox))
    pool.run(functools.partial(write_cwd, str(tmp_path / "home")), "home", None)
    assert (sandbox / "where").read_text() == str(sandbox)
    assert (tmp_path / "home").read_text() == str(tmp_path)

    out = tmp_path / "pids"
    kills: list = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pool.run(
                functools.partial(sleep_with_child, str(out)), "sleeper", None, started=kills.append
            )
        except BaseException as e:  # noqa: BLE001 - checked below
            failures.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: out.exists() and len(out.read_text().split()) == 2, 30, "the worker")
    worker, child = map(int, out.read_text().split())
    assert len(kills) == 1
    kills[0]()
    thread.join(30)
    assert not thread.is_alive()
    assert len(failures) == 1 and "signal SIGKILL" in str(failures[0]), failures
    assert_dead(worker, child)
    again = tmp_path / "again"
    pool.run(functools.partial(write_pid, str(again)), "again", None)  # same template
    assert again.exists()
