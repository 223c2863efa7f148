"""Deciding whether an action must run, and saying why.

An action's key is the SHA-256 of its type, version, keyed parameters (in
canonical form, with the digest of its code: ``kiln.planning.action_key``) and the digests
of its input files. It is skipped when its last record has the same key and its
outputs still have the recorded digests. An action that has no record but a
remembered failure with its key now (``kiln.engine.failures``) has that
failure in its ``Decision``: the scheduler does not run it again (unless asked
to); when its key changed since it failed, the reason says what changed. An
action without keyed parameters
(``always_run``, or holding a value kiln cannot key) is never skipped: its
``Decision`` has ``params`` None and a reason, which also keeps it out of every
cache (``kiln.cache.cacheable``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kiln.base.action_env import describe_change
from kiln.base.errors import NotRegularFile
from kiln.graph import BuildAction, BuildFile
from kiln.output_dir.tree_digest import tree_digest
from kiln.output_dir.writing import file_kind
from kiln.planning.action_key import (
    CODE_PARAM,
    ENV_PARAM,
    LOCALE_PARAM,
    THUNK_PARAM,
    KeyMaker,
    complete_params,
)
from kiln.planning.plan import Plan
from kiln.planning.run_deps import RunDeps, is_run_dep
from kiln.state import ActionRecord, DigestStore, FailureRecord

_MAX_CHANGES_SHOWN = 3
# A dry run's stand-in digest for the outputs of an action that would run.
REBUILT_DIGEST = "<rebuilt by "


@dataclass
class Decision:
    """Whether ``action`` runs; ``reason`` is None exactly when it is up to date.
    ``failed_before`` is set only when the action is not up to date and failed
    with this same key in an earlier build (its remembered failure)."""

    action_id: str
    key: str
    params: dict[str, Any] | None
    inputs: dict[str, str]
    reason: str | None
    failed_before: FailureRecord | None = None
    run_deps: dict[str, str] = field(default_factory=dict)

    @property
    def up_to_date(self) -> bool:
        return self.reason is None


def action_id(action: BuildAction, outputs: list[BuildFile]) -> str:
    if len(outputs) == 1:
        return outputs[0].key
    if outputs:
        return "|".join(f.key for f in outputs)
    return f"{action.action_type}:{action.desc}"


_UNKNOWN = "<not looked at yet>"  # compared by identity: no digest is this object
# The key's JSON text: one encoder for every action (json.dumps with options makes
# one per call). The text is the same as ``json.dumps(..., sort_keys=True)``'s.
_KEY_TEXT = json.JSONEncoder(sort_keys=True).encode


def _holds_output_dir(directory: BuildFile) -> bool:
    """Whether the directory input ``directory`` holds the output directory: what an
    action reads through it then includes kiln's state, logs and outputs."""
    inside = os.path.realpath(directory.fs_str).rstrip(os.sep) + os.sep
    out = os.path.realpath(directory.executor.layout.output_dir) + os.sep
    return out.startswith(inside)


class UpToDateChecker:
    """Decides actions in plan order. ``digests`` holds the digest of every file
    known this build (source files lazily, outputs as their producers finish);
    ``keys`` holds every action's keyed parameters, made when the build was planned."""

    def __init__(self, plan: Plan, store: DigestStore, keys: KeyMaker | None = None):
        self.plan = plan
        self.store = store
        if keys is None:  # not keyed when the build was planned: key it now
            keys = KeyMaker()
            keys.all(plan.actions)
        self.keys = keys
        self.run_deps = RunDeps(store.digest)
        self.digests: dict[BuildFile, str | None] = {}
        # Inputs whose digest does not cover what an action may read through them.
        self.unkeyable_inputs: dict[BuildFile, str] = {}
        self._records: Mapping[str, ActionRecord] | None = None  # the store's, read once
        self._failures: Mapping[str, FailureRecord] | None = None  # likewise, when needed

    def file_digest(self, f: BuildFile) -> str | None:
        if f in self.digests:
            return self.digests[f]
        try:
            digest = self.store.digest(f.fs_str)
        except NotRegularFile:
            if f.source is None or not os.path.isdir(f.fs_str):
                raise
            digest, escape = tree_digest(f.fs_str, self.store.digest)  # a directory input
            if _holds_output_dir(f):
                self.unkeyable_inputs[f] = (
                    f"its input {f.path} holds the output directory, whose files kiln "
                    "changes in every build (choose an --output-dir outside it to key it)"
                )
            elif escape is not None:
                self.unkeyable_inputs[f] = (
                    f"its input {f.path} holds a symbolic link out of it ({escape}), "
                    "which kiln does not follow"
                )
        self.digests[f] = digest
        return digest

    def decide(self, action: BuildAction) -> Decision:
        outputs = self.plan.outputs[action]
        aid = action_id(action, outputs)
        params = self.keys.params_of[action]
        digests = self.digests
        inputs = {}
        for f in self.plan.inputs[action]:
            digest = digests.get(f, _UNKNOWN)
            if digest is _UNKNOWN:
                digest = self.file_digest(f)
            inputs[f.key] = digest or "missing"
        unkeyed = self.keys.unkeyed.get(action) if params is None else None
        if params is not None and action in self.keys.deferred:
            params, unkeyed = complete_params(self.keys, action, params)
        if params is not None and self.unkeyable_inputs:
            unkeyed = next(
                (
                    self.unkeyable_inputs[f]
                    for f in self.plan.inputs[action]
                    if f in self.unkeyable_inputs
                ),
                None,
            )
            params = None if unkeyed else params
        # Without params the key names the action's run, never a result: the action is
        # never skipped and never cached (below, and ``kiln.cache.cacheable``).
        blob = _KEY_TEXT([action.action_type, action.VERSION, params, inputs])
        key = hashlib.sha256(blob.encode()).hexdigest()
        records = self._records
        if records is None:
            records = self._records = self.store.records()
        record = records.get(aid)
        if params is None:  # no key: it runs on every build (and is never cached)
            reason: str | None = (
                f"kiln cannot key it, so it runs on every build: {unkeyed}"
                if unkeyed
                else "marked always-run"
            )
        elif record is None:
            reason = "never built"
        elif record.key != key:
            reason = _why_key_changed(record, params, inputs)
        else:
            reason = self._outputs_changed(record, outputs)
            if reason is None and not record.looks_intact():
                reason = "its record in the build state is damaged"
        if reason is not None and record is not None and record.damaged:
            reason = "its record in the build state is damaged"
        if record is None and params is not None:  # a record of a success wins
            return self._after_failure(Decision(aid, key, params, inputs, reason))
        decision = Decision(aid, key, params, inputs, reason)
        if record is not None:
            decision.run_deps = record.run_deps()
            if reason is None and decision.run_deps:
                decision.reason = self.run_deps.stale(decision.run_deps)
        return decision

    def _after_failure(self, decision: Decision) -> Decision:
        """``decision`` for an action without a record: with its remembered failure
        when that has the same key (one not remembered: saying why it runs again),
        else saying what changed since it failed."""
        failures = self._failures
        if failures is None:
            failures = self._failures = self.store.failures()
        failure = failures.get(decision.action_id)
        if failure is None or decision.params is None:
            return decision
        if failure.key == decision.key and not failure.remembered:
            decision.reason = (
                "it failed with this same key in an earlier build, and that failure was not "
                f"remembered: {failure.why}"
            )
        elif failure.key == decision.key and (
            stale := self.run_deps.stale(failure.as_record().run_deps())
        ):
            decision.reason = f"it failed in an earlier build; since then {stale}"
        elif failure.key == decision.key:
            decision.reason = "it failed with this same key in an earlier build"
            decision.failed_before = failure
        else:
            changed = _why_key_changed(failure.as_record(), decision.params, decision.inputs)
            decision.reason = f"it failed in an earlier build; since then {changed}"
        return decision

    def _outputs_changed(self, record: ActionRecord, outputs: list[BuildFile]) -> str | None:
        # The stat cache's digest, no hashing: a file it does not know is looked at
        # by ``_output_change``.
        cached = self.store.cached_digest
        found = []
        for f in outputs:
            path = f.fs_str
            # Read only a regular file reached through real directories: anything else
            # there counts as modified, and is never followed or opened. (A file outside
            # the output directory, an action's own, is only read, never followed.)
            problem = None if f.source else f.layout.tree.dir_problem(path[: path.rindex("/")])
            if problem is not None:
                return f"output {f.path} was modified: {problem}"
            digest = cached(path, True)
            if digest is None or not record.has_output(f.key, digest):
                recorded = record.outputs  # a damaged record has none
                why = self._output_change(f, recorded)
                if why is not None:
                    return why
                digest = recorded[f.key]
            found.append((f, digest))
        self.digests.update(found)
        return None

    def _output_change(self, f: BuildFile, recorded: dict[str, str]) -> str | None:
        """Why output ``f`` no longer matches its record (the stat cache missed)."""
        try:
            digest = self.store.digest(f.fs_str, output=True)
        except NotRegularFile:
            kind = file_kind(os.lstat(f.fs_str).st_mode)
            return f"output {f.path} was modified: it is {kind}, not a regular file"
        if digest is None:
            return f"output {f.path} is missing"
        if recorded.get(f.key) != digest:
            return f"output {f.path} was modified"
        return None


def why_key_changed(
    params_a: dict[str, Any] | None,
    inputs_a: dict[str, str],
    params_b: dict[str, Any] | None,
    inputs_b: dict[str, str],
) -> str:
    """What differs between two keys' parts, in the words ``kiln explain`` uses (``kiln
    compare`` says so why an artifact changed between two builds)."""
    return _why_key_changed(ActionRecord("", params_a, inputs_a, {}), params_b or {}, inputs_b)


def _why_key_changed(record: ActionRecord, params: dict[str, Any], inputs: dict[str, str]) -> str:
    old = record.params or {}
    changes = []
    if old.get(CODE_PARAM) != params.get(CODE_PARAM):
        changes.append("the action's code changed")
    if old.get(THUNK_PARAM) != params.get(THUNK_PARAM):
        changes.append("the code or closure values of its _remotable_thunk changed")
    if old.get(ENV_PARAM) != params.get(ENV_PARAM):
        changes.append("the environment its programs are given changed (--action-env)")
    if old.get(LOCALE_PARAM) != params.get(LOCALE_PARAM):
        changes.append(describe_change(old.get(LOCALE_PARAM), params.get(LOCALE_PARAM)))
    mine = (CODE_PARAM, THUNK_PARAM, ENV_PARAM, LOCALE_PARAM)
    changes += _param_changes(
        "",
        {k: v for k, v in old.items() if k not in mine},
        {k: v for k, v in params.items() if k not in mine},
    )
    for name in sorted(set(record.inputs) | set(inputs)):
        if is_run_dep(name):
            continue  # checked when the key holds (``kiln.planning.run_deps``)
        if name not in record.inputs:
            changes.append(f"input {_file_name(name)} was added")
        elif name not in inputs:
            changes.append(f"input {_file_name(name)} was removed")
        elif inputs[name].startswith(REBUILT_DIGEST):
            changes.append(f"input {_file_name(name)} will be rebuilt")
        elif record.inputs[name] != inputs[name]:
            changes.append(f"input {_file_name(name)} changed")
    if not changes:
        return "the action's type or version changed"
    more = len(changes) - _MAX_CHANGES_SHOWN
    shown = "; ".join(changes[:_MAX_CHANGES_SHOWN])
    return shown + (f" (and {more} more)" if more > 0 else "")


def _param_changes(name: str, old: Any, new: Any) -> list[str]:
    """What differs between two parameter values, down to the changed leaves of
    dicts, records and equal-length lists, so that a long argv shows the flag that
    changed. Canonical forms (``kiln.planning.canonical``) are shown as Python spells them."""
    old, new = _unwrap(old), _unwrap(new)
    if isinstance(old, _Pairs) and isinstance(new, _Pairs) and old.kind == new.kind:
        found = [] if old.code == new.code else [f"the code of parameter {name}'s class changed"]
        if old.keys() == new.keys() and list(old) != list(new):
            return [*found, f"the order of parameter {name}'s {old.entries} changed"]
        return found + _param_changes(name, dict(old), dict(new))
    if isinstance(old, dict) and isinstance(new, dict) and _record_like(old, new):
        return [
            change
            for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)
            for change in _param_changes(_join(name, key), old.get(key), new.get(key))
        ]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            change
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            if a != b
            for change in _param_changes(f"{name}[{i}]", a, b)
        ]
    if isinstance(old, list) and isinstance(new, list):
        edits = _list_edits(name, old, new)
        if edits:
            return edits
    if _only_code_differs(old, new):
        return [f"the code of parameter {name}'s class changed"]
    before, after = _around_difference(_text(old), _text(new))
    return [f"parameter {name} changed from {before} to {after}"]


_EDITS_SHOWN = 3  # a list that gained or lost more is shown as a whole change


def _list_edits(name: str, old: list[Any], new: list[Any]) -> list[str]:
    """A list of plain values (an argv, flags) of another length, as the values it
    gained and lost (``parameter flags gained '--iree-opt-level=O3'``); nothing
    when it holds other values or changed more than that."""
    plain = (str, int, float, bool, type(None))
    if not all(isinstance(v, plain) for v in (*old, *new)):
        return []
    had, has = Counter(map(_text, old)), Counter(map(_text, new))
    gained, lost = list((has - had).elements()), list((had - has).elements())
    if not gained and not lost:
        return []  # the same values in another order: the whole change says it
    if len(gained) + len(lost) > _EDITS_SHOWN:
        return []
    return [f"parameter {name} gained {v}" for v in gained] + [
        f"parameter {name} lost {v}" for v in lost
    ]


class _Pairs(dict[str, Any]):
    """A canonical ``!dict``'s entries, or a record's fields, by the JSON text of
    their keys, in order; ``kind`` is ``!dict`` or the record's class, ``code`` the
    digest of the record's class."""

    kind: str = "!dict"
    code: Any = None
    entries = "entries"


def _unwrap(value: Any) -> Any:
    """A canonical tuple as its list; a canonical dict or record as ``_Pairs``."""
    if not isinstance(value, dict):
        return value
    if len(value) == 1 and "!tuple" in value and isinstance(value["!tuple"], list):
        return value["!tuple"]
    if len(value) == 1 and "!dict" in value:
        pairs = value["!dict"]
    elif "!record" in value and set(value) <= {"!record", "code", "fields"}:
        pairs = value.get("fields")
    else:
        return value
    if isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 for p in pairs):
        found = _Pairs((_entry_name(k), v) for k, v in pairs)
        if "!record" in value:
            found.kind, found.code, found.entries = value["!record"], value.get("code"), "fields"
        return found
    return value


def _record_like(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether to compare two dicts field by field: plain ones (an unwrapped
    ``!dict`` or record), not other tagged values."""
    return not any(k[:1] == "!" for k in old) and not any(k[:1] == "!" for k in new)


def _only_code_differs(old: Any, new: Any) -> bool:
    """Whether two tagged values (an enum, a subclass's instance) differ only in
    the digest of their class's code."""
    if not (isinstance(old, dict) and isinstance(new, dict) and "code" in old and "code" in new):
        return False
    return old["code"] != new["code"] and {**old, "code": None} == {**new, "code": None}


def _entry_name(key: Any) -> str:
    """A canonical dict key as ``_join`` reads it: a string (escaped when it starts
    like a tag or an escape), or ``=`` and the JSON of any other key."""
    if not isinstance(key, str):
        return "=" + json.dumps(key, sort_keys=True)
    return "\\" + key if key[:1] in ("!", "=", "\\") else key


def _join(name: str, key: str) -> str:
    if key[:1] == "=":  # a key that is not a string, as JSON
        return f"{name}[{key[1:]}]"
    key = key[1:] if key[:1] == "\\" else key
    return f"{name}.{key}" if name else key


def _file_name(key: str) -> str:
    """How a file reads in a reason: its graph path, or a source file's path
    (relative to the build module's directory)."""
    if not key.startswith("src:"):
        return key.split("/", 1)[-1]
    return key[4:]


def _text(value: Any) -> str:
    """A parameter value as a reason spells it: tagged values as Python would, the
    rest as JSON."""
    text = _spelled(value) if isinstance(value, dict) else None
    return json.dumps(value, sort_keys=True) if text is None else text


_SHOWN_CHARS = 60  # of each side of a changed value


def _around_difference(old: str, new: str) -> tuple[str, str]:
    """``old`` and ``new`` cut to a window of ``_SHOWN_CHARS`` around their first
    difference, each side the same window, so that the changed part shows even in
    two long values that share a long beginning (an argv that differs in its last
    flag); ``...`` marks what was left out."""
    if len(old) <= _SHOWN_CHARS and len(new) <= _SHOWN_CHARS:
        return old, new
    first = next(
        (i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
        min(len(old), len(new)),
    )
    start = max(0, min(first - _SHOWN_CHARS // 4, max(len(old), len(new)) - _SHOWN_CHARS))
    return _window(old, start), _window(new, start)


def _window(text: str, start: int) -> str:
    end = start + _SHOWN_CHARS
    return ("..." if start > 0 else "") + text[start:end] + ("..." if end < len(text) else "")


def _spelled(value: dict[str, Any]) -> str | None:
    """A tagged canonical value as Python spells it, e.g. ``Path('/opt')``."""
    if "!path" in value:
        return f"Path({value['!path']!r})"
    if "!enum" in value:
        return str(value["!enum"]).rsplit(".", 2)[-2] + "." + str(value["!enum"]).rsplit(".", 1)[-1]
    if "!callable" in value:
        return f"code {str(value['!callable'])[:12]}"
    if "!bytes" in value:
        return f"bytes {value['!bytes']}"
    if "!nan" in value:
        return f"NaN 0x{value['!nan']}"
    if "!ndarray" in value:
        return f"array {value['!ndarray']} {value['shape']} {value.get('data', '(objects)')}"
    return None
