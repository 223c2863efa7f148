"""A plan checked before it runs, and the keys of its actions: every action says
it can run, kiln's own actions write only into the output directory, and an
action kiln cannot key stops the build only with ``--strict-keys``."""

from __future__ import annotations

from collections.abc import Callable

from kiln.base.action_env import ActionEnvironment
from kiln.base.errors import BuildDefinitionError
from kiln.devices.identity import DeviceSet
from kiln.graph import BuildAction, BuildFile
from kiln.planning.action_key import KeyMaker
from kiln.planning.plan import Plan


class PlanChecker:
    """Checks the plans of one executor and keys their actions.

    Invariants: the keys of a plan are made once per environment and strictness
    (``keys``; the device parts follow the devices asked); each note is said once
    per executor: an action type that runs unkeyed, actions writing outside the
    output directory."""

    def __init__(self) -> None:
        self._keyed: tuple[Plan, KeyMaker, tuple[ActionEnvironment, bool]] | None = None
        self._noted_unkeyed: set[str] = set()  # action types said to run unkeyed
        self._noted_outside = False  # said that actions write outside the output dir

    def check(self, plan: Plan, say: Callable[[str], None]) -> None:
        """Raise ``BuildDefinitionError`` unless every action of ``plan`` can run."""
        outside: dict[BuildAction, list[BuildFile]] = {}
        for action in plan.actions:
            action.check_timeout()
            action.check_runnable()
            for f in plan.outputs[action]:
                if f.source is not None:
                    outside.setdefault(action, []).append(f)
        if outside:
            self._check_outside(outside, say)

    def _check_outside(
        self, outside: dict[BuildAction, list[BuildFile]], say: Callable[[str], None]
    ) -> None:
        """Refuse a built-in action writing outside the output directory; say once
        that the others' files there are theirs, not kiln's."""
        for action, files in outside.items():
            if type(action).__module__.startswith("kiln.actions."):
                raise BuildDefinitionError(
                    f"'{action.desc}' (at {action.def_site}) would write {files[0].path}, "
                    "outside the output directory; kiln's own actions write only into it: "
                    "give the output a relative name"
                )
        if self._noted_outside:
            return
        self._noted_outside = True
        action, files = next(iter(outside.items()))
        more = sum(map(len, outside.values())) - 1
        say(
            f"kiln: '{action.desc}' writes {files[0].path}"
            + (f" (and {more} more file(s) of actions like it)" if more else "")
            + ", outside the output directory: kiln runs it, but the file is not kiln's: "
            "kiln never deletes it nor takes it from a cache, and reruns the action when "
            "the file is missing or changed"
        )

    def keys(
        self,
        plan: Plan,
        environment: ActionEnvironment,
        strict: bool,
        devices: DeviceSet,
        say: Callable[[str], None],
    ) -> KeyMaker:
        """The keyed parameters of every action of ``plan`` (``strict``: as
        ``--strict-keys``), made once per plan and environment; the device parts for
        ``devices``."""
        known = self._keyed
        asked = (environment, strict)
        if known is not None and known[0] is plan and known[2] == asked:
            if known[1].devices is not devices:
                known[1].use_devices(devices)
            return known[1]
        keys = KeyMaker(environment, strict=strict, devices=devices)
        keys.all(plan.actions)
        self._keyed = (plan, keys, asked)
        self._note_unkeyed(keys, say)
        return keys

    def _note_unkeyed(self, keys: KeyMaker, say: Callable[[str], None]) -> None:
        """Say once per action type that its actions run on every build, and why."""
        for action, why in keys.unkeyed.items():
            kind = action.action_type
            if kind in self._noted_unkeyed:
                continue
            self._noted_unkeyed.add(kind)
            say(
                f"kiln: {type(action).__qualname__} actions ('{action.desc}', defined at "
                f"{action.def_site}) run on every build and are never cached: {why} "
                "(--strict-keys makes this an error)"
            )
