"""Two builds side by side: each artifact added, removed, renamed, unchanged or
changed (and why, in ``kiln explain``'s words), and for each compiled module its
size, compile time, latency, verification and outputs before and after.

Invariant: the same digest on the same device is the same artifact. Its benchmark
samples are pooled (``Pools``), whichever path or build they were recorded under,
and an unchanged module is never compared for latency: it is the same program.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kiln.compare.builds import Artifact, Build, samples
from kiln.compare.outputs import inputs_key, largest_difference
from kiln.compare.stats import LatencyVerdict, compare_latency
from kiln.engine.incremental import why_key_changed
from kiln.observe.report_data import number_at, records_at

ADDED, REMOVED, RENAMED, UNCHANGED, CHANGED = "added", "removed", "renamed", "unchanged", "changed"
UNKNOWN_WHY = "unknown (older manifest)"


# The run of ``--measure``'s interleaved samples: never pooled with a build's own,
# taken minutes apart, on inputs of its own (docs/compare.md: those differ beyond noise).
MEASURED = "--measure"

# (digest, device, run): run is what the samples were measured on (``inputs_key`` of
# the benchmark, "" where it did not say) or ``MEASURED``.
Pool = tuple[str, str, str]


class Pools:
    """The benchmark samples of each digest, by device and by what they ran on: two
    benchmarks of one module on other inputs (other shapes) measure other work."""

    def __init__(self, builds: Iterable[Build] = ()):
        self.samples: dict[Pool, list[float]] = {}
        self._runs: dict[str, set[tuple[str, str]]] = {}  # digest -> (device, run): no scan
        self._verdicts: dict[tuple[Pool, Pool], tuple[int, int, LatencyVerdict]] = {}
        for build in builds:
            for art in build.artifacts.values():
                self.add_artifact(art)

    def add_artifact(self, art: Artifact) -> None:
        if art.sha256 is None:
            return
        for entry in art.benchmark:
            device = entry.get("device_id")
            if isinstance(device, str) and entry.get("status") == "measured":
                self.add(art.sha256, device, samples(entry), inputs_key(entry) or "")

    def add(self, digest: str, device: str, more: list[float], run: str) -> None:
        """``more`` latencies (``kiln.compare.builds.is_latency``, as their reader keeps)."""
        if more:
            self.samples.setdefault((digest, device, run), []).extend(more)
            self._runs.setdefault(digest, set()).add((device, run))

    def discard(self, digest: str, device: str, run: str) -> None:
        """Forget the samples of ``digest`` on ``device`` and ``run``."""
        self.samples.pop((digest, device, run), None)
        self._runs.get(digest, set()).discard((device, run))

    def runs(self, digest: str | None) -> set[tuple[str, str]]:
        """The (device, run) pairs ``digest`` has samples of."""
        return set(self._runs.get(digest, ())) if digest is not None else set()

    def devices(self, digest: str | None) -> set[str]:
        return {device for device, _ in self.runs(digest)}

    def compare(self, a: str, b: str, device: str, run: str) -> LatencyVerdict:
        """The latency verdict of digest ``b`` against ``a`` on ``device`` and ``run``,
        from their pooled samples; made once while the pools stay as they are (a build
        of many paths that share one digest asks it once a path)."""
        pa, pb = (a, device, run), (b, device, run)
        xs, ys = self.samples.get(pa, []), self.samples.get(pb, [])
        kept = self._verdicts.get((pa, pb))
        if kept is not None and kept[:2] == (len(xs), len(ys)):
            return kept[2]
        verdict = compare_latency(xs, ys)
        self._verdicts[(pa, pb)] = (len(xs), len(ys), verdict)
        return verdict


@dataclass
class Module:
    """What changed in one compiled module between A and B."""

    target: str | None
    size_a: int | None = None
    size_b: int | None = None
    compile_a: float | None = None
    compile_b: float | None = None
    device: str | None = None  # the device both were measured on
    latency: LatencyVerdict | None = None
    latency_note: str = ""  # why there is no latency verdict
    verify_a: str = "none"  # pass, fail, skipped, none
    verify_b: str = "none"
    err_a: float | None = None
    err_b: float | None = None
    # The largest share of its tolerance an element of any output used against any
    # reference (1.0: all of it; ``kiln.actions._tensors.compare``); None in an older
    # manifest, and for exact comparisons.
    tolerance_used_a: float | None = None
    tolerance_used_b: float | None = None
    output_diff: float | None = None  # the largest |B - A| over outputs on the same inputs
    output_note: str = ""


@dataclass
class Row:
    """One artifact of either build."""

    path: str
    change: str
    why: str = ""
    was: str | None = None  # A's path, when renamed
    status_a: str | None = None
    status_b: str | None = None
    module: Module | None = None
    flags: list[str] = field(default_factory=list)  # what regressed: slower, accuracy, ...


def compare_builds(a: Build, b: Build, pools: Pools | None = None) -> list[Row]:
    """A row per artifact of either build, regressions first."""
    pools = pools if pools is not None else Pools([a, b])
    rows: list[Row] = []
    gone = {p: art for p, art in a.artifacts.items() if p not in b.artifacts}
    by_digest = {art.sha256: p for p, art in gone.items() if art.sha256}
    for path, art_b in b.artifacts.items():
        art_a = a.artifacts.get(path)
        if art_a is None and art_b.sha256 in by_digest:
            was = by_digest.pop(art_b.sha256)
            art_a = gone.pop(was)
            rows.append(_row(path, art_a, art_b, pools, was))
        elif art_a is None:
            rows.append(Row(path, ADDED, status_b=art_b.status, module=_added(art_b, "b")))
        else:
            rows.append(_row(path, art_a, art_b, pools))
    for path, art_a in gone.items():
        rows.append(Row(path, REMOVED, status_a=art_a.status, module=_added(art_a, "a")))
    for row in rows:
        row.flags = regressions(row)
    return sorted(rows, key=_order)


_ORDER = {CHANGED: 1, RENAMED: 2, ADDED: 3, REMOVED: 4, UNCHANGED: 5}


def _order(row: Row) -> tuple[int, float, str]:
    ratio = row.module.latency.ratio if row.module and row.module.latency else 1.0
    return (0 if row.flags else _ORDER[row.change], -ratio, row.path)


def _row(path: str, a: Artifact, b: Artifact, pools: Pools, was: str | None = None) -> Row:
    same = a.sha256 is not None and a.sha256 == b.sha256
    change = RENAMED if was is not None else UNCHANGED if same else CHANGED
    why = "" if same else _why(a, b)
    module = _module(a, b, pools) if a.is_module or b.is_module else None
    return Row(path, change, why, was, a.status, b.status, module)


def _why(a: Artifact, b: Artifact) -> str:
    """Why ``b`` differs from ``a``, as ``kiln explain`` says why an action runs."""
    if a.sha256 is None or b.sha256 is None:
        which = "A" if a.sha256 is None else "B"
        status = a.status if a.sha256 is None else b.status
        return f"not built in {which} ({status})"
    if a.key is None or b.key is None:
        return UNKNOWN_WHY
    if a.key["digest"] == b.key["digest"]:
        return "same key, other bytes: its action is not reproducible"
    try:
        return why_key_changed(a.key["params"], a.key["inputs"], b.key["params"], b.key["inputs"])
    except (TypeError, ValueError, AttributeError, KeyError, RecursionError):
        return "unknown (the manifest's record of its key is damaged)"


def _added(art: Artifact, side: str) -> Module | None:
    if not art.is_module:
        return None
    module = Module(art.target)
    verified = _verified(art)
    if side == "a":
        module.size_a, module.compile_a = art.size, art.duration_s
        module.verify_a, module.err_a, module.tolerance_used_a = verified
    else:
        module.size_b, module.compile_b = art.size, art.duration_s
        module.verify_b, module.err_b, module.tolerance_used_b = verified
    return module


def _module(a: Artifact, b: Artifact, pools: Pools) -> Module:
    m = Module(b.target or a.target, a.size, b.size, a.duration_s, b.duration_s)
    m.verify_a, m.err_a, m.tolerance_used_a = _verified(a)
    m.verify_b, m.err_b, m.tolerance_used_b = _verified(b)
    m.output_diff, m.output_note = largest_difference(a.verification, b.verification)
    _latency(m, a, b, pools)
    return m


def _latency(m: Module, a: Artifact, b: Artifact, pools: Pools) -> None:
    on_a, on_b = pools.devices(a.sha256), pools.devices(b.sha256)
    if a.sha256 is not None and a.sha256 == b.sha256:
        m.latency_note = "same artifact"
        return
    if not on_a or not on_b:
        m.latency_note = "not benchmarked in " + (
            "A and B" if not on_a and not on_b else "A" if not on_a else "B"
        )
        return
    digest_a, digest_b = a.sha256 or "", b.sha256 or ""
    if not on_a & on_b:
        m.latency_note = (
            f"measured on different devices (A: {', '.join(sorted(on_a))}; "
            f"B: {', '.join(sorted(on_b))}): latency not compared"
        )
        return
    common = sorted(pools.runs(digest_a) & pools.runs(digest_b))
    if not common:
        m.latency_note = "benchmarked on other inputs in A and B: latency not compared"
        return
    # --measure's interleaved runs when there are any; else the largest pool
    interleaved = [c for c in common if c[1] == MEASURED]
    m.device, run = (
        interleaved[0]
        if interleaved
        else max(common, key=lambda c: len(pools.samples[(digest_a, *c)]))
    )
    m.latency = pools.compare(digest_a, digest_b, m.device, run)


def _verified(art: Artifact) -> tuple[str, float | None, float | None]:
    """The module's verification outcome (pass, fail, skipped, none), its largest
    error against its references, and the largest share of a tolerance it used."""
    checks = art.verification
    if not checks:
        return "none", None, None
    passed = [c.get("passed") for c in checks]
    outcome = (
        "fail"
        if any(p is False for p in passed)
        else "pass"
        if any(p is True for p in passed)
        else "skipped"
    )
    outputs = [out for c in checks for ref in _references(c) for out in records_at(ref, "outputs")]
    errors = [e for out in outputs if (e := number_at(out, "max_abs_err")) is not None]
    used = [u for out in outputs if (u := number_at(out, "tolerance_used")) is not None]
    return outcome, max(errors, default=None), max(used, default=None)


def _references(check: dict[str, Any]) -> list[dict[str, Any]]:
    refs = check.get("references")
    if isinstance(refs, dict):
        return [r for r in refs.values() if isinstance(r, dict)]
    return [check]


# A module that grew by less is not marked as a regression (``--fail-if size`` still
# sees any growth).
_SIZE_GROWTH = 0.01


def regressions(row: Row) -> list[str]:
    """What got worse in ``row``: ``slower``, ``new-failure``, ``accuracy``, ``size``
    (grown by more than 1%)."""
    found = []
    m = row.module
    if m is not None and m.latency is not None and m.latency.verdict == "slower":
        found.append("slower")
    failed = ("failed", "not run")
    if row.status_b in failed and row.status_a not in failed:
        found.append("new-failure")
    if m is not None and m.verify_b == "fail" and m.verify_a != "fail":
        found.append("new-failure")
    if m is not None and _less_accurate(m):
        found.append("accuracy")
    if m is not None and m.size_a and m.size_b and m.size_b > m.size_a * (1 + _SIZE_GROWTH):
        found.append("size")
    return list(dict.fromkeys(found))


# B is less accurate when it uses this much more of its tolerance than A (a tenth of
# it): a difference of a rounding or two, under any tolerance, is not a regression.
ACCURACY_STEP = 0.1


def _less_accurate(m: Module) -> bool:
    if m.verify_a == "pass" and m.verify_b == "fail":
        return True
    if m.tolerance_used_a is not None and m.tolerance_used_b is not None:
        return m.tolerance_used_b > m.tolerance_used_a + ACCURACY_STEP
    # nothing to weigh it by (exact comparisons, an older manifest): any growth
    return m.err_a is not None and m.err_b is not None and m.err_b > m.err_a
