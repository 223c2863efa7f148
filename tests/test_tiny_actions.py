"""Tiny thread actions run in-line on the scheduler's thread (``kiln.engine.limits.TinyActions``);
actions that wait or compute for long stay on the worker threads, ``-j`` at once."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from kiln.engine.limits import TinyActions
from kiln.graph import BuildAction

MODULE = """
import threading, time
from kiln import entrypoint, run_command
from kiln.executor import BuildAction, BuildContext

RUNNING = [0, 0]  # running now, most at once
LOCK = threading.Lock()


class Step(BuildAction):
    \"\"\"Writes its name; ``sleep`` seconds in the middle.\"\"\"

    def __init__(self, *, output, sleep=0.0, **kwargs):
        super().__init__(**kwargs)
        self.output = output
        self.sleep = sleep
        output.deps.add(self)

    def _invoke(self):
        with LOCK:
            RUNNING[0] += 1
            RUNNING[1] = max(RUNNING)
        if self.sleep:
            time.sleep(self.sleep)
        with LOCK:
            RUNNING[0] -= 1
        self.output.get_fs_path().write_text(f"{self.output.path} {RUNNING[1]}\\n")


class Sleeper(Step):
    pass


class Blob(Step):
    \"\"\"Writes its name, padded to ``size`` bytes.\"\"\"

    def __init__(self, *, size, **kwargs):
        super().__init__(**kwargs)
        self.size = size

    def _invoke(self):
        self.output.get_fs_path().write_bytes(self.output.path.encode().ljust(self.size, b"."))


def many(count, name, make):
    # ``count`` actions, the i-th made by ``make(output, i, executor)`` and writing
    # the file ``name(i)``; their outputs.
    ctx = BuildContext.current()
    outs = [ctx.allocate_file(name(i)) for i in range(count)]
    for i, out in enumerate(outs):
        make(out, i, ctx.executor)
    return outs


@entrypoint
def tiny():
    return many(240, lambda i: f"t{i}.txt",
                lambda out, i, ex: Step(output=out, desc=f"tiny {i}", executor=ex))


@entrypoint
def sleepy():
    return many(24, lambda i: f"s{i}.txt",
                lambda out, i, ex: Sleeper(output=out, sleep=0.03, desc=f"sleepy {i}",
                                           executor=ex))


@entrypoint
def blobs():
    return many(96, lambda i: f"{'big' if i % 2 else 'small'}{i}.bin",
                lambda out, i, ex: Blob(output=out, size=300_000 if i % 2 else 40,
                                        desc=f"blob {i}", executor=ex))


@entrypoint
def commands():
    return [run_command(name=f"c{i}.txt", command=["sh", "-c", ": > {out}"])
            for i in range(40)]
"""


def lanes(events: Path, event: str = "finished") -> dict[str, list[str]]:
    """The lanes of the finished (or ``event``) actions, by the first word of their
    description."""
    found: dict[str, list[str]] = {}
    for line in events.read_text().splitlines():
        e = json.loads(line)
        if e["event"] == event:
            found.setdefault(e["desc"].split()[0], []).append(e["lane"])
    return found


@pytest.mark.parametrize("jobs", ["1", "4"])
def test_tiny_actions_run_in_line_within_jobs(
    write_module, kiln, tmp_path: Path, jobs: str
) -> None:
    write_module(MODULE, header=False)
    r = kiln("build", "build.py", "tiny", "-j", jobs, "--no-cache", "--events", "ev.jsonl")
    assert r.returncode == 0, r.stderr
    found = lanes(tmp_path / "ev.jsonl")["tiny"]
    assert len(found) == 240
    # After the first windows on workers (more of them when the machine is busy).
    assert found.count("main") >= 80, found
    most = max(
        int(p.read_text().split()[1]) for p in (tmp_path / "kiln-out/genfiles/tiny").iterdir()
    )
    assert most <= int(jobs)
    again = kiln("build", "build.py", "tiny", "-j", jobs)
    assert "0 built, 240 up to date" in again.stderr


def test_tiny_cache_lookups_are_served_in_line(write_module, kiln, tmp_path: Path) -> None:
    """A warm cache serving a fresh output directory: the actions never run, so their
    lookups are judged on their own; small ones are served on the scheduler's thread
    after the first windows (before, every one was handed to a worker and back)."""
    write_module(MODULE, header=False)
    common = ("build", "build.py", "tiny", "-j", "2", "--cache-dir", "cache")
    assert kiln(*common, "--output-dir", "o1").returncode == 0
    r = kiln(*common, "--output-dir", "o2", "--events", "ev.jsonl")
    assert r.returncode == 0, r.stderr
    assert "0 built, 240 cached" in r.stderr
    served = lanes(tmp_path / "ev.jsonl", "cached")["tiny"]
    assert len(served) == 240
    assert served.count("main") >= 80, served
    assert sorted(p.read_text() for p in (tmp_path / "o2/genfiles/tiny").iterdir()) == sorted(
        p.read_text() for p in (tmp_path / "o1/genfiles/tiny").iterdir()
    )


def test_a_hit_that_copies_a_blob_is_never_served_on_the_schedulers_thread(
    write_module, kiln, tmp_path: Path
) -> None:
    """Outputs kept in their entry are served in-line once lookups of their type are
    tiny; one kept as a blob is copied by a worker, whatever the type's other hits
    cost (a large copy on the scheduler's thread would hold up the whole build)."""
    write_module(MODULE, header=False)
    common = ("build", "build.py", "blobs", "-j", "2", "--cache-dir", "cache")
    assert kiln(*common, "--output-dir", "o1").returncode == 0
    r = kiln(*common, "--output-dir", "o2", "--events", "ev.jsonl")
    assert r.returncode == 0, r.stderr
    assert "0 built, 96 cached" in r.stderr
    events = [json.loads(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()]
    lane_of = {
        e["outputs"][0]["path"].rsplit("/", 1)[1]: e["lane"]
        for e in events
        if e["event"] == "cached"
    }
    big = [lane for name, lane in lane_of.items() if name.startswith("big")]
    small = [lane for name, lane in lane_of.items() if name.startswith("small")]
    assert len(big) == len(small) == 48
    assert "main" not in big, big
    assert small.count("main") >= 16, small
    assert tree_bytes(tmp_path / "o2") == tree_bytes(tmp_path / "o1")


def tree_bytes(out: Path) -> dict[str, bytes]:
    gen = out / "genfiles" / "blobs"
    return {p.name: p.read_bytes() for p in gen.iterdir()}


def test_ctrl_c_during_a_lookup_on_the_schedulers_thread_stops_at_once(
    write_module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or SIGTERM) that lands in a lookup made on the scheduler's thread ends
    the build at once: the action it was looking up is not waited for as running."""
    import io
    import time

    from kiln.cache import build_cache
    from kiln.cli.main import run_cli
    from kiln.engine import interruption

    write_module(MODULE, header=False)
    monkeypatch.chdir(tmp_path)
    common = ["build", "build.py", "tiny", "-j", "2", "--cache-dir", "cache"]
    assert run_cli([*common, "--output-dir", "o1"], stdout=io.StringIO(), stderr=io.StringIO()) == 0
    monkeypatch.setattr(interruption, "WAIT_S", 30.0)  # what waiting for it would cost
    real = build_cache.BuildCache.restore_small
    calls: list[str] = []

    def interrupted(self: Any, key: str, outputs: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            calls.append(key)
            if len(calls) == 30:
                raise KeyboardInterrupt
        return real(self, key, outputs)

    monkeypatch.setattr(build_cache.BuildCache, "restore_small", interrupted)
    err = io.StringIO()
    started = time.monotonic()
    code = run_cli([*common, "--output-dir", "o2"], stdout=io.StringIO(), stderr=err)
    assert code == 130, err.getvalue()
    assert len(calls) == 30
    assert time.monotonic() - started < 15  # not the 30 s a forgotten running action costs


def test_waiting_actions_stay_on_workers_jobs_at_once(write_module, kiln, tmp_path: Path) -> None:
    write_module(MODULE, header=False)
    r = kiln(
        "build", "build.py", "sleepy", "commands", "-j", "4", "--no-cache", "--events", "ev.jsonl"
    )
    assert r.returncode == 0, r.stderr
    found = lanes(tmp_path / "ev.jsonl")
    assert len(found["sleepy"]) == 24 and len(found["Running"]) == 40
    assert all(lane.startswith("kiln-") for lane in found["sleepy"] + found["Running"]), found
    most = max(
        int(p.read_text().split()[1]) for p in (tmp_path / "kiln-out/genfiles/sleepy").iterdir()
    )
    assert most == 4  # -j 4 of them at once


class _A(BuildAction):
    pass


class _B(BuildAction):
    pass


def _feed(judge: TinyActions, action: Any, runs: list[tuple[float, float]], inline: bool) -> None:
    for cpu, wall in runs:
        judge.observe(action, cpu, wall, inline)


def test_judge_promotes_by_window_and_demotes_by_vote() -> None:
    judge = TinyActions()
    a, b = object.__new__(_A), object.__new__(_B)
    _feed(judge, a, [(0.0001, 0.0002)] * 7, inline=False)
    assert not judge.is_tiny(a)  # a window is not full yet
    _feed(judge, a, [(0.0001, 0.03)], inline=False)  # one slow run (preempted) does not decide
    assert judge.is_tiny(a) and not judge.is_tiny(b)
    _feed(judge, a, [(0.0001, 0.0001)] * 3, inline=False)  # late worker runs are ignored
    _feed(judge, a, [(0.005, 0.005)] * 8, inline=True)  # in-line, too slow: back to workers
    assert not judge.is_tiny(a)
    _feed(judge, a, [(0.0001, 0.0002)] * 8, inline=False)
    assert judge.is_tiny(a)
    _feed(judge, a, [(0.06, 0.06)], inline=True)  # one very long run is enough
    assert not judge.is_tiny(a)
    _feed(judge, a, [(0.0001, 0.0002)] * 8, inline=False)
    _feed(judge, a, [(0.0001, 0.0015)] * 8, inline=True)  # short, but waiting: never again
    assert not judge.is_tiny(a)
    _feed(judge, a, [(0.0001, 0.0002)] * 16, inline=False)
    assert not judge.is_tiny(a)
    _feed(judge, b, [(0.0025, 0.003)] * 8, inline=False)  # too much CPU: stays on workers
    assert not judge.is_tiny(b)


def test_judge_is_safe_from_many_threads() -> None:
    judge = TinyActions()
    a = object.__new__(_A)
    threads = [
        threading.Thread(target=_feed, args=(judge, a, [(0.0001, 0.0002)] * 800, False))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert judge.is_tiny(a)


def test_judge_keeps_a_type_near_its_bound_where_it_is() -> None:
    """Runs between the two bounds change nothing: a type whose CPU per run sits near
    one bound does not flip between in-line and the workers window by window."""
    judge = TinyActions()
    a, b = object.__new__(_A), object.__new__(_B)
    _feed(judge, a, [(0.0015, 0.0018)] * 8, inline=False)  # the GIL's handing over shows
    assert judge.is_tiny(a)
    _feed(judge, a, [(0.003, 0.0031)] * 64, inline=True)  # a slower stretch of the disk
    assert judge.is_tiny(a)
    _feed(judge, b, [(0.003, 0.0031)] * 64, inline=False)
    assert not judge.is_tiny(b)
