"""Writing outputs: re-exported from the core module ``kiln.outputs``."""

from __future__ import annotations

from kiln.outputs import (
    TMP_PREFIX,
    TemporarySweeper,
    atomic_output,
    atomic_write,
    remove_partial,
)

__all__ = ["TMP_PREFIX", "TemporarySweeper", "atomic_output", "atomic_write", "remove_partial"]
