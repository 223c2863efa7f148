#!/usr/bin/env python3
"""A model with more than 1 GB of weights through import, the local and the remote
cache and ``kiln clean``: kiln's own memory must stay flat.

    benchmarks/params_large.py                       # in a temporary directory
    benchmarks/params_large.py --work-dir /mnt/xfs   # on a file system with reflinks
    benchmarks/params_large.py --write               # also benchmarks/results/

It writes ``big.onnx`` (a chain of ``--layers`` 4096x4096 float32 MatMuls, 64 MiB of
weights each) with its weights in ``big.onnx.data``, streamed (the generator never
holds more than one layer), and a build of ``onnx_import(params=True,
external_data=[...])``. Each step runs ``kiln`` in its own process and reports its
wall time, the peak RSS of kiln's own process (``/proc/self/status``, read
inside it: VmHWM) and the peak RSS of the largest process it started (the worker that runs
the importer: RUSAGE_CHILDREN):

1. clean build, filling a new local cache and an nginx remote cache (WebDAV on
   127.0.0.1, as the tests start it);
2. ``kiln clean``;
3. the same output directory, now empty, served by the local cache;
4. again, with a new local cache: served by the remote;
5. ``kiln clean``.

It also says whether the archive served from the local cache shares its bytes with
the cache's blob (a reflink, on XFS or btrfs: per ``filefrag``) or is a copy, and
how much disk the copy takes.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from nginx import NginxCache  # noqa: E402

N = 4096
BUILD = """
from kiln import *


@entrypoint
def big():
    return onnx_import(name="big.mlir", source=source_file("big.onnx"), params=True,
                       external_data=[source_file("big.onnx.data")], opset_version=None)
"""
# Runs kiln in this process and prints its own and its children's peak RSS.
RUNNER = """
import resource, sys
from kiln.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
# VmHWM: this process's own peak since it started (ru_maxrss would keep the peak of
# the process that started it across exec).
self_kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(f"RSS {self_kb} {child_kb} EXIT {code}", file=sys.stderr)
"""


def write_model(work: Path, layers: int) -> int:
    """Write big.onnx and big.onnx.data; return the data's size in bytes."""
    import numpy as np
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    inits, nodes, offset = [], [], 0
    with open(work / "big.onnx.data", "wb") as data:
        for i in range(layers):
            block = rng.standard_normal((N, N), dtype=np.float32) / np.float32(64.0)
            raw = block.tobytes()
            data.write(raw)
            tensor = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[N, N])
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", "big.onnx.data"), ("offset", offset)):
                tensor.external_data.add(key=key, value=str(value))
            tensor.external_data.add(key="length", value=str(len(raw)))
            offset += len(raw)
            inits.append(tensor)
            nodes.append(helper.make_node("MatMul", [f"x{i}", f"w{i}"], [f"x{i + 1}"]))
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1, N])],
        [helper.make_tensor_value_info(f"x{layers}", TensorProto.FLOAT, [1, N])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (work / "big.onnx").write_bytes(model.SerializeToString())
    return offset


def kiln(work: Path, *args: str) -> tuple[float, int, int]:
    """Run kiln with ``args`` in ``work``: wall seconds, kiln's and the largest
    child's peak RSS in MiB."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, *args], cwd=work, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    line = next((x for x in proc.stderr.splitlines() if x.startswith("RSS ")), None)
    if line is None or not line.endswith("EXIT 0"):
        raise SystemExit(f"kiln {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    _, own, child, _, _ = line.split()
    return wall, int(own) // 1024, int(child) // 1024


def _shared(path: Path) -> bool:
    """Whether the file shares extents with another (a reflink), per ``filefrag``."""
    proc = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True)
    return "shared" in proc.stdout


def _fs_type(path: Path) -> str:
    proc = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True)
    lines = proc.stdout.splitlines()
    return lines[-1].split()[1] if len(lines) > 1 else "?"


def run(root: Path, layers: int) -> str:
    work = root / "src"
    work.mkdir(parents=True)
    (work / "build.py").write_text(BUILD)
    start = time.perf_counter()
    size = write_model(work, layers)
    made = time.perf_counter() - start
    cache = NginxCache(root / "nginx")
    rows = []
    try:
        local, local2 = str(root / "cache1"), str(root / "cache2")
        remote = ["--remote-cache", cache.url]
        build = ["build", "build.py", "-j", "2", "--console", "plain"]
        rows.append(
            (
                "clean build, filling local + remote cache",
                kiln(work, *build, "--cache-dir", local, *remote),
            )
        )
        archive = work / "kiln-out/params/big/big.irpa"
        archive_size = archive.stat().st_size
        rows.append(("kiln clean", kiln(work, "clean")))
        rows.append(
            (
                "after kiln clean: served by the local cache",
                kiln(work, *build, "--cache-dir", local, *remote),
            )
        )
        shared = _shared(archive)
        copied = archive.stat().st_blocks * 512
        rows.append(("kiln clean", kiln(work, "clean")))
        rows.append(
            (
                "after kiln clean, a new local cache: served by the remote",
                kiln(work, *build, "--cache-dir", local2, *remote),
            )
        )
        rows.append(("kiln clean", kiln(work, "clean")))
    finally:
        cache.close()
    lines = [
        f"{layers} MatMul layers, {size / 2**30:.2f} GiB of external weights -> an archive of "
        f"{archive_size / 2**30:.2f} GiB; work directory on {_fs_type(root)} "
        f"({datetime.date.today()}; model written in {made:.1f} s). Served from the local "
        "cache, the archive "
        + (
            "shares its bytes with the cache's blob (a reflink)."
            if shared
            else f"is a copy of the cache's blob, {copied / 2**20:.0f} MiB more on disk "
            "(no reflinks on this file system)."
        ),
        "",
        "| step | wall s | kiln's peak RSS MiB | largest child's peak RSS MiB |",
        "|---|--:|--:|--:|",
    ]
    lines += [f"| {label} | {w:.1f} | {own} | {child} |" for label, (w, own, child) in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=17, help="64 MiB of weights each")
    parser.add_argument("--work-dir", type=Path, help="where to build (default: a temp dir)")
    parser.add_argument("--write", action="store_true", help="save to benchmarks/results/")
    args = parser.parse_args()
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="kiln-large-", dir=args.work_dir))
    try:
        text = run(root, args.layers)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(text)
    if args.write:
        out = HERE / "results" / f"{datetime.date.today()}-params-large.md"
        out.write_text(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("NO_COLOR", "1")
    raise SystemExit(main())
