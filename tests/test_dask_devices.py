"""Devices on a real Dask cluster: three workers that advertise stand-in devices
(``KILN_DEVICES``) and publish them as resources when kiln connects; an action
that ``needs`` a device runs only on a worker with it, is skipped within seconds
when none has it, is keyed by the device, and is retried on another worker with
the same device when its worker dies."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dask_cluster import DaskCluster, require_dask
from nginx import NginxCache
from test_dask_executor import remote_args, start_kiln, wait_for

H100 = "cuda:sm_90=H100"
DEVICES = {
    "w0": {"KILN_DEVICES": H100},
    "w1": {"KILN_DEVICES": f"{H100},hip:gfx942"},
    "w2": {"KILN_DEVICES": "vulkan=RDNA3"},
}

WHERE = """
def where(name, needs=None, sleep=0):
    return run_command(name=name, command=["sh", "-c", f"sleep {sleep}; pwd > {{out}}"],
                       needs=needs)
"""


@pytest.fixture
def devices_cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    require_dask()
    cluster = DaskCluster(tmp_path_factory.mktemp("dask"), n_workers=3, worker_env=DEVICES)
    try:
        yield cluster
    finally:
        cluster.close()


def _worker(cluster: DaskCluster, out: Path, name: str) -> str | None:
    return cluster.worker_of((out / "genfiles/top" / name).read_text().strip())


def test_checks_go_only_to_a_worker_with_their_device(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    devices_cluster: DaskCluster,
    nginx_cache: NginxCache,
) -> None:
    write_module(
        WHERE
        + """
@entrypoint
def top():
    return ([where(f"cuda{i}.txt", "cuda:sm_90") for i in range(4)]
            + [where(f"hip{i}.txt", "hip:gfx942") for i in range(2)]
            + [where("vk.txt", "vulkan"), where("any.txt"), where("mi.txt", "hip:gfx90a")])
"""
    )
    start = time.monotonic()
    r = kiln(*remote_args(devices_cluster, nginx_cache, "out", "-j", "4"))
    took = time.monotonic() - start
    assert r.returncode == 0, r.stderr + devices_cluster.logs()
    out = tmp_path / "out"
    for i in range(4):
        assert _worker(devices_cluster, out, f"cuda{i}.txt") in ("w0", "w1")
    assert {_worker(devices_cluster, out, f"hip{i}.txt") for i in range(2)} == {"w1"}
    assert _worker(devices_cluster, out, "vk.txt") == "w2"
    assert _worker(devices_cluster, out, "any.txt") in ("w0", "w1", "w2")
    # No worker has it: skipped at once, naming the cluster, never queued.
    assert f"no hip:gfx90a device on the cluster at {devices_cluster.address}" in r.stderr
    assert took < 60
    manifest = json.loads((out / "manifest.json").read_text())
    entries = {Path(o["path"]).name: o for o in manifest["entrypoints"]["top"]["outputs"]}
    assert entries["mi.txt"]["status"] == "skipped"
    assert entries["hip0.txt"]["status"] == "built" and entries["hip0.txt"]["worker"]
    # --require-devices: the same absence fails it, within seconds.
    r = kiln(*remote_args(devices_cluster, nginx_cache, "out", "--require-devices"))
    assert r.returncode == 1 and "(--require-devices)" in r.stderr


def test_kiln_devices_lists_every_workers_devices(
    kiln: Callable[..., Any], devices_cluster: DaskCluster
) -> None:
    r = kiln("devices", "--json", "--executor", devices_cluster.url)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert len(found) == 3
    kinds = sorted(sorted(d["kind"] for d in devices) for devices in found.values())
    assert kinds == [["cpu", "cuda"], ["cpu", "cuda", "hip"], ["cpu", "vulkan"]]
    cuda_ids = {d["id"] for ds in found.values() for d in ds if d["kind"] == "cuda"}
    assert len(cuda_ids) == 1 and next(iter(cuda_ids)).startswith("cuda:sm_90@standin-")


def test_a_worker_lost_mid_check_is_retried_on_one_with_the_same_device(
    tmp_path: Path,
    write_module: Callable[..., Path],
    devices_cluster: DaskCluster,
    nginx_cache: NginxCache,
) -> None:
    marker = tmp_path / "started"
    write_module(f"""
@entrypoint
def top():
    return run_command(name="slow.txt", needs="cuda:sm_90", command=["sh", "-c",
                       "pwd >> {marker}; sleep 3; pwd > {{out}}"])
""")
    proc = start_kiln(tmp_path, *remote_args(devices_cluster, nginx_cache, "out"))
    first = devices_cluster.worker_of(wait_for(marker, proc).splitlines()[0])
    assert first in ("w0", "w1")
    devices_cluster.kill_worker(first)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    runs = marker.read_text().splitlines()
    second = devices_cluster.worker_of(runs[-1])
    assert len(runs) == 2 and second in ("w0", "w1") and second != first


def test_a_check_whose_only_worker_dies_fails_within_seconds(
    tmp_path: Path,
    write_module: Callable[..., Path],
    devices_cluster: DaskCluster,
    nginx_cache: NginxCache,
) -> None:
    marker = tmp_path / "started"
    write_module(f"""
@entrypoint
def top():
    return run_command(name="vk.txt", needs="vulkan", command=["sh", "-c",
                       "pwd >> {marker}; sleep 30; pwd > {{out}}"])
""")
    proc = start_kiln(tmp_path, *remote_args(devices_cluster, nginx_cache, "out"))
    assert devices_cluster.worker_of(wait_for(marker, proc)) == "w2"
    devices_cluster.kill_worker("w2")
    start = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "no Dask worker with device vulkan:@standin-" in err
    assert time.monotonic() - start < 25


def test_devices_by_tool_versions_no_wrong_device_hit(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    nginx_cache: NginxCache,
) -> None:
    """A matrix of device models and tool versions over one shared cache: each
    combination runs once, on its own device, and is never served another's."""
    require_dask()
    write_module(
        WHERE
        + """
@entrypoint
def top():
    return [where("g.txt", "cuda:sm_90")]
"""
    )
    seen: dict[tuple[str, str], str] = {}
    for model in ("H100", "GH200"):
        for version in ("1", "2"):
            env = {"KILN_DEVICES": f"cuda:sm_90={model}", "KILN_TEST_TOOL": version}
            cluster = DaskCluster(
                tmp_path / f"c-{model}-{version}",
                n_workers=2,
                worker_env={"w0": env, "w1": {}},
            )
            try:
                out = f"o-{model}-{version}"
                r = kiln(
                    *remote_args(cluster, nginx_cache, out, "--action-env", "KILN_TEST_TOOL"),
                    env={"KILN_TEST_TOOL": version},
                )
                assert r.returncode == 0, r.stderr
                entry = json.loads((tmp_path / out / "manifest.json").read_text())
                (g,) = entry["entrypoints"]["top"]["outputs"]
                assert g["cached"] is False, (model, version)  # never another's result
                where = (tmp_path / out / "genfiles/top/g.txt").read_text().strip()
                assert cluster.worker_of(where) == "w0", (model, version)
                seen[(model, version)] = where
                again = kiln(
                    *remote_args(cluster, nginx_cache, out + "b", "--action-env", "KILN_TEST_TOOL"),
                    env={"KILN_TEST_TOOL": version},
                )
                (g,) = json.loads((tmp_path / (out + "b") / "manifest.json").read_text())[
                    "entrypoints"
                ]["top"]["outputs"]
                assert again.returncode == 0 and g["cached"] is True  # its own result
            finally:
                cluster.close()
    assert len(seen) == 4


def test_a_build_on_a_cluster_identifies_none_of_this_machines_devices(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    devices_cluster: DaskCluster,
    nginx_cache: NginxCache,
) -> None:
    """The cluster's devices are where its checks run: kiln does not enumerate this
    machine's (iree.runtime's enumeration, a child process, takes seconds), neither
    for the keys when the plan is checked nor later. A stand-in ``iree.runtime`` on
    kiln's path notes each enumeration; the local build shows that it is the one used."""
    fake, marker = tmp_path / "fake", tmp_path / "enumerated"
    (fake / "iree").mkdir(parents=True)
    (fake / "iree" / "runtime.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\ndef query_available_drivers():\n    return []\n"
    )
    write_module(
        WHERE
        + """
@entrypoint
def top():
    return [where("cuda.txt", "cuda:sm_90"), where("mi.txt", "hip:gfx90a")]
"""
    )
    path = os.pathsep.join(p for p in (str(fake), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path}
    r = kiln(*remote_args(devices_cluster, nginx_cache, "out"), env=env)
    assert r.returncode == 0, r.stderr + devices_cluster.logs()
    assert _worker(devices_cluster, tmp_path / "out", "cuda.txt") in ("w0", "w1")
    assert f"no hip:gfx90a device on the cluster at {devices_cluster.address}" in r.stderr
    assert not marker.exists()
    local = kiln("build", "build.py", "--output-dir", "local", env=env)
    assert local.returncode == 0, local.stderr
    assert "no cuda:sm_90 device here" in local.stderr
    assert marker.exists()
