"""Before anything is timed: kiln as a user's machine runs it, bytecode written.

A user's Python writes ``.pyc`` files beside the modules it imports (pip also
compiles them at install time); a benchmark child inheriting
``PYTHONDONTWRITEBYTECODE=1`` would recompile every module on every run and time
that. ``allow_bytecode`` removes the variable from this process's environment,
which every child inherits; ``warm`` then runs one small build of each kind
(in-process, ``run_command``, PROCESS actions) so that the bytecode of every
module a timed run imports exists before the first timed run.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from _graph import make_graph
from _measure import checked, run_child, say
from _synthetic import KILN_PY, KILN_SH, kiln_argv
from process_actions import MODULE


def allow_bytecode() -> None:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def warm(work: Path) -> None:
    """One untimed build of each kind of action, and the analysis driver once."""
    graph = make_graph(3, 3)
    root = work / "warm"
    for system in (KILN_PY, KILN_SH):
        where = root / system.key
        system.setup(graph, where)
        checked(
            run_child(system.argv(where), cwd=where, log=where / "warm.log"),
            f"warm-up {system.name}",
        )
    process = root / "process"
    process.mkdir(parents=True, exist_ok=True)
    (process / "trivial.py").write_text(MODULE.format(n=4, kind="PROCESS"))
    checked(
        run_child(kiln_argv("trivial.py"), cwd=process, log=process / "warm.log"),
        "warm-up PROCESS actions",
    )
    driver = Path(__file__).resolve().parent / "analyze_only.py"
    where = root / KILN_PY.key
    checked(
        run_child(
            [sys.executable, str(driver), "gen_kiln_py.py"], cwd=where, log=where / "analysis.log"
        ),
        "warm-up analysis",
    )
    shutil.rmtree(root, ignore_errors=True)
    say("  warmed: bytecode written, one build of each kind of action")
