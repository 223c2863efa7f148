"""The build state: what each action last produced, and a file-digest cache.

    store.py         ``StateStore``: the state of one output directory, by concern
    database.py      the SQLite connection: opened, checked, moved aside, written
    file_digests.py  the digest cache (``files``) and ``DigestStore``
    records.py       ``ActionRecord``, one row of ``actions``
    snapshot.py      ``StateSnapshot``: a read-only copy in memory
    schema.py        the tables; integrity.py: checking what is read

Stored in ``OUTPUT_DIR/.kiln/state.db``, SQLite in WAL mode. Format, schema 1:

``meta(name TEXT PRIMARY KEY, value TEXT)``
    ``app`` = ``kiln``, ``schema`` = ``1``. Anything else is a foreign database.
``files(path TEXT PRIMARY KEY, size, mtime_ns, ino, ctime_ns, sha256 TEXT)``
    SHA-256 of a file, valid while its stat still matches the four numbers, so a
    no-op build reads no file contents. Here and in ``written`` and
    ``file_metadata``, a path that is not UTF-8 is stored as its bytes, a BLOB
    (``schema.stored_path``).
``actions(id TEXT PRIMARY KEY, key TEXT, params TEXT, inputs TEXT, outputs TEXT)``
    One row per action that last succeeded. ``id`` names the action by its
    outputs; ``key`` is the digest deciding whether it must run again;
    ``params`` is its parameters as JSON; ``inputs`` and ``outputs`` are JSON
    objects mapping file keys to SHA-256 digests. ``inputs`` also holds the
    action's run-time dependencies, under keys that start with ``!``
    (``!imported:PATH``, ``!opened:PATH``: ``kiln.planning.run_deps``), which no file key
    does; an older kiln reads them as inputs that are gone, and runs the action.
``file_metadata(path TEXT PRIMARY KEY, data TEXT)``
    ``BuildFile.access_metadata`` dictionaries as JSON.
``written(path TEXT PRIMARY KEY)``
    Every output path (relative to the output directory) kiln let an action
    write, recorded before the action starts: what ``kiln clean`` may delete.
``nonreproducible(key TEXT PRIMARY KEY, why TEXT)``
    The keys whose results ``kiln build --check-reproducible`` found not
    reproduced, with what differed (``kiln.engine.reproducible``): no build of this
    output directory puts them into or takes them from a cache.
``durations(id TEXT PRIMARY KEY, seconds REAL)``
    How long each action (by ``id``, as in ``actions``) took the last time it
    ran, successful or not: the weights of critical-path scheduling
    (``kiln.engine.priority``). Durations are written with the action records and
    at the end of a build; a killed build may lose those of its last actions,
    which only makes the next build's order less informed.

``failures(id TEXT PRIMARY KEY, key, params, inputs, error, detail, log, result, time, why,
remembered)``
    One row per keyed action whose last run failed: its ``key``, ``params`` and
    ``inputs`` as in ``actions``, the error as the console showed it (and, as
    ``detail``, what ``-v`` showed when that says more, a traceback, or NULL), the
    path of that run's log (or NULL), the JSON result the failure carried (a
    verification's, or NULL), when it failed (epoch seconds), ``remembered`` (1 when
    it will fail again with the same key, else 0: ``kiln.engine.failures``
    decides) and ``why`` (or why not), which ``kiln explain`` says. A build does
    not run an action again whose key equals its remembered failure's (unless
    ``--retry-failed``); the row goes when the action starts again. Local to the
    output directory: nothing of it goes into a cache. A table of other columns
    (an older kiln's) is replaced by an empty one on open: its failures run again.

The records of the actions that finished in one round of the scheduler are
written in one transaction (``StateStore.commit_round``), before any of their
dependents starts, so a build killed at any point keeps the records of what it
finished and nothing else (a kill in the middle of a round loses that round's
records, and those actions run again). An action that is about to run loses its
old record (and its remembered failure) first, so a half-run action is never
trusted. A failure is remembered in the same transactions as the records.

A database that fails the integrity check (not SQLite, truncated, another
program's, another schema or other tables, a damaged page found while the
tables are read, as kiln reads them whole) is moved aside to
``state.db.corrupt-<time>``, unchanged, replacing any earlier such copy (at most
one is kept), and replaced by an empty one. Any other failure to open it (a
full disk, an I/O error, a lock held by another program, no permission) is not
corruption: the state is kept and ``StateError`` names the OS's reason. Every
table is ``WITHOUT ROWID``: its primary key is its only b-tree, so reading a
table reads all of its pages. A row of the right tables holding values of the
wrong types (a key that is not text, fields that are not the JSON objects
described above) is a damaged record: its action runs again.

``written``, ``nonreproducible``, ``durations`` and ``failures`` were added to schema 1
compatibly: a database that lacks them (written by an older kiln) gets them,
empty, when opened, and an older kiln ignores them.
"""

from kiln.output_dir.digests import hash_file
from kiln.state.file_digests import DigestStore, Produced, StatKey, stat_key
from kiln.state.records import ActionRecord, FailureRecord
from kiln.state.schema import SCHEMA_VERSION
from kiln.state.store import StateStore

__all__ = [
    "SCHEMA_VERSION",
    "ActionRecord",
    "DigestStore",
    "FailureRecord",
    "Produced",
    "StatKey",
    "StateStore",
    "hash_file",
    "stat_key",
]
