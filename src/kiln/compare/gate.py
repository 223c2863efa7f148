"""``kiln compare --fail-if``: the conditions a CI gate fails on, and the rows that
meet them.

Conditions (comma-separated, or the option repeated):

- ``slower`` / ``slower>P%``: a module's latency is classed slower (its interval lies
  above 1), and its ratio is more than P% above 1;
- ``size`` / ``size>P%``: a module grew (by more than P%);
- ``accuracy``: a module's verification passed in A and fails in B, or B used more
  than a tenth more of its tolerance than A (``kiln.compare.diff.ACCURACY_STEP``; where
  its checks recorded no share of a tolerance, any growth of its largest error);
- ``new-failures``: an artifact built in A failed (or was not run) in B, or a
  module's verification passed or did not run in A and fails in B.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kiln.base.errors import UsageError
from kiln.compare.diff import Row

# ASCII digits, a percentage of at most nine digits before the point: no threshold so
# large that it is infinite, which would turn the gate off without a word.
_CONDITION = re.compile(r"(slower|size)(?:>([0-9]{1,9}(?:\.[0-9]{1,9})?)%)?|accuracy|new-failures")


@dataclass(frozen=True)
class Condition:
    name: str  # slower, size, accuracy, new-failures
    threshold: float = 0.0  # a fraction: 0.05 for 5%
    text: str = ""


def parse_conditions(values: list[str]) -> list[Condition]:
    """The conditions of every ``--fail-if`` value; UsageError naming a bad one."""
    found = []
    for value in values:
        for part in (p.strip() for p in value.split(",")):
            match = _CONDITION.fullmatch(part)
            if match is None:
                raise UsageError(
                    f"--fail-if {part!r}: expected slower, slower>P%, size, size>P%, accuracy "
                    "or new-failures (comma-separated and quoted, e.g. 'slower>5%,accuracy')"
                )
            name = match.group(1) or part
            percent = float(match.group(2)) / 100 if match.group(2) else 0.0
            found.append(Condition(name, percent, part))
    return found


def failing(conditions: list[Condition], rows: list[Row]) -> list[tuple[Condition, Row]]:
    """Each (condition, row) that meets it, in the order of the rows."""
    return [(c, row) for row in rows for c in conditions if _meets(c, row)]


def _meets(c: Condition, row: Row) -> bool:
    m = row.module
    if c.name == "slower":
        v = m.latency if m is not None else None
        return v is not None and v.verdict == "slower" and v.ratio - 1 > c.threshold
    if c.name == "size":
        return (
            m is not None
            and bool(m.size_a)
            and m.size_b is not None
            and m.size_b > (m.size_a or 0) * (1 + c.threshold)
        )
    if c.name == "accuracy":
        return "accuracy" in row.flags
    return "new-failure" in row.flags
