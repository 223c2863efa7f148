#!/usr/bin/env python3
"""Checks that ``_launch.py`` measures a program's own CPU time (its process alone,
every thread included, children excluded) as the program itself counts it.

    benchmarks/owncpu_check.py

The program measured is this file run as ``--burn``: a Python process whose
threads burn CPU in parallel (hashing releases the GIL; some threads are joined,
one is still running when the process exits) while it runs a child that burns
CPU too, and leaves behind an orphan (started through ``sh -c 'CMD &'``) that
burns CPU after the program has exited. It prints its own ``time.process_time()``
and its children's CPU (``RUSAGE_CHILDREN``) as it exits; the launcher's /proc
reading must agree with both, and its total CPU must be both plus the orphan's
(which the launcher adopts and reaps). Exit status 0 when they agree.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _measure import Sample, run_child

BURN_S = 0.4  # CPU seconds per thread and for the child


def _hash_for(seconds: float) -> None:
    """Burn about ``seconds`` of this thread's CPU, mostly outside the GIL."""
    block = b"x" * (1 << 20)
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        hashlib.sha256(block).digest()


def _burn(report: Path) -> None:
    child = [
        sys.executable,
        "-c",
        f"import time\nend = time.process_time() + {BURN_S}\nwhile time.process_time() < end: pass",
    ]
    # The shell exits at once; its background job is re-parented (to the launcher).
    subprocess.run(["sh", "-c", '"$@" &', "sh", *child], check=True)
    joined = [threading.Thread(target=_hash_for, args=(BURN_S,)) for _ in range(3)]
    for t in joined:
        t.start()
    subprocess.run(child, check=True)
    for t in joined:
        t.join()
    # Still running when the process exits: its time so far must count too.
    threading.Thread(target=_hash_for, args=(60.0,), daemon=True).start()
    time.sleep(0.2)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    report.write_text(
        json.dumps({"own": time.process_time(), "children": children.ru_utime + children.ru_stime})
    )
    os._exit(0)  # no interpreter shutdown: the report is the last CPU the process uses


def check(tolerance_s: float = 0.05) -> tuple[bool, str]:
    """Measure ``--burn`` through the launcher; (agrees, what was compared)."""
    with tempfile.TemporaryDirectory(prefix="kiln-owncpu-") as tmp:
        report = Path(tmp) / "report.json"
        sample: Sample = run_child([sys.executable, __file__, "--burn", str(report)])
        said = json.loads(report.read_text())
    own, children = sample.own_cpu_s, sample.children_cpu_s
    if own is None or children is None:
        return False, "the launcher could not read /proc/PID/stat"
    lines = [
        f"own CPU: launcher {own:.3f} s, the program itself {said['own']:.3f} s",
        f"children's CPU: launcher {children:.3f} s, the program itself {said['children']:.3f} s",
        f"own + children + the orphan's {BURN_S} s = {own + children + BURN_S:.3f} s; the "
        f"launcher's total {sample.cpu_s:.3f} s",
    ]
    ok = (
        sample.ok
        and said["own"] >= 3 * BURN_S  # the threads did run
        and abs(own - said["own"]) <= tolerance_s + 0.02 * said["own"]
        and abs(children - said["children"]) <= tolerance_s
        and abs(own + children + BURN_S - sample.cpu_s) <= tolerance_s
    )
    return ok, "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--burn"]:
        _burn(Path(argv[1]))
    ok, text = check()
    print(text)
    print("agree" if ok else "DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
