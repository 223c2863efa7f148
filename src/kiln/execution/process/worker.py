"""A kiln worker process: the child the template (``kiln.execution.process.template``) forks for
one PROCESS action, and the framing kiln and its workers talk in.

A worker runs exactly one action. It is forked from the clean template, which
already has the build's environment and working directory; it leads a process
group (and session) of its own, so that the template can kill it together with
every subprocess it started, and the kernel kills it when the template dies
(``PR_SET_PDEATHSIG``). It reads one pickled ``((sys.path, hidden), cwd, shim,
cloudpickled thunk)`` from its socket (``hidden``: the build modules whose file
names import nothing, ``kiln.base.modnames``; ``shim``: whether ``iree.build`` imports
resolve to kiln, as in the kiln that sent it: ``kiln.base.iree_shim``), runs the thunk
(what it prints escaped: ``kiln.execution.process.worker_output``), answers with a
pickled tuple, ``("ok", reached)`` (what the thunk reached while it ran, as
``kiln.base.reached.Reached.as_data`` gives it) or
``("err", type_name, message, traceback_text, pickled_exception_or_None, reached)``, and
exits: nothing an action does to its process reaches another action.

Framing: the sockets are ``SOCK_SEQPACKET`` (each send is one whole message), and
a pickle travels as messages of at most ``CHUNK`` bytes, each a one-byte tag and
a piece: the tag is lowercase on the last piece.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import socket
import sys
import traceback
from collections.abc import Callable

from kiln.base.modnames import hide_build_modules
from kiln.base.reached import Reached, recording
from kiln.execution.process.byvalue import install as import_unpickled_build_modules
from kiln.execution.process.worker_output import escaped_output

CHUNK = 32 * 1024
PAYLOAD, REPLY = b"P", b"R"  # kiln -> worker, worker -> kiln
_PR_SET_PDEATHSIG = 1


def send_framed(sock: socket.socket, tag: bytes, data: bytes) -> None:
    """Send ``data`` as ``tag`` pieces (uppercase tag on all but the last)."""
    view = memoryview(data)
    more, last = tag.upper(), tag.lower()
    while len(view) > CHUNK:
        sock.send(more + view[:CHUNK])
        view = view[CHUNK:]
    sock.send(last + view)


class Frames:
    """Puts one ``tag`` pickle sent by ``send_framed`` together from its pieces."""

    def __init__(self, tag: bytes) -> None:
        self.more, self.last = tag.upper(), tag.lower()
        self._pieces: list[bytes] = []

    def takes(self, message: bytes) -> bool:
        """Whether ``message`` is one of this pickle's pieces."""
        return message[:1] in (self.more, self.last)

    def add(self, message: bytes) -> bytes | None:
        """Add a piece (``takes`` said so); the whole pickle once this was the last."""
        self._pieces.append(message[1:])
        return b"".join(self._pieces) if message[:1] == self.last else None


def recv_framed(sock: socket.socket, tag: bytes) -> bytes | None:
    """Receive one ``tag`` pickle sent by ``send_framed``; None at end of file or on a
    message that is not one of its pieces."""
    frames = Frames(tag)
    while True:
        message = sock.recv(CHUNK + 1)
        if not message or not frames.takes(message):
            return None
        whole = frames.add(message)
        if whole is not None:
            return whole


def pdeathsig_setter() -> Callable[[int], object]:
    """``prctl(PR_SET_PDEATHSIG, sig)`` through libc, looked up once (in the template)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda sig: prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def become_worker(
    template_pid: int, env: dict[str, str], cwd: str, set_pdeathsig: Callable[[int], object]
) -> None:
    """Turn the freshly forked child of the template into a worker: its own session
    and process group, death with the template, kiln's signal dispositions, and
    the build's environment and directory (should an import in the template have
    changed them)."""
    os.setsid()
    set_pdeathsig(signal.SIGKILL)
    if os.getppid() != template_pid:  # the template died before the request took effect
        os._exit(1)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    # kiln decides when a worker stops; a terminal's Ctrl-C must not reach it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ != env:
        os.environ.clear()
        os.environ.update(env)
    if os.getcwd() != cwd:
        os.chdir(cwd)


def run_one(sock: socket.socket) -> None:
    """Receive the thunk, run it and send back how it went."""
    data = recv_framed(sock, PAYLOAD)
    if data is None:
        return
    # What the action prints is escaped, and all of it out (the worker ends with
    # os._exit) before the reply.
    reached = Reached()
    with escaped_output():
        try:
            (sys_path, hidden), cwd, shim, payload = pickle.loads(data)
            # kiln's, so that the thunk's modules import as there
            hide_build_modules(hidden)
            sys.path[:] = sys_path
            # Nothing into the user's tree; and no bytecode cache of a module that a
            # same-second edit of the same size leaves stale for the next run.
            sys.dont_write_bytecode = True
            if cwd is not None:
                os.chdir(cwd)
            if shim:
                from kiln.base.iree_shim import install

                install()
            import cloudpickle

            import_unpickled_build_modules()
            thunk = cloudpickle.loads(payload)
            # After unpickling: the modules that imported are those the thunk's code
            # names, keyed already (``kiln.planning.code_key``).
            with recording(reached):
                thunk()
            reply: tuple[object, ...] = ("ok", reached.as_data())
        except BaseException as e:  # noqa: BLE001 - every failure goes back to kiln
            tb, blob = traceback.format_exc(), _exception_blob(e)
            reply = ("err", type(e).__name__, str(e), tb, blob, reached.as_data())
    send_framed(sock, REPLY, pickle.dumps(reply))


def _exception_blob(e: BaseException) -> bytes | None:
    """``(e, the exceptions it was raised from)`` pickled (pickling an exception leaves
    its ``__cause__`` and ``__context__`` out, and kiln reads them to tell a failure
    that recurs from one that may pass: ``kiln.engine.failures``); ``(e, [])``
    when a cause does not pickle; None when ``e`` itself does not survive a round
    trip (it then travels as text)."""
    import cloudpickle

    for payload in ((e, _causes(e)), (e, [])):
        try:
            blob: bytes = cloudpickle.dumps(payload)
            pickle.loads(blob)
        except Exception:  # noqa: BLE001 - an unpicklable exception travels as text
            continue
        return blob
    return None


def _causes(e: BaseException, most: int = 16) -> list[BaseException]:
    """The exceptions ``e`` was raised from or while handling, nearest first."""
    chain: list[BaseException] = []
    seen = {id(e)}
    while len(chain) < most:
        cause = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
        if cause is None or id(cause) in seen:
            break
        seen.add(id(cause))
        chain.append(cause)
        e = cause
    return chain
