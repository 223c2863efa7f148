"""How many CPUs this process may use: the default of ``-j``.

``os.cpu_count()`` counts the machine's CPUs. A process pinned to some of them
(``taskset``, an affinity mask) or in a container with a CPU quota (a cgroup's
``cpu.max``, or ``cpu.cfs_quota_us`` in cgroup v1) may use fewer, and running one
memory-hungry compile per machine CPU there oversubscribes it. The answer is the
smallest of the affinity mask and every quota on the way from this process's
cgroup up to the root, rounded up, and at least 1 (as Dask and loky count).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path


def usable_cpus(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_self: Path = Path("/proc/self")
) -> int:
    """The CPUs this process may use (see the module's docstring)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = cgroup_quota(cgroup_root, proc_self)
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def cgroup_quota(cgroup_root: Path, proc_self: Path) -> float | None:
    """The tightest CPU quota (CPUs' worth of time per period) of this process's
    cgroups, or None when none is set or none can be read."""
    try:
        lines = (proc_self / "cgroup").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    quotas: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2
            quotas += _each_level(cgroup_root, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # cgroup v1
            mount = next(
                (
                    cgroup_root / n
                    for n in ("cpu,cpuacct", "cpu", controllers)
                    if (cgroup_root / n).is_dir()
                ),
                None,
            )
            if mount is not None:
                quotas += _each_level(mount, path, _v1_quota)
    return min(quotas, default=None)


def _each_level(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """The quotas found in ``path``'s cgroup and each of its ancestors under ``mount``
    (a container may see its own cgroup as the root: ``path`` is then ``/``)."""
    found: list[float] = []
    parts = [p for p in path.split("/") if p and p != ".."]
    for depth in range(len(parts), -1, -1):
        quota = read(mount.joinpath(*parts[:depth]))
        if quota is not None:
            found.append(quota)
    return found


def _v2_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if text is None:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _ratio(fields[0], fields[1])


def _v1_quota(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
