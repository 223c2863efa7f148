"""``iree.build.test_actions``: running any picklable function as an action."""

from kiln.actions.thunks import ExecuteOutOfProcessThunkAction

__all__ = ["ExecuteOutOfProcessThunkAction"]
