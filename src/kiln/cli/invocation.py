"""What one command of the command line works on (its own module, so that the
commands and the session that makes it import it without importing ``main``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import IO, Any


@dataclass
class Invocation:
    """Everything a command needs: parsed options, the analysed graph, streams."""

    command: str
    ns: argparse.Namespace
    executor: Any
    stdout: IO[str]
    stderr: IO[str]
