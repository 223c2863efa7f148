"""``kiln devices``: the devices of this machine, or of every worker of a cluster
(``--executor``), as kiln identifies them (``kiln.devices.identity``): the ids that checks'
keys and results name, and that Dask workers advertise as resources."""

from __future__ import annotations

import json
import os
from typing import IO, Any

from kiln.base.errors import BadNeed, UsageError
from kiln.base.terminal import printable
from kiln.cli import project_config
from kiln.cli.plain_parsers import devices_parser
from kiln.devices.identity import local_devices
from kiln.execution.cluster.spec import parse_executor


def run(argv: list[str], out: IO[str], err: IO[str]) -> int:
    ns = project_config.parse(devices_parser(), argv, os.getcwd())  # [tool.kiln] counts
    text = ns.executor or os.environ.get("KILN_EXECUTOR") or "local"
    spec = parse_executor(text)
    found = _cluster(spec, ns.executor_timeout) if spec.remote else {"here": _here()}
    if ns.json:
        json.dump(found, out, indent=2, sort_keys=True)
        out.write("\n")
        return 0
    for machine, devices in sorted(found.items()):
        print(printable(f"{machine}:", one_line=True), file=out)
        for d in devices:
            print(f"  {_line(d)}", file=out)
    return 0


def _here() -> list[dict[str, Any]]:
    try:
        return [d.to_json() for d in local_devices()]
    except BadNeed as e:
        raise UsageError(str(e)) from None


def _cluster(spec: Any, timeout_s: float) -> dict[str, list[dict[str, Any]]]:
    from kiln.execution.cluster.dask_client import DaskClient
    from kiln.execution.cluster.worker_devices import described

    client = DaskClient(spec, "", connect_timeout_s=timeout_s)
    try:
        answers = client.client.run(described, on_error="return")
    finally:
        client.close()
    out = {}
    for worker, answer in answers.items():
        if not isinstance(answer, list) or not all(isinstance(d, dict) for d in answer):
            said = printable(str(answer)[:200], one_line=True)
            raise UsageError(f"Dask worker {worker} cannot say which devices it has: {said}")
        out[str(worker)] = answer
    return out


def _line(d: dict[str, Any]) -> str:
    """One device in a line: its id, model, memory and versions."""
    parts = [str(d.get("id")), str(d.get("model"))]
    memory = d.get("memory")
    if isinstance(memory, int):
        parts.append(f"{memory / (1 << 30):.1f} GiB")
    if d.get("driver_version"):
        parts.append(f"driver {d['driver_version']}")
    if d.get("runtime_version"):
        parts.append(f"iree-base-runtime {d['runtime_version']}")
    if d.get("stand_in"):
        parts.append("stand-in (KILN_DEVICES)")
    # What a worker reports (a model name from nvidia-smi, say) is shown escaped.
    return "  ".join(printable(p, one_line=True) for p in parts)
