"""The model zoo: every ONNX backend test model the ``onnx`` package ships (under
``pytorch-converted``, ``pytorch-operator`` and ``simple``) goes
source -> import -> compile for ``cpu`` (host) and ``vmvx`` -> verify against its
``test_data_set_0`` and against onnxruntime on the same inputs -> benchmark.
``--target`` replaces the two default targets (``--target cuda:sm_89``: compiled
for CUDA; its checks are skipped on a machine without a CUDA device).

Each model is an entrypoint, so one model builds alone with
``kiln build examples/model_zoo.py <model>``. Run this file as a script to build
everything and end with a table of models x stages:

    python examples/model_zoo.py [--strict] [kiln build options, e.g. -j 2 --output-dir DIR]

It exits 0 when the build ran, even if some models failed a stage (the table
shows which); with ``--strict`` any failed stage makes it exit 1.

To see what a compiler flag does to every model, build the zoo twice and compare
(docs/compare.md):

    kiln build examples/model_zoo.py --output-dir zoo-a -j 2
    kiln build examples/model_zoo.py --output-dir zoo-b -j 2 \
        --iree-compile-extra-args="--iree-opt-level=O3"
    kiln compare zoo-a zoo-b [--measure] [--fail-if slower>5%,accuracy]
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from zoo_models import ZooModel, model_zoo

from kiln import (
    benchmark,
    compile,
    entrypoint,
    kiln_main,
    onnx_import,
    requested_targets,
    source_file,
    verify,
)

TARGETS = ("cpu", "vmvx")  # unless the command line gives --target
# Some reference models compute in f64; by default IREE demotes f64 to f32, and
# the module then no longer accepts the f64 reference inputs.
FLAGS = ("--iree-input-demote-f64-to-f32=false",)
CHECKS = ("verify", "ort", "bench")  # per target, in the order the build returns them


def stages(targets: list[str]) -> list[str]:
    """The table's columns for ``targets`` (their labels, as in the outputs' names)."""
    return [
        "import",
        *(f"compile {t}" for t in targets),
        *(f"{check} {t}" for check in CHECKS for t in targets),
    ]


MARKS = {
    "built": "ok",
    "failed": "FAILED",
    "not run": "-",
    "not built": "?",
    "stale": "?",
    "skipped": "skipped",
}


def _model_build(model: ZooModel):  # type: ignore[no-untyped-def]
    def build():  # type: ignore[no-untyped-def]
        onnx_file = source_file(model.model, name="model.onnx")
        inputs = [source_file(p, name=f"data/{Path(p).name}") for p in model.inputs]
        expected = [source_file(p, name=f"data/{Path(p).name}") for p in model.outputs]
        mlir = onnx_import(name="model.mlir", source=onnx_file)
        targets = requested_targets(default=TARGETS)
        modules = compile(name="model", source=mlir, targets=targets, flags=FLAGS)
        checks = []
        for spec, module in zip(targets, modules, strict=True):
            target = spec.replace(":", "-")
            # Against the shipped outputs and against onnxruntime, as two checks, so
            # that each reference's verdict stands even when the other cannot run.
            checks.append(
                verify(
                    name=f"verify_{target}.json",
                    module=module,
                    inputs=inputs,
                    expected=expected,
                    rtol=1e-3,
                    atol=1e-4,
                )
            )
            checks.append(
                verify(
                    name=f"ort_{target}.json",
                    module=module,
                    inputs=inputs,
                    reference="onnxruntime",
                    rtol=1e-3,
                    atol=1e-4,
                )
            )
            checks.append(
                benchmark(
                    name=f"bench_{target}.json",
                    module=module,
                    inputs=inputs,
                    # Ten: what kiln compare needs to class a change (docs/compare.md).
                    repetitions=10,
                    min_time_s=0.01,
                )
            )
        return [mlir, *modules, *checks]

    build.__name__ = model.name
    build.__doc__ = f"{model.category}: {Path(model.model).parent.name}"
    return build


for _model in model_zoo():
    globals()[_model.name] = entrypoint(_model_build(_model))


def _check_status(entries: list[dict], i: int) -> str:  # type: ignore[type-arg]
    entry = entries[i] if i < len(entries) else {"status": "not built"}
    status = entry.get("status") or "not built"
    return "built" if status in ("passed", "measured") else status


Row = tuple[dict[str, str], dict[str, str], dict[str, float]]


def _targets(outputs: list[dict]) -> list[str]:  # type: ignore[type-arg]
    """A model's target labels, from the names of its checks' results (the build
    returns the import, one module per target, then three checks per target)."""
    count = (len(outputs) - 1) // (1 + len(CHECKS))
    checks = outputs[1 + count :: len(CHECKS)]
    return [Path(o["path"]).stem.split("_", 1)[1] for o in checks]


def _row(outputs: list[dict]) -> Row:  # type: ignore[type-arg]
    """(stage -> status, stage -> table cell, target -> benchmark median) of a model."""
    status = {"import": outputs[0]["status"]}
    cells, medians = {}, {}
    targets = _targets(outputs)
    for target, module in zip(targets, outputs[1 : 1 + len(targets)], strict=True):
        checks, benches = module.get("verification", []), module.get("benchmark", [])
        status[f"compile {target}"] = module["status"]
        status[f"verify {target}"] = _check_status(checks, 0)
        status[f"ort {target}"] = _check_status(checks, 1)
        status[f"bench {target}"] = _check_status(benches, 0)
        if status[f"bench {target}"] == "built":
            medians[target] = benches[0]["median"]
            cells[f"bench {target}"] = _duration(medians[target])
    for stage, value in status.items():
        cells.setdefault(stage, MARKS.get(value, value))
    return status, cells, medians


def _duration(us: float) -> str:
    """A latency in microseconds, readably: 42us, 14.7ms, 2.75s."""
    if us < 1000:
        return f"{us:.0f}us"
    return f"{us / 1000:.3g}ms" if us < 1e6 else f"{us / 1e6:.3g}s"


def _disagreements(manifest: dict) -> list[str]:  # type: ignore[type-arg]
    """Models where IREE and onnxruntime disagree, each with the error."""
    found = []
    for ep, value in sorted(manifest["entrypoints"].items()):
        targets = _targets(value["outputs"])
        for target, module in zip(targets, value["outputs"][1 : 1 + len(targets)], strict=True):
            checks = module.get("verification", [])
            if len(checks) > 1 and checks[1].get("status") == "failed":
                error = checks[1].get("error", "").splitlines()
                found.append(f"  {ep} ({target}): {error[-1].strip() if error else '?'}")
    return found


def print_table(output_dir: Path) -> None:
    """Models x stages from the build's manifest, with the counts per stage."""
    manifest = json.loads((output_dir / "manifest.json").read_text())
    entrypoints = sorted(manifest["entrypoints"].items())
    rows = {ep: _row(v["outputs"]) for ep, v in entrypoints}
    # Models not asked for this time (targets on the command line) stay out.
    rows = {ep: r for ep, r in rows.items() if not set(r[0].values()) <= {"not built", "stale"}}
    targets = list(
        dict.fromkeys(t for ep, v in entrypoints if ep in rows for t in _targets(v["outputs"]))
    )
    columns = stages(targets)
    counts = {s: sum(1 for st, _, _ in rows.values() if st.get(s) == "built") for s in columns}
    cells = {ep: [r[1].get(s, "") for s in columns] for ep, r in rows.items()}
    if not sys.stdout.isatty() or not _print_rich_table(cells, columns, counts, len(rows)):
        print("\t".join(["model", *columns]))
        for ep, row in cells.items():
            print("\t".join([ep, *row]))
    print(_summary(rows, counts, targets))
    disagree = _disagreements(manifest)
    if disagree:
        print(f"IREE and onnxruntime disagree on {len(disagree)} module(s):", *disagree, sep="\n")


# Marks shortened on a terminal, where every column counts.
_SHORT = {"FAILED": "FAIL", "skipped": "skip"}


def _print_rich_table(
    cells: dict[str, list[str]], columns: list[str], counts: dict[str, int], total: int
) -> bool:
    """The table on a terminal: a section per category, each model by its test's
    name (the category and ``test_`` prefix are the section's), one column per
    stage with its targets' cells side by side (``ok/FAIL``), every cell whole:
    a terminal too narrow for it all cuts model names, never a result. False (and
    nothing printed) when even that does not fit."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    stages = list(dict.fromkeys(c.partition(" ")[0] for c in columns))
    targets = list(dict.fromkeys(c.partition(" ")[2] for c in columns if " " in c))
    where = {c: i for i, c in enumerate(columns)}

    def joined(values: list[str], stage: str) -> str:
        picked = [values[where[f"{stage} {t}"]] for t in targets if f"{stage} {t}" in where]
        return "/".join(picked) if picked else values[where[stage]]

    rows = {
        ep: [joined([_SHORT.get(v, v) for v in row], st) for st in stages]
        for ep, row in cells.items()
    }
    oks = [joined([f"{counts[c]}" for c in columns], st) for st in stages]
    table = Table(box=box.SIMPLE_HEAD, title="model zoo", title_justify="left")
    table.add_column("model", no_wrap=True, overflow="ellipsis", min_width=8)
    needed = 8 + 2 + 8  # the model column at its narrowest, its padding, the edges
    for i, stage in enumerate(stages):
        header = f"{stage}\n{'/'.join(targets)}" if stage != "import" else stage
        widest = max(len(x) for x in [*header.split("\n"), oks[i], *(r[i] for r in rows.values())])
        table.add_column(header, no_wrap=True, min_width=widest)
        needed += widest + 2
    category = None
    for ep, row in rows.items():
        group, _, test = ep.partition("__")
        if group != category:
            if category is not None:
                table.add_section()
            table.add_row(f"[bold]{group}", *[""] * len(stages))
            category = group
        table.add_row("  " + (test.removeprefix("test_") or ep), *row)
    table.add_section()
    table.add_row(f"[bold]ok (of {total})", *(f"[bold]{x}" for x in oks))
    console = Console()
    if needed > console.width:  # rich would cut or drop columns
        return False
    table.columns[0].max_width = 8 + console.width - needed  # rich cuts this one only
    console.print(table)
    return True


def _summary(rows: dict[str, Row], counts: dict[str, int], targets: list[str]) -> str:
    fully = sum(1 for st, _, _ in rows.values() if all(v == "built" for v in st.values()))
    skipped = sum(1 for st, _, _ in rows.values() for v in st.values() if v == "skipped")
    bench = ""
    for target in targets:
        medians = sorted(m[target] for _, _, m in rows.values() if target in m)
        if medians:
            mid = medians[len(medians) // 2]
            bench += f"; bench {target} {_duration(medians[0])}-{_duration(medians[-1])}"
            bench += f" (median {_duration(mid)})"
    return (
        f"models: {len(rows)}; "
        + ", ".join(f"{s}: {n}" for s, n in counts.items())
        + f"; {fully} verified on every target{bench}"
        + (f"; {skipped} check(s) skipped (no device here)" if skipped else "")
    )


def verdict(output_dir: Path, status: int, strict: bool) -> str:
    """The script's last line: what the survey found and what its exit status means."""
    if not (output_dir / "manifest.json").exists():
        return f"zoo: the build did not run; exit {status}"
    manifest = json.loads((output_dir / "manifest.json").read_text())
    rows = [_row(v["outputs"])[0] for v in manifest["entrypoints"].values()]
    rows = [r for r in rows if not set(r.values()) <= {"not built", "stale"}]
    compiled = sum(1 for r in rows if all(r[s] == "built" for s in r if s.startswith("compile")))
    passed = sum(1 for r in rows if all(v in ("built", "skipped") for v in r.values()))
    failed = sum(1 for r in rows for v in r.values() if v == "failed")
    found = (
        f"zoo: {len(rows)} models, {compiled} compiled for every target, {passed} through "
        f"every stage, {failed} failed stage(s); exit {status}"
    )
    if status == 0 and failed:
        return f"{found}: failures are results (--strict exits 1 on them)"
    if status == 1 and strict:
        return f"{found}: --strict, and a stage failed"
    return found if status == 0 else f"{found}: the build failed (see kiln's messages above)"


if __name__ == "__main__":
    strict = "--strict" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--strict"]
    out = Path(args[args.index("--output-dir") + 1]) if "--output-dir" in args else Path("kiln-out")
    # The table below reports each failed stage: kiln names them in its summary
    # only, one line each, instead of each failure's details as it happens.
    if not any(a == "--failures" or a.startswith("--failures=") for a in args):
        args = ["--failures=summary", *args]
    try:
        # The table below is the zoo's answer: the outputs' paths (over a thousand)
        # are in the manifest, not on the screen.
        kiln_main(args=["build", *args], stdout=io.StringIO())
        status = 0
    except SystemExit as e:
        status = int(e.code or 0) if isinstance(e.code, int | None) else 1
    if status in (0, 1) and (out / "manifest.json").exists():
        print_table(out)
        print(f"outputs: {out / 'manifest.json'} lists every file the build made")
        # Models the compiler cannot handle are results of the survey, shown in the
        # table; the run itself succeeded. Pass --strict to exit 1 on any failure.
        if status == 1 and not strict:
            status = 0
    sys.stdout.flush()
    print(verdict(out, status, strict))
    sys.exit(status)
