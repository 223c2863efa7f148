"""Graph analysis alone, the way ``kiln build`` does it but running nothing: import
the build module, call its entrypoints, make the plan (cycle check included).

    python benchmarks/analyze_only.py [--traced] BUILD_MODULE.py

Prints one JSON line: seconds per phase, the number of planned actions, and the
peak resident memory the process had reached once the module was
loaded, which is CPython compiling it, before kiln made a node. With
``--traced`` (slower: not for timing), also the bytes the graph and the plan
hold once made, as ``tracemalloc`` counts them from after the module loaded.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import tracemalloc


def _peak_rss_mib() -> float:
    """This process's peak resident memory so far (``ru_maxrss``: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(module_path: str, traced: bool = False) -> dict[str, float]:
    t0 = time.perf_counter()
    from kiln.cli.loader import collect_entrypoints, load_build_module
    from kiln.cli.requested import resolve_targets
    from kiln.executor import Executor
    from kiln.graph.args import argument_namespace_context

    t1 = time.perf_counter()
    module = load_build_module(module_path)
    entrypoints = collect_entrypoints(module)
    t2 = time.perf_counter()
    found: dict[str, float] = {"peak_loaded_mib": _peak_rss_mib()}
    if traced:
        tracemalloc.start()
    executor = Executor("kiln-out-unused")
    with argument_namespace_context(argparse.Namespace()):
        executor.analyze(*entrypoints.values())
    t3 = time.perf_counter()
    plan = executor.plan(resolve_targets(executor, []))  # every top-level entrypoint
    t4 = time.perf_counter()
    if traced:
        found["graph_bytes"] = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    return {
        "import_kiln": t1 - t0,
        "load_module": t2 - t1,
        "analyze": t3 - t2,
        "plan": t4 - t3,
        "total": t4 - t1,
        "actions": len(plan.actions),
        **found,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traced", action="store_true", help="count the graph's bytes")
    parser.add_argument("module")
    args = parser.parse_args()
    print(json.dumps(main(args.module, args.traced)))
