"""``StateStore``: the state of one output directory, by concern: the database
(``kiln.state.database``), the digest cache (``kiln.state.file_digests``), the
action records (``kiln.state.records``), the remembered failures, the durations,
the outputs kiln let actions write, the keys found not reproduced and per-file
metadata."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln.output_dir.layout import output_rel_path
from kiln.state import file_digests
from kiln.state.database import StateDatabase
from kiln.state.file_digests import FileDigests, StatKey
from kiln.state.integrity import metadata_dict
from kiln.state.records import ActionRecord, FailureRecord
from kiln.state.schema import FAILURES_COLUMNS, loaded_path, stored_path

# The columns of ``failures`` by name: a row is written and read the same whatever
# else a table of another kiln holds.
_FAILURE_COLUMNS = ", ".join(FAILURES_COLUMNS)
_INSERT_FAILURE = (
    f"INSERT OR REPLACE INTO failures({_FAILURE_COLUMNS}) "
    f"VALUES ({', '.join('?' * len(FAILURES_COLUMNS))})"
)


class StateStore:
    """The state database of one output directory.

    Invariant: rows are read once at open; the records of finished actions and
    the failures remembered are written in groups (``commit_round``: one
    transaction per scheduler round), so a kill keeps a round's records all or
    none; an action that starts loses its record and its failure in the round
    that starts it. Safe to call from several threads.
    """

    database_class: type[StateDatabase] = StateDatabase

    def __init__(self, output_dir: Path, warn: Callable[[str], None]):
        self.output_dir = output_dir
        self.path = output_dir / ".kiln" / "state.db"
        self._warn = warn
        self.database = self.database_class(output_dir, self.path, warn)
        self._lock = self.database.lock
        self._records: dict[str, ActionRecord] | None = None
        self._durations: dict[str, float] | None = None
        self._failures: dict[str, FailureRecord] | None = None
        self._new_durations: dict[str, float] = {}
        try:
            # Tables are WITHOUT ROWID (no separate index b-trees): reading them whole
            # touches every page, so damage shows now rather than at a later write.
            self.files = FileDigests(self.database.read(file_digests.TYPED_ROWS))
            self.database.read("SELECT count(data) FROM file_metadata")
        except sqlite3.Error as e:
            self.database.recover(e)
            self.files = FileDigests([])
        # The digest cache, as every caller uses it.
        self.digest = self.files.digest
        self.cached_digest = self.files.cached_digest

    def close(self) -> None:
        with self._lock:
            self.flush()
            self.database.close()

    def remember_digest(self, path: str, skey: StatKey, digest: str) -> None:
        self.files.remember(path, skey, digest)

    def flush(self) -> None:
        """Write pending digest-cache entries and durations."""
        self.commit_round([], [], [])

    # -- durations -------------------------------------------------------------

    def durations(self) -> dict[str, float]:
        """Seconds each action took when it last ran, by action id (read once)."""
        with self._lock:
            if self._durations is None:
                try:
                    rows = self.database.read("SELECT id, seconds FROM durations")
                except sqlite3.DatabaseError as e:
                    self._warn(f"warning: cannot read past durations from {self.path}: {e}")
                    rows = []
                self._durations = {aid: float(sec) for aid, sec in rows}
            return self._durations

    def remember_duration(self, action_id: str, seconds: float) -> None:
        """Note how long an action took; written with the next round or flush."""
        with self._lock:
            self.durations()[action_id] = seconds
            self._new_durations[action_id] = seconds

    # -- action records ------------------------------------------------------

    def records(self) -> dict[str, ActionRecord]:
        with self._lock:
            if self._records is None:
                try:
                    rows = self.database.read(
                        "SELECT id, key, params, inputs, outputs FROM actions"
                    )
                    self._records = {
                        aid: ActionRecord(key, params, inputs, outputs, raw=True)
                        for aid, key, params, inputs, outputs in rows
                        if type(aid) is str  # another type names no action
                    }
                except sqlite3.Error as e:
                    self.database.recover(e)
                    self.files.forget_all()
                    self._records = {}
            return self._records

    def failures(self) -> dict[str, FailureRecord]:
        """The remembered failures, by action id (read once). A row of the wrong
        types is left out: its action runs again."""
        with self._lock:
            if self._failures is None:
                try:
                    rows = self.database.read(f"SELECT {_FAILURE_COLUMNS} FROM failures")
                except sqlite3.DatabaseError as e:
                    self._warn(
                        f"warning: cannot read the failures remembered in {self.path}: {e}; "
                        "the actions that failed run again"
                    )
                    rows = []
                found = {}
                for aid, *fields in rows:
                    failure = FailureRecord.from_row(tuple(fields))
                    if type(aid) is str and failure is not None:
                        found[aid] = failure
                self._failures = found
            return self._failures

    def record(self, action_id: str, rec: ActionRecord) -> None:
        """Record a finished action and its outputs' digests, in one transaction."""
        self.commit_round([(action_id, rec)], [], [])

    def claim_outputs(self, paths: list[str]) -> None:
        """Record that kiln lets an action write ``paths`` (relative to the output dir)."""
        self.commit_round([], [], paths)

    def commit_round(
        self,
        finished: list[tuple[str, ActionRecord]],
        starting: list[str],
        paths: list[str],
        failed: list[tuple[str, FailureRecord]] | None = None,
    ) -> None:
        """One round of the scheduler in one transaction: record the ``finished``
        actions (with the digests and durations remembered so far) and the
        failures to remember (``failed``), drop the records and failures of the
        actions ``starting`` (a half-run action is never trusted) and record that
        kiln lets them write ``paths``. A kill keeps all of it or none."""
        failed = failed or []
        with self._lock:
            records = self.records() if finished or starting else {}
            failures = self.failures() if finished or starting or failed else {}
            forgotten = [(a,) for a in (*starting, *(aid for aid, _ in finished)) if a in failures]
            durations = list(self._new_durations.items())
            actions = [
                (
                    aid,
                    rec.key,
                    json.dumps(rec.params),
                    json.dumps(rec.inputs),
                    json.dumps(rec.outputs),
                )
                for aid, rec in finished
            ]
            gone = [(a,) for a in starting if a in records]
            self.database.transaction(
                [
                    (file_digests.UPSERT, self.files.take_pending()),
                    ("INSERT OR REPLACE INTO durations VALUES (?,?)", durations),
                    ("INSERT OR REPLACE INTO actions VALUES (?,?,?,?,?)", actions),
                    ("DELETE FROM actions WHERE id = ?", gone),
                    ("DELETE FROM failures WHERE id = ?", forgotten),
                    (_INSERT_FAILURE, [failure.row(aid) for aid, failure in failed]),
                    (
                        "INSERT OR IGNORE INTO written VALUES (?)",
                        [(stored_path(p),) for p in paths],
                    ),
                ]
            )
            self._new_durations.clear()
            records.update(finished)
            for (a,) in gone:
                records.pop(a, None)
            for (a,) in forgotten:
                failures.pop(a, None)
            failures.update(failed)

    # -- what kiln may delete, what is never shared, per-file metadata ----------

    def written_outputs(self) -> set[str]:
        """Every output path kiln ever let an action write here."""
        try:
            rows = self.database.read("SELECT path FROM written")
        except sqlite3.DatabaseError:
            return set()
        return {loaded_path(r[0]) for r in rows if isinstance(r[0], (str, bytes))}

    def recorded_outputs(self) -> set[str]:
        """The outputs of the recorded actions, as paths relative to the output dir."""
        found = set()
        for record in self.records().values():
            outputs = record.outputs if isinstance(record.outputs, dict) else {}
            for key in outputs:
                rel = output_rel_path(str(key))
                if rel is not None:
                    found.add(rel)
        return found

    def undeclared_outputs(self, declared: set[str], keys: set[str]) -> dict[str, str]:
        """The outputs earlier builds recorded that no node of the graph now declares
        (``declared``: paths relative to the output directory; ``keys``: the graph
        keys of its outputs), each with the digest it was recorded with: an action
        renamed or removed left them. A record whose id names declared outputs only
        (an action's id is its outputs' keys) is not decoded: a no-op build asks."""
        found: dict[str, str] = {}
        for action_id, record in self.records().items():
            if all(part in keys for part in action_id.split("|")):
                continue
            outputs = record.outputs if isinstance(record.outputs, dict) else {}
            for key, digest in outputs.items():
                rel = output_rel_path(str(key))
                if rel is not None and rel not in declared and isinstance(digest, str):
                    found[rel] = digest
        return found

    def nonreproducible(self) -> frozenset[str]:
        """The keys whose results a check found not reproduced (read once per call)."""
        try:
            rows = self.database.read("SELECT key FROM nonreproducible")
        except sqlite3.DatabaseError:
            return frozenset()
        return frozenset(r[0] for r in rows if isinstance(r[0], str))

    def mark_nonreproducible(self, key: str, why: str) -> None:
        """Remember that the results of ``key`` were not reproduced (``why``)."""
        self.database.transaction(
            [("INSERT OR REPLACE INTO nonreproducible VALUES (?, ?)", [(key, why)])]
        )

    def clear_nonreproducible(self, keys: list[str]) -> None:
        """Forget that the results of ``keys`` were not reproduced (a check now did)."""
        if keys:
            self.database.transaction(
                [("DELETE FROM nonreproducible WHERE key = ?", [(k,) for k in keys])]
            )

    def file_metadata(
        self, key: str, mutate: Callable[[dict[str, Any]], bool] | None
    ) -> dict[str, Any]:
        """The metadata dict of ``key``; ``mutate`` edits it under the lock and returns
        True to persist."""
        with self._lock:
            stored = stored_path(key)
            found = self.database.read("SELECT data FROM file_metadata WHERE path = ?", (stored,))
            data = metadata_dict(found[0][0]) if found else {}
            if mutate is not None and mutate(data):
                self.database.transaction(
                    [
                        (
                            "INSERT OR REPLACE INTO file_metadata VALUES (?, ?)",
                            [(stored, json.dumps(data, sort_keys=True))],
                        )
                    ]
                )
            return data
