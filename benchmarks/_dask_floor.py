"""Dask alone, the floor under kiln's Dask overhead: ``N`` tasks on the cluster at
``ADDRESS``, each running the command kiln's sleep actions run (``sh -c 'sleep S;
echo I > OUT'``), at most ``IN_FLIGHT`` at a time (as ``kiln -j IN_FLIGHT``), from
a plain ``distributed.Client``: no kiln, no CAS, no sandbox.

    python benchmarks/_dask_floor.py ADDRESS N IN_FLIGHT SLEEP_S OUT_DIR [RESOURCE]

With ``RESOURCE`` (a worker resource, e.g. a device's ``kiln-device:<id>``), each
task takes one of it, as kiln's placement asks of a check that needs the device.

Prints one JSON line: ``{"wall_s": ...}`` (submission of the first task to the
result of the last).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


def run(out_dir: str, i: int, sleep_s: float) -> int:
    script = f'sleep {sleep_s}; echo $1 > "$0"'
    subprocess.run(["sh", "-c", script, f"{out_dir}/s{i}", str(i)], check=True)
    return i


def main(
    address: str, n: int, in_flight: int, sleep_s: float, out_dir: str, resource: str = ""
) -> float:
    from distributed import Client, as_completed

    resources = {resource: 1} if resource else None
    with Client(address, timeout=60) as client:

        def submit(i: int) -> object:
            return client.submit(run, out_dir, i, sleep_s, pure=False, resources=resources)

        started = time.perf_counter()
        futures = [submit(i) for i in range(min(n, in_flight))]
        queued = len(futures)
        pending = as_completed(futures)
        for future in pending:
            future.result()
            if queued < n:
                pending.add(submit(queued))
                queued += 1
        return time.perf_counter() - started


if __name__ == "__main__":
    address, n, in_flight, sleep_s, out_dir = sys.argv[1:6]
    resource = sys.argv[6] if len(sys.argv) > 6 else ""
    wall = main(address, int(n), int(in_flight), float(sleep_s), out_dir, resource)
    print(json.dumps({"wall_s": wall}))
