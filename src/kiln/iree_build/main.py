"""``iree.build.main``: running kiln's command line on a build module."""

from kiln.cli.loader import load_build_module
from kiln.cli.main import iree_build_main

__all__ = ["iree_build_main", "load_build_module"]
