"""Issue 13's two measured targets, run from ``run.py --dask``: the zoo on
``dask-local:2`` vs local ``-j 2``, and kiln's added cost per action on a
LocalCluster-like cluster of single-thread workers.

The stages are ``dask_exec.py``'s: ``zoo_stage(count, work, cache_url, runs)``
returning ``{"local -j 2": [wall s, ...], "dask-local:2": [...]}`` and
``overhead_stage(actions, workers, work, cache_url)`` returning a dict with
``ideal``, ``dask_wall``, ``local_wall``, ``dask_ms_per_action``,
``local_ms_per_action``. Where the module no longer offers them with those
signatures, ``dask_exec.py`` runs as a command and its printed summary is read.
"""

from __future__ import annotations

import inspect
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ZOO_LOCAL, ZOO_DASK = "local -j 2", "dask-local:2"


@dataclass
class DaskResult:
    """What the Dask stages measured; ``None`` where a stage did not run or say."""

    zoo_models: int
    actions: int
    workers: int
    zoo_local_s: float | None = None
    zoo_dask_s: float | None = None
    overhead: dict[str, float] = field(default_factory=dict)
    how: str = ""  # "in-process" or the command that ran
    output: list[str] = field(default_factory=list)  # the command's summary lines

    def table(self) -> list[str]:
        lines = [
            f"Stages of `benchmarks/dask_exec.py` ({self.how}); a fresh nginx remote "
            "cache per run.",
            "",
        ]
        if self.zoo_local_s is not None and self.zoo_dask_s is not None:
            lines += [
                "| zoo models | local -j 2 s | dask-local:2 s | dask ÷ local |",
                "|--:|--:|--:|--:|",
                f"| {self.zoo_models} | {self.zoo_local_s:.2f} | {self.zoo_dask_s:.2f} "
                f"| {self.zoo_dask_s / self.zoo_local_s:.2f} |",
                "",
            ]
        o = self.overhead
        if "dask_ms_per_action" in o:
            alone = o.get("dask_alone_ms_per_action")
            lines += [
                "| sleep 0.02 actions | workers | ideal s | dask s | added ms/action "
                "| Dask alone added ms/action | local s | local added ms/action |",
                "|--:|--:|--:|--:|--:|--:|--:|--:|",
                f"| {self.actions:,} | {self.workers} | {o.get('ideal', 0):.2f} "
                f"| {o.get('dask_wall', 0):.2f} | {o['dask_ms_per_action']:.2f} "
                f"| {'—' if alone is None else f'{alone:.2f}'} "
                f"| {o.get('local_wall', 0):.2f} | {o.get('local_ms_per_action', 0):.2f} |",
                "",
            ]
        if self.output:
            lines += ["```", *self.output, "```"]
        return lines


def _offers(module: object, name: str, *args: object) -> bool:
    fn = getattr(module, name, None)
    if fn is None:
        return False
    try:
        inspect.signature(fn).bind(*args)
    except (TypeError, ValueError):
        return False
    return True


def bench_dask(work: Path, *, zoo: int, actions: int, workers: int, runs: int) -> DaskResult:
    """Run both stages (``zoo`` or ``actions`` 0 skips one)."""
    result = DaskResult(zoo, actions, workers)
    work.mkdir(parents=True, exist_ok=True)
    import dask_exec

    args = (zoo, work, "", runs)
    if not (
        _offers(dask_exec, "zoo_stage", *args)
        and _offers(dask_exec, "overhead_stage", actions, workers, work, "")
    ):
        return _as_command(result, runs)
    from nginx import NginxCache

    cache = NginxCache(work / "nginx")
    try:
        if zoo:
            walls = dask_exec.zoo_stage(zoo, work, cache.url, runs)
            result.zoo_local_s = statistics.median(walls[ZOO_LOCAL])
            result.zoo_dask_s = statistics.median(walls[ZOO_DASK])
        if actions:
            result.overhead = dict(dask_exec.overhead_stage(actions, workers, work, cache.url))
    finally:
        cache.close()
    result.how = (
        f"in-process: zoo_stage({zoo} models, {runs} runs), "
        f"overhead_stage({actions} actions, {workers} workers)"
    )
    return result


def _as_command(result: DaskResult, runs: int) -> DaskResult:
    argv = [
        sys.executable,
        str(HERE / "dask_exec.py"),
        "--zoo",
        str(result.zoo_models),
        "--actions",
        str(result.actions),
        "--workers",
        str(result.workers),
        "--runs",
        str(runs),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    out = done.stdout.strip().splitlines()
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise RuntimeError(f"dask_exec.py exited {done.returncode}:\n{tail}")
    text = "\n".join(out)
    m = re.search(r"local -j 2 ([\d.]+) s, dask-local:2 ([\d.]+) s", text)
    if m:
        result.zoo_local_s, result.zoo_dask_s = float(m[1]), float(m[2])
    m = re.search(r"ideal ([\d.]+) s; dask ([\d.]+) s = ([\d.]+) ms/action added", text)
    if m:
        result.overhead = {
            "ideal": float(m[1]),
            "dask_wall": float(m[2]),
            "dask_ms_per_action": float(m[3]),
        }
    m = re.search(r"Dask alone ([\d.]+) s = ([\d.]+) ms/action", text)
    if m:
        result.overhead.update(dask_alone_wall=float(m[1]), dask_alone_ms_per_action=float(m[2]))
    result.how = "`" + " ".join(["benchmarks/dask_exec.py", *argv[2:]]) + "`"
    result.output = [line for line in out if not line.startswith("  ")]
    return result
