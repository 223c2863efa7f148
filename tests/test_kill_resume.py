"""A real ``kiln build`` killed with SIGKILL is completed correctly by the next one:
what finished is kept, what was running re-runs, nothing half-written is trusted,
and the outputs equal a clean build's."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import wait_gone

from kiln.state import StateStore

TOOL = """\
import os, sys, time
name, op, out, *inputs = sys.argv[1:]
# Commands run in the output directory, given a link to this script in .kiln/src.
here = os.path.dirname(os.path.realpath(__file__))
with open(os.path.join(here, "ran.log"), "a") as log:
    log.write(name + "\\n")
text = "".join(open(i).read() for i in inputs)
if op == "slow" and os.path.exists(os.path.join(here, "slow.flag")):
    open(os.path.join(here, "marker.tmp"), "w").write(str(os.getpid()))
    os.replace(os.path.join(here, "marker.tmp"), os.path.join(here, "marker"))
    time.sleep(60)
open(out, "w").write(text.upper() + "|" + name)
"""

CHAIN = """\
import sys
from kiln import entrypoint, run_command, source_file

def tool(name, op, *inputs):
    return run_command(name=name, inputs=list(inputs),
                       command=[sys.executable, "tool.py", name, op, "{out}",
                                *[f"{{inputs[{i}]}}" for i in range(len(inputs))]])

@entrypoint
def chain():
    one = tool("one.out", "fast", source_file("a.txt"))
    two = tool("two.out", "fast", source_file("b.txt"))
    slow = tool("slow.out", "slow", one, two)
    return tool("final.out", "fast", slow, two)
"""

IN_PLACE = """\
import os, time
from pathlib import Path
from kiln import entrypoint, source_file
from kiln.executor import BuildAction, BuildContext

HERE = Path(__file__).parent

class InPlace(BuildAction):
    \"\"\"Writes its output in place, in two steps, pausing in between when asked.\"\"\"

    def __init__(self, output, source, **kwargs):
        super().__init__(**kwargs)
        self.output = output
        self.source = source

    def _invoke(self):
        with open(HERE / "ran.log", "a") as log:
            log.write(self.output.path + "\\n")
        with open(self.output.get_fs_path(), "w") as f:
            f.write("partial")
            f.flush()
            if (HERE / "slow.flag").exists():
                (HERE / "marker").write_text(str(os.getpid()))
                time.sleep(60)
            f.write(":" + self.source.get_fs_path().read_text())

class Copy(BuildAction):
    def __init__(self, output, source, **kwargs):
        super().__init__(**kwargs)
        self.output = output
        self.source = source

    def _invoke(self):
        with open(HERE / "ran.log", "a") as log:
            log.write(self.output.path + "\\n")
        self.output.get_fs_path().write_text(self.source.get_fs_path().read_text())

@entrypoint
def model():
    context = BuildContext.current()
    src = source_file("a.txt")
    mid = context.allocate_file("mid.out")
    mid.deps.add(InPlace(mid, src, desc="in place", executor=context.executor, deps=[src]))
    top = context.allocate_file("top.out")
    top.deps.add(Copy(top, mid, desc="copy", executor=context.executor, deps=[mid]))
    return top
"""

GRID = """\
import time
from pathlib import Path
from kiln import entrypoint, source_file
from kiln.executor import BuildAction, BuildContext

HERE = Path(__file__).parent
LAYERS, WIDTH = 5, 8

class Step(BuildAction):
    def __init__(self, output, inputs, **kwargs):
        super().__init__(deps=inputs, **kwargs)
        self.output = output
        self.inputs = inputs

    def _invoke(self):
        with open(HERE / "ran.log", "a") as log:
            log.write(self.output.path + "\\n")
        text = "".join(f.get_fs_path().read_text()[:40] for f in self.inputs)
        with open(self.output.get_fs_path(), "w") as f:
            f.write(self.output.path + ":")
            f.flush()
            time.sleep(0.02)
            f.write(text + "\\n")

@entrypoint
def grid():
    context = BuildContext.current()
    previous = [source_file("a.txt")]
    for layer in range(LAYERS):
        current = []
        for i in range(WIDTH):
            out = context.allocate_file(f"s{layer}_{i}.out")
            inputs = [previous[i % len(previous)], previous[(i + 1) % len(previous)]]
            out.deps.add(Step(out, inputs, desc=f"step {out.path}",
                              executor=context.executor))
            current.append(out)
        previous = current
    return previous
"""


def kiln_argv(*args: str, command: str = "build") -> list[str]:
    return [sys.executable, "-m", "kiln", command, "build.py", *args]


def env() -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1"}


class Runs:
    """Starts ``kiln build`` subprocesses in a directory; kills what is left at the end."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pids: list[int] = []  # tool processes orphaned by a killed build

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        n = len(self.procs)
        proc = subprocess.Popen(
            kiln_argv(*args),
            cwd=self.root,
            env=env(),
            stdout=open(self.root / f"stdout.{n}", "wb"),  # noqa: SIM115 - closed by the child
            stderr=open(self.root / f"stderr.{n}", "wb"),  # noqa: SIM115
        )
        self.procs.append(proc)
        return proc

    def run(self, *args: str, command: str = "build") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            kiln_argv(*args, command=command),
            cwd=self.root,
            env=env(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def stderr(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.root / f"stderr.{self.procs.index(proc)}").read_text()

    def kill_when(
        self,
        proc: subprocess.Popen[bytes],
        ready: Callable[[], bool],
        sig: signal.Signals = signal.SIGKILL,
    ) -> None:
        """Send ``sig`` (SIGKILL) to ``proc`` as soon as ``ready()``; fail if it ends first."""
        deadline = time.monotonic() + 30
        while not ready():
            if proc.poll() is not None:
                pytest.fail(
                    f"the build ended (status {proc.returncode}) before it was "
                    f"killed:\n{self.stderr(proc)}"
                )
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"timed out waiting to kill the build:\n{self.stderr(proc)}")
            time.sleep(0.002)
        proc.send_signal(sig)
        # kiln turns SIGINT and SIGTERM into an orderly stop with status 128 + N.
        expected = -sig if sig == signal.SIGKILL else 128 + sig
        assert proc.wait(timeout=30) == expected, self.stderr(proc)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    r = Runs(tmp_path)
    yield r
    r.close()


def ran(root: Path) -> list[str]:
    """What ran since the last call (and forget it)."""
    log = root / "ran.log"
    lines = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return sorted(lines)


def outputs(out_dir: Path) -> dict[str, bytes]:
    """Every output file's content, by path under genfiles; temporary files aside."""
    gen = out_dir / "genfiles"
    return {
        str(p.relative_to(gen)): p.read_bytes()
        for p in sorted(gen.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def recorded(out_dir: Path) -> set[str]:
    """Output paths (under genfiles) of the actions the state database holds."""
    warnings: list[str] = []
    store = StateStore(out_dir, warn=warnings.append)
    try:
        ids = set(store.records())
    finally:
        store.close()
    assert warnings == []  # a killed build never leaves a database to move aside
    return {i.removeprefix("gen/") for i in ids}


def clean_build(runs: Runs, *args: str) -> dict[str, bytes]:
    """The outputs of a build from scratch in another output directory."""
    result = runs.run("--output-dir", "clean-out", *args)
    assert result.returncode == 0, result.stderr
    return outputs(runs.root / "clean-out")


@pytest.mark.parametrize(
    "sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name
)
def test_build_killed_during_an_action_is_completed_by_the_next(
    tmp_path: Path, runs: Runs, write_module: Callable[..., Path], sig: signal.Signals
) -> None:
    write_module(CHAIN, header=False)
    (tmp_path / "tool.py").write_text(TOOL)
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "b.txt").write_text("beta")
    (tmp_path / "slow.flag").write_text("")
    marker = tmp_path / "marker"

    proc = runs.start("-j", "2")
    runs.kill_when(proc, marker.exists, sig)
    tool_pid = int(marker.read_text())
    runs.pids.append(tool_pid)
    if sig != signal.SIGKILL:
        assert "kiln: interrupted" in runs.stderr(proc)
        assert wait_gone(tool_pid), "an interrupted build left its command running"
    assert ran(tmp_path) == ["one.out", "slow.out", "two.out"]

    out = tmp_path / "kiln-out"
    # What finished is recorded; the action killed mid-run is not, and its
    # output never took its name.
    assert recorded(out) == {"chain/one.out", "chain/two.out"}
    assert not (out / "genfiles" / "chain" / "slow.out").exists()
    explain = runs.run(command="explain")
    assert explain.stdout.splitlines() == [
        "Running chain/slow.out: never built",
        "Running chain/final.out: never built",
    ]

    (tmp_path / "slow.flag").unlink()
    resumed = runs.run("-j", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert "warning" not in resumed.stderr
    assert "kiln: done: 2 built, 2 up to date, 0 failed, 0 not run" in resumed.stderr
    assert ran(tmp_path) == ["final.out", "slow.out"]
    assert outputs(out) == clean_build(runs, "-j", "2")
    assert outputs(out)["chain/final.out"] == (
        b"ALPHA|ONE.OUTBETA|TWO.OUT|SLOW.OUTBETA|TWO.OUT|final.out"
    )
    ran(tmp_path)  # forget the clean build's runs

    again = runs.run()
    assert "0 built, 4 up to date" in again.stderr
    assert ran(tmp_path) == []


def test_half_written_output_of_a_killed_action_is_not_trusted(
    tmp_path: Path, runs: Runs, write_module: Callable[..., Path]
) -> None:
    write_module(IN_PLACE, header=False)
    (tmp_path / "a.txt").write_text("original")
    first = runs.run()
    assert first.returncode == 0, first.stderr
    mid = tmp_path / "kiln-out" / "genfiles" / "model" / "mid.out"
    assert mid.read_text() == "partial:original"
    ran(tmp_path)

    # Rebuild with a new input, killed while the output is half written.
    (tmp_path / "a.txt").write_text("changed")
    (tmp_path / "slow.flag").write_text("")
    proc = runs.start()
    runs.kill_when(proc, (tmp_path / "marker").exists)
    assert mid.read_text() == "partial"
    assert ran(tmp_path) == ["model/mid.out"]

    # Back to the original input: the key is the old record's again, but the
    # record went when the action started, and the output does not match it.
    (tmp_path / "a.txt").write_text("original")
    (tmp_path / "slow.flag").unlink()
    resumed = runs.run("--no-cache")  # the cache would serve the first build's output
    assert resumed.returncode == 0, resumed.stderr
    assert ran(tmp_path) == ["model/mid.out"], resumed.stderr  # top.out: same input
    assert mid.read_text() == "partial:original"
    assert outputs(tmp_path / "kiln-out") == clean_build(runs)
    ran(tmp_path)
    assert "0 built, 2 up to date" in runs.run().stderr
    assert ran(tmp_path) == []


@pytest.mark.parametrize(
    ("kill_after", "some_finish"),
    [([3, 10, 8], True), ([1, 1, 1], False)],  # started actions when each build is killed
)
def test_builds_killed_at_any_point_keep_what_they_finished(
    tmp_path: Path,
    runs: Runs,
    write_module: Callable[..., Path],
    kill_after: list[int],
    some_finish: bool,
) -> None:
    write_module(GRID, header=False)
    (tmp_path / "a.txt").write_text("seed")
    out = tmp_path / "kiln-out"
    log = tmp_path / "ran.log"
    all_actions = {f"grid/s{layer}_{i}.out" for layer in range(5) for i in range(8)}
    done: set[str] = set()
    for threshold in kill_after:
        proc = runs.start("-j", "4")

        def started(threshold: int = threshold) -> bool:
            return log.exists() and len(log.read_text().splitlines()) >= threshold

        runs.kill_when(proc, started)
        this_run = set(ran(tmp_path))
        assert not this_run & done, "a finished action ran again"
        done = recorded(out)
        assert done <= all_actions
    if some_finish:
        assert done, "no build got far enough to finish an action"

    final = runs.run("-j", "4")
    assert final.returncode == 0, final.stderr
    assert "warning" not in final.stderr
    # What finished but was not yet recorded when kiln died comes back from the cache.
    restored = set(re.findall(r"\] cached: step (\S+)", final.stderr))  # GRID's descs
    rerun = set(ran(tmp_path))
    assert rerun | restored == all_actions - done and not rerun & restored
    assert recorded(out) == all_actions
    assert outputs(out) == clean_build(runs, "-j", "4")
    assert f"0 built, {len(all_actions)} up to date" in runs.run().stderr


PROBE = """\
import sqlite3, sys, time
db, wanted, out, limit = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
start = time.monotonic()
seen = "missing"
while True:  # at least once
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        if con.execute("SELECT 1 FROM actions WHERE id = ?", (wanted,)).fetchone():
            seen = "recorded"
            break
    finally:
        con.close()
    if time.monotonic() - start > limit:
        break
    time.sleep(0.01)
open(out, "w").write(seen)
"""

GROUP_COMMIT = """\
import sys
from pathlib import Path
from kiln import entrypoint, run_command

DB = str(Path(__file__).parent / "kiln-out" / ".kiln" / "state.db")

def probe(name, wanted, limit, inputs=()):
    return run_command(name=name, inputs=list(inputs),
                       command=[sys.executable, "probe.py", DB, wanted, "{out}", limit])

@entrypoint
def records():
    first = run_command(name="first.out", command=[sys.executable, "-c",
                        "import sys; open(sys.argv[1], 'w').write('1')", "{out}"])
    # Starts only after ``first`` ended: its record must be in the state by then.
    after = probe("after.out", "gen/records/first.out", "0", [first])
    # Runs beside ``first`` while nothing else starts: the record still comes soon.
    beside = probe("beside.out", "gen/records/first.out", "20")
    return after, beside
"""


def test_finished_actions_are_recorded_before_dependents_start_and_soon_otherwise(
    tmp_path: Path, runs: Runs, write_module: Callable[..., Path]
) -> None:
    """Records wait for the next round's claims to share their transaction (a group
    commit), never past a dependent's start, and not for long when nothing starts."""
    write_module(GROUP_COMMIT, header=False)
    (tmp_path / "probe.py").write_text(PROBE)
    result = runs.run("-j", "2")
    assert result.returncode == 0, result.stderr
    gen = tmp_path / "kiln-out" / "genfiles" / "records"
    assert (gen / "after.out").read_text() == "recorded"
    assert (gen / "beside.out").read_text() == "recorded"
    names = ("first", "after", "beside")
    assert recorded(tmp_path / "kiln-out") == {f"records/{n}.out" for n in names}


THIRD_WAITS = """\
import os, sys, time
name, out = sys.argv[1:]
here = os.path.dirname(os.path.realpath(__file__))
with open(os.path.join(here, "ran.log"), "a") as log:
    log.write(name + "\\n")
with open(os.path.join(here, "ran.log")) as log:
    third = len(log.read().splitlines()) == 3
if third and os.path.exists(os.path.join(here, "slow.flag")):
    open(os.path.join(here, "marker.tmp"), "w").write(str(os.getpid()))
    os.replace(os.path.join(here, "marker.tmp"), os.path.join(here, "marker"))
    time.sleep(60)
open(out, "w").write(name)
"""

MANY = """\
import sys
from kiln import entrypoint, run_command

@entrypoint
def many():
    return [run_command(name=f"m{i:02}.out", command=[sys.executable, "third.py", f"m{i:02}.out",
                                                      "{out}"])
            for i in range(40)]
"""


def test_actions_claimed_ahead_that_never_started_run_in_the_next_build(
    tmp_path: Path, runs: Runs, write_module: Callable[..., Path]
) -> None:
    """A round's transaction claims the actions waiting after it too (their records
    dropped, their outputs kiln's); a build killed before they start leaves them to
    the next build, which runs each of them and what finished unrecorded, once."""
    write_module(MANY, header=False)
    (tmp_path / "third.py").write_text(THIRD_WAITS)
    (tmp_path / "slow.flag").write_text("")
    marker = tmp_path / "marker"
    proc = runs.start("-j", "1")
    runs.kill_when(proc, marker.exists)
    runs.pids.append(int(marker.read_text()))
    first = ran(tmp_path)
    assert len(first) == 3
    out = tmp_path / "kiln-out"
    # The two that finished are recorded within GROUP_COMMIT_S: a kill sooner loses it.
    kept = recorded(out)
    assert kept <= {f"many/{name}" for name in first}
    assert len(kept) <= 2

    (tmp_path / "slow.flag").unlink()
    resumed = runs.run("-j", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert f"kiln: done: {40 - len(kept)} built, {len(kept)} up to date" in resumed.stderr
    names = {f"m{i:02}.out" for i in range(40)}
    assert ran(tmp_path) == sorted(names - {k.removeprefix("many/") for k in kept})
    assert recorded(out) == {f"many/{n}" for n in names}
    assert outputs(out) == clean_build(runs, "-j", "2")


def test_a_round_of_actions_claimed_ahead_starts_without_a_transaction(
    tmp_path: Path,
    kiln_in_process: Callable[..., Any],
    write_module: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Independent commands, one or two per round at -j 2: all are claimed by the
    first round's transaction, not one transaction per round (the records of what
    finished go to the state within GROUP_COMMIT_S)."""
    write_module(
        """\
        from kiln import entrypoint, run_command

        @entrypoint
        def touch():
            return [run_command(name=f"t{i}", command=["sh", "-c", ": > {out}"])
                    for i in range(300)]
        """,
        header=False,
    )
    claims: list[int] = []
    commit = StateStore.commit_round

    def counted(self: StateStore, finished: Any, starting: list[str], *rest: Any) -> None:
        if starting:
            claims.append(len(starting))
        commit(self, finished, starting, *rest)

    monkeypatch.setattr(StateStore, "commit_round", counted)
    result = kiln_in_process("build", "build.py", "-j", "2")
    assert result.returncode == 0, result.stderr
    assert sum(claims) >= 300  # every action claimed before it started
    assert len(claims) <= 5, claims  # was one per round: 150 or more
    assert "0 built, 300 up to date" in kiln_in_process("build", "build.py").stderr
