"""The PyTorch zoo: torchvision architectures with seeded random weights (nothing is
downloaded) go model -> ``torch_export`` (iree-turbine, weights in a parameter
archive) -> compile for ``cpu`` (host) and ``vmvx`` -> verify against the same model
in eager PyTorch on the same inputs -> benchmark. Needs ``pip install -e '.[iree,torch-zoo]'``
(torchvision).

Each model is an entrypoint (``kiln build examples/torch_zoo.py resnet18``). Run as a
script to build them all and end with a table of models x stages, and every failure
with its error:

    python examples/torch_zoo.py [--strict] [kiln build options, e.g. -j 2]

It exits 0 when the build ran, even if a model failed a stage (the table says which);
with ``--strict`` any failed stage makes it exit 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kiln import benchmark, compile, entrypoint, kiln_main, torch_export, verify

TARGETS = ("cpu", "vmvx")
# (name, factory, example input): the factory is called with torch's generators
# seeded, so its random initialization is the same in every worker and every build.
MODELS = (
    ("resnet18", "torchvision.models:resnet18", (1, 3, 224, 224)),
    ("mobilenet_v3_small", "torchvision.models:mobilenet_v3_small", (1, 3, 224, 224)),
    ("squeezenet1_1", "torchvision.models:squeezenet1_1", (1, 3, 224, 224)),
    ("efficientnet_b0", "torchvision.models:efficientnet_b0", (1, 3, 224, 224)),
)
STAGES = (
    "export",
    *(f"compile {t}" for t in TARGETS),
    *(f"verify {t}" for t in TARGETS),
    *(f"bench {t}" for t in TARGETS),
)
MARKS = {"built": "ok", "failed": "FAILED", "not run": "-", "not built": "?", "stale": "?"}


def _model_build(name: str, factory: str, shape: tuple[int, ...]):  # type: ignore[no-untyped-def]
    def build():  # type: ignore[no-untyped-def]
        mlir = torch_export(
            name="model.mlir", model=factory, args=[(shape, "float32")], params=True
        )
        modules = compile(name="model", source=mlir, targets=TARGETS)
        checks = []
        for target, module in zip(TARGETS, modules, strict=True):
            checks.append(
                verify(
                    name=f"verify_{target}.json",
                    module=module,
                    reference="torch",
                    # Relative only: with torchvision's initialization in eval mode
                    # some models' outputs are about 1e-14, which any absolute
                    # tolerance would pass whatever IREE computed.
                    rtol=1e-2,
                    atol=0.0,
                )
            )
            checks.append(
                benchmark(
                    name=f"bench_{target}.json", module=module, repetitions=1, min_time_s=0.01
                )
            )
        return [mlir, *modules, *checks]

    build.__name__ = name
    build.__doc__ = f"torchvision {name}, random weights (seed 0)"
    return build


for _name, _factory, _shape in MODELS:
    globals()[_name] = entrypoint(_model_build(_name, _factory, _shape))


def _check(entries: list[dict]) -> str:  # type: ignore[type-arg]
    status = entries[0].get("status", "not built") if entries else "not built"
    return "built" if status in ("passed", "measured") else status


def _duration(us: float) -> str:
    if us < 1000:
        return f"{us:.0f}us"
    return f"{us / 1000:.3g}ms" if us < 1e6 else f"{us / 1e6:.3g}s"


def _row(outputs: list[dict]) -> tuple[dict[str, str], dict[str, str]]:  # type: ignore[type-arg]
    status = {"export": outputs[0]["status"]}
    cells: dict[str, str] = {}
    for target, module in zip(TARGETS, outputs[1 : 1 + len(TARGETS)], strict=True):
        status[f"compile {target}"] = module["status"]
        status[f"verify {target}"] = _check(module.get("verification", []))
        bench = module.get("benchmark", [])
        status[f"bench {target}"] = _check(bench)
        if status[f"bench {target}"] == "built":
            cells[f"bench {target}"] = _duration(bench[0]["median"])
        checks = module.get("verification", [])
        if status[f"verify {target}"] == "built":
            out = checks[0]["references"]["torch"]["outputs"][0]
            cells[f"verify {target}"] = f"ok (rel {out['max_rel_err']:.1e})"
    for stage, value in status.items():
        cells.setdefault(stage, MARKS.get(value, value))
    return status, cells


def _failures(output_dir: Path) -> list[str]:
    """Each action that failed in the last build, with the last line of its error."""
    events = output_dir / ".kiln" / "last-events.jsonl"
    found = []
    for line in events.read_text().splitlines() if events.exists() else []:
        event = json.loads(line)
        if event.get("event") == "failed":
            lines = [x.strip() for x in str(event.get("error", "")).splitlines() if x.strip()]
            found.append(f"  {event['desc']}: {lines[-1] if lines else '?'}")
    return found


def print_table(output_dir: Path) -> None:
    """Models x stages from the manifest, then every failure with its error."""
    manifest = json.loads((output_dir / "manifest.json").read_text())
    rows = {ep: _row(v["outputs"]) for ep, v in sorted(manifest["entrypoints"].items())}
    rows = {ep: r for ep, r in rows.items() if not set(r[0].values()) <= {"not built", "stale"}}
    print("| model | " + " | ".join(STAGES) + " |")
    print("|---" * (len(STAGES) + 1) + "|")
    for ep, (_, cells) in rows.items():
        print(f"| {ep} | " + " | ".join(cells[s] for s in STAGES) + " |")
    ok = {s: sum(1 for st, _ in rows.values() if st[s] == "built") for s in STAGES}
    print("| ok | " + " | ".join(f"{ok[s]}/{len(rows)}" for s in STAGES) + " |")
    failures = _failures(output_dir)
    if failures:
        print(f"{len(failures)} failure(s):", *failures, sep="\n")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--strict"]
    out = Path(args[args.index("--output-dir") + 1]) if "--output-dir" in args else Path("kiln-out")
    try:
        kiln_main(args=["build", *args])
        status = 0
    except SystemExit as e:
        status = int(e.code or 0)
    if status in (0, 1) and (out / "manifest.json").exists():
        print_table(out)
        if status == 1 and "--strict" not in sys.argv:
            status = 0
    sys.exit(status)
