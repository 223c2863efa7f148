"""``[tool.kiln]`` in a project's ``pyproject.toml``: the options a project always
builds with, set once instead of on every command line.

A key is a long option of kiln's without its dashes (``jobs``, ``remote-cache``,
``output-dir``, ``pool``, ``action-env``, ``target``...); its value is what the
option takes: a string or a number, ``true`` for an option without a value, a
list for an option given several times, a table for ``pool`` (``{memory = 2}``).
Paths are relative to the ``pyproject.toml``'s directory. The order, strongest
first: the command line, an option's ``KILN_*`` variable, ``[tool.kiln]``, kiln's
default. A list option given on the command line replaces the file's list.

The file is the nearest ``pyproject.toml`` above the build module (for commands
without one, above the working directory), as ruff and black find theirs. The
nearest one is the project's, whatever it is: one that is not a regular file
(a FIFO, a device, a directory, a link to nothing), is larger than 1 MiB or
cannot be read is a usage error naming it and what is wrong, never passed over
in silence (the project's settings would be dropped) nor waited on (it is
never opened unless it is a regular file, and then without blocking).
"""

from __future__ import annotations

import argparse
import difflib
import os
import stat
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.base.errors import NotRegularFile, UsageError
from kiln.cli.options import command_parser
from kiln.cli.plain_parsers import (
    cache_parser,
    clean_parser,
    compare_parser,
    devices_parser,
    report_parser,
)
from kiln.output_dir.ownership import open_regular
from kiln.output_dir.writing import file_kind

FILE = "pyproject.toml"
_MAX_BYTES = 1 << 20
# Options whose value is a path: relative to the file's directory.
_PATHS = {"output_dir", "cache_dir", "events", "profile"}
# Options that a variable of the environment sets too: it wins over the file.
_ENVIRONMENT = {
    "cache_dir": "KILN_CACHE_DIR",
    "cache_max_size": "KILN_CACHE_MAX_SIZE",
    "remote_cache": "KILN_REMOTE_CACHE",
    "executor": "KILN_EXECUTOR",
}
# Not settings of a project.
_NEVER = {"help", "version"}


class _FromFile(list[Any]):
    """A list option's value taken from the file. Given on the command line, the
    option starts from an empty list (argparse copies its default to append to)."""

    def __copy__(self) -> list[Any]:
        return []


@dataclass(frozen=True)
class _Scalar:
    """A single option's value taken from the file (argparse keeps a default that
    the command line did not replace)."""

    value: Any

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class ProjectConfig:
    """The ``[tool.kiln]`` table of the file at ``path``."""

    path: Path
    table: dict[str, Any]

    @classmethod
    def find(cls, start: str | os.PathLike[str]) -> ProjectConfig | None:
        """The nearest ``pyproject.toml`` at or above ``start`` with a ``[tool.kiln]``
        table; None when the nearest has none, or there is none."""
        here = Path(os.path.abspath(start))
        for directory in (here, *here.parents):
            path = directory / FILE
            try:
                os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as e:
                raise _unusable(path, f"kiln cannot look at it ({e.strerror})") from None
            return cls._read(path)
        return None

    @classmethod
    def _read(cls, path: Path) -> ProjectConfig | None:
        text = _read_text(path)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{path}: cannot read it as TOML: {e}") from None
        tool = data.get("tool")
        table = tool.get("kiln") if isinstance(tool, dict) else None
        if table is None:
            return None
        if not isinstance(table, dict):
            raise UsageError(f"{path}: [tool.kiln] must be a table of options")
        return cls(path, table)

    def install(self, parser: argparse.ArgumentParser, known: Iterable[str] = ()) -> None:
        """Make the file's values ``parser``'s defaults. A key that is an option of
        another command only (``known``: every command's long options) is left to
        that command; one that is no option of kiln's is an error naming it."""
        options = {
            s[2:]: a
            for a in parser._actions
            for s in a.option_strings
            if s.startswith("--") and a.dest not in _NEVER
        }
        defaults: dict[str, Any] = {}
        for key, value in self.table.items():
            action = options.get(key)
            if action is None:
                if key in known and key not in _NEVER:
                    continue
                names = [n for n in (*options, *known) if n not in _NEVER]
                close = difflib.get_close_matches(key, names, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise UsageError(
                    f"{self.path}: [tool.kiln] sets '{key}', which is not an option of "
                    f"kiln's{hint}; a key is a long option without its dashes"
                )
            if os.environ.get(_ENVIRONMENT.get(action.dest, "")):
                continue
            defaults[action.dest] = self._value(key, action, value)
        parser.set_defaults(**defaults)

    def _value(self, key: str, action: argparse.Action, value: Any) -> Any:
        where = f"{self.path}: [tool.kiln] {key}"
        if isinstance(action, argparse._CountAction):  # -v: how many times
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UsageError(f"{where} must be a count (0, 1, 2), not {value!r}")
            return _Scalar(value)
        if action.nargs == 0:  # a flag: true, or false to leave it off
            if not isinstance(value, bool):
                raise UsageError(f"{where} must be true or false, not {value!r}")
            if isinstance(action, argparse.BooleanOptionalAction):
                return _Scalar(value)
            return _Scalar(action.const if value else action.default)
        if isinstance(action, argparse._AppendAction):
            if key == "pool" and isinstance(value, dict):
                value = [f"{name}={limit}" for name, limit in value.items()]
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(
                isinstance(v, str | int | float) and not isinstance(v, bool) for v in value
            ):
                raise UsageError(f"{where} must be a list of strings, not {value!r}")
            return _FromFile(self._convert(where, action, v) for v in value)
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise UsageError(f"{where} must be a string or a number, not {value!r}")
        return _Scalar(self._convert(where, action, value))

    def _convert(self, where: str, action: argparse.Action, value: str | int | float) -> Any:
        text = str(value)
        if action.dest in _PATHS:
            text = os.path.join(self.path.parent, os.path.expanduser(text))
        if action.choices is not None and text not in action.choices:
            raise UsageError(f"{where}: {text!r} is not one of {', '.join(action.choices)}")
        convert = action.type
        if convert is None or not callable(convert):
            return text
        try:
            return convert(text)
        except (argparse.ArgumentTypeError, TypeError, ValueError, UsageError) as e:
            raise UsageError(f"{where}: {e}") from None


def _read_text(path: Path) -> str:
    """The text of the project file ``path``: a regular file (looked at before it is
    opened, so that no device is opened and no FIFO waited on) of at most 1 MiB of
    UTF-8; else a UsageError saying what it is."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise _unusable(path, f"it is {file_kind(st.st_mode)}, not a regular file")
        with os.fdopen(open_regular(path, follow=True), "rb") as f:  # no FIFO swapped in
            data = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        raise _unusable(path, "it is a symbolic link to nothing") from None
    except NotRegularFile as e:
        raise _unusable(path, f"it is not a regular file ({e})") from None
    except OSError as e:
        raise _unusable(path, f"kiln cannot read it ({e.strerror})") from None
    if len(data) > _MAX_BYTES:
        raise _unusable(path, "it is larger than 1 MiB, more than kiln reads of it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: cannot read it as TOML: {e}") from None


def _unusable(path: Path, why: str) -> UsageError:
    return UsageError(
        f"{path}: kiln takes its settings ([tool.kiln]) from the nearest {FILE}, and {why}; "
        "make it a readable file, or remove it"
    )


def settle(ns: argparse.Namespace) -> argparse.Namespace:
    """``ns`` with the file's values, where the command line did not replace them,
    as plain values."""
    for name, value in vars(ns).items():
        if isinstance(value, _Scalar):
            setattr(ns, name, value.value)
        elif isinstance(value, _FromFile):
            setattr(ns, name, list(value))
    return ns


def parse(
    parser: argparse.ArgumentParser, argv: list[str], start: str | os.PathLike[str]
) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with the defaults of the ``[tool.kiln]`` found from
    ``start`` (its subcommands' parsers too); a key that no command of kiln's knows
    is an error. ``project_file`` is the file read, or None."""
    config = ProjectConfig.find(start)
    if config is not None:
        known = _long_options(_every_parser())
        for p in _with_subparsers(parser):
            config.install(p, known)
    ns = settle(parser.parse_args(argv))
    # What kiln read its settings from: an input, never a file to write (--profile).
    ns.project_file = config.path if config is not None else None
    return ns


def _with_subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _with_subparsers(sub)
    return found


def _every_parser() -> list[argparse.ArgumentParser]:
    """A parser of each command of kiln's."""
    parsers: list[argparse.ArgumentParser] = [
        command_parser(c, "kiln", None) for c in ("build", "list", "explain", "graph")
    ]
    parsers += [clean_parser(), report_parser(), cache_parser(), compare_parser()]
    parsers.append(devices_parser())
    return [p for parser in parsers for p in _with_subparsers(parser)]


def _long_options(parsers: Iterable[argparse.ArgumentParser]) -> set[str]:
    return {s[2:] for p in parsers for a in p._actions for s in a.option_strings if s[:2] == "--"}
