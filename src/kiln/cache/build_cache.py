"""The cache as a build uses it: the local cache in front of an optional remote one.

Before a cacheable action runs the scheduler asks ``restore``: on a hit the
outputs are materialized from the CAS into the output directory (a copy or a
reflink, each verified against its digest, renamed into place only when every
output of the action is whole) and the action does not run. After it succeeds the
scheduler hands its outputs to ``save``. Which actions are cacheable:
``cacheable``. A cache that fails never fails the build: a local error is reported
once and the cache is left alone for the rest of the build; the remote reports
its own failures (``kiln.cache.remote``).

A key that ``--check-reproducible`` found not reproducible is withdrawn from
every cache the build can write to (``withdraw``: a withdrawal entry replaces its
entry, ``kiln.cache.entry``). A lookup that meets a withdrawal is a miss, and
remembers it (``withdrawn``): the build says why the action was not served, and
does not store what the action then produces under that key. Only a save that
a check vouches for (``reproduced``) replaces a withdrawal.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.base.errors import NotRegularFile
from kiln.cache.entry import (
    INLINE_MAX,
    MAX_ENTRY_SIZE,
    CachedOutput,
    CacheEntry,
    is_digest,
    served_mode,
)
from kiln.cache.local import LocalCache
from kiln.cache.withdrawals import Withdrawals, write
from kiln.graph import BuildAction, BuildFile
from kiln.output_dir.digests import hash_output
from kiln.output_dir.writing import NOFOLLOW, atomic_output, process_umask
from kiln.state import Produced, stat_key

if TYPE_CHECKING:  # imported only by a build that has a remote cache
    from kiln.cache.remote import RemoteCache


# What hashing an output read (``kiln.engine.action_outputs``): its permission
# bits, and its bytes when it is at most ``INLINE_MAX`` long (else None).
ReadOutput = tuple[int, bytes | None]


class _Miss(Exception):
    """A cached output cannot be served (a blob is missing or corrupt)."""


def cacheable(action: BuildAction, params: Any, outputs: list[BuildFile]) -> bool:
    """Whether the results of ``action`` may be cached: it has outputs and parameters
    (``always_run`` actions and those kiln cannot key have none), does not say
    ``cacheable = False``, and writes nothing outside the output directory (a file
    kiln does not own is never restored)."""
    return (
        bool(outputs)
        and params is not None
        and getattr(action, "cacheable", True) is not False
        and all(f.source is None for f in outputs)
    )


def known_digests(action: BuildAction, outputs: list[BuildFile]) -> dict[str, str] | None:
    """Output digests an action declares before it runs (a ``fetch_http`` with
    ``sha256``), by file key: such outputs are served from the CAS by digest."""
    declared = getattr(action, "output_digests", None)
    found = declared() if callable(declared) else None
    if not found or len(found) != len(outputs):
        return None
    return {f.key: d for f, d in found.items() if isinstance(d, str) and is_digest(d)} or None


class BuildCache:
    """The caches one build reads and writes, and what happened to them.

    Invariant: once ``broken`` is set the local cache is not touched again; counts
    only grow. Safe to call from several threads.
    """

    def __init__(
        self,
        local: LocalCache,
        remote: RemoteCache | None = None,
        *,
        max_size: int = 10 << 30,
        warn: Callable[[str], None] = lambda text: None,
    ):
        self.local = local
        self.remote = remote
        self.max_size = max_size
        self.counts = dict.fromkeys(("hits", "remote_hits", "misses", "stored", "corrupt"), 0)
        self.broken = False
        self._warn = warn
        self._lock = threading.Lock()
        self._reported: set[str] = set()
        # Blobs known to be in the remote CAS (a remote worker put them there).
        self._remote_has: set[str] = set()
        # Keys met withdrawn (or withdrawn) in this build: never served, never
        # stored but by a save that a check vouches for.
        self._withdrawals = Withdrawals()

    def _count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def _report_once(self, topic: str, text: str) -> None:
        with self._lock:
            if topic in self._reported:
                return
            self._reported.add(topic)
        self._warn(text)

    def failed(self, error: BaseException) -> None:
        """Something unforeseen went wrong in the cache: say so once and build the
        rest without it (``kiln.engine.cache_step`` turns every cache step's exception into
        this and a miss)."""
        self.broken = True
        if self.remote is not None:
            self.remote.disabled = True
        self._report_once(
            "failed",
            f"warning: the cache failed ({type(error).__name__}: {error}); "
            "building without it for the rest of this build",
        )

    def _local_failed(self, error: OSError) -> None:
        self.broken = True
        self._report_once(
            "local",
            f"warning: cannot use the cache {self.local.root} ({error}); "
            "building without it (choose another with --cache-dir, or --no-cache)",
        )

    # -- looking up ----------------------------------------------------------

    def restore(
        self,
        key: str,
        outputs: list[BuildFile],
        known: dict[str, str] | None = None,
        share: bool = True,
    ) -> Produced | None:
        """Materialize the outputs cached for ``key`` (or, for ``known`` digests, the
        blobs with those digests); None on a miss. ``share=False``: this machine's
        cache only, never the remote."""
        if self.broken:
            return None
        try:
            served = self._restore(key, outputs, known, self.remote if share else None)
        except OSError as e:
            self._local_failed(e)
            served = None
        self._count("misses" if served is None else "hits")
        return served

    def restore_small(self, key: str, outputs: list[BuildFile]) -> tuple[bool, Produced | None]:
        """A lookup in this machine's cache that copies no blob (one the scheduler's
        thread can make): ``(True, outputs)`` on a hit whose outputs all live in
        the entry, ``(True, None)`` on a miss (counted), ``(False, None)`` when a hit
        would copy blobs or when a remote cache is set, whose server this never
        asks (``restore`` then, on a worker; nothing counted)."""
        if self.remote is not None:
            return False, None
        if self.broken:
            return True, None
        try:
            entry, _ = self._entry(key, None)
            plan = _match(entry, outputs) if entry is not None else None
            if plan is not None and any(out.data is None for _, out in plan):
                return False, None
            produced = None if plan is None else self._materialize(plan)
        except _Miss:
            produced = None
        except OSError as e:
            self._local_failed(e)
            produced = None
        self._count("misses" if produced is None else "hits")
        return True, produced

    def _restore(
        self,
        key: str,
        outputs: list[BuildFile],
        known: dict[str, str] | None,
        remote_cache: RemoteCache | None,
    ) -> Produced | None:
        entry, remote = self._entry(key, remote_cache)
        if entry is not None:
            plan = _match(entry, outputs)
        elif known is not None and self.withdrawn(key) is None:
            plan = [(f, CachedOutput(f.key, known[f.key], -1, -1)) for f in outputs]
        else:
            return None
        if plan is None:
            return None
        for _, out in plan:
            if out.data is None and not self.local.has_blob(out.sha256):
                if not self._fetch(out, remote_cache):
                    return None
                remote = True
        try:
            produced = self._materialize(plan)
        except _Miss:
            return None
        if entry is not None and remote:
            self.local.put_entry(key, entry.encode())
        if remote:
            self._count("remote_hits")
        return produced

    def _entry(
        self, key: str, remote: RemoteCache | None, touch: bool = True
    ) -> tuple[CacheEntry | None, bool]:
        """The entry for ``key`` that may be served, and whether it came from
        ``remote``; None when there is none, or when a cache withdrew the key (then
        the remote is not asked, and a remote's withdrawal is kept here too)."""
        data = self.local.get_entry(key, touch)
        if data is not None:
            entry = CacheEntry.decode(key, data)
            if entry is not None:
                return self._withdrawals.servable(entry), False
        if remote is None:
            return None, False
        data = remote.get_entry(key)
        entry = CacheEntry.decode(key, data) if data is not None else None
        if data is not None and entry is None:
            self._report_once(
                "unreadable entry",
                f"warning: remote cache {remote.shown} has "
                f"an unreadable entry ac/{key}; ignored it (and any more)",
            )
        if entry is None:
            return None, False
        if entry.not_reproducible is not None:
            self.local.put_entry(key, entry.encode())  # this machine's lookups know it
            return self._withdrawals.servable(entry), False
        return entry, True

    def withdrawn(self, key: str) -> str | None:
        """Why ``key`` is withdrawn, when this build met its withdrawal or made it."""
        return self._withdrawals.why(key)

    def withdraw(self, key: str, desc: str, why: str) -> None:
        """Withdraw ``key`` (found not reproducible: ``why``) from every cache this
        build can write to: its entry, here and on the remote, becomes a withdrawal,
        which no build serves."""
        self._withdrawals.add(key, why)
        data = CacheEntry.withdrawal(key, desc, why).encode()
        try:
            write(
                data,
                key,
                None if self.broken else self.local,
                self.remote,
                lambda text: self._report_once("withdraw", text),
            )
        except OSError as e:
            self._local_failed(e)

    def marked(self, key: str) -> bool:
        """Whether a cache this build reads holds a withdrawal of ``key`` (asks the
        remote: for what a check found reproducible, which may clear it)."""
        if self.withdrawn(key) is not None:
            return True
        try:
            self._entry(key, self.remote, touch=False)
        except OSError as e:
            self._local_failed(e)
        return self.withdrawn(key) is not None

    def _materialize(self, plan: list[tuple[BuildFile, CachedOutput]]) -> Produced:
        """Copy every blob to a temporary beside its output, check it, then rename them
        all into place. Any failure is a miss: the action runs, and meets (and reports)
        whatever is wrong with its output path itself."""
        try:
            with contextlib.ExitStack() as stack:
                for f, out in plan:
                    tmp = stack.enter_context(atomic_output(f.get_fs_path(), create=False))
                    # kiln's modes, never the entry's: not setuid, not world-writable.
                    mode = served_mode(max(out.mode, 0), process_umask())
                    if out.data is not None:
                        self._write_inline(out, tmp, mode)
                        continue
                    copied = self.local.copy_blob(out.sha256, tmp, mode)
                    if copied is None:
                        raise _Miss  # evicted meanwhile, or skipped (reported)
                    if copied != out.sha256:
                        self._corrupt(self.local.blob_path(out.sha256), out.sha256)
                    self.local.touch_blob(out.sha256)
            return {f: (stat_key(os.lstat(f.fs_str)), out.sha256) for f, out in plan}
        except (OSError, NotRegularFile):  # a blob evicted meanwhile, an output path that
            raise _Miss from None  # cannot be written: the action meets it and says so

    def _fetch(self, out: CachedOutput, remote: RemoteCache | None) -> bool:
        """Whether ``remote`` put blob ``out.sha256`` into the local CAS; at most the
        size its entry declares is read (without one, the cache's size bound)."""
        if remote is None:
            return False
        size = out.size if out.size >= 0 else None
        return remote.fetch_blob(out.sha256, self.local, size, self.max_size)

    def _write_inline(self, out: CachedOutput, tmp: Path, mode: int) -> None:
        """Write an output kept in its entry, once its bytes are checked: the new
        temporary ``tmp`` is created, written and given ``mode`` through one
        descriptor."""
        assert out.data is not None
        if hashlib.sha256(out.data).hexdigest() != out.sha256:
            self._count("corrupt")
            self._report_once(
                f"ac/{out.sha256}",
                "warning: a cache entry holds an output "
                f"({out.path}) whose content does not match its digest; "
                "ignored it",
            )
            raise _Miss
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(out.data)
            os.fchmod(fd, mode)

    def _corrupt(self, blob: Path, digest: str) -> None:
        self.local.remove_blob(digest)
        self._count("corrupt")
        self._report_once(
            f"cas/{digest}",
            f"warning: cache blob {blob} was damaged (its "
            "content does not match its name); removed it",
        )
        raise _Miss

    def materialize(self, digests: dict[BuildFile, str]) -> Produced | None:
        """Put the blobs ``digests`` (from the CAS, local or remote) at their files:
        the outputs of an action that ran remotely. None if one cannot be had."""
        if self.broken:
            return None
        plan = [(f, CachedOutput(f.key, d, -1, -1)) for f, d in digests.items()]
        with self._lock:
            self._remote_has.update(digests.values())
        try:
            for _, out in plan:
                if not self.local.has_blob(out.sha256) and not self._fetch(out, self.remote):
                    return None
            return self._materialize(plan)
        except _Miss:
            return None
        except OSError as e:
            self._local_failed(e)
            return None

    def would_serve(
        self,
        key: str,
        outputs: list[BuildFile],
        known: dict[str, str] | None = None,
        share: bool = True,
    ) -> bool:
        """Whether ``restore`` would most likely hit (blobs are not read)."""
        try:
            data = self.local.get_entry(key, touch=False)
            entry = CacheEntry.decode(key, data) if data is not None else None
            if entry is not None and self._withdrawals.servable(entry) is None:
                return False
            if entry is not None:
                plan = _match(entry, outputs)
                if plan is not None and all(o.data is not None for _, o in plan):
                    return True
                digests = [o.sha256 for _, o in plan if o.data is None] if plan else []
            else:
                digests = list(known.values()) if known else []
            if digests and all(self.local.has_blob(d) for d in digests):
                return True
        except OSError:
            return False
        if not share or self.remote is None:
            return False
        data = self.remote.get_entry(key)  # read: a withdrawal is no hit
        entry = CacheEntry.decode(key, data) if data is not None else None
        return entry is not None and self._withdrawals.servable(entry) is not None

    # -- storing -------------------------------------------------------------

    def save(
        self,
        key: str,
        desc: str,
        produced: Produced,
        share: bool = True,
        read: Mapping[BuildFile, ReadOutput] | None = None,
        reproduced: bool = False,
    ) -> None:
        """Put an action's outputs (digests already known) into the caches (with
        ``share=False``, into this machine's only). ``read``: what hashing them read
        (their modes, and the bytes of the small ones), so that they are not opened
        again. A key withdrawn in this build is stored only when ``reproduced`` (a
        check found its outputs reproduced), which replaces the withdrawal."""
        if self.broken or not produced:
            return
        if not reproduced and self.withdrawn(key) is not None:
            return
        outputs = []
        try:
            for f, ((size, *_), digest) in produced.items():
                seen = read.get(f) if read is not None else None
                if seen is None:
                    seen = _read_back(f, size, digest)
                    if seen is None:
                        return  # changed since it was hashed: nothing to vouch for
                mode, data = seen
                if data is None and not self.local.put_file(f.fs_str, digest):
                    return
                if data is not None:
                    size = len(data)
                outputs.append(CachedOutput(f.key, digest, size, mode, data))
            entry = CacheEntry(key, desc, tuple(sorted(outputs, key=lambda o: o.path)))
            data = entry.encode()
            if len(data) > MAX_ENTRY_SIZE:
                return  # more outputs than an entry holds: not cached
            self.local.put_entry(key, data)
        except NotRegularFile:
            return  # replaced since it was hashed: nothing to vouch for
        except OSError as e:
            self._local_failed(e)
            return
        self._withdrawals.replaced(key)
        self._count("stored")
        if share and self.remote is not None and self.remote.uploads:
            for out in outputs:  # the CAS holds every blob, for readers that ignore data
                if out.sha256 not in self._remote_has:
                    body = out.data if out.data is not None else self.local.blob_path(out.sha256)
                    self.remote.put_blob(out.sha256, body)
            self.remote.put_entry(key, data)

    def end_build(self) -> None:
        """Write the entries that wait, log this build's counts and evict down to the
        size bound (when the cache may have outgrown it)."""
        try:
            if self.broken or not any(self.counts.values()):
                return
            self.local.index.flush()
            self.local.log_build(dict(self.counts))
            if self.counts["stored"] or self.counts["remote_hits"]:
                self.local.evict(self.max_size)
        except OSError as e:
            self._local_failed(e)
        except Exception as e:  # noqa: BLE001 - the cache never fails the build
            self.failed(e)
        finally:
            self.close()

    def close(self) -> None:
        """Write what waits for the local cache's index and close it (an explain or a
        dry run leaves nothing open in the cache directory); it is reopened if used
        again."""
        with contextlib.suppress(Exception):
            self.local.close()


def _read_back(f: BuildFile, size: int, digest: str) -> ReadOutput | None:
    """The mode of output ``f``, and its bytes when it is small enough to be kept in
    its entry (read with its mode through one open); None when those bytes no
    longer have ``digest``. A larger output's digest is checked as it is copied."""
    if size > INLINE_MAX:
        return os.lstat(f.fs_str).st_mode & 0o7777, None
    st, now, data = hash_output(f.fs_str, INLINE_MAX)
    return (st.st_mode & 0o7777, data) if now == digest else None


def _match(
    entry: CacheEntry, outputs: list[BuildFile]
) -> list[tuple[BuildFile, CachedOutput]] | None:
    """Pair the entry's outputs with the action's files by file key; an action with one
    output takes the entry's one output whatever its name (a download of the same URL
    and digest to another file)."""
    by_path = {o.path: o for o in entry.outputs}
    if len(outputs) == 1 and len(entry.outputs) == 1:
        return [(outputs[0], entry.outputs[0])]
    if set(by_path) != {f.key for f in outputs}:
        return None
    return [(f, by_path[f.key]) for f in outputs]
