"""Remote execution on a real Dask cluster (``dask scheduler`` and two ``dask
worker`` processes with their own local directories, on 127.0.0.1) with a real
nginx remote cache: outputs byte-identical to a local build, actions in worker
sandboxes, workers and the scheduler killed mid-build, Ctrl-C, usage errors."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dask_cluster import DaskCluster, require_dask
from dask_cluster import dask_cluster as dask_cluster  # noqa: F401 - the fixture
from nginx import NginxCache, free_port

_THUNK_ACTIONS = """
import functools, os

def _shout(src, out, extra):
    with open(src) as f, open(out, "w") as g:
        g.write(f.read().upper() + extra())

def _nothing():
    return ""

class Shout(BuildAction):
    def __init__(self, src, out, extra=_nothing, **kw):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kw)
        self.src, self.out, self.extra = src, out, extra
        self.deps.add(src)
        out.deps.add(self)

    def _remotable_thunk(self):
        return self._sandbox_thunk(lambda f: str(f.get_fs_path()))

    def _sandbox_thunk(self, path):
        return functools.partial(_shout, path(self.src), path(self.out), self.extra)

class StaysHere(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kw)
        self.out = out
        out.deps.add(self)

    def _remotable_thunk(self):
        return functools.partial(_where, str(self.out.get_fs_path()))

def _where(out):
    with open(out, "w") as f:
        f.write(os.getcwd())

def shout(name, src, extra=_nothing):
    ctx = BuildContext.current()
    out = ctx.allocate_file(name)
    Shout(src, out, extra, desc=f"Shouting {name}", executor=ctx.executor)
    return out
"""


def start_kiln(cwd: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "kiln", *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 90) -> str:
    """The content of ``path`` once the action wrote it (the build must not end first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            pytest.fail(f"the build ended first: {proc.communicate()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"{path} was not written within {timeout} s: {proc.communicate()}")


def lanes(events: Path) -> dict[str, str]:
    """The lane of each finished (or failed) action, by description."""
    found = {}
    for line in events.read_text().splitlines():
        e = json.loads(line)
        if e.get("event") in ("finished", "failed"):
            found[e["desc"]] = e.get("lane")
    return found


def remote_args(cluster: DaskCluster, cache: NginxCache, out: str, *more: str) -> list[str]:
    return [
        "build",
        "build.py",
        "--output-dir",
        out,
        "--cache-dir",
        f"cache-{out}",
        "--executor",
        cluster.url,
        "--remote-cache",
        cache.url,
        *more,
    ]


def test_outputs_are_byte_identical_to_a_local_build(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    dask_cluster: DaskCluster,
    nginx_cache: NginxCache,
) -> None:
    (tmp_path / "data.txt").write_text("hello cluster\n")
    write_module(
        _THUNK_ACTIONS
        + """
@entrypoint
def top():
    src = source_file("data.txt")
    a = run_command(name="a.txt", command=["sh", "-c", "cat {inputs[0]} {inputs[0]} > {out}"],
                    inputs=[src])
    b = shout("b.txt", a)
    return run_command(name="c.txt", command=["sh", "-c", "cat {inputs[0]} {inputs[1]} > {out}"],
                       inputs=[a, b])
"""
    )
    local = kiln("build", "build.py", "--output-dir", "local", "--no-cache")
    assert local.returncode == 0, local.stderr
    remote = kiln(*remote_args(dask_cluster, nginx_cache, "remote", "--events", "ev.jsonl"))
    assert remote.returncode == 0, remote.stderr
    for name in ("a.txt", "b.txt", "c.txt"):
        mine = (tmp_path / "remote/genfiles/top" / name).read_bytes()
        assert mine == (tmp_path / "local/genfiles/top" / name).read_bytes(), name
    assert (tmp_path / "remote/genfiles/top/c.txt").read_text() == (
        "hello cluster\nhello cluster\nHELLO CLUSTER\nHELLO CLUSTER\n"
    )
    worker_addresses = lanes(tmp_path / "ev.jsonl")
    assert len(worker_addresses) == 3
    assert all(lane.startswith("dask tcp://127.0.0.1:") for lane in worker_addresses.values())
    manifest = json.loads((tmp_path / "remote/manifest.json").read_text())
    (c_entry,) = manifest["entrypoints"]["top"]["outputs"]
    assert c_entry["worker"] == worker_addresses["Running top/c.txt"].removeprefix("dask ")
    assert f"Running top/c.txt: ran on Dask worker {c_entry['worker']}" in remote.stderr
    # The outputs went through the CAS; a rebuild runs nothing.
    assert len(nginx_cache.files("cas")) >= 4
    again = kiln(*remote_args(dask_cluster, nginx_cache, "remote"))
    assert again.returncode == 0 and "0 built, 3 up to date" in again.stderr, again.stderr


def test_a_module_compiled_on_a_worker_is_the_local_modules_bytes(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    dask_cluster: DaskCluster,
    nginx_cache: NginxCache,
) -> None:
    """Import and compile (for the host CPU too: compiled for this machine's CPU on
    any worker) on the cluster give the bytes a local build gives; so does a
    command that writes the paths it is given."""
    from test_same_bytes import _project, tree

    _project(tmp_path)
    local = kiln("build", "build.py", "--output-dir", "local", "--no-cache")
    assert local.returncode == 0, local.stderr
    remote = kiln(*remote_args(dask_cluster, nginx_cache, "remote", "--events", "ev.jsonl"))
    assert remote.returncode == 0, remote.stderr
    ran_there = lanes(tmp_path / "ev.jsonl")
    assert all(
        ran_there[d].startswith("dask ")
        for d in ran_there
        if d.startswith(("Compiling", "Importing", "Running"))
    ), ran_there
    assert tree(tmp_path / "remote") == tree(tmp_path / "local")


def test_actions_run_in_a_sandbox_inside_a_workers_directory(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    dask_cluster: DaskCluster,
    nginx_cache: NginxCache,
) -> None:
    (tmp_path / "data.txt").write_text("x")
    write_module(
        _THUNK_ACTIONS
        + """
@entrypoint
def top():
    cmd = run_command(name="cmd.txt", command=["sh", "-c", "pwd > {out}"])
    thunk = shout("thunk.txt", source_file("data.txt"), extra=os.getcwd)
    ctx = BuildContext.current()
    here = ctx.allocate_file("here.txt")
    StaysHere(here, desc="Staying here", executor=ctx.executor)
    return [cmd, thunk, here]
"""
    )
    r = kiln(*remote_args(dask_cluster, nginx_cache, "out"))
    assert r.returncode == 0, r.stderr
    top = tmp_path / "out/genfiles/top"
    cmd_dir = (top / "cmd.txt").read_text().strip()
    thunk_dir = (top / "thunk.txt").read_text()[1:]
    for where in (cmd_dir, thunk_dir):
        assert dask_cluster.worker_of(where) is not None, where
        assert "/kiln/sandbox-" in where
        assert not os.path.exists(where)  # the sandbox is removed after the action
    # A process action that cannot say where its files are runs here, with a note.
    assert dask_cluster.worker_of((top / "here.txt").read_text()) is None
    assert "StaysHere actions run on this machine" in r.stderr


def test_jobs_bounds_the_actions_in_flight_on_the_cluster(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    dask_cluster: DaskCluster,
    nginx_cache: NginxCache,
) -> None:
    log = tmp_path / "spans.log"
    write_module(f"""
@entrypoint
def top():
    return [run_command(name=f"{{i}}.txt", command=["sh", "-c",
            "echo start $(date +%s.%N) >> {log}; sleep 0.4; echo end $(date +%s.%N) >> {log}; "
            "echo x > {{out}}"]) for i in range(4)]
""")
    r = kiln(*remote_args(dask_cluster, nginx_cache, "out", "-j", "1"))
    assert r.returncode == 0, r.stderr
    marks = [line.split() for line in log.read_text().splitlines()]
    assert [m[0] for m in marks] == ["start", "end"] * 4  # never two at once


def test_a_resource_pool_maps_to_dask_worker_resources(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    nginx_cache: NginxCache,
) -> None:
    require_dask()
    log = tmp_path / "spans.log"
    write_module(f"""
def in_pool(f):
    for action in f.deps:
        action.pool = "memory"
    return f

def span(tag):
    return (f"echo start {{tag}} $(pwd) >> {log}; sleep 0.3; echo end {{tag}} $(pwd) >> {log}; "
            "echo x > {{out}}")

@entrypoint
def top():
    heavy = [in_pool(run_command(name=f"m{{i}}.txt", command=["sh", "-c", span("m")]))
             for i in range(3)]
    light = [run_command(name=f"l{{i}}.txt", command=["sh", "-c", span("l")])
             for i in range(3)]
    return heavy + light
""")
    # Only w0 has the resource, and one unit of it: kiln's own pool allows 3 at once.
    cluster = DaskCluster(tmp_path / "cluster", worker_args={"w0": ["--resources", "memory=1"]})
    try:
        r = kiln(*remote_args(cluster, nginx_cache, "out", "-j", "4", "--pool", "memory=3"))
        marks = [line.split() for line in log.read_text().splitlines()]
        workers = {(tag, cluster.worker_of(where)) for _, tag, where in marks}
    finally:
        cluster.close()
    assert r.returncode == 0, r.stderr
    heavy = [(what, where) for what, tag, where in marks if tag == "m"]
    assert {w for t, w in workers if t == "m"} == {"w0"}, marks
    assert [what for what, _ in heavy] == ["start", "end"] * 3  # one unit: never two at once
    assert len(heavy) == 6 and {w for t, w in workers if t == "l"} <= {"w0", "w1"}


def test_a_worker_killed_mid_action_is_retried_on_the_other(
    tmp_path: Path,
    write_module: Callable[..., Path],
    dask_cluster: DaskCluster,
    nginx_cache: NginxCache,
) -> None:
    marker = tmp_path / "started"
    write_module(f"""
@entrypoint
def top():
    return run_command(name="slow.txt", command=["sh", "-c",
                       "pwd >> {marker}; sleep 3; echo done > {{out}}"])
""")
    proc = start_kiln(
        tmp_path, *remote_args(dask_cluster, nginx_cache, "out", "--events", "ev.jsonl")
    )
    first = dask_cluster.worker_of(wait_for(marker, proc).splitlines()[0])
    assert first is not None
    dask_cluster.kill_worker(first)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert (tmp_path / "out/genfiles/top/slow.txt").read_text() == "done\n"
    runs = marker.read_text().splitlines()
    assert len(runs) == 2 and dask_cluster.worker_of(runs[1]) not in (None, first)


def test_an_action_whose_workers_all_die_fails_naming_it_and_the_worker(
    tmp_path: Path,
    write_module: Callable[..., Path],
    nginx_cache: NginxCache,
) -> None:
    require_dask()
    cluster = DaskCluster(
        tmp_path / "cluster", env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}
    )
    try:
        marker = tmp_path / "started"
        write_module(f"""
@entrypoint
def top():
    return run_command(name="doomed.txt", command=["sh", "-c",
                       "pwd >> {marker}; sleep 30; echo done > {{out}}"])
""")
        proc = start_kiln(tmp_path, *remote_args(cluster, nginx_cache, "out"))
        victim = cluster.worker_of(wait_for(marker, proc))
        assert victim is not None
        cluster.kill_worker(victim)
        _, err = proc.communicate(timeout=120)
    finally:
        cluster.close()
    assert proc.returncode == 1, err
    assert "'Running top/doomed.txt': every Dask worker that ran it died" in err
    assert "tcp://127.0.0.1:" in err and "Traceback" not in err
    assert not (tmp_path / "out/genfiles/top/doomed.txt").exists()
    # A crash is no failure of the action's own: nothing is remembered, the next
    # build runs it again.
    with sqlite3.connect(tmp_path / "out/.kiln/state.db") as db:
        assert db.execute("SELECT count(*) FROM failures WHERE remembered").fetchone() == (0,)


def test_a_failure_on_the_cluster_is_not_remembered(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    dask_cluster: DaskCluster,
    nginx_cache: NginxCache,
) -> None:
    # The worker's machine is not in the key, and its error comes back as text: a
    # failure there is retried by the next build, on the cluster or here.
    counter = tmp_path / "counter"
    write_module(f"""
@entrypoint
def top():
    return run_command(name="bad.txt", command=["sh", "-c", "echo ran >> {counter}; exit 3"])
""")
    for n in (1, 2):
        r = kiln(*remote_args(dask_cluster, nginx_cache, "out"))
        assert r.returncode == 1 and "(unchanged)" not in r.stderr, r.stderr
        assert "(on Dask worker tcp://127.0.0.1:" in r.stderr
        assert len(counter.read_text().splitlines()) == n
    here = kiln("build", "build.py", "--output-dir", "out", "--cache-dir", "cache-out")
    assert here.returncode == 1 and len(counter.read_text().splitlines()) == 3


def test_losing_the_scheduler_fails_the_build_and_a_rerun_resumes(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    nginx_cache: NginxCache,
) -> None:
    require_dask()
    marker = tmp_path / "started"
    write_module(f"""
@entrypoint
def top():
    first = run_command(name="first.txt", command=["sh", "-c", "echo 1 > {{out}}"])
    return run_command(name="second.txt", inputs=[first], command=["sh", "-c",
        "if test ! -e {marker}; then pwd > {marker}; sleep 60; fi; cat {{inputs[0]}} > {{out}}"])
""")
    cluster = DaskCluster(tmp_path / "c1")
    try:
        proc = start_kiln(tmp_path, *remote_args(cluster, nginx_cache, "out"))
        wait_for(marker, proc)
        cluster.kill_scheduler()
        _, err = proc.communicate(timeout=120)
    finally:
        cluster.close()
    assert proc.returncode == 1, err
    assert "lost the Dask scheduler at tcp://127.0.0.1:" in err and "Traceback" not in err, err
    assert not (tmp_path / "out/genfiles/top/second.txt").exists()
    cluster = DaskCluster(tmp_path / "c2")
    try:
        r = kiln(*remote_args(cluster, nginx_cache, "out"))
    finally:
        cluster.close()
    assert r.returncode == 0, r.stderr
    assert "1 built, 1 up to date" in r.stderr
    assert (tmp_path / "out/genfiles/top/second.txt").read_text() == "1\n"


def test_ctrl_c_cancels_the_clusters_work_and_exits_130(
    tmp_path: Path,
    write_module: Callable[..., Path],
    dask_cluster: DaskCluster,
    nginx_cache: NginxCache,
) -> None:
    marker = tmp_path / "started"
    write_module(f"""
@entrypoint
def top():
    return run_command(name="long.txt", command=["sh", "-c",
                       "echo $$ > {marker}; sleep 60; echo done > {{out}}"])
""")
    proc = start_kiln(tmp_path, *remote_args(dask_cluster, nginx_cache, "out"))
    pid = int(wait_for(marker, proc))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    # The command on the worker is stopped, not left to run its minute.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")
    from distributed import Client

    with Client(dask_cluster.address, timeout=10) as client:

        def kiln_tasks() -> int:  # what the scheduler still holds of kiln's
            return int(
                client.run_on_scheduler(
                    lambda dask_scheduler: sum(
                        1 for key in dask_scheduler.tasks if str(key).startswith("kiln-")
                    )
                )
            )

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and kiln_tasks():
            time.sleep(0.2)
        assert kiln_tasks() == 0


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--executor", "dask://127.0.0.1:9"], "needs --remote-cache"),
        (
            ["--executor", "dask-local:2", "--remote-cache", "http://127.0.0.1:9", "--no-cache"],
            "drop --no-cache",
        ),
        (["--executor", "dask:/nowhere"], "--executor 'dask:/nowhere': give local"),
        (["--executor", "dask-local:0"], "dask-local:N"),
    ],
)
def test_bad_executor_options_are_usage_errors(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    args: list[str],
    expected: str,
) -> None:
    write_module('@entrypoint\ndef top():\n    return run_command(name="a", command=["true"])\n')
    r = kiln("build", "build.py", *args)
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "kiln-out").exists()


def test_without_dask_the_executor_names_the_extra(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
) -> None:
    blocker = tmp_path / "blocked"
    blocker.mkdir()
    (blocker / "distributed.py").write_text("raise ImportError('no distributed here')\n")
    write_module('@entrypoint\ndef top():\n    return run_command(name="a", command=["true"])\n')
    path = os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])
    r = kiln(
        "build",
        "build.py",
        "--executor",
        "dask-local:1",
        "--remote-cache",
        "http://127.0.0.1:9",
        env={"PYTHONPATH": path},
    )
    assert r.returncode == 2 and "pip install 'kiln[dask]'" in r.stderr, r.stderr


def test_an_unreachable_scheduler_is_a_usage_error(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
) -> None:
    require_dask()
    write_module('@entrypoint\ndef top():\n    return run_command(name="a", command=["true"])\n')
    port = free_port()
    r = kiln(
        "build",
        "build.py",
        "--executor",
        f"dask://127.0.0.1:{port}",
        "--remote-cache",
        "http://127.0.0.1:9",
    )
    assert r.returncode == 2, r.stderr
    assert f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}" in r.stderr


def test_an_action_run_on_a_worker_keeps_its_key_in_the_next_build(
    tmp_path: Path, dask_cluster: DaskCluster, nginx_cache: NginxCache
) -> None:
    """Where an action ran is a fact of that build's record, never an attribute of
    the action: the same executor builds again and finds everything up to date."""
    from kiln.cache import BuildCache, LocalCache
    from kiln.cache.remote import RemoteCache
    from kiln.execution.cluster.dask_client import DaskClient
    from kiln.execution.cluster.offload import ClusterOffload
    from kiln.execution.cluster.spec import parse_executor
    from kiln.executor import BuildContext, Executor, SchedulerOptions

    executor = Executor(tmp_path / "out")
    executor.cache = BuildCache(
        LocalCache(tmp_path / "cache"), RemoteCache(nginx_cache.url), warn=print
    )

    def ep() -> object:
        ctx = BuildContext.current()
        return run_command_here(ctx)

    from kiln.actions.process import run_command

    def run_command_here(ctx: BuildContext) -> object:
        return run_command(name="x.txt", command=["sh", "-c", "echo remote > {out}"])

    executor.analyze(ep)
    (target,) = [f for f in executor.graph.files() if f.path.endswith("x.txt")]
    cluster = DaskClient(parse_executor(dask_cluster.url), nginx_cache.url)
    try:
        executor.remote = ClusterOffload(cluster, executor.cache, executor.cache.remote, print)
        first = executor.run([target], SchedulerOptions(jobs=1))
        assert first.ok and len(first.built) == 1
        (action,) = first.built
        assert first.runs[action].worker is not None  # it ran on the cluster
        assert "remote_worker" not in vars(action)
        again = executor.run([target], SchedulerOptions(jobs=1))
        assert again.ok and again.skipped == [action] and not again.built
    finally:
        cluster.close()
        executor.close()
