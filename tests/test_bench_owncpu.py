"""The benchmarks' own-CPU measurement (benchmarks/_launch.py): a program's process
alone, every thread counted, its children apart, as the program counts itself."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def test_own_cpu_of_a_threaded_parent_with_a_child() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import owncpu_check
    finally:
        sys.path.remove(str(BENCH))
    ok, text = owncpu_check.check(tolerance_s=0.1)
    assert ok, text
