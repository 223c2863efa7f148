"""kiln's shared, content-addressed cache (docs/caching.md; docs/cluster.md).

entry.py           the action-cache entry format (``kiln-ac/1``), served modes
claim.py           whose a cache directory is (``.kiln/format``), and claiming it
cache_dir.py       every open, write, rename, delete and scan in the cache directory
local.py           the cache directory's contents: action cache, CAS, eviction, build log
index.py           the entries and the size accounting, in one SQLite database
remote.py          the Bazel HTTP cache protocol client
http_transport.py  its requests: a total deadline each, bounded replies
deadlines.py       the thread that cuts a request past its deadline
build_cache.py     what one build does with them: restore, save, report
withdrawals.py     what --check-reproducible withdrew: never served, never stored again
config.py          where the cache lives and how big it may grow
"""

from __future__ import annotations

from kiln.cache.build_cache import BuildCache, ReadOutput, cacheable, known_digests
from kiln.cache.config import DEFAULT_MAX_SIZE, default_cache_dir, format_size, parse_size
from kiln.cache.local import LocalCache

__all__ = [
    "DEFAULT_MAX_SIZE",
    "BuildCache",
    "LocalCache",
    "ReadOutput",
    "cacheable",
    "default_cache_dir",
    "format_size",
    "known_digests",
    "parse_size",
]
