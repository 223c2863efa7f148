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
or ``THREAD``) run inside kiln and read kiln's own ``os.environ``; kiln cannot
see what they read. ``docs/reliability.md`` says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kiln.errors import UsageError

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
        import os

        return {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
