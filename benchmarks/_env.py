"""Running the benchmark scripts under the repository's virtual environment."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ensure_venv(script: str) -> None:
    """Re-execute ``script`` with ``ROOT/.venv``'s Python when another one runs it."""
    venv_python = ROOT / ".venv" / "bin" / "python"
    if venv_python.exists() and Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        os.execv(str(venv_python), [str(venv_python), script, *sys.argv[1:]])


def ensure_bench_extra() -> None:
    """Install the ``bench`` extra (ninja, doit) into the running environment if missing."""
    missing = [m for m in ("ninja", "doit") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"installing the bench extra (missing: {', '.join(missing)})", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "-e", ".[bench]"], cwd=ROOT, check=True
        )
