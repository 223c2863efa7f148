"""The main loop of a kiln worker process.

A worker receives cloudpickled no-argument thunks over a pipe, one at a time,
runs each and answers with a pickled tuple: ``("ok",)`` or
``("err", type_name, message, traceback_text, pickled_exception_or_None)``.
It leads its own process group so kiln can kill it together with any
subprocess it started. It dies with kiln (``PR_SET_PDEATHSIG``), and a forked
watchdog then kills the rest of its group, so a SIGKILLed kiln leaves no
worker and no subprocess of a worker running.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when kiln dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        import ctypes
        import multiprocessing

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        # kiln may have died before the request took effect; then no signal comes.
        parent = multiprocessing.parent_process()
        if parent is not None and os.getppid() != parent.pid:
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


def worker_main(conn: Connection) -> None:
    os.setsid()
    _die_with_parent()
    _guard_group()
    # kiln decides when a worker stops; a terminal's Ctrl-C must not reach it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # kiln's stdout carries only the paths it built: what actions print goes to stderr.
    os.dup2(2, 1)
    import cloudpickle

    while True:
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
