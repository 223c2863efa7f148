"""``kiln compare --measure``: benchmark, on this machine, the modules whose digest
differs between A and B, interleaving the two (A B B A A B ...) so that a drift of
the machine weighs on both alike, until each is classed (``stop_measuring``) or the
time budget runs out. A run is one sample, the median of its repetitions: repetitions
of one run share its state (its process, its placement on the machine), and counted
one by one they make a run's chance level look like a change. A module whose digest
did not change is never benchmarked: it is the same artifact (``kiln.compare.diff``).
What is measured forms a pool of its own (``MEASURED``) for (digest, this device):
samples the builds took minutes apart, on a machine in another state, are not mixed
into it.

The measuring itself is the caller's (``Runner``: the command line hands in the
benchmark action's own ``iree-benchmark-module`` runs), so that this module needs
no tool.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kiln.base.errors import KilnError, NotRegularFile
from kiln.compare.builds import Artifact, Build, is_latency
from kiln.compare.diff import MEASURED, Pools
from kiln.compare.outputs import inputs_key
from kiln.compare.stats import stop_measuring
from kiln.devices.identity import need_for_flags
from kiln.output_dir.digests import hash_file
from kiln.output_dir.names import file_below, path_below

# (module file, its compile flags) -> one run's latencies per repetition, in µs.
Runner = Callable[[Path, list[str]], list[float]]


@dataclass
class Job:
    """One module to measure on both sides."""

    path: str
    a: Artifact
    b: Artifact
    file_a: Path
    file_b: Path
    runs: int = 0
    done: bool = False


@dataclass
class Measured:
    """What ``--measure`` did: runs per module, and why a module was not measured."""

    device: str
    runs: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    out_of_budget: bool = False


def plan_jobs(a: Build, b: Build, measured: Measured) -> list[Job]:
    """The modules to measure: in both builds, with other digests (the same digest is
    the same artifact); each needs its two files, whose digests must match."""
    jobs = []
    for path, art_b in sorted(b.artifacts.items()):
        art_a = a.artifacts.get(path)
        if art_a is None or not (art_a.is_module and art_b.is_module):
            continue
        if art_a.sha256 is None or art_b.sha256 is None:
            measured.skipped[path] = "not built in both"
            continue
        if art_a.sha256 == art_b.sha256:
            continue  # the same artifact: nothing to measure
        needs = {need_for_flags(art.flags or []) for art in (art_a, art_b)}
        if needs != {"cpu"}:
            measured.skipped[path] = f"needs {', '.join(sorted(needs))}: measured on the CPU only"
            continue
        on_a, on_b = _inputs(art_a), _inputs(art_b)
        if on_a is not None and on_b is not None and on_a != on_b:
            measured.skipped[path] = "benchmarked on other inputs in A and B"
            continue  # A and B run on one set of inputs: picking either would be a choice
        file_a, why_a = _module_file(a, art_a)
        file_b, why_b = _module_file(b, art_b)
        if file_a is None or file_b is None:
            measured.skipped[path] = why_a or why_b
            continue
        jobs.append(Job(path, art_a, art_b, file_a, file_b))
    return jobs


def _inputs(art: Artifact) -> str | None:
    """What the build's benchmark of ``art`` ran on (``inputs_key``), if it said."""
    for entry in art.benchmark:
        if isinstance(entry.get("inputs"), dict):
            return inputs_key(entry)
    return None


def _module_file(build: Build, art: Artifact) -> tuple[Path | None, str]:
    """The build's file of ``art``, if it still holds the digest the manifest says."""
    if build.root is None:
        return None, f"{build.label}: a manifest alone has no module files to run"
    if path_below(build.root, art.path) is None:
        return None, f"{build.label}: {art.path!r} is not a path below its output directory"
    path = file_below(build.root, art.path)
    if path is None:  # a link on the way, a FIFO, nothing: not the module the build made
        return None, f"{build.label}: {art.path} is gone or was rebuilt since"
    try:
        digest: str | None = hash_file(path, follow=False)
    except (OSError, NotRegularFile):
        digest = None
    if digest != art.sha256:
        return None, f"{build.label}: {art.path} is gone or was rebuilt since"
    return path, ""


def measure(
    jobs: list[Job],
    pools: Pools,
    measured: Measured,
    run: Runner,
    budget_s: float,
    max_rounds: int = 30,
) -> None:
    """Interleave A and B (A B, then B A, ...) per module, one sample a run, until
    ``stop_measuring`` says each has enough, the budget is spent, or ``max_rounds``
    rounds ran."""
    deadline = time.monotonic() + budget_s
    for round_ in range(max_rounds):
        live = [j for j in jobs if not j.done]
        if not live:
            return
        for job in live:
            if time.monotonic() >= deadline:
                measured.out_of_budget = True
                return
            order = [(job.a, job.file_a), (job.b, job.file_b)]
            try:
                for art, file in order if round_ % 2 == 0 else order[::-1]:
                    job.runs += 1
                    latencies = [v for v in run(file, art.flags or []) if is_latency(v)]
                    if latencies:
                        median = statistics.median(latencies)
                        pools.add(art.sha256 or "", measured.device, [median], MEASURED)
            except KilnError as e:  # what it measured so far classes nothing
                measured.skipped[job.path] = str(e)
                job.done = True
                for art in (job.a, job.b):
                    pools.discard(art.sha256 or "", measured.device, MEASURED)
            measured.runs[job.path] = job.runs
            # judged on this run's interleaved samples alone, never the builds' own
            here = (measured.device, MEASURED)
            xs = pools.samples.get((job.a.sha256 or "", *here), [])
            ys = pools.samples.get((job.b.sha256 or "", *here), [])
            if xs and ys and stop_measuring(xs, ys):
                job.done = True
