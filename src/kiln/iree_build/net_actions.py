"""``iree.build.net_actions``: ``fetch_http`` and its action."""

from kiln.actions.net import FetchHttpAction as FetchHttpAction
from kiln.actions.net import fetch_http

__all__ = ["fetch_http"]
