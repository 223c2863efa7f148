"""Timing whole child processes: wall time, CPU time (user + sys, the child and
every descendant it waited for), the child's own CPU time (its process alone, from
/proc before it is reaped) and peak RSS, measured by ``_launch.py``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Sample:
    """One run of a command. ``timed_out`` runs were killed at the limit."""

    wall_s: float
    cpu_s: float
    rss_mib: float
    returncode: int
    timed_out: bool = False
    log: Path | None = None
    own_cpu_s: float | None = None  # the command's process alone, threads included
    children_cpu_s: float | None = None  # the children it reaped
    sys_s: float | None = None  # the kernel's part of cpu_s

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class CommandFailed(RuntimeError):
    pass


def say(message: str) -> None:
    """Progress on stdout, at once (it is often a file)."""
    print(message, flush=True)


_LAUNCHER = Path(__file__).resolve().parent / "_launch.py"


def run_child(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    log: Path | None = None,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
) -> Sample:
    """Run ``argv`` to completion (or kill it and all it started at ``timeout_s``).

    The command is started by ``_launch.py``, which measures it (see there why);
    stdout and stderr go to ``log`` (or nowhere).
    """
    fd, result_name = tempfile.mkstemp(prefix="kiln-bench-", suffix=".json")
    os.close(fd)
    result = Path(result_name)
    launch = [sys.executable, "-I", "-S", str(_LAUNCHER), result_name, "--", *argv]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    killed = threading.Event()
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(
            launch,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )

        def kill() -> None:
            killed.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout_s, kill) if timeout_s else None
        if timer is not None:
            timer.start()
        proc.wait()
        wall = time.perf_counter() - start
        if timer is not None:
            timer.cancel()
        if killed.is_set():  # whatever the command started is in its group too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return Sample(wall, 0.0, 0.0, proc.returncode, timed_out=True, log=log)
        measured = json.loads(result.read_text() or "null")
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
        result.unlink(missing_ok=True)
    if measured is None:
        raise CommandFailed(f"the launcher did not measure {list(argv)} (log: {log})")
    return Sample(
        wall_s=measured["wall_s"],
        cpu_s=measured["cpu_s"],
        rss_mib=measured["rss_kib"] / 1024.0,
        returncode=measured["returncode"],
        log=log,
        own_cpu_s=measured.get("own_cpu_s"),
        children_cpu_s=measured.get("children_cpu_s"),
        sys_s=measured.get("sys_s"),
    )


def checked(sample: Sample, what: str) -> Sample:
    """``sample``, or CommandFailed naming ``what`` and the tail of its log."""
    if sample.ok:
        return sample
    tail = ""
    if sample.log is not None and sample.log.exists():
        tail = "\n".join(sample.log.read_text(errors="replace").splitlines()[-15:])
    why = "timed out" if sample.timed_out else f"exited with {sample.returncode}"
    raise CommandFailed(f"{what} {why} (log: {sample.log})\n{tail}")


@dataclass
class Series:
    """Samples of one system in one scenario, and what to say about them."""

    system: str
    samples: list[Sample] = field(default_factory=list)
    actions_run: int | None = None
    note: str = ""
    timeout_s: float | None = None  # set when the run was killed at this limit
    failed: bool = False  # set when the run failed: its numbers mean nothing

    @property
    def finished(self) -> bool:
        return bool(self.samples) and all(s.ok for s in self.samples)

    def _median(self, attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in self.samples)

    @property
    def wall_s(self) -> float:
        return self._median("wall_s")

    @property
    def cpu_s(self) -> float:
        return self._median("cpu_s")

    @property
    def rss_mib(self) -> float:
        return self._median("rss_mib")

    @property
    def own_cpu_s(self) -> float | None:
        """Median CPU of the command's own process, None where /proc was unreadable."""
        return self._known_median("own_cpu_s")

    @property
    def sys_s(self) -> float | None:
        """Median system (kernel) time, None where a sample did not measure it."""
        return self._known_median("sys_s")

    def _known_median(self, attr: str) -> float | None:
        values = [getattr(s, attr) for s in self.samples]
        if not values or any(v is None for v in values):
            return None
        return statistics.median(v for v in values if v is not None)
