"""benchmarks/run.py runs in the README's environment (kiln's ``iree`` extra, no
pytest) and, unless asked to record, leaves the repository's files as they were."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# As the README's venv has it: no pytest (tests/nginx.py, which the benchmarks start
# nginx with, must not need it).
WITHOUT_PYTEST = """
import runpy, sys
sys.modules["pytest"] = None
sys.argv = ["benchmarks/run.py", *sys.argv[1:]]
sys.path.insert(0, "benchmarks")
runpy.run_path("benchmarks/run.py", run_name="__main__")
"""


def test_run_py_imports_everything_without_pytest() -> None:
    r = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYTEST, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "--record" in r.stdout
    probe = "import sys; sys.modules['pytest'] = None; sys.path[:0] = ['benchmarks', 'tests']; "
    for module in ("_zoo_cache", "_dask_row", "dask_exec", "_dask_devices", "nginx"):
        imported = subprocess.run(
            [sys.executable, "-c", probe + f"import {module}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert imported.returncode == 0, (module, imported.stderr)


def test_results_go_to_the_kept_folder_only_when_recorded() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    kept = ROOT / "benchmarks" / "results"
    assert run.results_dir(run._parse([])) == kept / "local"
    assert run.results_dir(run._parse(["--quick"])) == kept / "local"
    assert run.results_dir(run._parse(["--record"])) == kept
    assert run.results_dir(run._parse(["--readme"])) == kept
    # git status stays clean after a run.
    assert "benchmarks/results/local/" in (ROOT / ".gitignore").read_text().splitlines()
