"""Resource pools: ``--pool NAME=N`` bounds a pool's members, and an ``exclusive``
member (a benchmark in the ``machine`` pool) never runs beside another member."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kiln.engine.scheduler import SchedulerOptions
from kiln.executor import BuildAction, BuildContext, BuildFile, Executor


class Timed(BuildAction):
    """Sleeps, writes its output, and records when it ran."""

    def __init__(
        self,
        *,
        out: BuildFile,
        log: list[tuple[str, float, float]],
        sleep: float,
        lock: threading.Lock,
        **kw,
    ):
        super().__init__(**kw)
        self._out, self._log, self._sleep, self._lock = out, log, sleep, lock
        out.deps.add(self)

    def _invoke(self) -> None:
        start = time.monotonic()
        time.sleep(self._sleep)
        self._out.get_fs_path().write_text(self.desc)
        with self._lock:
            self._log.append((self.desc, start, time.monotonic()))


def _run(tmp_path: Path, spec: dict[str, tuple[str | None, bool]], **options):  # type: ignore[no-untyped-def]
    """Run one action per ``name: (pool, exclusive)``; return {name: (start, end)}."""
    log: list[tuple[str, float, float]] = []
    lock = threading.Lock()
    executor = Executor(tmp_path / "out")
    try:
        with executor.get_context(""):
            ctx = BuildContext.current()
            files = []
            for name, (pool, exclusive) in spec.items():
                out = ctx.allocate_file(name)
                action = Timed(
                    out=out, log=log, lock=lock, sleep=0.15, desc=name, executor=executor
                )
                action.pool, action.exclusive = pool, exclusive
                files.append(out)
        result = executor.run(files, SchedulerOptions(**options))
    finally:
        executor.close()
    assert result.ok
    return {name: (start, end) for name, start, end in log}


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_exclusive_members_run_alone_in_their_pool(tmp_path: Path) -> None:
    spec = {f"compile{i}": ("machine", False) for i in range(4)}
    spec |= {f"bench{i}": ("machine", True) for i in range(2)}
    spec["other"] = (None, False)
    times = _run(tmp_path, spec, jobs=4)
    for b in ("bench0", "bench1"):
        for name, span in times.items():
            if name not in (b, "other"):
                assert not _overlap(times[b], span), (b, name)
    compiles = [times[f"compile{i}"] for i in range(4)]
    assert any(_overlap(a, b) for a in compiles for b in compiles if a is not b)


@pytest.mark.parametrize("limit", [1, 2])
def test_pool_limit_bounds_its_members(tmp_path: Path, limit: int) -> None:
    spec = {f"compile{i}": ("machine", False) for i in range(4)}
    times = _run(tmp_path, spec, jobs=4, pools={"machine": limit})
    points = sorted(t for span in times.values() for t in span)
    most = max(sum(1 for s in times.values() if s[0] <= p < s[1]) for p in points)
    assert most == limit
