"""``iree.build.compile_actions``: ``compile`` and its action."""

from kiln.actions.iree import CompileAction as CompileAction
from kiln.actions.iree import CompileSourceMeta as CompileSourceMeta
from kiln.actions.iree import compile  # noqa: A004 - iree.build's public name

__all__ = ["compile"]
