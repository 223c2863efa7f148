"""Worker processes for PROCESS actions: a ``ProcessPool`` runs each thunk in a
worker of its own, forked from a clean template process (``kiln.execution.process.template``),
so no action sees what an earlier one did to its process (environment, working
directory, module globals, monkey-patches), and when a worker dies only its
action fails. The thread that runs the action hands its thunk to the pool and
waits.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kiln.base.errors import (
    ActionFailed,
    ActionTimeout,
    RemoteError,
    TemplateGone,
    WorkerCrashed,
    signal_name,
)
from kiln.base.iree_shim import active as iree_build_shim_active
from kiln.base.modnames import hidden_build_modules
from kiln.base.reached import Reached
from kiln.execution.process.template import Template, modules_for
from kiln.execution.process.worker import CHUNK, PAYLOAD, REPLY, Frames, send_framed
from kiln.graph import NAMED_RELATIVE, BuildAction, BuildFile
from kiln.planning.sandbox import runs_in_output_dir

_GONE_WAIT_S = 5.0  # for the template to report a killed worker gone


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "an unknown status"
    if exitcode < 0:
        name = signal_name(-exitcode)
        return name if name.startswith("signal") else f"signal {name}"
    return f"exit code {exitcode}"


class ProcessPool:
    """One fresh worker process per thunk, forked from a clean template.

    Invariants: at most one template process (``kiln.execution.process.template``) serves the
    pool at a time; a new one replaces it if it died. When ``run`` returns, the
    kill of its worker's process group has been asked for (after a reply the
    worker is exiting anyway); when it raises, the worker is gone. Every worker
    starts with ``env`` and ``cwd``: the build's environment and the output
    directory; an action's worker then moves to where the action runs
    (``run_action``): ``cwd``, or ``start_dir``, the directory the build runs from
    (default: this process's working directory now). After ``shutdown`` no worker
    starts.
    """

    def __init__(self, env: dict[str, str], cwd: str, start_dir: str | None = None) -> None:
        self._env = env
        self._cwd = cwd
        self._start_dir = start_dir if start_dir is not None else os.getcwd()
        self._lock = threading.Lock()
        self._template: Template | None = None
        self._closed = False

    def run(
        self,
        thunk: Callable[[], Any],
        desc: str,
        timeout: float | None,
        *,
        cwd: str | None = None,
        started: Callable[[Callable[[], None]], object] | None = None,
        reached: Reached | None = None,
    ) -> Reached:
        """Run ``thunk`` in a worker; what it reached while it ran (``kiln.base.reached``),
        also put into ``reached`` (so that a failure's is known too); raise what
        it raised, or why the worker died.
        ``cwd``: the worker's directory instead of the pool's. ``started`` is given a
        function that kills this worker with its group (and no other worker)."""
        import cloudpickle

        try:
            shim = iree_build_shim_active()  # the worker resolves iree.build as kiln does
            imports = (sys.path, sorted(hidden_build_modules()))  # as kiln imports
            payload = pickle.dumps((imports, cwd, shim, cloudpickle.dumps(thunk)))
        except Exception as e:
            raise ActionFailed(f"cannot send '{desc}' to a worker process: {e}") from e
        template, ident, sock = self._start_worker(modules_for(thunk))
        if started is not None:
            started(lambda: template.kill(ident))
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            sock.settimeout(timeout)  # a large payload waits for the worker to read it
            with contextlib.suppress(OSError):  # a worker that died early: its status says why
                send_framed(sock, PAYLOAD, payload)
            sock.settimeout(None)
            reply = _Awaited(template, ident, sock).result(desc, deadline, timeout)
        finally:
            sock.close()
        found = Reached.from_data(reply[-1])
        if reached is not None:
            reached.modules, reached.files = found.modules, found.files
        if reply[0] != "ok":
            _, type_name, message, tb, blob = reply[:5]
            raise _rebuild_exception(type_name, message, tb, blob)
        return found

    def run_action(
        self,
        action: BuildAction,
        started: Callable[[Callable[[], None]], object] | None = None,
        reached: Reached | None = None,
    ) -> Reached:
        """Run the PROCESS ``action``'s thunk in a worker, in the output directory or
        in the directory the build runs from, as ``kiln.planning.sandbox.runs_in_output_dir``
        says: the one place that decides where an action's worker runs. What it
        reached, as ``run``."""
        asked: list[BuildFile] = []
        token = NAMED_RELATIVE.set(asked)
        try:
            thunk = action._remotable_thunk()
        finally:
            NAMED_RELATIVE.reset(token)
        cwd = None if runs_in_output_dir(action, bool(asked)) else self._start_dir
        return self.run(
            thunk, action.desc, action.timeout, cwd=cwd, started=started, reached=reached
        )

    def _start_worker(self, modules: tuple[str, ...]) -> tuple[Template, int, socket.socket]:
        """A new worker from the template, starting (or restarting) the template."""
        for _ in range(2):
            with self._lock:
                if self._closed:
                    raise ActionFailed("the build is stopping")
                if self._template is None or not self._template.alive():
                    if self._template is not None:
                        self._template.stop()
                    self._template = Template(self._env, self._cwd)
                template = self._template
            try:
                return (template, *template.fork(modules))
            except TemplateGone:
                continue
        raise ActionFailed("kiln's worker template process keeps dying")

    def shutdown(self) -> None:
        """Stop the template, which kills every worker with its process group;
        running actions then fail with their worker's death."""
        with self._lock:
            self._closed = True
            template, self._template = self._template, None
        if template is not None:
            template.stop()


class _Awaited:
    """What kiln reads on one worker's socket: the worker's reply, then the
    template's word that the worker is gone (``E``: exit code, note)."""

    def __init__(self, template: Template, ident: int, sock: socket.socket) -> None:
        self._template = template
        self._ident = ident
        self._sock = sock
        self._reply = Frames(REPLY)
        self.reply: tuple[Any, ...] | None = None
        self.ended: tuple[int | None, str] | None = None
        self.eof = False
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def result(self, desc: str, deadline: float | None, timeout: float | None) -> tuple[Any, ...]:
        """The worker's reply; raise why there is none (once the worker is gone)."""
        if not self._read_until(deadline):
            self._template.kill(self._ident)
            self._await_gone()
            raise ActionTimeout(f"'{desc}' ran past its timeout of {timeout:g} s and was killed")
        if self.reply is None and self.ended is None:  # end of file: the template died
            raise WorkerCrashed(
                f"the worker process running '{desc}' died with kiln's worker template process"
            )
        if self.reply is not None:
            if self.ended is None:  # it is exiting; its group dies now, without waiting
                self._template.kill(self._ident)
            return self.reply
        assert self.ended is not None
        exitcode, note = self.ended
        if note:
            raise ActionFailed(f"'{desc}': {note}")
        raise WorkerCrashed(
            f"the worker process running '{desc}' died with {describe_exit(exitcode)}"
        )

    def _await_gone(self) -> None:
        """Wait (a bounded time) for the template's word that the worker is gone."""
        deadline = time.monotonic() + _GONE_WAIT_S
        while self.ended is None and not self.eof and self._read_until(deadline):
            pass

    def _read_until(self, deadline: float | None) -> bool:
        """Read messages until the worker's whole reply, the template's ``E`` or end
        of file; False if ``deadline`` passed first."""
        while True:
            wait_ms = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
            if not self._poll.poll(wait_ms):
                return False
            try:
                message = self._sock.recv(CHUNK + 1)
            except OSError:
                message = b""
            if not message:
                self.eof = True
                return True
            tag = message[:1]
            if tag == b"E":
                self.ended = pickle.loads(message[1:])
                return True
            if self.reply is None and self._reply.takes(message):
                whole = self._reply.add(message)
                if whole is not None:
                    self.reply = pickle.loads(whole)
                    return True


def _rebuild_exception(type_name: str, message: str, tb: str, blob: bytes | None) -> BaseException:
    """The worker's exception as itself, raised from the exceptions it was raised from
    there (``kiln.execution.process.worker``), else as a ``RemoteError``."""
    if blob is not None:
        try:
            exc, causes = pickle.loads(blob)
            if isinstance(exc, BaseException):
                exc.remote_traceback = tb  # type: ignore[attr-defined]
                link = exc
                for cause in causes:
                    if isinstance(cause, BaseException):
                        link.__cause__ = cause
                        link = cause
                return exc
        except Exception:  # noqa: BLE001 - fall back to the text form
            pass
    return RemoteError(type_name, message, tb)
