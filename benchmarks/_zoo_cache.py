"""The shared cache on the model zoo: a clean build without and with a cold cache, and
builds into a fresh output directory served by a warm local cache or by a warm
remote cache alone (nginx with WebDAV on 127.0.0.1, as the tests start it)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from _measure import Series, checked, run_child, say
from _zoo import HERE, _argv
from _zoo_models import ENV

sys.path.insert(0, str(HERE.parent / "tests"))
from nginx import NginxCache  # noqa: E402

NO_CACHE = "clean, --no-cache"
COLD = "clean, cold cache"
UPLOAD = "clean, cold cache, uploading to the remote"
WARM = "fresh output dir, warm local cache"
REMOTE = "fresh output dir, only the remote cache warm"
SCENARIOS = (NO_CACHE, COLD, WARM, UPLOAD, REMOTE)


@dataclass
class ZooCacheResult:
    models: list[str]
    series: dict[str, Series] = field(default_factory=dict)
    identical: bool | None = None


def _tree(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes()
        for area in ("bin", "genfiles")
        for p in sorted((out / area).rglob("*"))
        if p.is_file()
    }


def bench_zoo_cache(count: int, *, work: Path, runs: int) -> ZooCacheResult:
    from _zoo_models import model_zoo

    chosen = model_zoo()[:count]
    root = work / f"zoo-cache{count}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    listing = root / "models.json"
    listing.write_text(json.dumps([[m.name, m.model] for m in chosen]))
    names = [m.name for m in chosen]
    result = ZooCacheResult(names, {s: Series("kiln") for s in SCENARIOS})
    for round_ in range(runs):
        _round(root, names, listing, result, round_)
    return result


def _round(root: Path, names: list[str], listing: Path, result: ZooCacheResult, n: int) -> None:
    for sub in ("out", "cache"):
        shutil.rmtree(root / sub, ignore_errors=True)
    nginx_dir = root / f"nginx-{n}"
    shutil.rmtree(nginx_dir, ignore_errors=True)
    nginx_dir.mkdir()
    nginx = NginxCache(nginx_dir)
    try:
        plan = {
            NO_CACHE: ("no-cache", None, ["--no-cache"]),
            COLD: ("cold", "local", []),
            WARM: ("warm", "local", []),
            UPLOAD: ("upload", "uploader", ["--remote-cache", nginx.url]),
            REMOTE: ("remote", "consumer", ["--remote-cache", nginx.url]),
        }
        # The two clean builds alternate which goes first, so drifting load evens out.
        order = list(SCENARIOS) if n % 2 == 0 else [COLD, NO_CACHE, *SCENARIOS[2:]]
        for scenario in order:
            out_name, cache_name, extra = plan[scenario]
            out = root / "out" / out_name
            env = {
                **os.environ,
                ENV: str(listing),
                "KILN_CACHE_DIR": str(root / "cache" / (cache_name or "unused")),
            }
            log = root / f"{out_name}-{n}.log"
            sample = checked(
                run_child([*_argv("kiln", names, out), *extra], cwd=root, log=log, env=env),
                f"zoo cache {scenario}",
            )
            result.series[scenario].samples.append(sample)
            say(f"  zoo {len(names)} kiln {scenario}: {sample.wall_s:.2f} s wall")
    finally:
        nginx.close()
    # What the cache serves must be what the build that filled it made (a compile embeds
    # its input's absolute path, so builds into two output directories differ anyway).
    cold, warm, upload, remote = (
        _tree(root / "out" / name) for name in ("cold", "warm", "upload", "remote")
    )
    same = bool(cold) and cold == warm and bool(upload) and upload == remote
    result.identical = same if result.identical is None else result.identical and same


def cache_table(result: ZooCacheResult) -> list[str]:
    base = result.series[NO_CACHE]
    lines = [
        "| models | scenario | runs | wall s | CPU s | ÷ clean (--no-cache) |",
        "|--:|---|--:|--:|--:|--:|",
    ]
    for scenario, s in result.series.items():
        ratio = f"{s.wall_s / base.wall_s:.3f}" if s.samples and base.samples else "—"
        lines.append(
            f"| {len(result.models)} | {scenario} | {len(s.samples)} | "
            f"{s.wall_s:.2f} | {s.cpu_s:.2f} | {ratio} |"
        )
    lines.append("")
    lines.append(
        "Outputs served from the warm local cache byte-identical to the cold build's, "
        "and those served from the remote to the uploading build's: "
        f"{'yes' if result.identical else '**no**'}."
    )
    return lines


def cache_targets(result: ZooCacheResult | None) -> list[tuple[str, str, str, bool | None]]:
    """(target, measured, goal, met) rows."""
    if result is None or not result.series[NO_CACHE].samples:
        return []
    s = result.series
    base, cold = s[NO_CACHE].wall_s, s[COLD].wall_s
    warm, remote = s[WARM].wall_s / base, s[REMOTE].wall_s / base
    overhead = cold / base - 1
    return [
        ("zoo fresh dir, warm local cache ÷ clean", f"{warm:.3f}", "≤ 0.10", warm <= 0.10),
        ("zoo fresh dir, only remote warm ÷ clean", f"{remote:.3f}", "≤ 0.20", remote <= 0.20),
        (
            "zoo clean, cold cache overhead over --no-cache",
            f"{overhead:+.1%}",
            "≤ +10%",
            overhead <= 0.10,
        ),
        (
            "zoo cached outputs byte-identical",
            "yes" if result.identical else "no",
            "yes",
            bool(result.identical),
        ),
    ]
