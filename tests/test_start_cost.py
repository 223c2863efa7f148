"""What a ``kiln`` start imports: a build that fetches, benchmarks, keys a library
or names a start method imports what it needs when it needs it, so a build that
does none of these does not pay for it (every start of ``kiln`` did: ssl,
http.client, importlib.metadata, multiprocessing, statistics: about a third of
a trivial build's instructions, 764 million against 506 million under callgrind)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = (
    "ssl",
    "http.client",
    "urllib.request",
    "importlib.metadata",
    "importlib.resources",
    "multiprocessing",
    "statistics",
)

PROBE = """
import json, runpy, sys
sys.argv = ["kiln", *sys.argv[1:]]
try:
    runpy.run_module("kiln", run_name="__main__")
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "loaded": [m for m in HEAVY if m in sys.modules]}))
"""


def test_a_build_that_needs_no_network_or_metadata_imports_neither(tmp_path: Path) -> None:
    (tmp_path / "build.py").write_text(
        "from kiln import *\n\n"
        "@entrypoint\n"
        "def e():\n"
        '    return run_command(name="x.txt", command=["sh", "-c", "echo x > {out}"])\n'
    )
    r = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{PROBE}", "build", "build.py", "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = json.loads(r.stdout.splitlines()[-1])
    assert found["code"] == 0, r.stderr
    assert (tmp_path / "kiln-out" / "genfiles" / "e" / "x.txt").read_text() == "x\n"
    assert found["loaded"] == [], found
