"""Incremental builds: action keys, up-to-date decisions and what re-runs.

Most tests build small graphs in-process through the API (a fresh ``Executor``
per build, as the command line does) and observe what ran through a log file
that every action appends to; the last ones drive the real ``kiln`` CLI.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from chain import chain_project, ran

import kiln.engine.action_outputs
import kiln.state
from kiln import run_command, source_file
from kiln.base.errors import ActionFailed
from kiln.engine.scheduler import BuildResult, SchedulerOptions
from kiln.executor import (
    BuildAction,
    BuildContext,
    BuildDependency,
    BuildFile,
    Executor,
    ProgressReporter,
)
from kiln.observe.summary import format_summary
from kiln.state import ActionRecord

OPS: dict[str, Callable[[str], str]] = {
    "upper": str.upper,
    "bang": lambda t: t + "!",
    "norm": lambda t: " ".join(t.split()).lower(),  # whitespace and case do not matter
    "copy": lambda t: t,
}


class Transform(BuildAction):
    """Writes ``OPS[op]`` of its inputs' joined text to its output, in place, and
    appends its output's name to the run log."""

    def __init__(self, *, op: str, inputs: list[BuildFile], output: BuildFile, log: Path):
        super().__init__(desc=f"make {output.path}", executor=output.executor, deps=inputs)
        self.op = op
        self.inputs = inputs
        self.output = output
        self._log = log  # private: not part of the key

    def _invoke(self) -> None:
        with open(self._log, "a") as f:
            f.write(f"{self.output.path}\n")
        if self.op == "fail":
            raise ActionFailed(f"{self.desc}: told to fail")
        text = "".join(f.get_fs_path().read_text() for f in self.inputs)
        if self.op == "write-then-fail":
            self.output.get_fs_path().write_text("half-written")
            raise ActionFailed(f"{self.desc}: failed after writing")
        if self.op == "write-nothing":
            return
        self.output.get_fs_path().write_text(OPS[self.op](text))


class Recorder(ProgressReporter):
    """Keeps what the scheduler reports."""

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}
        self.messages: list[str] = []

    def explain(self, dep: BuildDependency, reason: str) -> None:
        self.reasons[str(dep)] = reason

    def message(self, text: str) -> None:
        self.messages.append(text)


@dataclass
class Build:
    result: BuildResult
    ran: list[str]  # output names of the actions that ran, from the log, sorted
    reasons: dict[str, str] = field(default_factory=dict)  # output name -> why it ran
    messages: list[str] = field(default_factory=list)

    @property
    def built(self) -> list[str]:
        return sorted(a.desc.removeprefix("make ") for a in self.result.built)

    @property
    def skipped(self) -> list[str]:
        return sorted(a.desc.removeprefix("make ") for a in self.result.skipped)


Declare = Callable[["Project"], list[BuildFile]]


class Project:
    """A source directory, an output directory and the run log of one test."""

    def __init__(self, root: Path):
        self.src = root / "src"
        self.out = root / "out"
        self.log = root / "ran.log"
        self.src.mkdir()
        self.log.write_text("")
        self.params: dict[str, Any] = {}  # read by declare functions

    def write(self, name: str, text: str) -> Path:
        path = self.src / name
        path.write_text(text)
        return path

    def source(self, name: str) -> BuildFile:
        return source_file(self.src / name, name=name)

    def make(
        self, name: str, op: str, *inputs: BuildFile, cls: type[Transform] = Transform
    ) -> BuildFile:
        out = BuildContext.current().allocate_file(name)
        out.deps.add(cls(op=op, inputs=list(inputs), output=out, log=self.log))
        return out

    def output(self, name: str) -> Path:
        return self.out / "genfiles" / name

    def build(self, declare: Declare, **options: Any) -> Build:
        before = len(self.log.read_text().splitlines())
        reporter = Recorder()
        executor = Executor(self.out, reporter=reporter)
        try:
            with executor.get_context(""):
                targets = declare(self)
            result = executor.run(targets, SchedulerOptions(jobs=2, **options))
        finally:
            executor.close()
        ran = sorted(self.log.read_text().splitlines()[before:])
        reasons = {k.removeprefix("make "): v for k, v in reporter.reasons.items()}
        return Build(result, ran, reasons, reporter.messages)


@pytest.fixture
def p(tmp_path: Path) -> Project:
    return Project(tmp_path)


def two_chains(p: Project) -> list[BuildFile]:
    """a.txt -> A (upper) -> B (bang); b.txt -> C (upper); B + C -> J."""
    a = p.make("A", "upper", p.source("a.txt"))
    b = p.make("B", p.params.get("B.op", "bang"), a)
    c = p.make("C", "upper", p.source("b.txt"))
    return [p.make("J", "copy", b, c)]


def normalised(p: Project) -> list[BuildFile]:
    """a.txt -> N (norm) -> D (upper) -> E (bang)."""
    n = p.make("N", "norm", p.source("a.txt"))
    d = p.make("D", "upper", n)
    return [p.make("E", "bang", d)]


def sources(p: Project) -> None:
    p.write("a.txt", "alpha")
    p.write("b.txt", "beta")


ALL = ["A", "B", "C", "J"]


# -- what re-runs --------------------------------------------------------------


def test_first_build_runs_everything_then_a_noop_build_runs_nothing(p: Project) -> None:
    sources(p)
    first = p.build(two_chains)
    assert first.ran == ALL and first.built == ALL and first.result.ok
    assert p.output("J").read_text() == "ALPHA!BETA"

    again = p.build(two_chains)
    assert again.ran == [] and again.built == []
    assert again.skipped == ALL
    assert again.result.ok and again.result.failed == again.result.not_run == []
    assert p.output("J").read_text() == "ALPHA!BETA"


def test_noop_build_reads_no_file_contents(p: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    sources(p)
    p.build(two_chains)
    hashed: list[str] = []
    real = kiln.state.hash_file

    def counting(path: Path | str, follow: bool = True) -> str:
        hashed.append(Path(path).name)
        return real(path, follow)

    real_output = kiln.engine.action_outputs.hash_output

    def counting_output(path: str, keep: int) -> tuple[os.stat_result, str, bytes | None]:
        hashed.append(Path(path).name)
        return real_output(path, keep)

    monkeypatch.setattr(kiln.state.file_digests, "hash_file", counting)
    monkeypatch.setattr(kiln.engine.action_outputs, "hash_output", counting_output)

    assert p.build(two_chains).ran == []
    assert hashed == []

    # The check can fail: after one edit exactly that source and the rebuilt
    # outputs are read.
    p.write("b.txt", "BETA, changed")
    assert p.build(two_chains).ran == ["C", "J"]
    assert sorted(hashed) == ["C", "J", "b.txt"]
    hashed.clear()
    assert p.build(two_chains).ran == []
    assert hashed == []


def test_editing_one_source_reruns_exactly_its_downstream_chain(p: Project) -> None:
    sources(p)
    p.build(two_chains)

    p.write("a.txt", "alpha, longer")
    build = p.build(two_chains)
    assert build.ran == ["A", "B", "J"]
    assert build.skipped == ["C"]
    assert p.output("J").read_text() == "ALPHA, LONGER!BETA"

    p.write("b.txt", "beta, longer")
    build = p.build(two_chains)
    assert build.ran == ["C", "J"]
    assert build.skipped == ["A", "B"]
    assert p.output("J").read_text() == "ALPHA, LONGER!BETA, LONGER"


def test_touching_files_reruns_nothing(p: Project) -> None:
    sources(p)
    p.build(two_chains)
    later = 2_000_000_000_000_000_000  # ns: 2033
    for path in [p.src / "a.txt", p.src / "b.txt", p.output("A"), p.output("J")]:
        os.utime(path, ns=(later, later))
    build = p.build(two_chains)
    assert build.ran == []
    assert build.skipped == ALL


def test_identical_regenerated_output_stops_the_cascade(p: Project) -> None:
    p.write("a.txt", "Hello   World")
    assert p.build(normalised).ran == ["D", "E", "N"]
    assert p.output("N").read_text() == "hello world"

    p.write("a.txt", "  HELLO\tworld \n")  # N's output stays the same
    build = p.build(normalised)
    assert build.ran == ["N"]
    assert build.skipped == ["D", "E"]

    p.write("a.txt", "hello there")
    assert p.build(normalised).ran == ["D", "E", "N"]
    assert p.output("E").read_text() == "HELLO THERE!"


def test_changing_a_parameter_reruns_the_action_and_what_changed_downstream(
    p: Project,
) -> None:
    sources(p)
    p.build(two_chains)
    p.params["B.op"] = "upper"  # B's output changes from ALPHA! to ALPHA
    build = p.build(two_chains, explain=True)
    assert build.ran == ["B", "J"]
    assert build.reasons["B"] == 'parameter op changed from "bang" to "upper"'
    assert build.reasons["J"] == "input B changed"
    assert p.output("J").read_text() == "ALPHABETA"


def test_deleting_an_output_reruns_its_producer_only(p: Project) -> None:
    sources(p)
    p.build(two_chains)
    p.output("B").unlink()
    build = p.build(two_chains, explain=True)
    assert build.ran == ["B"]  # J's input comes back identical
    assert build.reasons == {"B": "output B is missing"}
    assert p.output("B").read_text() == "ALPHA!"


def test_editing_an_output_reruns_its_producer(p: Project) -> None:
    sources(p)
    p.build(two_chains)
    p.output("J").write_text("hand edited")
    build = p.build(two_chains, explain=True)
    assert build.ran == ["J"]
    assert build.reasons == {"J": "output J was modified"}
    assert p.output("J").read_text() == "ALPHA!BETA"
    assert p.build(two_chains).ran == []


def test_adding_an_input_reruns_the_consumer(p: Project) -> None:
    sources(p)
    p.build(two_chains)

    def with_extra_input(p: Project) -> list[BuildFile]:
        [j] = two_chains(p)
        return (
            [p.make("K", "copy", j)]
            if not p.params.get("extra")
            else [p.make("K", "copy", j, p.source("a.txt"))]
        )

    p.build(with_extra_input)
    p.params["extra"] = True
    build = p.build(with_extra_input, explain=True)
    assert build.ran == ["K"]
    # Named relative to the executor's source root (by default the working directory).
    name = os.path.relpath(p.src / "a.txt")
    assert build.reasons["K"].endswith(f"input {name} was added")


# -- user actions' keys and the always-run escape hatch --------------------------


class Tunable(Transform):
    """A user action with extra plain attributes: they are part of its key."""

    level = 0  # class attribute: the instance's own value below is what counts
    key_exclude = ("callback",)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.level = TUNING["level"]
        self.options = {"mode": TUNING["mode"], "paths": [Path("/opt") / TUNING["mode"]]}
        self.callback = lambda: None  # would be keyed by its code: excluded
        self._cache_note = TUNING["note"]  # private: ignored


TUNING: dict[str, Any] = {}


def tunable(p: Project) -> list[BuildFile]:
    t = p.make("T", "upper", p.source("a.txt"), cls=Tunable)
    return [p.make("U", "bang", t)]


@pytest.mark.parametrize(
    ("change", "reruns"),
    [
        ({"level": 2}, True),
        ({"mode": "slow"}, True),
        ({"note": "something else"}, False),
        ({}, False),
    ],
)
def test_user_action_default_key_includes_its_plain_attributes(
    p: Project, monkeypatch: pytest.MonkeyPatch, change: dict[str, Any], reruns: bool
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "TUNING", {"level": 1, "mode": "fast", "note": "n"})
    p.write("a.txt", "alpha")
    assert p.build(tunable).ran == ["T", "U"]
    TUNING.update(change)
    build = p.build(tunable, explain=True)
    assert build.ran == (["T"] if reruns else [])  # U's input is unchanged
    if "level" in change:
        assert build.reasons["T"] == "parameter level changed from 1 to 2"
    if "mode" in change:
        assert build.reasons["T"] == (
            'parameter options.mode changed from "fast" to "slow"; '
            "parameter options.paths[0] changed from Path('/opt/fast') to Path('/opt/slow')"
        )


class Versioned(Transform):
    VERSION = 1


def test_bumping_an_action_version_reruns_it(p: Project) -> None:
    def declare(p: Project) -> list[BuildFile]:
        return [p.make("V", "upper", p.source("a.txt"), cls=Versioned)]

    p.write("a.txt", "alpha")
    assert p.build(declare).ran == ["V"]
    Versioned.VERSION = 2
    try:
        build = p.build(declare, explain=True)
    finally:
        Versioned.VERSION = 1
    assert build.ran == ["V"]
    assert build.reasons["V"] == "the action's type or version changed"


class AlwaysByAttribute(Transform):
    always_run = True


class AlwaysByParams(Transform):
    def params(self) -> dict[str, Any] | None:
        return None


class OnlyOp(Transform):
    """Overrides params(): only ``op`` matters, whatever else changes."""

    def params(self) -> dict[str, Any] | None:
        return {"op": self.op}


@pytest.mark.parametrize("cls", [AlwaysByAttribute, AlwaysByParams])
def test_always_run_actions_run_every_build(p: Project, cls: type[Transform]) -> None:
    def declare(p: Project) -> list[BuildFile]:
        r = p.make("R", "upper", p.source("a.txt"), cls=cls)
        return [p.make("S", "bang", r)]

    p.write("a.txt", "alpha")
    assert p.build(declare).ran == ["R", "S"]
    for _ in range(2):
        build = p.build(declare, explain=True)
        assert build.ran == ["R"]  # S's input came back identical
        assert build.reasons == {"R": "marked always-run"}
        assert build.skipped == ["S"]


def test_overridden_params_decide_the_key(p: Project) -> None:
    def declare(p: Project) -> list[BuildFile]:
        out = BuildContext.current().allocate_file("O")
        action = OnlyOp(op="upper", inputs=[p.source("a.txt")], output=out, log=p.log)
        action.desc = p.params.get("desc", "make O")  # not in params(): no effect
        out.deps.add(action)
        return [out]

    p.write("a.txt", "alpha")
    assert p.build(declare).ran == ["O"]
    p.params["desc"] = "renamed"
    assert p.build(declare).ran == []


# -- failures leave nothing that counts as built ---------------------------------


def test_failed_action_leaves_no_record_and_cascades(p: Project) -> None:
    sources(p)
    p.build(two_chains)
    p.params["B.op"] = "fail"
    build = p.build(two_chains)
    assert build.ran == ["B"]
    assert [a.desc for a in build.result.failed] == ["make B"]
    assert [a.desc for a in build.result.not_run] == ["make J"]
    assert build.skipped == ["A", "C"]
    assert not build.result.ok
    summary = format_summary(build.result)
    assert "0 built, 2 up to date, 1 failed, 1 not run" in summary

    # Back to the old parameters: B's key is its old key again and its output is
    # untouched, but the failed run dropped its record, so it runs again; the
    # reason says what changed since it failed.
    del p.params["B.op"]
    build = p.build(two_chains, explain=True)
    assert build.ran == ["B"]
    assert build.reasons["B"] == (
        'it failed in an earlier build; since then parameter op changed from "fail" to "bang"'
    )
    assert build.skipped == ["A", "C", "J"]


def test_half_written_output_of_a_failed_action_is_not_trusted(p: Project) -> None:
    sources(p)
    p.params["B.op"] = "write-then-fail"
    assert p.build(two_chains).ran == ["A", "B", "C"]
    assert p.output("B").read_text() == "half-written"
    # Still failing with the same key: it is not run again, nor is the output it
    # left trusted; asked to retry, it runs again.
    again = p.build(two_chains)
    assert again.ran == [] and [a.desc for a in again.result.unchanged()] == ["make B"]
    assert sorted(a.desc for a in again.result.skipped) == ["make A", "make C"]
    assert p.build(two_chains, retry_failed=True).ran == ["B"]
    del p.params["B.op"]
    build = p.build(two_chains)
    assert build.ran == ["B", "J"]
    assert p.output("J").read_text() == "ALPHA!BETA"


def test_action_that_writes_no_output_fails_and_is_not_recorded(p: Project) -> None:
    p.write("a.txt", "alpha")

    def declare(p: Project) -> list[BuildFile]:
        return [p.make("W", p.params.get("op", "write-nothing"), p.source("a.txt"))]

    build = p.build(declare)
    assert [a.desc for a in build.result.failed] == ["make W"]
    assert "without writing its output" in str(build.result.failed[0].failure)
    again = p.build(declare).result  # not recorded as built: failed, unchanged
    assert [a.desc for a in again.unchanged()] == ["make W"] and not again.skipped
    assert p.build(declare, retry_failed=True).ran == ["W"]


def test_run_command_writes_a_temporary_name_and_renames(p: Project) -> None:
    script = "import sys; open(sys.argv[1], 'w').write('partial'); sys.exit(int(sys.argv[2]))"

    def declare(p: Project) -> list[BuildFile]:
        code = str(p.params.get("code", 0))
        return [run_command(name="r.txt", command=[sys.executable, "-c", script, "{out}", code])]

    p.params["code"] = 3
    build = p.build(declare)
    assert len(build.result.failed) == 1
    out_dir = p.output("r.txt").parent
    assert list(out_dir.iterdir()) == []  # neither the output nor a temporary file
    p.params["code"] = 0
    assert len(p.build(declare).result.built) == 1
    assert [f.name for f in out_dir.iterdir()] == ["r.txt"]
    assert p.output("r.txt").read_text() == "partial"
    assert len(p.build(declare).result.skipped) == 1


# -- the state database ----------------------------------------------------------


def test_records_hold_key_params_and_digests(p: Project) -> None:
    p.write("a.txt", "alpha")

    def declare(p: Project) -> list[BuildFile]:
        return [p.make("A", "upper", p.source("a.txt"))]

    p.build(declare)
    store = kiln.state.StateStore(p.out, warn=print)
    try:
        rec = store.records()["gen/A"]
    finally:
        store.close()
    assert isinstance(rec, ActionRecord)
    assert rec.params is not None and rec.params["op"] == "upper"
    # Source files are named relative to the source root: keys do not depend on
    # where the checkout lies.
    name = os.path.relpath(p.src / "a.txt", os.getcwd())  # the executor's default source root
    assert rec.inputs == {f"src:{name}": kiln.state.hash_file(p.src / "a.txt")}
    assert rec.outputs == {"gen/A": kiln.state.hash_file(p.output("A"))}


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign"])
def test_corrupt_state_gives_a_clean_build_that_trusts_no_output(p: Project, damage: str) -> None:
    sources(p)
    p.build(two_chains)
    p.output("B").write_text("stale")  # the old state would have caught this ...
    db = p.out / ".kiln" / "state.db"
    if damage == "garbage":
        db.write_bytes(os.urandom(8192))
    elif damage == "truncated":
        with open(db, "r+b") as f:
            f.truncate(db.stat().st_size // 2)
    else:
        db.unlink()
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE things(x)")
        conn.commit()
        conn.close()
    build = p.build(two_chains)
    assert build.ran == ALL  # ... and no output is trusted without it
    assert p.output("J").read_text() == "ALPHA!BETA"
    [warning] = build.messages
    assert "state.db.corrupt-" in warning and "\n" not in warning
    assert p.build(two_chains).ran == []


def test_damaged_record_is_not_trusted(p: Project) -> None:
    """A record whose JSON cannot be read makes its action run again; no crash."""
    sources(p)
    p.build(two_chains)
    p.output("B").write_text("stale")
    conn = sqlite3.connect(p.out / ".kiln" / "state.db")
    conn.execute("UPDATE actions SET outputs = '{not json', params = '[' WHERE id = 'gen/B'")
    conn.commit()
    conn.close()
    build = p.build(two_chains)
    assert build.result.ok
    assert "B" in build.ran
    assert p.output("J").read_text() == "ALPHA!BETA"
    assert p.build(two_chains).ran == []


def test_recorded_outputs_are_compared_as_values_not_as_text(p: Project) -> None:
    """A no-op build compares most records by their stored text; a record written in
    another spelling of the same JSON is still up to date, and one whose text a
    tampered digest would complete (quotes in the digest cache) is not."""
    sources(p)
    p.build(two_chains)
    conn = sqlite3.connect(p.out / ".kiln" / "state.db", isolation_level=None)
    # The same value, spelled compactly and with an escaped character.
    conn.execute(
        "UPDATE actions SET outputs = replace(replace(json(outputs), 'gen', "
        "'g\\u0065n'), '\":\"', '\": \"') WHERE id = 'gen/B'"
    )
    assert (
        conn.execute("SELECT outputs FROM actions WHERE id = 'gen/B'")
        .fetchone()[0]
        .startswith('{"g\\u0065n/B": "')
    )
    assert p.build(two_chains).ran == []
    # B's record now holds a second output whose text the digest cache's quotes would
    # complete if the comparison were by unescaped text.
    (digest,) = conn.execute("SELECT sha256 FROM files WHERE path LIKE '%/B'").fetchone()
    forged = f'{digest}", "gen/X": "{"0" * 64}'
    conn.execute("UPDATE files SET sha256 = ? WHERE path LIKE '%/B'", (forged,))
    conn.execute("UPDATE actions SET outputs = ? WHERE id = 'gen/B'", (f'{{"gen/B": "{forged}"}}',))
    conn.close()
    build = p.build(two_chains)
    assert "B" in build.ran
    assert p.output("J").read_text() == "ALPHA!BETA"
    assert p.build(two_chains).ran == []


# -- through the command line --------------------------------------------------------


@pytest.fixture
def cli_project(tmp_path: Path, write_module: Callable[..., Path]) -> Callable[[str], None]:
    return chain_project(tmp_path, write_module)


def test_cli_noop_rebuild_runs_nothing_and_says_so(
    tmp_path: Path, cli_project: Callable[[str], None], kiln: Callable[..., Any]
) -> None:
    first = kiln("build", "build.py")
    assert first.returncode == 0, first.stderr
    assert "kiln: done: 3 built, 0 up to date, 0 failed, 0 not run" in first.stderr
    assert ran(tmp_path) == ["a.out", "b.out", "c.out"]
    output = tmp_path / "kiln-out" / "genfiles" / "chain" / "c.out"
    assert first.stdout.split() == [str(output)]
    assert output.read_text() == "ALPHA!!"

    second = kiln("build", "build.py")
    assert second.returncode == 0, second.stderr
    assert "kiln: done: 0 built, 3 up to date, 0 failed, 0 not run" in second.stderr
    assert ran(tmp_path) == []
    assert second.stdout.split() == [str(output)]


def test_cli_edit_reruns_downstream_and_summary_counts_failures(
    tmp_path: Path, cli_project: Callable[[str], None], kiln: Callable[..., Any]
) -> None:
    assert kiln("build", "build.py").returncode == 0
    ran(tmp_path)
    (tmp_path / "a.txt").write_text("alpha, edited")
    build = kiln("build", "build.py")
    assert "kiln: done: 3 built, 0 up to date" in build.stderr
    assert ran(tmp_path) == ["a.out", "b.out", "c.out"]

    cli_project("fail")  # b.out now fails; c.out cannot run
    build = kiln("build", "build.py")
    assert build.returncode == 1
    assert "kiln: FAILED: 0 built, 1 up to date, 1 failed, 1 not run" in build.stderr
    assert "told to fail" in build.stderr
    assert ran(tmp_path) == ["b.out"]

    cli_project("bang")
    build = kiln("build", "build.py", "--no-cache")  # else b.out comes from the cache
    assert build.returncode == 0
    assert "kiln: done: 1 built, 2 up to date, 0 failed, 0 not run" in build.stderr
    assert ran(tmp_path) == ["b.out"]  # c.out's input came back identical


def test_cli_corrupt_state_is_moved_aside_and_everything_rebuilds(
    tmp_path: Path, cli_project: Callable[[str], None], kiln: Callable[..., Any]
) -> None:
    assert kiln("build", "build.py").returncode == 0
    ran(tmp_path)
    kiln_dir = tmp_path / "kiln-out" / ".kiln"
    (kiln_dir / "state.db").write_bytes(b"\x13garbage" * 1000)
    build = kiln("build", "build.py", "--no-cache")
    assert build.returncode == 0, build.stderr
    warnings = [line for line in build.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1
    [aside] = kiln_dir.glob("state.db.corrupt-*")
    assert str(aside) in warnings[0]
    assert aside.read_bytes() == b"\x13garbage" * 1000
    assert "kiln: done: 3 built, 0 up to date" in build.stderr
    assert ran(tmp_path) == ["a.out", "b.out", "c.out"]
    again = kiln("build", "build.py")
    assert "warning" not in again.stderr
    assert "0 built, 3 up to date" in again.stderr


COUNTING_KILN = """\
import sys
import kiln.engine.action_outputs, kiln.state.file_digests

real = kiln.state.hash_file

def counting(path, follow=True):
    with open("hashed.log", "a") as log:
        log.write(str(path) + "\\n")
    return real(path, follow)

real_output = kiln.engine.action_outputs.hash_output

def counting_output(path, keep):
    with open("hashed.log", "a") as log:
        log.write(path + "\\n")
    return real_output(path, keep)

kiln.state.file_digests.hash_file = counting
kiln.engine.action_outputs.hash_output = counting_output
from kiln.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_noop_build_reads_no_file_contents(
    tmp_path: Path, cli_project: Callable[[str], None]
) -> None:
    """The whole command, manifest included, hashes nothing when nothing changed."""
    (tmp_path / "counting_kiln.py").write_text(COUNTING_KILN)
    hashed = tmp_path / "hashed.log"

    def build() -> list[str]:
        hashed.write_text("")
        proc = subprocess.run(
            [sys.executable, "counting_kiln.py", "build", "build.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "NO_COLOR": "1"},
        )
        assert proc.returncode == 0, proc.stderr
        return sorted(Path(line).name for line in hashed.read_text().splitlines())

    # tool.py, the script the commands run, is an input of theirs (hashed once).
    assert build() == ["a.out", "a.txt", "b.out", "c.out", "tool.py"]
    assert build() == []
    (tmp_path / "a.txt").write_text("alpha, edited")
    assert build() == ["a.out", "a.txt", "b.out", "c.out"]
    os.utime(tmp_path / "a.txt", ns=(10**18, 10**18))  # touched: read once to see it
    assert build() == ["a.txt"]
    assert build() == []
