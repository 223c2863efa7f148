"""Shared fixtures: writing build modules and running the real ``kiln`` CLI."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import needs
import pytest
from nginx import NginxCache
from procs import tagged_processes

# A build module's usual header, for tests that write modules.
HEADER = """\
from kiln import *
from kiln.executor import *
"""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def write_module(tmp_path: Path):
    """Write a build module (dedented, with HEADER prepended) and return its path."""

    def write(text: str, name: str = "build.py", header: bool = True) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((HEADER if header else "") + textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def kiln(request: pytest.FixtureRequest):
    """Run ``kiln ARGS`` in tmp_path (plain console); return its Result. In a process
    of its own (``kiln_subprocess``), or in this one (``kiln_in_process``, much
    faster) where the test module is marked ``pytestmark = pytest.mark.in_process``;
    a test there that needs a process of its own (a signal, a kill, a hang that
    must stay bounded, the process's own threads) takes ``kiln_subprocess``."""
    in_process = request.node.get_closest_marker("in_process") is not None
    return request.getfixturevalue("kiln_in_process" if in_process else "kiln_subprocess")


@pytest.fixture
def kiln_subprocess(tmp_path: Path):
    """Run ``python -m kiln ARGS`` in tmp_path (plain console); return its Result."""

    def run(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> Result:
        full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
        proc = subprocess.run(
            [sys.executable, "-m", "kiln", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def kiln_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run ``kiln ARGS`` in this process (``kiln.cli.main.run_cli``) in tmp_path, with
    the streams captured; return its Result. For tests that need no process of their
    own (no signal, no kill, no terminal, no start-up environment): much faster than
    the ``kiln`` fixture's ``python -m kiln``."""
    from kiln.cli.main import run_cli

    def run(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> Result:
        out, err = io.StringIO(), io.StringIO()
        with monkeypatch.context() as m:
            m.chdir(tmp_path)
            for name, value in {"NO_COLOR": "1", **(env or {})}.items():
                m.setenv(name, value)
            code = run_cli(list(args), stdout=out, stderr=err)
        return Result(code, out.getvalue(), err.getvalue())

    return run


@pytest.fixture
def nginx_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxCache]:
    """A real nginx serving WebDAV on 127.0.0.1 (``tests/nginx.py``). Without nginx the
    test skips, except in CI (``CI`` set), where it fails: there the tests must run
    (``scripts/test`` installs nginx)."""
    needs.program("nginx")
    server = NginxCache(tmp_path_factory.mktemp("nginx"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def _private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test gets its own empty shared cache (``KILN_CACHE_DIR``): no test reads the
    user's cache or another test's results, and none reaches a remote cache, nor a
    proxy of the machine's environment (the remote cache honours it)."""
    path = tmp_path_factory.mktemp("kiln-cache")
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    proxies = [n for n in os.environ if n.lower().endswith("_proxy")]
    for name in ("KILN_REMOTE_CACHE", "KILN_CACHE_MAX_SIZE", *proxies):
        monkeypatch.delenv(name, raising=False)
    return path


@pytest.fixture
def tag() -> Iterator[str]:
    """A value for $KILN_TEST_TAG; processes still carrying it at the end are killed."""
    value = uuid.uuid4().hex
    yield value
    for pid in tagged_processes(value):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    """IREE's runtime bindings (nanobind), once imported by an in-process test, print
    hundreds of "leaked" lines when the interpreter finalizes, burying pytest's
    summary. The run is over by now: leave without finalizing, with pytest's status."""
    if "iree._runtime" in sys.modules or "iree.runtime" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash.get(_EXIT_STATUS, 0))


_EXIT_STATUS = pytest.StashKey[int]()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per CPU this process may use. Most tests spend much
    of their time waiting on the processes they start (a start, a timeout, a
    server), and while one worker waits another computes (README: the suite's
    times, quiet and beside a second build)."""
    return 2 * len(os.sched_getaffinity(0))


# The suite's longest tests, longest first (seconds on the 2-core machine under the
# load of a second build). They start first, one at the head of each worker's share,
# so that none starts last and holds the run up alone; tests/test_suite_order.py
# checks that each still names a test.
LONGEST = (
    "test_torch_export.py::test_export_verify_against_torch_and_new_weights",
    "test_kill_fuzz.py::test_sigkill_at_random_moments_never_corrupts_the_next_build",
    "test_torch_export.py::test_a_no_op_build_neither_runs_nor_imports_torch_and_bytes_do_not_move",
    "test_torch_export.py::test_factory_spec_is_keyed_by_its_source_with_a_dynamic_batch",
    "test_params.py::test_weights_only_change_reruns_import_and_checks_not_compile",
    "test_params.py::test_threshold_and_scope_and_the_same_bytes_elsewhere",
    "test_docs.py::test_the_readme_commands_run_as_written",
    "test_docs.py::test_the_cluster_doc_commands_run_as_written",
    "test_torch_export.py::test_iree_turbine_build_actions_run_unchanged",
    "test_same_bytes.py::test_a_reproducible_build_passes_the_check",
    "test_reentrant.py::test_two_hundred_runs_leave_the_process_as_it_was",
    "test_dask_executor.py::test_a_module_compiled_on_a_worker_is_the_local_modules_bytes",
    "test_dask_executor.py::test_losing_the_scheduler_fails_the_build_and_a_rerun_resumes",
    "test_same_bytes.py::test_two_output_directories_two_checkouts_and_a_cache_hit_give_the_same_bytes",
    "test_same_bytes.py::test_a_host_cpu_compile_is_keyed_by_what_the_host_resolves_to",
    "test_cache_index.py::test_a_busy_index_holds_a_build_up_once_at_most",
    "test_outside_files.py::test_a_directory_input_is_keyed_by_its_tree",
    "test_ireetools.py::test_every_target_form_is_accepted_by_iree_compile",
    "test_model_zoo.py::test_the_readmes_two_models_through_every_stage",
    "test_same_bytes.py::test_a_benchmark_is_not_checked_and_never_leaves_the_machine",
    "test_params.py::test_external_data_must_be_declared_and_is_keyed",
    "test_torch_export.py::test_a_factory_with_other_weights_on_every_call_fails",
    "test_interrupt.py::test_signal_stops_the_build_cleanly",
    "test_priority.py::test_random_graph_starts_a_longest_chain_first",
    "test_scheduler.py::test_random_graph_invariants",
)


def _longest_rank(item: pytest.Item) -> int | None:
    """``item``'s place in LONGEST (a parametrized test by its function), or None."""
    name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
    return LONGEST.index(name) if name in LONGEST else None


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deal LONGEST's tests to the heads of the workers' shares, longest first; the
    other tests keep their order. ``--dist worksteal`` gives each of N workers a
    contiguous share (sizes as below) and steals from the tail of a busy worker's
    queue, so a long test at a share's head neither waits behind short ones nor is
    the last to start."""
    ranked = [
        (rank, i) for i, item in enumerate(items) if (rank := _longest_rank(item)) is not None
    ]
    if not ranked:
        return
    longest = [items[i] for _, i in sorted(ranked)]
    chosen = {i for _, i in ranked}
    rest = iter([item for i, item in enumerate(items) if i not in chosen])
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    ordered: list[pytest.Item] = []
    left = len(items)
    for worker in range(workers):
        size = left // (workers - worker)  # as xdist's worksteal sizes its first shares
        left -= size
        share = longest[worker::workers]
        share += itertools.islice(rest, max(0, size - len(share)))
        ordered += share
    ordered += list(rest)
    items[:] = ordered
