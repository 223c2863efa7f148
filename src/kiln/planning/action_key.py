"""The keyed parameters of every action of a plan, made before anything runs.

An action's keyed parameters are what its ``params()`` returns, each value in
canonical form (``kiln.planning.canonical``), plus two entries of kiln's own:

- ``!code``: the digest of the action's code: for each class of its MRO that is
  the user's, the digest of what the class defines (``kiln.planning.code_key``); kiln's own
  classes count as kiln's version and the digest of kiln's code
  (``kiln.planning.code_key.kiln_code_digest``: a change to kiln reruns its actions); another
  installed package's as its name and version.
- ``!thunk``: for an action that runs its ``_remotable_thunk`` (a PROCESS action,
  or one that keeps the default ``_invoke``) when that method is the user's, the
  digest of the callable it returns: the function's code, its closure values or
  a partial's arguments, and the globals it names.
- ``!env``: for an action whose work runs in a program kiln starts (a PROCESS
  action, a command), the environment that program is given: the base set's
  version and the declared variables (``kiln.base.action_env``).
- ``!locale``: for an action that runs in kiln's own process (not PROCESS) and
  whose class is not all kiln's own, the time zone and locale kiln's process has
  when the build is planned (``kiln.base.action_env.local_conventions``): its code
  sees them, and formats times and text by them (``keys_conventions``; being
  keyed, ``--check-reproducible`` never varies them for it).

An action holding a value that cannot be keyed (a third-party library's object,
an open file) has no key: it runs on every build, as iree.build runs every
action, and is never taken from or put into a cache; ``unkeyed`` says why, and
the build says so once per action type. With ``strict`` such a value is a
``BuildDefinitionError`` naming the action, the attribute, the value's type and
the fix, raised when the build is planned (``--strict-keys``).

The rule that keeps this safe is in one place: an action whose keyed parameters
are None (``always_run``, or not keyable) is never up to date and never cached
(``kiln.engine.incremental``, ``kiln.cache.cacheable``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from kiln._version import __version__
from kiln.base.action_env import ActionEnvironment, local_conventions
from kiln.base.errors import BadNeed, BuildDefinitionError, Unkeyable
from kiln.base.gc_pause import gc_paused
from kiln.devices.identity import DeviceSet, local_set
from kiln.graph import KEYING_ONLY, ActionConcurrency, BuildAction, SpawnsCommand
from kiln.planning.canonical import canonical, file_ref_for, qualname
from kiln.planning.code_key import CodeDigests, kiln_code_digest, package_version

_ESCAPED = ("!", "=", "\\")
_SELF_REFERENCE = "value that contains itself (or is nested too deeply)"
CODE_PARAM = "!code"
THUNK_PARAM = "!thunk"
ENV_PARAM = "!env"
LOCALE_PARAM = "!locale"
DEVICE_PARAM = "!device"  # an action that ``needs`` a device: which one (``kiln.devices.identity``)
# Class attributes of BuildAction that are in the key otherwise (VERSION) or that
# do not change what an action produces.
_NOT_CODE = frozenset(
    {"VERSION", "key_exclude", "always_run", "timeout", "pool", "exclusive", "reproducible"}
)
_TYPES_KEYED = (
    "str, numbers, None, lists, tuples, dicts, sets, dataclasses, named tuples, enums, "
    "paths, bytes, numpy arrays, functions and classes, and the action's input and "
    "output files"
)


class KeyMaker:
    """Keys the actions of one build; class digests are computed once per class.

    Invariant: after ``all``, ``params_of`` holds the keyed parameters of every
    action given (None: it always runs), ``unkeyed`` why each action that holds a
    value kiln cannot key has none (never filled with ``strict``: it raises), and
    ``deferred`` the actions whose thunk could not be made while planning (it
    raised: it may need its inputs); ``thunk_digest`` completes their keys once
    their inputs exist.
    """

    def __init__(
        self,
        environment: ActionEnvironment | None = None,
        strict: bool = False,
        devices: DeviceSet | None = None,
    ) -> None:
        self.code = CodeDigests()
        self.devices = devices if devices is not None else local_set()
        self.env_key = (environment or ActionEnvironment()).key()
        self.locale_key = local_conventions()
        self.strict = strict
        self.params_of: dict[BuildAction, dict[str, Any] | None] = {}
        self.unkeyed: dict[BuildAction, str] = {}
        self.deferred: set[BuildAction] = set()
        # class -> (its code digest, whether its _remotable_thunk is the user's,
        # whether every class of its MRO is kiln's own)
        self._classes: dict[type, tuple[str, bool, bool]] = {}
        self._type_digests: dict[type, str] = {}  # code_ref's of classes
        self._code_ref = self.code_ref  # one bound method, not one per action

    def code_ref(self, value: Any) -> str:
        """The digest of a function, method, partial or class held in a parameter
        (a class's once per build: every record, enum or subclass instance names it)."""
        if isinstance(value, type):
            digest = self._type_digests.get(value)
            if digest is None:
                text = self.code.of_value(value, strict=True)
                digest = self._type_digests[value] = hashlib.sha256(text.encode()).hexdigest()
            return digest
        return hashlib.sha256(self.code.of_value(value, strict=True).encode()).hexdigest()

    def all(self, actions: Iterable[BuildAction]) -> dict[BuildAction, dict[str, Any] | None]:
        """Key ``actions`` (into ``params_of``); an action kiln cannot key has None
        (and a reason in ``unkeyed``), or raises when ``strict``."""
        with gc_paused():  # many small objects, none of them garbage
            self.params_of.update((a, self.params(a)) for a in actions)
        return self.params_of

    def params(self, action: BuildAction) -> dict[str, Any] | None:
        """``action``'s keyed parameters, or None when it always runs (marked so, or
        holding a value kiln cannot key: then ``unkeyed`` says why)."""
        try:
            return self._params(action)
        except _CannotKey as e:
            if self.strict:
                raise BuildDefinitionError(str(e)) from None
            self.unkeyed[action] = e.reason
            return None

    def _params(self, action: BuildAction) -> dict[str, Any] | None:
        raw = action.params()
        if raw is None:
            return None
        if type(raw) is not dict:
            raise BuildDefinitionError(
                f"{_describe(action)}: params() returned a {qualname(type(raw))}; "
                "return a dict of parameter names to values, or None to always run"
            )
        file_ref = file_ref_for(action)
        out: dict[str, Any] = {}
        code_ref = self._code_ref
        for name, value in raw.items():
            key = name
            if type(name) is not str or name[:1] in _ESCAPED:
                key = _param_name(name)
            try:
                out[key] = canonical(value, file_ref, code_ref)
            except Unkeyable as e:
                raise _unkeyable(action, name, e) from None
            except RecursionError:
                hint = (
                    f"it holds a {_SELF_REFERENCE}, which kiln cannot put in the action's "
                    "key; override params(), or leave it out of the key with key_exclude"
                )
                raise _unkeyable(action, name, Unkeyable("", hint=hint)) from None
        kind = type(action)
        info = self._class_info(kind)
        out[CODE_PARAM] = info[0]
        if action.needs is not None:
            out[DEVICE_PARAM] = self.device_part(action)
        in_process = action.concurrency is not ActionConcurrency.PROCESS
        if not in_process or isinstance(action, SpawnsCommand):
            out[ENV_PARAM] = self.env_key
        if self.keys_conventions(action):
            out[LOCALE_PARAM] = self.locale_key
        if info[1] and (
            action.concurrency is ActionConcurrency.PROCESS
            or kind._invoke is BuildAction._invoke  # the default _invoke calls the thunk
        ):
            try:
                out[THUNK_PARAM] = self.thunk_digest(action)
            except _ThunkNotMade:
                self.deferred.add(action)  # keyed when its inputs exist
        return out

    def _class_info(self, kind: type[BuildAction]) -> tuple[str, bool, bool]:
        info = self._classes.get(kind)
        if info is None:
            own = is_kiln_class(kind)
            info = self._classes[kind] = (self.class_digest(kind), self._user_thunk(kind), own)
        return info

    def keys_conventions(self, action: BuildAction) -> bool:
        """Whether ``action``'s key holds kiln's time zone and locale (``!locale``):
        the user's code runs in kiln's process. The one rule: the key holds them,
        and ``--check-reproducible`` leaves them as they are for such an action
        (what is keyed may change the output), or it does not, and the check may
        vary them (``kiln.engine.reproducible``)."""
        in_process = action.concurrency is not ActionConcurrency.PROCESS
        return in_process and not self._class_info(type(action))[2]

    def device_part(self, action: BuildAction) -> dict[str, Any]:
        """The device ``action`` runs on, as its key holds it: the one place a
        check's or benchmark's key gets the device's identity."""
        assert action.needs is not None
        try:
            return self.devices.key_part(action.needs)
        except BadNeed as e:
            raise BuildDefinitionError(f"{_describe(action)}: needs: {e}") from None

    def use_devices(self, devices: DeviceSet) -> None:
        """Key every keyed action's device part again, for ``devices`` (the build's,
        once it has chosen them): no other part of a key depends on them."""
        self.devices = devices
        for action, params in self.params_of.items():
            if params is not None and action.needs is not None:
                params[DEVICE_PARAM] = self.device_part(action)

    def class_digest(self, kind: type) -> str:
        """The digest of the code of ``kind`` and its bases (see the module docstring)."""
        skip = _NOT_CODE.union(getattr(kind, "key_exclude", ()))
        parts = []
        for klass in kind.__mro__:
            if klass is object:
                continue
            if _in_kiln(klass):
                parts.append(f"{qualname(klass)} kiln {__version__} {kiln_code_digest()}")
            elif self.code.is_user(klass):
                parts.append(self.code.of_class(klass, skip))
            else:
                parts.append(f"{qualname(klass)} {package_version(klass.__module__)}")
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def _user_thunk(self, kind: type[BuildAction]) -> bool:
        """Whether ``kind._remotable_thunk`` is the user's (kiln's own is covered by
        kiln's code digest and the action's parameters)."""
        return self.code.is_user(kind._remotable_thunk)

    def thunk_digest(self, action: BuildAction) -> str:
        """The digest of the callable ``action._remotable_thunk()`` returns, made
        without creating anything on disk. Raises ``_ThunkNotMade`` when making it
        raised, ``_CannotKey`` when it holds a value kiln cannot key."""
        token = KEYING_ONLY.set(True)
        try:
            thunk = action._remotable_thunk()
        except Exception as e:  # noqa: BLE001 - the user's code: said in the reason
            raise _ThunkNotMade(f"{type(e).__name__}: {e}") from e
        finally:
            KEYING_ONLY.reset(token)
        try:
            return hashlib.sha256(self.code.of_value(thunk, strict=True).encode()).hexdigest()
        except RecursionError:
            held = f"the callable its _remotable_thunk() returns holds a {_SELF_REFERENCE}"
            fix = "give the thunk plain data"
            raise _CannotKey(f"{_describe(action)}: {held}; {fix}", held) from None
        except Unkeyable as e:
            held = (
                f"the callable its _remotable_thunk() returns holds {e.where}a value of "
                f"type {e.type_name}, which kiln cannot put in the action's key"
            )
            raise _CannotKey(
                f"{_describe(action)}: {held}; give the thunk only {_TYPES_KEYED}", held
            ) from None


def _in_kiln(klass: type) -> bool:
    return klass.__module__.split(".", 1)[0] == "kiln"


def is_kiln_class(kind: type) -> bool:
    """Whether ``kind`` and every class it derives from are kiln's own (an action of
    kiln's, not a user's subclass of one)."""
    return all(k is object or _in_kiln(k) for k in kind.__mro__)


class _ThunkNotMade(Exception):
    """Making an action's thunk raised (the message says what)."""


class _CannotKey(Exception):
    """An action holds a value kiln cannot key: the whole error (with the fix) and
    the short reason that ``unkeyed`` and ``kiln explain`` give."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def complete_params(
    keys: KeyMaker, action: BuildAction, params: dict[str, Any]
) -> tuple[dict[str, Any] | None, str | None]:
    """``params`` with the thunk digest of a deferred action, now that its inputs
    exist; or, when the thunk still cannot be made or keyed, None (the action then
    has no key: it runs, and is never cached) and why."""
    try:
        return {**params, THUNK_PARAM: keys.thunk_digest(action)}, None
    except _ThunkNotMade as e:
        return None, f"its _remotable_thunk() could not be made to key it ({e})"
    except _CannotKey as e:
        return None, e.reason


def _param_name(name: Any) -> str:
    """A parameter's name as a key of the keyed parameters (see ``kiln.planning.canonical``)."""
    if type(name) is not str:
        raise BuildDefinitionError(
            f"params() returned the parameter name {name!r}; parameter names must be strings"
        )
    return "\\" + name if name[:1] in _ESCAPED else name


def _describe(action: BuildAction) -> str:
    site = getattr(action, "def_site", None)
    where = f", defined at {site}" if site is not None else ""
    return f"action {type(action).__qualname__} ('{action.desc}'{where})"


def _unkeyable(action: BuildAction, name: str, e: Unkeyable) -> _CannotKey:
    """The error for a parameter with no canonical form, naming the fix."""
    default = type(action).params is BuildAction.params
    what = f"attribute '{name}'" if default else f"params()[{name!r}]"
    inner = f" (at {name}{e.where})" if e.where else ""
    if e.hint:
        held = f"{what}{inner}: {e.hint}"
        return _CannotKey(f"{_describe(action)}: {held}", held)
    if default:
        fix = (
            f"override params() to return what the outputs depend on, or leave the "
            f"attribute out of the key: key_exclude = ({name!r},) on the class, or a name "
            f"with a leading underscore (_{name})"
        )
    else:
        fix = f"return only {_TYPES_KEYED} from params()"
    held = (
        f"{what}{inner} holds a value of type {e.type_name}, which kiln cannot put in "
        "the action's key"
    )
    return _CannotKey(f"{_describe(action)}: {held}; {fix}", held)
