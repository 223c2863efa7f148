"""Worker side of ``verify``: run a compiled module on its inputs and compare its
outputs with each reference (shipped expected files, onnxruntime's outputs).

The result JSON (written only when every reference matches)::

    {"status": "passed" | "skipped", "passed": true | null, "reason": (when skipped),
     "model", "module", "target", "driver", "device_id" (``kiln.devices.identity``), "function",
     "inputs": {"source": "given", "files", "paths", "sha256"}
         | {"source": "generated", "seed", "shapes", "model"} (``_reference.check_inputs``:
         ``paths`` and ``model`` relative to the output directory, ``sha256`` per file),
     "references": {"shipped" | "onnxruntime": {"passed", "summary", "outputs": [
         {"index", "name", "shape", "dtype", "rtol", "atol", "max_abs_err",
          "max_rel_err", "tolerance_used", "worst_index", "mismatches", "passed", "worst"}]}},
     "outputs": (the first reference's outputs), "summary",
     "actual": [{"dtype", "shape", "sha256", "values" | "data" (when small)}] (what the
         module computed, for ``kiln compare``: ``kiln.actions.output_record``)}

A mismatch raises `VerificationFailed`, carrying the same dict as ``result`` (for
the manifest) and a message naming the model, target, output and error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln.actions._reference import output_names, read_reference, run_inputs
from kiln.actions._runtime import RunSpec, run_module, write_result
from kiln.actions._tensors import compare_all, load_tensor
from kiln.actions.output_record import fingerprint
from kiln.base.errors import VerificationFailed


@dataclass(kw_only=True)
class Check(RunSpec):
    """Everything one verification needs: the run (``RunSpec``) and its references."""

    label: str  # the model (or module) as the user named it in the build
    expected: list[str]
    reference: str | None  # the onnxruntime outputs (.npz), if asked for
    tolerances: dict[str, list[float]] = field(default_factory=dict)
    reference_name: str = "onnxruntime"  # what computed ``reference``


def run_check(check: Check) -> None:
    """Verify ``check.module``; write the result, or raise VerificationFailed."""
    head: dict[str, Any] = {
        "model": check.label,
        "module": check.module,
        "target": check.target,
        "driver": check.driver,
        "device_id": check.device,
    }
    if check.absent is not None:
        write_result(
            check.result_path,
            {**head, "status": "skipped", "passed": None, "reason": check.absent},
        )
        return
    args, how = run_inputs(check)
    function, actual = run_module(
        check.module, args, check.driver, check.function, check.loads.parameters
    )
    names = output_names(check.model) if check.model else []
    wanted: dict[str, list[Any]] = {}
    if check.expected:
        wanted["shipped"] = [load_tensor(p) for p in check.expected]
    if check.reference:
        wanted[check.reference_name] = read_reference(check.reference)
    refs = {ref: compare_all(actual, want, check.tolerances, names) for ref, want in wanted.items()}
    passed = all(r["passed"] for r in refs.values())
    summary = "\n".join(f"against {ref}: {r['summary']}" for ref, r in refs.items())
    result = {
        **head,
        "function": function,
        "inputs": how,
        "references": refs,
        "status": "passed" if passed else "failed",
        "passed": passed,
        "summary": summary,
        "outputs": next(iter(refs.values()))["outputs"] if refs else [],
        "actual": [fingerprint(a) for a in actual],
    }
    if not passed:
        raise VerificationFailed(_failure_message(check, refs), result)
    write_result(check.result_path, result)


def _failure_message(check: Check, refs: dict[str, dict[str, Any]]) -> str:
    lines = [f"{check.label} compiled for {check.target} ({check.module}): outputs do not match:"]
    for ref, r in refs.items():
        if not r["passed"]:
            lines += [f"  against {ref}: {line}" for line in r["summary"].splitlines()]
    return "\n".join(lines)
