"""Graph analysis alone, the way ``kiln build`` does it but running nothing: import
the build module, call its entrypoints, make the plan (cycle check included).

    python benchmarks/analyze_only.py BUILD_MODULE.py

Prints one JSON line of seconds per phase and the number of planned actions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(module_path: str) -> dict[str, float]:
    t0 = time.perf_counter()
    from kiln.args import argument_namespace_context
    from kiln.cli.loader import collect_entrypoints, load_build_module
    from kiln.cli.targets import resolve_targets
    from kiln.executor import Executor

    t1 = time.perf_counter()
    module = load_build_module(module_path)
    entrypoints = collect_entrypoints(module)
    t2 = time.perf_counter()
    executor = Executor("kiln-out-unused")
    with argument_namespace_context(argparse.Namespace()):
        executor.analyze(*entrypoints.values())
    t3 = time.perf_counter()
    plan = executor.plan(resolve_targets(executor, []))  # every top-level entrypoint
    t4 = time.perf_counter()
    return {
        "import_kiln": t1 - t0,
        "load_module": t2 - t1,
        "analyze": t3 - t2,
        "plan": t4 - t3,
        "total": t4 - t1,
        "actions": len(plan.actions),
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(json.dumps(main(sys.argv[1])))
