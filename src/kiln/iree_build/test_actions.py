"""``iree.build.test_actions``: running any picklable function as an action."""

from kiln.test_actions import ExecuteOutOfProcessThunkAction

__all__ = ["ExecuteOutOfProcessThunkAction"]
