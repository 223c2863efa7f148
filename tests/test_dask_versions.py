"""A result enters the build and the caches only when it was built by the kiln and
the tools its key names: on a real Dask cluster (``tests/dask_cluster.py``), a
worker running another kiln (a copy of kiln's source with another version, on its
``PYTHONPATH``) or another version of a tool an action's key holds (an installed
distribution's metadata saying another version) is refused, naming the worker
and both versions, when kiln connects or when the worker joins mid-build; the
actions whose keys do not hold that tool still run there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cache_build import entries
from dask_cluster import DaskCluster, require_dask
from nginx import NginxCache

import kiln as kiln_package
from kiln.execution.cluster.versions import kiln_version

OTHER = "0.0.1+elsewhere"


def other_kiln(root: Path, version: str = OTHER) -> Path:
    """A copy of the kiln under test whose version is ``version``: a PYTHONPATH entry."""
    copy = root / "other-kiln"
    here = Path(kiln_package.__file__).parent
    shutil.copytree(here, copy / "kiln", ignore=shutil.ignore_patterns("__pycache__"))
    source = copy / "kiln" / "_version.py"
    line = f'__version__ = "{kiln_package.__version__}"'
    assert source.read_text().count(line) == 1
    source.write_text(source.read_text().replace(line, f'__version__ = "{version}"'))
    return copy


def recoded_kiln(root: Path) -> Path:
    """A copy of the kiln under test of the same version whose action code differs."""
    copy = other_kiln(root, kiln_package.__version__)
    action = copy / "kiln" / "actions" / "process.py"
    action.write_text(action.read_text() + "\n# other code under the same version\n")
    return copy


def silent_kiln(root: Path) -> Path:
    """A copy of the kiln under test as a kiln older than the version check acts on a
    worker: it runs every task and sends no versions back."""
    copy = other_kiln(root, kiln_package.__version__)
    task = copy / "kiln" / "execution" / "cluster" / "task.py"
    text = task.read_text()
    check, report = "if mine != task.versions:", "return dataclasses.replace(result, versions=mine)"
    assert text.count(check) == 1 and text.count(report) == 1  # what an older kiln lacks
    patched = text.replace(check, "if False:").replace(report, "return result")
    task.write_text(patched)
    return copy


def other_tool(root: Path, dist: str, version: str) -> str:
    """A PYTHONPATH on which the installed distribution ``dist`` says it is ``version``
    (its metadata found first; its code is still the installed one)."""
    info = root / "other-tool" / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return os.pathsep.join(filter(None, [str(info.parent), os.environ.get("PYTHONPATH")]))


def address_of(cluster: DaskCluster, name: str) -> str:
    from distributed import Client

    with Client(cluster.address, timeout=10) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
    return next(a for a, w in workers.items() if w.get("name") == name)


@pytest.fixture
def make_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., DaskCluster]]:
    require_dask()
    made: list[DaskCluster] = []

    def make(n_workers: int, worker_env: dict[str, dict[str, str]] | None = None) -> DaskCluster:
        made.append(DaskCluster(tmp_path_factory.mktemp("dask"), n_workers, worker_env=worker_env))
        return made[-1]

    yield make
    for cluster in made:
        cluster.close()


def remote(cluster: DaskCluster, cache: NginxCache, out: str = "out") -> list[str]:
    return [
        "build", "build.py", "--output-dir", out, "--cache-dir", f"cache-{out}",
        "--executor", cluster.url, "--remote-cache", cache.url,
    ]  # fmt: skip


COMMANDS = """
@entrypoint
def top():
    return run_command(name="a.txt", command=["sh", "-c", "echo a > {out}"])
"""


@pytest.mark.parametrize("other", ["version", "code"])
def test_a_worker_running_another_kiln_is_refused_when_kiln_connects(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    make_cluster: Callable[..., DaskCluster],
    nginx_cache: NginxCache,
    other: str,
) -> None:
    """Another kiln: another version, or the same version with other code (the key of
    a kiln action holds the digest of kiln's code, ``kiln.execution.cluster.versions.identity``)."""
    write_module(COMMANDS)
    there = other_kiln(tmp_path) if other == "version" else recoded_kiln(tmp_path)
    cluster = make_cluster(2, {"w1": {"PYTHONPATH": str(there)}})
    r = kiln(*remote(cluster, nginx_cache))
    assert r.returncode != 0, r.stderr
    here = kiln_version()
    said = f"Dask worker {address_of(cluster, 'w1')} runs kiln "
    said += f"{OTHER} (code " if other == "version" else f"{kiln_package.__version__} (code "
    assert said in r.stderr, r.stderr
    if other == "code":  # the worker's code digest is shown, and is not ours
        assert r.stderr.split(said)[1][:12] != here.split("(code ")[1][:12], r.stderr
    assert f"this is kiln {here}" in r.stderr, r.stderr
    assert address_of(cluster, "w0") not in r.stderr
    assert not nginx_cache.files("ac") and not entries(tmp_path / "cache-out")
    assert not (tmp_path / "out/genfiles/top/a.txt").exists()


WAITING = """
@entrypoint
def top():
    return run_command(name="a.txt", command=[
        "sh", "-c", "touch STARTED; while [ ! -e GO ]; do sleep 0.05; done; echo a > {out}"])
"""


@pytest.mark.parametrize("newcomer", ["other version", "says nothing"])
def test_a_worker_with_another_kiln_that_joins_mid_build_is_refused(
    tmp_path: Path,
    write_module: Callable[..., Path],
    make_cluster: Callable[..., DaskCluster],
    nginx_cache: NginxCache,
    newcomer: str,
) -> None:
    """The worker that passed the check when kiln connected dies mid-action; its
    replacement runs another kiln (one that runs the action and says nothing of its
    versions, too): its result does not enter the build."""
    started, go = tmp_path / "started", tmp_path / "go"
    write_module(WAITING.replace("STARTED", str(started)).replace("GO", str(go)))
    cluster = make_cluster(1)
    other = other_kiln(tmp_path) if newcomer == "other version" else silent_kiln(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", *remote(cluster, nginx_cache)],
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1"},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        cluster.add_worker("w1", {"PYTHONPATH": str(other)})
        cluster.kill_worker("w0")  # the action goes to the newcomer
        go.touch()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    there = address_of(cluster, "w1")
    if newcomer == "other version":
        assert f"refused Dask worker {there}: kiln {OTHER} (code " in err, err
        assert f"{kiln_version()} here" in err, err
    else:
        assert f"refused Dask worker {there}: it did not say which kiln built it" in err, err
    assert not nginx_cache.files("ac") and not entries(tmp_path / "cache-out")
    assert not (tmp_path / "out/genfiles/top/a.txt").exists()


MLIR = """\
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""

COMPILE = """
@entrypoint
def top():
    (module,) = compile(name="add", source=source_file("add.mlir"), targets=["vmvx"])
    plain = run_command(name="plain.txt", command=["sh", "-c", "echo plain > {out}"])
    return [module, plain]
"""


def test_a_worker_with_another_compiler_version_is_refused_for_compiles_alone(
    tmp_path: Path,
    write_module: Callable[..., Path],
    kiln: Callable[..., Any],
    make_cluster: Callable[..., DaskCluster],
    nginx_cache: NginxCache,
) -> None:
    from kiln.planning.code_key import distribution_version

    here = distribution_version("iree-base-compiler")
    if here is None:
        pytest.skip("iree-base-compiler is not installed")
    (tmp_path / "add.mlir").write_text(MLIR)
    write_module(COMPILE)
    path = other_tool(tmp_path, "iree-base-compiler", "0.0.7")
    cluster = make_cluster(1, {"w0": {"PYTHONPATH": path}})
    r = kiln(*remote(cluster, nginx_cache))
    assert r.returncode == 1, r.stderr
    worker = address_of(cluster, "w0")
    assert f"refused Dask worker {worker}: iree-base-compiler 0.0.7 there, {here} here" in (
        r.stderr
    ), r.stderr
    assert not (tmp_path / "out/bin/top/add_vmvx.vmfb").exists()
    # The command's key holds no compiler: it ran there, and is cached.
    assert (tmp_path / "out/genfiles/top/plain.txt").read_text() == "plain\n"
    assert len(nginx_cache.files("ac")) == 1 and len(entries(tmp_path / "cache-out")) == 1


def test_a_long_version_matches_itself_and_is_shown_bounded() -> None:
    """Versions are compared whole and cut only where shown: cut first, a version over
    80 characters never matched its own and every result of its worker was refused."""
    from kiln.execution.cluster.versions import differences

    long = "1.0.0+" + "x" * 94
    assert differences((("tool", long),), (("tool", long),)) is None
    said = differences((("tool", "1.0"),), (("tool", long + "y" * 10_000),))
    assert said is not None and len(said) < 200
