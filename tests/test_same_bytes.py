"""Same key, same bytes, through the real command line on real models and commands:
an output does not depend on where it is built (two output directories, two
checkouts, a cache hit), a host-dependent compile is keyed by what the host
resolves to, and ``--check-reproducible`` finds the actions that break the rule
and keeps them out of every shared cache."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import needs
import pytest
from cache_build import entries
from nginx import NginxCache

onnx = needs.module("onnx")
np = needs.module("numpy")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.in_process


MODULE = """
from kiln import *


@entrypoint
def add():
    model = source_file("add.onnx")
    mlir = onnx_import(name="add.mlir", source=model)
    modules = compile(name="add", source=mlir, targets=["cpu", "vmvx"])
    checks = [
        verify(name=f"check_{i}.json", module=m, inputs=[source_file("x.pb")],
               expected=[source_file("y.pb")])
        for i, m in enumerate(modules)
    ]
    paths = run_command(name="paths.txt", inputs=[model, mlir],
                        command=["sh", "-c", "echo {inputs[0]} {inputs[1]} {out} > {out}"])
    script = run_command(name="script.txt", command=["sh", "tools/stamp.sh", "{out}"])
    return [*modules, *checks, paths, script]
"""


def _project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    const = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "c")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[const],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), root / "add.onnx"
    )
    x = np.ones((2, 3), dtype=np.float32)
    (root / "x.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    y = x + np.arange(6, dtype=np.float32).reshape(2, 3)
    (root / "y.pb").write_bytes(numpy_helper.from_array(y, "y").SerializeToString())
    (root / "tools").mkdir(exist_ok=True)
    (root / "tools/stamp.sh").write_text('printf "stamped %s\\n" "$1" > "$1"\n')
    (root / "build.py").write_text(MODULE)
    return root


def tree(root: Path) -> dict[str, bytes]:
    """Every output under ``root`` (kiln's own state and the manifest aside)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".kiln" not in p.parts and p.name != "manifest.json"
    }


def _build(kiln: Callable[..., Any], *args: str) -> Any:
    r = kiln("build", *args)
    assert r.returncode == 0, r.stderr
    return r


def test_two_output_directories_two_checkouts_and_a_cache_hit_give_the_same_bytes(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    one = _project(tmp_path / "one")
    _build(kiln, "one/build.py", "--no-cache", "--output-dir", "one/kiln-out")
    first = tree(one / "kiln-out")
    assert len([p for p in first if p.endswith(".vmfb")]) == 2
    assert first["genfiles/add/paths.txt"] == (
        b".kiln/src/add.onnx genfiles/add/add.mlir genfiles/add/.kiln-tmp-"
        + first["genfiles/add/paths.txt"].split(b".kiln-tmp-", 1)[1]
    )
    # Another output directory, deeper, elsewhere.
    _build(kiln, "one/build.py", "--no-cache", "--output-dir", "elsewhere/deep/er/out")
    assert tree(tmp_path / "elsewhere/deep/er/out") == first
    # Another checkout at another path (its output directory beside its module).
    two = tmp_path / "a/second/checkout"
    shutil.copytree(one, two, ignore=shutil.ignore_patterns("kiln-out"))
    _build(kiln, "a/second/checkout/build.py", "--no-cache", "--output-dir", f"{two}/kiln-out")
    assert tree(two / "kiln-out") == first
    # Through the shared cache: what a hit hands out is what a local build makes.
    _build(kiln, "one/build.py", "--output-dir", "filled")
    served = _build(kiln, "a/second/checkout/build.py", "--output-dir", f"{two}/served")
    assert "0 built, 7 cached" in served.stderr, served.stderr
    assert tree(two / "served") == first


def test_a_host_cpu_compile_is_keyed_by_what_the_host_resolves_to(
    tmp_path: Path, kiln_subprocess: Callable[..., Any]
) -> None:
    kiln = kiln_subprocess  # a process of its own: what this one learnt of the host is not asked
    _project(tmp_path)
    _build(kiln, "build.py")
    manifest = json.loads((tmp_path / "kiln-out/manifest.json").read_text())
    entries = {e["path"]: e for e in manifest["entrypoints"]["add"]["outputs"]}
    cpu = entries["bin/add/add_cpu-host.vmfb"]
    host = cpu["host"]
    assert host["cpu"] and host["cpu_features"] and host["triple"]
    assert f"--iree-llvmcpu-target-cpu-features={host['cpu_features']}" in cpu["flags"]
    assert "host" not in entries["bin/add/add_vmvx.vmfb"]  # nothing of the host in VMVX
    # The same build on a machine whose CPU has fewer features: another key, and
    # code compiled for that CPU (the memo stands in for the other machine).
    memo_path = tmp_path / "kiln-out/.kiln/host-targets.json"
    memo = json.loads(memo_path.read_text())
    (answer,) = memo["entries"].values()
    fewer = ",".join(answer["cpu_features"].split(",")[:-1])
    for value in memo["entries"].values():
        value["cpu_features"] = fewer
    memo_path.write_text(json.dumps(memo))
    explained = kiln("explain", "build.py").stdout
    assert "parameter host.cpu_features changed" in explained, explained
    r = _build(kiln, "build.py")
    assert "2 built, 5 up to date" in r.stderr, r.stderr  # the compile, then its verify
    manifest = json.loads((tmp_path / "kiln-out/manifest.json").read_text())
    entries = {e["path"]: e for e in manifest["entrypoints"]["add"]["outputs"]}
    assert (
        f"--iree-llvmcpu-target-cpu-features={fewer}"
        in entries["bin/add/add_cpu-host.vmfb"]["flags"]
    )


NOT_REPRODUCIBLE = """
import os
import random
from kiln import *
from kiln.executor import BuildAction, BuildContext


class Dice(BuildAction):
    def __init__(self, out, **kwargs):
        super().__init__(**kwargs)
        self.out = out
        out.deps.add(self)

    def _invoke(self):
        self.out.get_fs_path().write_text(str(random.random()))


@entrypoint
def mixed():
    steady = run_command(name="steady.txt", command=["sh", "-c", "echo steady {out} > {out}"])
    where = run_command(name="where.txt", command=["sh", "-c", "pwd > {out}"])
    clock = run_command(name="clock.txt", command=["sh", "-c", "date +%s%N > {out}"])
    ctx = BuildContext.current()
    dice = ctx.allocate_file("dice.txt")
    Dice(dice, desc="rolling", executor=ctx.executor)
    return [steady, where, clock, dice]
"""


def _ac_entries(cache: Path) -> set[str]:
    """The entries that serve outputs (a withdrawal, ``kiln.cache.entry``, serves none)."""
    return {n for n, d in entries(cache).items() if b'"not_reproducible"' not in d}


def _remote_entries(cache: NginxCache) -> set[str]:
    return {p.name for p in cache.files("ac") if b'"not_reproducible"' not in p.read_bytes()}


def test_check_reproducible_lists_what_differs_and_never_shares_it(
    tmp_path: Path, kiln: Callable[..., Any], _private_cache: Path, nginx_cache: NginxCache
) -> None:
    (tmp_path / "build.py").write_text(NOT_REPRODUCIBLE)
    remote = ("--remote-cache", nginx_cache.url)
    r = kiln("build", "build.py", "--check-reproducible", *remote)
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if " differs " in ln or "differs in size" in ln]
    assert len(lines) == 3, r.stderr
    assert any(
        "'Running mixed/where.txt': genfiles/mixed/where.txt differs at byte" in ln
        and "(run again in a scratch directory)" in ln
        for ln in lines
    ), lines
    assert any("mixed/clock.txt" in ln for ln in lines)
    assert any(
        "'rolling': genfiles/mixed/dice.txt" in ln and ln.endswith("(run again in place)")
        for ln in lines
    ), lines
    assert "3 not reproducible" in r.stderr and "kiln: FAILED" in r.stderr
    # The build's own outputs stay as built and recorded.
    again = kiln("build", "build.py", *remote)
    assert "0 built, 4 up to date" in again.stderr, again.stderr
    # Only the reproducible action went into the caches, local and remote; the others
    # are withdrawn there.
    assert len(_ac_entries(_private_cache)) == 1 and len(entries(_private_cache)) == 4
    assert len(_remote_entries(nginx_cache)) == 1 and len(nginx_cache.files("ac")) == 4
    # Marked in this directory's state, they stay unshared in its later builds.
    kiln("build", "build.py", "--check-reproducible", *remote)
    assert len(_ac_entries(_private_cache)) == 1 and len(_remote_entries(nginx_cache)) == 1
    # A fresh output directory: the reproducible one is served, the others run.
    fresh = kiln("build", "build.py", "--output-dir", "fresh")
    assert "3 built, 1 cached" in fresh.stderr, fresh.stderr


def test_a_reproducible_build_passes_the_check(tmp_path: Path, kiln: Callable[..., Any]) -> None:
    _project(tmp_path)
    r = kiln("build", "build.py", "--check-reproducible")
    assert r.returncode == 0, r.stderr
    assert "not reproducible" not in r.stderr
    assert not (tmp_path / "kiln-out/.kiln/check").exists()
    # Checking an up-to-date build runs every action again all the same.
    r = kiln("build", "build.py", "--check-reproducible")
    assert r.returncode == 0 and "0 built, 7 up to date" in r.stderr, r.stderr


BENCH = """
from kiln import *


@entrypoint
def timed():
    mlir = onnx_import(name="add.mlir", source=source_file("add.onnx"))
    (module,) = compile(name="add", source=mlir, targets=["vmvx"])
    return benchmark(name="bench.json", module=module, inputs=[source_file("x.pb")],
                     repetitions=1, min_time_s=0.001)
"""


def test_a_benchmark_is_not_checked_and_never_leaves_the_machine(
    tmp_path: Path, kiln: Callable[..., Any], _private_cache: Path, nginx_cache: NginxCache
) -> None:
    _project(tmp_path)
    (tmp_path / "build.py").write_text(BENCH)
    r = kiln("build", "build.py", "--check-reproducible", "--remote-cache", nginx_cache.url)
    assert r.returncode == 0, r.stderr
    local = _ac_entries(_private_cache)
    remote = _remote_entries(nginx_cache)
    assert len(local) == 3 and len(remote) == 2 and remote < local  # all but the benchmark
    # A second machine (a fresh cache) reads the remote: the benchmark runs there.
    other = tmp_path / "other-cache"
    r = kiln(
        "build",
        "build.py",
        "--output-dir",
        "other",
        "--cache-dir",
        str(other),
        "--remote-cache",
        nginx_cache.url,
    )
    assert "1 built, 2 cached" in r.stderr, r.stderr


SANDBOXED = """
import os
from kiln import *
from kiln.executor import ActionConcurrency, BuildAction, BuildFile


def _write_cwd(path):
    with open(path, "w") as f:
        f.write(os.getcwd())


class WhereAmI(BuildAction):
    # Writes the directory it runs in: the same for a second run in place, another
    # one in a scratch directory.
    def __init__(self, *, out, **kw):
        super().__init__(desc=f"where {out.path}", executor=out.executor,
                         concurrency=ActionConcurrency.PROCESS, **kw)
        self.out = out
        out.deps.add(self)

    def _remotable_thunk(self):
        where = str(self.out.get_fs_path())
        return lambda: _write_cwd(where)


class Public(WhereAmI):
    def sandbox_thunk(self, path):
        where = path(self.out)
        return lambda: _write_cwd(where)


class Earlier(WhereAmI):
    def _sandbox_thunk(self, path):
        where = path(self.out)
        return lambda: _write_cwd(where)


@entrypoint
def where():
    ctx = executor.BuildContext.current()
    outs = []
    for kind in (Public, Earlier, WhereAmI):
        out = ctx.allocate_file(f"{kind.__name__}.txt")
        kind(out=out)
        outs.append(out)
    return outs
"""


def test_a_user_action_is_found_sandboxable_by_its_type(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    """``kiln.planning.sandbox.RemotableThunk`` (and the earlier ``_sandbox_thunk``) is how an
    action says where its files are: found by its type, the second run of
    ``--check-reproducible`` is in a scratch directory (here: a different working
    directory, so the output differs); an action that says nothing runs in place."""
    from kiln.planning.sandbox import RemotableThunk, remotable

    (tmp_path / "build.py").write_text(SANDBOXED)
    r = kiln("build", "build.py", "--check-reproducible")
    assert r.returncode == 1, r.stderr
    assert "2 not reproducible" in r.stderr, r.stderr
    for name in ("Public", "Earlier"):
        assert f"genfiles/where/{name}.txt differs" in r.stderr
    assert "(run again in a scratch directory)" in r.stderr
    assert "WhereAmI.txt differs" not in r.stderr
    out = tmp_path / "kiln-out/genfiles/where"
    ran = {p.name: p.read_text() for p in out.iterdir()}
    # An action that names its files as kiln's do runs in the output directory; one
    # of iree.build's kind where the build was started (``runs_in_output_dir``).
    assert ran == {
        "Public.txt": str((tmp_path / "kiln-out").resolve()),
        "Earlier.txt": str((tmp_path / "kiln-out").resolve()),
        "WhereAmI.txt": str(tmp_path),
    }
    assert not isinstance(object(), RemotableThunk)

    class Thunked:
        def sandbox_thunk(self, path: Callable[..., str]) -> Callable[[], None]:
            return lambda: None

    assert isinstance(Thunked(), RemotableThunk) and remotable(Thunked())  # type: ignore[arg-type]
