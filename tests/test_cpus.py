"""The default -j: the CPUs kiln may use, under an affinity mask and cgroup quotas."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.base.cpus import usable_cpus


def _proc(tmp_path: Path, cgroup: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    return proc


def _write(path: Path, text: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for line in text.splitlines():
        name, _, value = line.partition("=")
        (path / name).write_text(value + "\n")


def test_a_cgroup_v2_quota_on_an_ancestor_bounds_the_default(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root, "cpu.max=max 100000")
    _write(root / "kubepods", "cpu.max=150000 100000")  # 1.5 CPUs: rounds up to 2
    _write(root / "kubepods" / "pod1", "cpu.max=max 100000")
    proc = _proc(tmp_path, "0::/kubepods/pod1\n")
    expected = min(len(os.sched_getaffinity(0)), 2)
    assert usable_cpus(root, proc) == expected


def test_a_quota_under_one_cpu_still_gives_one_job(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root, "cpu.max=20000 100000")
    assert usable_cpus(root, _proc(tmp_path, "0::/\n")) == 1


def test_a_cgroup_v1_quota_bounds_the_default_and_minus_one_means_none(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(
        root / "cpu,cpuacct" / "docker" / "abc", "cpu.cfs_quota_us=100000\ncpu.cfs_period_us=100000"
    )
    proc = _proc(tmp_path, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n")
    assert usable_cpus(root, proc) == 1
    _write(root / "cpu,cpuacct" / "docker" / "abc", "cpu.cfs_quota_us=-1")
    assert usable_cpus(root, proc) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "cgroup, cpu_max",
    [("", None), ("0::/x\n", "garbage"), ("0::/x\n", "0 100000"), ("not a cgroup line", None)],
)
def test_unreadable_or_odd_cgroups_leave_the_affinity_mask(
    tmp_path: Path, cgroup: str, cpu_max: str | None
) -> None:
    root = tmp_path / "cg"
    root.mkdir()
    if cpu_max is not None:
        _write(root / "x", f"cpu.max={cpu_max}")
    assert usable_cpus(root, _proc(tmp_path, cgroup)) == len(os.sched_getaffinity(0))
    assert usable_cpus(root, tmp_path / "no-proc") == len(os.sched_getaffinity(0))


def test_kiln_under_an_affinity_mask_of_one_cpu_defaults_to_one_job() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kiln", "build", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "cgroup CPU quota, here 1)" in proc.stdout, proc.stdout
