"""The surroundings' signs in what a failed action printed or raised: the words of
a machine that ran out of something, a network or server that failed, a program
or module that is missing, a program that was killed or timed out.

Only ``kiln.engine.failures`` asks, and a sign only ever makes a failure
retried, never remembered; so the matching leans toward finding one:

- the text is normalized first (escape sequences removed, other control characters
  and runs of white space made one space, case folded), so colour, case, CRLF,
  tabs or doubled spaces cannot hide a sign, nor can a line break inside one;
- a log is read only through a bounded tail (``LOG_TAIL_BYTES``: the words of a
  failure come last) and only when it is a regular file reached without a link;
  one that cannot be read so is itself a reason to retry (``log_sign``);
- every pattern is a plain substring or a regular expression of bounded repeats,
  so matching takes time linear in the bounded text.
"""

from __future__ import annotations

import builtins
import errno
import os
import re
import signal
import stat

LOG_TAIL_BYTES = 64 << 10  # of a log, the part read
TEXT_TAIL_CHARS = 64 << 10  # of an error's message, the part read

_MEMORY = "it ran out of memory"
_MACHINE = "the disk or another limit of the machine"
_NETWORK = "the network or a server failed"
_MISSING = "a program, library or module it needs is missing here"
_STOPPED = "a program was killed, interrupted or timed out"


def _strerrors(names: str) -> tuple[str, ...]:
    """The operating system's words for the errnos ``names`` (as ``errno`` names them)."""
    return tuple(os.strerror(getattr(errno, name)).lower() for name in names.split())


# Words, as they read after ``normalize``, and what each kind says.
_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        _MEMORY,
        (
            *_strerrors("ENOMEM"),
            "memoryerror",
            "out of memory",
            "outofmemory",
            "bad_alloc",
            "memory exhausted",
            "not enough memory",
            "insufficient memory",
            "failed to allocate",
            "oom-kill",
            "oom kill",
            "oomkill",
            "resource_exhausted",
            "resource exhausted",
        ),
    ),
    (
        _MACHINE,
        (
            *_strerrors("ENOSPC EDQUOT EFBIG EROFS EIO EMFILE ENFILE EAGAIN EINTR EBUSY"),
            "disk full",
            "can't start new thread",
            "cannot start new thread",
        ),
    ),
    (
        _NETWORK,
        (
            *_strerrors("ECONNREFUSED ECONNRESET ECONNABORTED ETIMEDOUT EHOSTUNREACH"),
            *_strerrors("EHOSTDOWN ENETUNREACH ENETDOWN ENETRESET EPIPE"),
            "connection refused",
            "connection reset",
            "connection aborted",
            "connection closed",
            "connection timed out",
            "couldn't connect",
            "could not connect",
            "failed to connect",
            "unable to connect",
            "remote end closed connection",
            "temporary failure in name resolution",
            "name or service not known",
            "nodename nor servname",
            "no address associated with hostname",
            "could not resolve",
            "couldn't resolve",
            "unable to resolve",
            "getaddrinfo",
            "name resolution",
            "service unavailable",
            "bad gateway",
            "gateway timeout",
            "gateway time-out",
            "too many requests",
            "request timeout",
            "internal server error",
            "certificate verify failed",
            "ssl handshake",
            "eof occurred in violation of protocol",
            "empty reply from server",
            "statuscode.unavailable",
            "deadline exceeded",
            "deadline_exceeded",
        ),
    ),
    (
        _MISSING,
        (
            *_strerrors("ENOENT EACCES ENOEXEC"),
            "command not found",
            "not installed",
            "no module named",
            "can't open file",
            "cannot execute",
            "error while loading shared libraries",
            "cannot open shared object file",
        ),
    ),
    (
        _STOPPED,
        (
            "timed out",
            "time limit exceeded",
            "killed by signal",
            "terminated by signal",
            "was killed",
            "core dumped",
        ),
    ),
)

# Python's exception names that report the surroundings (every ``OSError``,
# ``MemoryError``, ``ImportError``, an interruption) and others' that do too.
_ENVIRONMENT_TYPES = (OSError, MemoryError, ImportError, KeyboardInterrupt)
_NAMES = frozenset(
    {
        name.lower()
        for name, value in vars(builtins).items()
        if isinstance(value, type) and issubclass(value, _ENVIRONMENT_TYPES)
    }
    | {
        "urlerror",
        "httperror",
        "remotedisconnected",
        "incompleteread",
        "gaierror",
        "herror",
        "sslerror",
        "readtimeout",
        "connecttimeout",
        "timeoutexpired",
        "brokenprocesspool",
    }
)
_NAMES_FOUND = re.compile(r"\b(?:" + "|".join(sorted(_NAMES)) + r")\b")
# Parts of an exception type's name that say the surroundings failed (httpx's
# ``ConnectError``, urllib3's ``MaxRetryError``, torch's ``OutOfMemoryError``).
_NAME_PARTS = (
    "connect",
    "timeout",
    "network",
    "socket",
    "memory",
    "unavailable",
    "ssl",
    "disk",
    "quota",
    "interrupt",
    "retry",
    "resolv",
    "dns",
    "proxy",
    "transport",
)
_SUFFIXES = ("error", "exception", "timeout", "exceeded")
_MAX_NAME = 100  # a longer word is no exception's name

# Abnormal statuses: a signal's (128 + N, or -N) or a missing program's (126, 127),
# as a program that ran another reports it ("make: *** [all] Error 137", Python's
# "returned non-zero exit status 127", "died with <Signals.SIGKILL: 9>").
_ABNORMAL = r"(?:12[6-9]|1[3-9]\d|2[0-5]\d|-\d{1,3})\b"
_NOT_FATAL = {signal.SIGCHLD, signal.SIGCONT, signal.SIGWINCH, signal.SIGURG}
_NOT_FATAL |= {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}
_SIGNALS = "|".join(
    re.escape(said.lower())
    for said in sorted({signal.strsignal(s) or "" for s in signal.Signals if s not in _NOT_FATAL})
    if said
)
# Patterns, on text as ``normalize`` makes it (lines kept), and what each says.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # A server's answer that may pass by itself: 5xx, 429 (too many requests), 408
    # (request timeout), after the words HTTP tools print before it.
    (
        re.compile(
            r"\b(?:http(?:/\d(?:\.\d)?)?|error|status|code|response)\b[ :]{0,3}"
            r"(?:5\d\d|429|408)\b|\b(?:5\d\d|429|408) (?:server|client) error\b"
        ),
        _NETWORK,
    ),
    # A shell's word that a program is missing: dash's "sh: 1: tool: not found".
    (re.compile(r"\bsh: (?:line )?(?:\d+: )?[^\n]{1,256}?: not found\b"), _MISSING),
    # A shell's or make's report of a program a signal killed: a line that is the
    # signal's description, bash's "line 1: 4242 Killed  prog", make's "*** [x] Killed".
    (
        re.compile(
            rf"(?m)^ ?(?:{_SIGNALS})(?: \(core dumped\)|: \d+)? ?$"
            rf"|: \d+ (?:{_SIGNALS})\b|\*\*\* \[[^\n\]]{{0,256}}\] (?:{_SIGNALS})\b"
        ),
        _STOPPED,
    ),
    (
        re.compile(
            r"\*\*\* \[[^\n\]]{0,256}\] error "
            + _ABNORMAL
            + r"|\b(?:exit (?:status|code)|exited with (?:status|code)|non-zero exit status) "
            + _ABNORMAL
            + r"|\bsignals\.sig[a-z0-9]+\b"
        ),
        _STOPPED,
    ),
)

_ESCAPE = re.compile(
    r"\x1b(?:\[[0-?]{0,64}[ -/]{0,8}[@-~]|\][^\x07\x1b]{0,1024}(?:\x07|\x1b\\)?|[@-Z\\-_])"
    r"|\\x1b\[[0-?]{0,64}[ -/]{0,8}[@-~]"  # as kiln's own messages escape one
)
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f\u0085\u2028\u2029]+")
_SPACES = re.compile(r"[ \t]+")
_NAMED = re.compile(r"\b\w+(?:error|exception|timeout|exceeded)\b")


def normalize(text: str) -> str:
    """``text`` as signs are looked for in it: escape sequences removed, other control
    characters a space, case folded, runs of spaces one; lines kept."""
    text = _ESCAPE.sub("", text)
    text = _CONTROL.sub(" ", text).casefold()
    return _SPACES.sub(" ", text)


def sign_in(text: str) -> str | None:
    """The first of the surroundings' signs found in ``text`` (its last
    ``TEXT_TAIL_CHARS``), said as ``'words' (what they mean)``; None when none is."""
    lines = normalize(text[-TEXT_TAIL_CHARS:])
    flat = _SPACES.sub(" ", lines.replace("\n", " "))
    for kind, words in _WORDS:
        for word in words:
            if word in flat:
                return f"{word!r} ({kind})"
    for pattern, kind in _PATTERNS:
        match = pattern.search(lines)
        if match is not None:
            return f"{match.group().strip()[-80:]!r} ({kind})"
    name = _name_in(flat)
    return None if name is None else f"{name!r} ({_NAME_KIND})"


def _name_in(flat: str) -> str | None:
    """The first exception type's name in ``flat`` that reports the surroundings."""
    match = _NAMES_FOUND.search(flat)
    name = None if match is None else match.group()
    if name is None and any(part in flat for part in _NAME_PARTS):
        words = (m.group() for m in _NAMED.finditer(flat))
        name = next((word for word in words if environment_name(word)), None)
    return name


_NAME_KIND = "an error of the surroundings"


def environment_name(name: str) -> bool:
    """Whether ``name`` is an exception type's name that reports the surroundings:
    one of Python's (``ConnectionRefusedError``, ``MemoryError``, ``URLError``...) or
    an ``...Error``/``...Exception``/``Timeout`` naming a connection, a timeout, the
    network, memory, the disk..."""
    name = name.casefold()
    if name in _NAMES:
        return True
    if len(name) > _MAX_NAME or name in _SUFFIXES or not name.endswith(_SUFFIXES):
        return False
    return any(part in name for part in _NAME_PARTS)


def log_sign(path: str) -> str | None:
    """A sign found in the last ``LOG_TAIL_BYTES`` of the log at ``path``, or why the
    log could not be read (then nothing can be ruled out); None when it was read and
    says nothing of the surroundings. The log is opened without following a link and
    read only when it is a regular file (a FIFO there would block)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError as e:
        return f"kiln cannot read its log ({e.strerror}), so cannot rule out its surroundings"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "its log is not a regular file, so kiln cannot rule out its surroundings"
        start = max(0, st.st_size - LOG_TAIL_BYTES)
        data = os.pread(fd, LOG_TAIL_BYTES, start)
    except OSError as e:
        return f"kiln cannot read its log ({e.strerror}), so cannot rule out its surroundings"
    finally:
        os.close(fd)
    said = sign_in(data.decode(errors="replace"))
    return None if said is None else f"its output says {said}"
