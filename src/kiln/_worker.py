"""The main function of a kiln worker process.

A worker runs exactly one action: it is forked from a clean template (the fork
server of ``kiln.runners``), takes the build's environment and working
directory, receives one cloudpickled no-argument thunk over a pipe, runs it and
answers with a pickled tuple: ``("ok",)`` or
``("err", type_name, message, traceback_text, pickled_exception_or_None)``. Then
it exits, so nothing an action does to its process reaches another action.
It leads its own process group so kiln can kill it together with any
subprocess it started. It dies with its parent, the fork server, which dies
with kiln (``PR_SET_PDEATHSIG``), and a forked watchdog then kills the rest of
its group, so a SIGKILLed kiln leaves no worker and no subprocess of a worker
running.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when its parent (kiln's fork server, which
    exits when kiln does) dies, even when kiln dies by SIGKILL."""
    if sys.platform.startswith("linux"):
        import ctypes
        import multiprocessing

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        # kiln may have died before the request took effect; then no signal comes.
        parent = multiprocessing.parent_process()  # kiln, watched through a pipe
        if parent is not None and not parent.is_alive():
            os._exit(1)


def _guard_group() -> None:
    """Fork a watchdog that kills this worker's process group once the worker is
    gone, however it died: the kernel's death signal reaches the worker alone."""
    read_end, write_end = os.pipe()  # the worker holds write_end until it dies
    if os.fork() != 0:
        os.close(read_end)
        return
    try:
        os.closerange(3, read_end)  # hold nothing of the worker's but the pipe
        os.closerange(read_end + 1, os.sysconf("SC_OPEN_MAX"))
        while os.read(read_end, 1):
            pass
    finally:
        os.killpg(0, signal.SIGKILL)


def _release_fork_server() -> None:
    """Close this worker's copy of kiln's end of the fork server's liveness pipe: the
    server exits when kiln's copy closes, which must not wait for its workers."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None  # type: ignore[union-attr]


def worker_main(conn: Connection, env: dict[str, str], cwd: str) -> None:
    """Run one thunk in the build's environment ``env`` and directory ``cwd``."""
    os.setsid()
    _release_fork_server()
    _die_with_parent()
    _guard_group()
    # kiln decides when a worker stops; a terminal's Ctrl-C must not reach it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # kiln's stdout carries only the paths it built: what actions print goes to stderr.
    os.dup2(2, 1)
    import cloudpickle

    try:
        data = conn.recv_bytes()
    except (EOFError, OSError):
        return
    try:
        cloudpickle.loads(data)()
        reply: tuple[object, ...] = ("ok",)
    except BaseException as e:  # noqa: BLE001 - every failure goes back to kiln
        blob: bytes | None
        try:
            blob = cloudpickle.dumps(e)
            pickle.loads(blob)
        except Exception:  # noqa: BLE001 - an unpicklable exception travels as text
            blob = None
        reply = ("err", type(e).__name__, str(e), traceback.format_exc(), blob)
    conn.send_bytes(pickle.dumps(reply))
