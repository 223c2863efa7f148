"""Worker processes forked from a clean template: kiln's own fork server.

The template is a process kiln starts from a fresh interpreter, once per process
pool, in a session of its own, with the build's environment and working
directory. It imports cloudpickle and kiln's worker and action modules and then
only forks, on request over one socket: each worker is a copy of that template,
so nothing an earlier action did to its own worker can reach the next one, and a
worker starts in about a millisecond instead of the hundreds a fresh interpreter
takes. It never imports a build module: thunks travel cloudpickled, by value
where they must. A thunk's function may name more modules for the template to
import once, before forking (``template_modules``): an importer's libraries,
say, which would otherwise be imported again by every worker.

The template also watches its workers, so that no process is needed per action
to do it: when a worker exits it kills the worker's process group (while the
dead worker's pid still holds the group's number), reaps it and sends its exit
status down the worker's socket, behind anything the worker sent. It is a child
subreaper, so what a worker leaves is reaped by it too. When kiln's end of the
control socket closes (the pool stopped, or kiln died, even by SIGKILL) it kills
every worker's group and exits; a worker dies with the template
(``PR_SET_PDEATHSIG``).

Control messages (``SOCK_SEQPACKET``, kiln -> template): ``F`` + 8-byte id +
pickled module names, carrying the worker's end of a socket pair: fork a worker
on it; ``K`` + id: kill that worker's group. The template answers ``ready`` once
started; on each worker's socket it sends ``E`` + pickled ``(exit code, note)``
after the worker is gone (exit code None and a note when no worker started).
"""

from __future__ import annotations

import array
import contextlib
import gc
import importlib
import os
import pickle
import selectors
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from kiln.base.errors import TemplateGone
from kiln.base.modnames import hidden_build_modules
from kiln.execution.process.groups import kill_group

# Imported once, in the template, at its start: what every worker needs. Never a
# build module: the template must stay clean. The kiln module a thunk's function
# comes from is imported on the first request that needs it (``modules_for``).
TEMPLATE_MODULES = ("cloudpickle", "kiln.execution.process.worker", "kiln.base.errors")
_MODULES_ATTR = "kiln_template_modules"
_STOP_WAIT_S = 5.0

F = TypeVar("F", bound=Callable[..., Any])


def template_modules(*modules: str) -> Callable[[F], F]:
    """Mark a function that PROCESS thunks call as needing ``modules``: the template
    imports them once, before forking the worker, instead of every worker
    importing them again. Only installed libraries, never a build's modules."""

    def mark(fn: F) -> F:
        setattr(fn, _MODULES_ATTR, tuple(modules))
        return fn

    return mark


def modules_for(thunk: Callable[[], Any]) -> tuple[str, ...]:
    """The modules ``thunk`` (or the function a ``functools.partial`` wraps) names,
    and the module of that function when it is kiln's own (a build module's never)."""
    fn = getattr(thunk, "func", thunk)
    names = getattr(fn, _MODULES_ATTR, ())
    found = [n for n in names if isinstance(n, str)] if isinstance(names, tuple) else []
    home = getattr(fn, "__module__", None)
    if isinstance(home, str) and home.startswith("kiln.") and home in sys.modules:
        found.insert(0, home)
    return tuple(found)


def bootstrap_code(fd: int) -> str:
    """The ``python -c`` program of a template serving the control socket ``fd``,
    with kiln's module search path. kiln itself is imported from where this kiln
    lives, first, and without the build modules' directories: a build module's
    directory (first on that path) may hold a ``kiln.py`` of its own, or the build
    module may be ``typing.py``, which must not stand in for kiln or what it imports.
    The build modules' file names stay theirs there too (``kiln.base.modnames``)."""
    package = sys.modules["kiln"].__file__ or ""  # imported before any of its modules
    home = os.path.dirname(os.path.dirname(os.path.abspath(package)))
    hidden = sorted(hidden_build_modules())
    dirs = {os.path.dirname(f) for f in hidden}
    first = [home, *(p for p in sys.path if os.path.realpath(p or os.curdir) not in dirs)]
    return (
        f"import sys; sys.path[:] = {first!r}; "
        "import kiln.base.modnames, kiln.execution.process.template; "
        f"kiln.base.modnames.hide_build_modules({hidden!r}); "
        f"sys.path[:] = {sys.path!r}; kiln.execution.process.template.serve({fd})"
    )


def serve(fd: int) -> NoReturn:
    """The template's main function: prepare, say ``ready``, fork on request."""
    control = socket.socket(fileno=fd)
    control.set_inheritable(False)
    env, cwd = dict(os.environ), os.getcwd()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in TEMPLATE_MODULES:
        importlib.import_module(name)
    from kiln.execution.process.reaper import set_subreaper

    set_subreaper(True)
    server = _Server(control, env, cwd)
    try:
        control.send(b"ready")
        server.loop()
    finally:
        server.stop_all()
        os._exit(0)


class _Stop(Exception):
    """SIGTERM or SIGHUP reached the template: stop as when kiln goes."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop()


class _Server:
    """The template's state. Invariant: ``workers`` maps each worker not yet reaped
    to its pid and the template's copy of its socket; a pid in it is this
    process's child (alive or a zombie), so its number is nobody else's."""

    def __init__(self, control: socket.socket, env: dict[str, str], cwd: str) -> None:
        self.control = control
        self.env, self.cwd = env, cwd
        self.workers: dict[int, tuple[int, socket.socket]] = {}
        self.by_pid: dict[int, int] = {}
        self.failed: set[str] = set()
        from kiln.execution.process.worker import pdeathsig_setter

        self.set_pdeathsig = pdeathsig_setter()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGTERM, _raise_stop)
        signal.signal(signal.SIGHUP, _raise_stop)
        self.selector = selectors.DefaultSelector()
        self.selector.register(control, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        gc.freeze()  # workers need not copy pages the collector would touch

    def loop(self) -> None:
        """Serve until kiln's end closes."""
        while True:
            try:
                events = self.selector.select()
            except _Stop:
                return
            for key, _ in events:
                if key.fileobj is self.control:
                    if not self.request():
                        return
                else:
                    while True:
                        try:
                            if not os.read(self.wake_r, 512):
                                break
                        except BlockingIOError:
                            break
                    self.reap()

    def request(self) -> bool:
        """Handle one control message; False once kiln is gone."""
        try:
            message, ancdata, _, _ = self.control.recvmsg(4096, socket.CMSG_SPACE(4))
        except (ConnectionError, OSError):
            return False
        if not message:
            return False
        fds = array.array("i")
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        ident = int.from_bytes(message[1:9], "big")
        for fd in fds:  # what a worker starts must not hold kiln's sockets
            os.set_inheritable(fd, False)
        if message[:1] == b"F" and len(fds) == 1:
            self.fork(ident, socket.socket(fileno=fds[0]), pickle.loads(message[9:]))
        elif message[:1] == b"K" and ident in self.workers:
            kill_group(self.workers[ident][0])
        else:
            for fd in fds:
                os.close(fd)
        return True

    def preload(self, modules: tuple[str, ...]) -> None:
        """Import ``modules`` here once (one that fails is left to the worker)."""
        fresh = [m for m in modules if m not in sys.modules and m not in self.failed]
        for name in fresh:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the worker's own import reports it
                self.failed.add(name)
        if fresh:
            gc.freeze()

    def fork(self, ident: int, sock: socket.socket, modules: tuple[str, ...]) -> None:
        self.preload(modules)
        try:
            pid = os.fork()
        except OSError as e:
            _notify(sock, None, f"cannot start a worker process: {e}")
            sock.close()
            return
        if pid == 0:
            self._child(sock)
        self.workers[ident] = (pid, sock)
        self.by_pid[pid] = ident

    def _child(self, sock: socket.socket) -> NoReturn:
        """In the new worker: drop the template's descriptors, run one action, exit."""
        code = 1
        try:
            from kiln.execution.process.worker import become_worker, run_one

            template = os.getppid()
            self.selector.close()
            self.control.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            for _, other in self.workers.values():
                other.close()
            become_worker(template, self.env, self.cwd, self.set_pdeathsig)
            run_one(sock)
            code = 0
        finally:
            os._exit(code)

    def reap(self) -> None:
        """Reap every child that exited; a worker's group is killed first."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or not info.si_pid:
                return
            self._reap(info.si_pid)

    def _reap(self, pid: int) -> None:
        ident = self.by_pid.pop(pid, None)
        if ident is not None:
            kill_group(pid)  # the dead leader's pid still holds the group's number
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = 0
        if ident is not None:
            _, sock = self.workers.pop(ident)
            _notify(sock, os.waitstatus_to_exitcode(status), "")
            sock.close()

    def stop_all(self) -> None:
        """Kill every worker's group and reap the workers (what they left that
        escaped their group stays, for kiln's end-of-build sweep)."""
        for pid, _ in self.workers.values():
            kill_group(pid)
        for pid in list(self.by_pid):
            self._reap(pid)


def _notify(sock: socket.socket, exitcode: int | None, note: str) -> None:
    """Tell kiln, on the worker's socket, how the worker ended (if kiln still listens)."""
    try:
        sock.settimeout(_STOP_WAIT_S)
        sock.send(b"E" + pickle.dumps((exitcode, note)))
    except OSError:
        pass


class Template:
    """kiln's end of one template process.

    Invariant: ``_control`` is kiln's only copy of the control socket (not
    inherited by anything kiln starts), so the template sees it close when the
    pool stops or kiln dies; request ids are never reused.
    """

    def __init__(self, env: dict[str, str], cwd: str, start_timeout: float = 300.0) -> None:
        import itertools
        import subprocess

        from kiln.base.errors import ActionFailed

        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # What workers print goes to stderr, escaped by each
        # (``kiln.execution.process.worker_output``).
        out: int = 2 if _valid_fd(2) else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", bootstrap_code(theirs.fileno())],
                env=env,
                cwd=cwd,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        except OSError as e:
            mine.close()
            raise ActionFailed(f"cannot start kiln's worker template process: {e}") from e
        finally:
            theirs.close()
        self._control = mine
        self._ids = itertools.count(1)
        mine.settimeout(start_timeout)
        try:
            ready = mine.recv(16)
        except OSError:
            ready = b""
        mine.settimeout(None)
        if ready != b"ready":
            self.stop()
            raise ActionFailed(
                "kiln's worker template process did not start (exit status "
                f"{self._proc.returncode}; its error is above)"
            )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def fork(self, modules: tuple[str, ...]) -> tuple[int, socket.socket]:
        """Ask for a worker; return its id and kiln's end of its socket."""
        ident = next(self._ids)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        message = b"F" + ident.to_bytes(8, "big") + pickle.dumps(modules)
        fds = array.array("i", [theirs.fileno()])
        try:
            self._control.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except OSError as e:
            mine.close()
            raise TemplateGone(str(e)) from e
        finally:
            theirs.close()
        return ident, mine

    def kill(self, ident: int) -> None:
        """Have worker ``ident`` killed with its process group (if it still runs)."""
        with contextlib.suppress(OSError):  # gone: its workers died with it
            self._control.send(b"K" + ident.to_bytes(8, "big"))

    def stop(self, wait_s: float = _STOP_WAIT_S) -> None:
        """Close the control socket (the template kills every worker and exits) and
        wait for the template; kill it if it does not go."""
        import subprocess

        self._control.close()
        try:
            self._proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _valid_fd(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
