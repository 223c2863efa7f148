"""Actions for testing build tools and build modules (iree.build's ``test_actions``).

``ExecuteOutOfProcessThunkAction`` runs any picklable function in a worker
process, which is how tests check that process actions really leave kiln's
process, that a failure in a worker is reported, and how the console draws a
running action.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from kiln.graph import ActionConcurrency, BuildAction

__all__ = ["ExecuteOutOfProcessThunkAction"]


class ExecuteOutOfProcessThunkAction(BuildAction):
    """Calls ``thunk(*args)`` in a worker process (or as ``concurrency`` says).

    ``thunk`` and ``args`` must be picklable: functions of an importable module,
    of a build module kiln loaded by path, or of the script run as ``__main__``
    all are. kiln cannot see what an arbitrary function reads or writes, so this
    action has no key: it runs on every build that needs it.
    """

    def __init__(
        self,
        thunk: Callable[..., Any],
        args: Sequence[Any] = (),
        concurrency: ActionConcurrency = ActionConcurrency.PROCESS,
        **kwargs: Any,
    ):
        super().__init__(concurrency=concurrency, **kwargs)
        self._thunk = thunk
        self._args = tuple(args)

    def params(self) -> dict[str, Any] | None:
        return None

    def _invoke(self) -> None:
        self._thunk(*self._args)

    def _remotable_thunk(self) -> Callable[[], None]:
        return functools.partial(self._thunk, *self._args)
