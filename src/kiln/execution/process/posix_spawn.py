"""``posix_spawn`` with a working directory, through the C library.

Python's ``os.posix_spawn`` cannot change the child's directory, and kiln's
commands run in the output directory (their paths are relative to it, so that
what they write does not depend on where the output directory is). glibc's
``posix_spawn_file_actions_addchdir_np`` (2.29 and later) does it inside the
spawn: no fork of kiln, no extra program. Where the C library has no such call,
``spawn`` starts ``/bin/sh`` to change directory and ``exec`` the command.

The command's program is found by kiln (``find_program``) on the PATH the
command is given, never on kiln's own: ``posix_spawnp`` would search kiln's.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
from collections.abc import Sequence
from typing import Any

_SETSIGDEF = 0x04  # POSIX_SPAWN_SETSIGDEF
_SETSID = 0x80  # POSIX_SPAWN_SETSID (glibc 2.26)
_OPAQUE = 1024  # bytes: more than glibc's posix_spawn_file_actions_t and posix_spawnattr_t


class _Opaque(ctypes.Structure):
    _fields_ = [("data", ctypes.c_char * _OPAQUE)]


class _Libc:
    """The C library's spawn calls and one attribute set (a new session, the
    signals kiln ignores reset to their defaults), made once per process."""

    def __init__(self, default_signals: Sequence[int]) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.init = libc.posix_spawn_file_actions_init
        self.destroy = libc.posix_spawn_file_actions_destroy
        self.dup2 = libc.posix_spawn_file_actions_adddup2
        self.close = libc.posix_spawn_file_actions_addclose
        self.open = libc.posix_spawn_file_actions_addopen
        self.chdir = libc.posix_spawn_file_actions_addchdir_np
        self.spawn = libc.posix_spawn
        self.attr = _Opaque()
        sigset = _Opaque()
        libc.sigemptyset(ctypes.byref(sigset))
        for sig in default_signals:
            libc.sigaddset(ctypes.byref(sigset), int(sig))
        libc.posix_spawnattr_init(ctypes.byref(self.attr))
        libc.posix_spawnattr_setflags.argtypes = [ctypes.c_void_p, ctypes.c_short]
        libc.posix_spawnattr_setflags(ctypes.byref(self.attr), _SETSID | _SETSIGDEF)
        libc.posix_spawnattr_setsigdefault(ctypes.byref(self.attr), ctypes.byref(sigset))


@functools.cache
def _libc(default_signals: tuple[int, ...]) -> _Libc | None:
    try:
        return _Libc(default_signals)
    except (AttributeError, OSError):
        return None


def find_program(name: str, path: str) -> str:
    """Where ``name`` is on ``path`` (a PATH value), as ``execvp`` would find it: a
    name with a slash is used as it is. Raises FileNotFoundError."""
    if "/" in name:
        return name
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(2, "No such file or directory (on the commands' PATH)", name)


def spawn(
    program: str,
    argv: Sequence[str],
    env: Sequence[bytes],
    *,
    cwd: str,
    out_fd: int,
    close_fds: Sequence[int],
    default_signals: Sequence[int] = (signal.SIGPIPE,),
) -> int:
    """Start ``program`` with ``argv`` and ``env`` (``NAME=VALUE`` entries) in ``cwd``,
    in a new session, stdin from ``/dev/null`` (a command never reads kiln's terminal
    or pipe: an input outside the key), stdout and stderr on ``out_fd``, ``close_fds``
    closed and ``default_signals`` at their defaults; its pid. Raises OSError when it
    cannot."""
    libc = _libc(tuple(int(s) for s in default_signals))
    if libc is None:
        return _spawn_through_shell(program, argv, env, cwd, out_fd, close_fds, default_signals)
    actions = _Opaque()
    libc.init(ctypes.byref(actions))
    try:
        ref = ctypes.byref(actions)
        libc.open(ref, 0, os.devnull.encode(), os.O_RDONLY, 0)
        libc.dup2(ref, out_fd, 1)
        libc.dup2(ref, out_fd, 2)
        for fd in close_fds:
            if fd != out_fd:
                libc.close(ref, fd)
        libc.chdir(ref, os.fsencode(cwd))
        c_argv: Any = (ctypes.c_char_p * (len(argv) + 1))(*map(os.fsencode, argv), None)
        c_env: Any = (ctypes.c_char_p * (len(env) + 1))(*env, None)
        pid = ctypes.c_int()
        error = libc.spawn(
            ctypes.byref(pid), os.fsencode(program), ref, ctypes.byref(libc.attr), c_argv, c_env
        )
    finally:
        libc.destroy(ctypes.byref(actions))
    if error:
        raise OSError(error, os.strerror(error), program)
    return pid.value


def _spawn_through_shell(
    program: str,
    argv: Sequence[str],
    env: Sequence[bytes],
    cwd: str,
    out_fd: int,
    close_fds: Sequence[int],
    default_signals: Sequence[int],
) -> int:
    """Without ``addchdir_np``: ``/bin/sh`` changes directory, then ``exec``s."""
    if not os.path.isdir(cwd):
        raise FileNotFoundError(2, "No such directory", cwd)
    shell = ["sh", "-c", 'cd -- "$1" && shift 2 && exec "$@"', "kiln", cwd, "--", program]
    shell += argv[1:]
    actions: list[tuple[int | str, ...]] = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out_fd, 1),
        (os.POSIX_SPAWN_DUP2, out_fd, 2),
    ]
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in close_fds if fd != out_fd]
    environ = dict(entry.split(b"=", 1) for entry in env)
    return os.posix_spawn(
        "/bin/sh",
        shell,
        environ,
        file_actions=actions,
        setsid=True,
        setsigdef=tuple(default_signals),
    )
