"""``kiln build --check-reproducible``: every action of the build run a second time
and its outputs compared with the build's, byte for byte (the idea of Bazel's
and Nix's checks).

Where an action can say where its files are (a command, kiln's own import,
compile and verify: ``sandbox_command``, ``sandbox_thunk``), the second run is
in a scratch directory under ``.kiln/check/``, laid out as a Dask worker's
sandbox is: its inputs copied to the same relative places, every path it is
given relative to where it runs. An output that depends on where it was built
(an absolute path, the time, a random number, a variable of kiln's scratch
directory) differs there. Any other action runs again in place, its first
outputs set aside and put back afterwards: that finds what depends on the time
or on chance, not on the place.

The check varies only what is not in an action's key (what is keyed may change
the output: that is what the key is for). An in-process action of the user's
has kiln's time zone and locale in its key (``KeyMaker.keys_conventions``), so
it runs again under the same ones; an in-process action of kiln's own, whose
key does not hold them, runs again with another time zone and locale in kiln's
environment (``kiln.base.action_env.other_conventions``; the second runs in place go
one at a time, after the build). A PROCESS action or a command is given a fixed,
keyed environment (``kiln.base.action_env``), the same on both runs; only the
scratch directory it is given as its home and temporary directory differs.

Which of these a second run is, the first of the check's own runners that takes
the action says (``first_taking``, as the build's dispatcher picks its runners;
``kiln.engine.runner``): a command in a scratch directory, a worker process's
thunk in one, a worker process in place, kiln's own process in place.

An action whose outputs differ is listed with the first differing byte; its key
is marked in the build state (``StateStore.mark_nonreproducible``) and neither
this build nor a later one puts its results into, or takes them from, a shared
cache. An action may declare itself non-reproducible (``reproducible = False``,
as benchmarks do: they time the machine): it is not checked, and its results
never leave the machine (``kiln.engine.cache_step``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import posixpath
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kiln.base.action_env import other_conventions
from kiln.base.bytecode import user_code
from kiln.base.errors import KilnError
from kiln.engine.result import BuildResult
from kiln.engine.runner import Takes, first_taking
from kiln.execution.process.pool import ProcessPool
from kiln.execution.run_context import RunContext
from kiln.graph import ActionConcurrency, BuildAction, BuildFile
from kiln.output_dir.ownership import open_regular
from kiln.planning.plan import Plan
from kiln.planning.sandbox import (
    RemotableCommand,
    remotable,
    sandbox_command,
    sandbox_paths,
    sandbox_thunk,
)

CHECK_DIR = "check"  # under .kiln/
_CHUNK = 1 << 20
_OUTPUT_LOG = "check.log"


@dataclass(frozen=True)
class Difference:
    """One output of ``action`` that its second run did not reproduce: ``detail``
    says where the bytes first differ; ``where`` how the second run ran."""

    action: BuildAction
    output: BuildFile
    detail: str
    where: str

    def __str__(self) -> str:
        return f"'{self.action.desc}': {self.output.action_path} {self.detail} ({self.where})"


def checked_actions(plan: Plan, result: BuildResult) -> list[BuildAction]:
    """The actions whose outputs the build made or kept (built, cached, up to date)
    and that do not say they are not reproducible."""
    done = {*result.built, *result.cached, *result.skipped}
    return [
        a
        for a in plan.actions
        if a in done and plan.outputs[a] and getattr(a, "reproducible", True) is not False
    ]


class ReproducibilityCheck:
    """Runs the second runs of one build.

    Invariant: the scratch directory ``root`` (``.kiln/check``) holds only what this
    check made, and is gone when ``run`` returns; an action rerun in place has its
    first outputs back, unchanged, whatever the second run did.
    """

    def __init__(
        self,
        plan: Plan,
        context: RunContext,
        jobs: int,
        keys_conventions: Callable[[BuildAction], bool],
    ) -> None:
        self.plan = plan
        self.context = context
        self.jobs = max(1, jobs)
        self.root = context.layout.kiln_dir / CHECK_DIR
        self._pool: ProcessPool | None = None
        self._second: dict[BuildAction, SecondRun] = {}  # each action's, chosen in run()
        self.runners: list[SecondRun] = [
            CommandInSandbox(context),
            ThunkInSandbox(self._process_pool),
            ProcessInPlace(self._process_pool),
            InPlace(keys_conventions),
        ]

    def run(self, actions: Iterable[BuildAction]) -> list[Difference]:
        """Run each of ``actions`` again; what it did not reproduce."""
        self._second = {a: first_taking(self.runners, a) for a in actions}  # asked once
        sandboxed = [a for a, second in self._second.items() if second.sandboxed]
        in_place = [a for a, second in self._second.items() if not second.sandboxed]
        self._clear()
        found: list[Difference] = []
        try:
            self.context.layout.ensure_dir(self.root)
            with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
                for differences in pool.map(self._in_sandbox, sandboxed, range(len(sandboxed))):
                    found += differences
            # In place, one at a time: nothing else reads an output set aside.
            for action in in_place:
                found += self._in_place(action)
        finally:
            if self._pool is not None:
                self._pool.shutdown()
            self._clear()
        return found

    def _clear(self) -> None:
        if self.root.is_dir() and not self.root.is_symlink():
            shutil.rmtree(self.root, ignore_errors=True)

    def _process_pool(self) -> ProcessPool:
        if self._pool is None:
            self._pool = ProcessPool(
                self.context.process_env(), self.context.work_dir, self.context.start_dir
            )
        return self._pool

    # -- in a scratch directory --------------------------------------------------

    def _in_sandbox(self, action: BuildAction, n: int) -> list[Difference]:
        inputs = self.plan.inputs[action]
        outputs = self.plan.outputs[action]
        paths = sandbox_paths(action, inputs, outputs)
        sandbox = self.root / str(n)
        workdir = sandbox
        where = "run again in a scratch directory"
        try:
            for f in inputs:
                _copy(Path(f.fs_str), _place(workdir, paths[f]))
            for f in outputs:
                _place(workdir, paths[f]).parent.mkdir(parents=True, exist_ok=True)
            self._second[action].run(action, workdir, paths, _unsaid)
        except (OSError, KilnError) as e:
            return [Difference(action, outputs[0], f"could not be made again: {e}", where)]
        return [
            d
            for f in outputs
            if (d := _compare(action, f, _place(workdir, paths[f]), where)) is not None
        ]

    # -- in place --------------------------------------------------------------

    def _in_place(self, action: BuildAction) -> list[Difference]:
        outputs = self.plan.outputs[action]
        aside = self.root / "first"
        where = "run again in place"
        self.context.layout.ensure_dir(aside)
        moved: list[tuple[BuildFile, Path]] = []
        try:
            for i, f in enumerate(outputs):
                keep = aside / str(i)
                os.replace(f.fs_str, keep)
                moved.append((f, keep))
            said = [where]
            try:
                self._second[action].run(action, aside, {}, said.append)
            except Exception as e:  # noqa: BLE001 - the second run's failure is a finding
                return [Difference(action, outputs[0], f"could not be made again: {e}", said[-1])]
            where = said[-1]
            return [d for f, keep in moved if (d := _compare(action, f, keep, where, swap=True))]
        finally:
            for f, keep in moved:
                os.replace(keep, f.fs_str)  # the build's outputs, as recorded


class SecondRun(Takes, Protocol):
    """One way to run an action a second time. ``sandboxed``: in a scratch
    directory ``workdir``, every file at its place ``paths`` there (these run side
    by side); else in place, the first outputs set aside (these run one at a
    time). ``say`` takes how the run differs from the build's, when it says more
    than where it ran."""

    sandboxed: bool

    def run(
        self,
        action: BuildAction,
        workdir: Path,
        paths: dict[BuildFile, str],
        say: Callable[[str], None],
    ) -> None: ...


class CommandInSandbox:
    """A command (``RemotableCommand``), its output into a log in the scratch
    directory; a nonzero exit status fails the second run."""

    sandboxed = True

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def takes(self, action: BuildAction) -> bool:
        return isinstance(action, RemotableCommand)

    def run(
        self,
        action: BuildAction,
        workdir: Path,
        paths: dict[BuildFile, str],
        say: Callable[[str], None],
    ) -> None:
        command = sandbox_command(action)
        assert command is not None  # a RemotableCommand's
        env = self.context.process_env(getattr(action, "env", None))
        with open(workdir / _OUTPUT_LOG, "wb") as log:
            proc = subprocess.run(
                command[0],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                timeout=getattr(action, "timeout", None),
                start_new_session=True,
            )
        if proc.returncode != 0:
            raise KilnError(f"its command exited with status {proc.returncode}")


class ThunkInSandbox:
    """A process action that can say where its files are (``sandbox_thunk``): its
    thunk in a worker process, in the scratch directory."""

    sandboxed = True

    def __init__(self, pool: Callable[[], ProcessPool]) -> None:
        self._pool = pool

    def takes(self, action: BuildAction) -> bool:
        return action.concurrency is ActionConcurrency.PROCESS and remotable(action)

    def run(
        self,
        action: BuildAction,
        workdir: Path,
        paths: dict[BuildFile, str],
        say: Callable[[str], None],
    ) -> None:
        thunk = sandbox_thunk(action, paths.__getitem__)
        assert thunk is not None  # a remotable process action's
        self._pool().run(thunk, action.desc, action.timeout, cwd=str(workdir))


class ProcessInPlace:
    """Any other process action, in place, in a worker process (its environment is
    fixed)."""

    sandboxed = False

    def __init__(self, pool: Callable[[], ProcessPool]) -> None:
        self._pool = pool

    def takes(self, action: BuildAction) -> bool:
        return action.concurrency is ActionConcurrency.PROCESS

    def run(
        self,
        action: BuildAction,
        workdir: Path,
        paths: dict[BuildFile, str],
        say: Callable[[str], None],
    ) -> None:
        self._pool().run_action(action)


class InPlace:
    """Any other action, in place, in kiln's process. One whose key holds kiln's
    time zone and locale (a user's) runs under the same ones: what is keyed may
    change its output, so the check does not vary it. Any other (kiln's own) runs
    with another time zone and locale (``other_conventions``)."""

    sandboxed = False

    def __init__(self, keys_conventions: Callable[[BuildAction], bool]) -> None:
        self.keys_conventions = keys_conventions

    def takes(self, action: BuildAction) -> bool:
        return True

    def run(
        self,
        action: BuildAction,
        workdir: Path,
        paths: dict[BuildFile, str],
        say: Callable[[str], None],
    ) -> None:
        keyed = self.keys_conventions(action)
        with contextlib.nullcontext() if keyed else other_conventions() as changed, user_code():
            if changed:
                say(f"run again in place, with {changed}")
            action._invoke()


def _unsaid(where: str) -> None:
    """A second run in a scratch directory is told apart by its place alone."""


def _place(workdir: Path, rel: str) -> Path:
    return Path(posixpath.normpath(os.path.join(workdir, rel)))


def _copy(src: Path, dst: Path) -> None:
    """A copy of the regular file ``src`` at ``dst``, its execute bits kept."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd = open_regular(src, follow=True)
    with os.fdopen(fd, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, _CHUNK)
        os.fchmod(fout.fileno(), os.fstat(fin.fileno()).st_mode & 0o755)


def _compare(
    action: BuildAction, f: BuildFile, second: Path, where: str, swap: bool = False
) -> Difference | None:
    """How the build's ``f`` and the second run's ``second`` differ, if they do
    (``swap``: ``second`` holds the build's bytes, ``f`` the second run's)."""
    first_path, second_path = (str(second), f.fs_str) if swap else (f.fs_str, str(second))
    try:
        detail = _first_difference(first_path, second_path)
    except FileNotFoundError:
        detail = "was not written by the second run"
    return None if detail is None else Difference(action, f, detail, where)


def _first_difference(first: str, second: str) -> str | None:
    """Where the bytes of ``first`` (the build's) and ``second`` first differ; None
    when they are the same."""
    offset = 0
    with open(first, "rb") as a, open(second, "rb") as b:
        while True:
            x, y = a.read(_CHUNK), b.read(_CHUNK)
            if x == y:
                if not x:
                    return None
                offset += len(x)
                continue
            i = next((k for k, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
            if i is None:  # one is a prefix of the other
                size_a, size_b = os.fstat(a.fileno()).st_size, os.fstat(b.fileno()).st_size
                return f"differs in size ({size_a} bytes in the build, {size_b} in the second run)"
            return (
                f"differs at byte {offset + i} (0x{x[i]:02x} in the build, "
                f"0x{y[i]:02x} in the second run)"
            )


def check_build(
    plan: Plan,
    result: BuildResult,
    context: RunContext,
    jobs: int,
    mark: Callable[[str, str], None],
    keys_conventions: Callable[[BuildAction], bool],
) -> list[Difference]:
    """The second runs of ``result``'s actions; each action found not reproducible is
    marked (``mark(key, why)``) by its key in this build. ``keys_conventions``: whether
    an action's key holds kiln's time zone and locale (then they are not varied)."""
    check = ReproducibilityCheck(plan, context, jobs, keys_conventions)
    found = check.run(checked_actions(plan, result))
    for difference in found:
        key = result.keys.get(difference.action)
        if key is not None:
            mark(key, str(difference))
    with contextlib.suppress(OSError):
        context.layout.kiln_dir.joinpath(CHECK_DIR).rmdir()
    return found
