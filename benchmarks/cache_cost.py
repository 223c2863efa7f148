#!/usr/bin/env python3
"""What the local cache costs one action, alone: a lookup that misses, then the
save of one small output (81 bytes, kept in its entry), as a build does for each
action it runs, on one thread, into a new cache in a temporary directory.

    benchmarks/cache_cost.py [--actions 10000] [--dir DIR]

Prints the CPU and wall time per action and what the end of the build (writing
what waits, the build log, eviction) took. ``--dir`` chooses the filesystem (the
default: the system's temporary directory). Run it with another kiln on
``PYTHONPATH`` to compare two versions.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import shutil
import tempfile
import time
from pathlib import Path

from kiln.cache import BuildCache, LocalCache

DATA = b"x" * 81


class _Output:
    """What the cache reads of an output: its file key and its path."""

    def __init__(self, root: Path, i: int) -> None:
        self.key = f"gen/graph/n{i}.txt"
        self.fs_str = str(root / f"n{i}.txt")
        Path(self.fs_str).write_bytes(DATA)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--actions", type=int, default=10_000)
    p.add_argument("--dir", type=Path, default=None)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kiln-cache-cost-", dir=args.dir))
    try:
        (root / "out").mkdir()
        outputs = [_Output(root / "out", i) for i in range(args.actions)]
        cache = BuildCache(LocalCache(root / "cache"))
        digest = hashlib.sha256(DATA).hexdigest()
        read_once = "read" in inspect.signature(cache.save).parameters
        cpu, wall = time.process_time(), time.perf_counter()
        for i, f in enumerate(outputs):
            key = hashlib.sha256(str(i).encode()).hexdigest()
            assert cache.restore(key, [f], None) is None
            produced = {f: ((len(DATA), 0, 0, 0), digest)}
            if read_once:  # what hashing the output read (this kiln reads it once)
                cache.save(key, f"n{i}", produced, read={f: (0o644, DATA)})
            else:
                cache.save(key, f"n{i}", produced)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        end = time.process_time()
        cache.end_build()
        end = time.process_time() - end
        n = args.actions
        print(
            f"{n:,} actions: {1e6 * cpu / n:.0f} µs CPU and {1e6 * wall / n:.0f} µs wall per "
            f"action; the end of the build {end:.3f} s CPU; {cache.counts}"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
