"""The environment of the programs kiln runs for actions: every command
(``run_command``) and every worker process (PROCESS actions, the built-in
import, compile, verify and benchmark), here and on a Dask worker.

As Bazel's actions do, they never see the environment of the user's shell. They
see a fixed base set (``BASE``: ``PATH``, a UTF-8 locale, ``TZ``, and the
reproducible-builds knobs ``PYTHONHASHSEED`` and ``SOURCE_DATE_EPOCH``), ``HOME``
and ``TMPDIR`` (with ``TMP`` and ``TEMP``) pointing into a directory of kiln's
own (``.kiln/tmp`` in the output directory, the sandbox on a Dask worker), and
what the build declares: ``--action-env NAME=VALUE``, ``--action-env NAME``
(the value kiln itself was started with, or unset), and a command's own
``env={...}``. Every declared value is in the key of every action that sees it,
with the base set's version (``BASE_VERSION``), so an undeclared variable cannot
make an output stale and a declared one that changes reruns what it reaches.
Where kiln's own directory is, is not in any key: an action that writes its
``HOME`` or ``TMPDIR`` into an output is not reproducible, and
``--check-reproducible`` says so.

In-process actions (``_invoke`` on a thread of kiln, ``ActionConcurrency.NONE``
or ``THREAD``) run inside kiln and read kiln's own ``os.environ``. Of it, what
changes how a program formats or reads times, dates and text is keyed for every
in-process action that runs the user's code (``local_conventions``: ``TZ``,
``LANG``, ``LANGUAGE``, every locale category's ``LC_*``, ``SOURCE_DATE_EPOCH``, and what Python
made of them: ``time.tzname`` and the zone's offsets, the C locale of each
category, the preferred encoding), as kiln's process has them when the build is
planned; ``kiln explain`` names the one that changed (``describe_change``).
Being keyed, they are what ``--check-reproducible`` leaves alone for such
actions; it varies them (``other_conventions``) only for in-process actions
whose key does not hold them, kiln's own. Any other variable they read is not
keyed (``docs/reliability.md`` says so).
"""

from __future__ import annotations

import contextlib
import hashlib
import locale
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kiln.base.errors import UsageError

BASE: Mapping[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "PYTHONHASHSEED": "0",
    "SOURCE_DATE_EPOCH": "315532800",  # 1980-01-01, the earliest a zip file can say
}
# Bumped whenever BASE changes, so that results made under the old base rerun.
BASE_VERSION = 1
# The variables that name kiln's own scratch directory (never keyed).
SCRATCH_VARIABLES = ("HOME", "TMPDIR", "TMP", "TEMP")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_variables(values: Mapping[Any, Any], where: str) -> dict[str, str]:
    """``values`` as environment variables: string names that a shell could set and
    string values without NUL; else a UsageError naming ``where``."""
    out = {}
    for name, value in values.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise UsageError(
                f"{where}: {name!r} is not an environment variable name "
                "(letters, digits and _, not starting with a digit)"
            )
        if not isinstance(value, str) or "\0" in value:
            raise UsageError(f"{where}: the value of {name} must be a string without NUL bytes")
        out[name] = value
    return out


@dataclass(frozen=True)
class ActionEnvironment:
    """The base set and the variables declared for every action of a build.

    Invariant: ``declared`` holds valid names (``check_variables``) and their
    values, in the order first given; a name declared without a value and unset
    in kiln's environment is absent.
    """

    declared: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_specs(cls, specs: Iterable[str], environ: Mapping[str, str]) -> ActionEnvironment:
        """The environment ``--action-env`` options declare: ``NAME=VALUE``, or
        ``NAME`` for the value in ``environ`` (none when it is unset there)."""
        declared: dict[str, str] = {}
        for spec in specs:
            name, sep, value = spec.partition("=")
            if not sep:
                if name in environ:
                    value = environ[name]
                else:
                    declared.pop(name, None)
                    check_variables({name: ""}, f"--action-env {spec}")
                    continue
            declared.update(check_variables({name: value}, f"--action-env {spec}"))
        return cls(declared)

    def key(self) -> dict[str, Any]:
        """What every action that sees this environment has in its key."""
        return {"base": BASE_VERSION, "declared": sorted(self.declared.items())}

    def variables(self, scratch: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The whole environment of a program: the base, ``scratch`` as its home and
        temporary directory, the declared variables, then ``extra`` (an action's own)."""
        env = dict(BASE)
        env.update(dict.fromkeys(SCRATCH_VARIABLES, scratch))
        env.update(self.declared)
        if extra:
            env.update(extra)
        return env

    @staticmethod
    def encoded(env: Mapping[str, str]) -> dict[bytes, bytes]:
        """``env`` as ``posix_spawn`` takes it (encoded once, not per command)."""
        return {os.fsencode(k): os.fsencode(v) for k, v in env.items()}


# The variables, besides the locale categories' LC_*, that decide how in-process code reads and
# writes times, dates and text.
_CONVENTION_VARIABLES = frozenset({"TZ", "LANG", "LANGUAGE", "SOURCE_DATE_EPOCH"})
# Zones for a second run, each with its ``time.timezone``: POSIX rules, which need
# no time zone database; the first whose offset is not kiln's own is used.
_OTHER_ZONES = (("<+0545>-5:45", -20700), ("<-0330>3:30", 12600))


# The locale's categories (POSIX's and glibc's): other LC_ names (a terminal's
# LC_TERMINAL, forwarded by ssh) set nothing, and would key a build by its terminal.
_LOCALE_CATEGORIES = frozenset(
    "LC_" + name
    for name in [
        "ALL",
        "CTYPE",
        "COLLATE",
        "MONETARY",
        "NUMERIC",
        "TIME",
        "MESSAGES",
        "PAPER",
        "NAME",
        "ADDRESS",
        "TELEPHONE",
        "MEASUREMENT",
        "IDENTIFICATION",
    ]
)


def _is_convention(name: str) -> bool:
    return name in _CONVENTION_VARIABLES or name in _LOCALE_CATEGORIES


def local_conventions(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The time zone and locale that code running in kiln's process sees now: the
    variables that set them (those set) and what Python made of them."""
    environ = os.environ if environ is None else environ
    found: dict[str, Any] = {n: environ[n] for n in sorted(environ) if _is_convention(n)}
    found["time"] = f"{'/'.join(time.tzname)} {time.timezone} {time.altzone} {time.daylight}"
    # Every category's locale (a query: changes nothing) and the encoding, as a
    # short digest: the key is encoded for every action of every build.
    categories = f"{locale.setlocale(locale.LC_ALL)} {locale.getpreferredencoding(False)}"
    found["locale"] = hashlib.sha256(categories.encode()).hexdigest()[:16]
    return found


def describe_change(old: Any, new: Any) -> str:
    """What changed between two ``local_conventions``, for ``kiln explain``."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return "the time zone and locale of kiln's process were not in its key before"
    changed = [n for n in sorted(set(old) | set(new)) if old.get(n) != new.get(n)]
    shown = ", ".join(f"{n} from {_spelled(old, n)} to {_spelled(new, n)}" for n in changed[:3])
    return f"the time zone or locale of kiln's process, which its code sees, changed: {shown}"


def _spelled(values: Mapping[str, Any], name: str) -> str:
    return repr(values[name]) if name in values else "unset"


@contextlib.contextmanager
def other_conventions() -> Iterator[str]:
    """kiln's process with another time zone and locale while the block runs (for
    ``--check-reproducible``'s second run of an in-process action whose key does
    not hold them; nothing else of the build may run meanwhile: the environment
    is the process's); yields what it set. The C locale itself is left alone: an action that calls
    ``setlocale(LC_ALL, "")`` takes the other one."""
    zone = next(z for z, offset in _OTHER_ZONES if offset != time.timezone)
    current = os.environ.get("LC_ALL") or os.environ.get("LANG")
    other = "C" if current != "C" else "C.UTF-8"
    names = {"TZ", "LANG", "LC_ALL", *(n for n in os.environ if n.startswith("LC_"))}
    saved = {n: os.environ.get(n) for n in names}
    os.environ.update(dict.fromkeys(names, other), TZ=zone)
    time.tzset()
    try:
        yield f"TZ={zone} LANG={other} LC_ALL={other}"
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        time.tzset()
