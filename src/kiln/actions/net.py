"""``fetch_http``: download a file (http, https or file URL) into the build."""

from __future__ import annotations

import re
from typing import Any

from kiln.base.errors import BuildDefinitionError
from kiln.base.redact import redact_url, url_digest
from kiln.graph import ActionConcurrency, BuildAction, BuildContext, BuildFile, FileNamespace

__all__ = ["FetchHttpAction", "fetch_http", "redact_url"]  # redact_url: kiln.base.redact's


_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


class FetchHttpAction(BuildAction):
    """Streams ``url`` to the output through a temporary file, retrying transient
    failures and checking ``sha256`` when given. Keyed by URL and checksum only, so
    an intact earlier download is never fetched again.

    The URL's secrets never leave this object: the description, the parameters
    stored in the build state and every message carry its redacted form; the key
    gets the whole URL as a digest. A failure is never remembered: the server may
    answer next time."""

    remember_failures = False

    def __init__(
        self,
        *,
        url: str,
        output_file: BuildFile,
        sha256: str | None = None,
        timeout_s: float | None = None,
        stall_timeout_s: float = 60.0,
        retries: int = 3,
        **kwargs: Any,
    ):
        super().__init__(concurrency=ActionConcurrency.THREAD, **kwargs)
        if sha256 and (not isinstance(sha256, str) or not _SHA256.fullmatch(sha256.strip())):
            raise BuildDefinitionError(
                f"{self.def_site}: fetch of {redact_url(url)}: sha256={sha256!r} is not a "
                "SHA-256 digest; give its 64 hexadecimal digits (sha256sum prints them)"
            )
        self._url = url
        self.output_file = output_file
        self.sha256 = sha256
        self.timeout_s = timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.retries = retries
        # Only a download pinned by ``sha256`` goes through the shared cache (as in
        # Bazel's repository cache): what a bare URL serves may change, and a cache
        # would hand every machine its first copy for ever.
        self.cacheable = bool(sha256)

    @property
    def url(self) -> str:
        """The URL as shown: its user information, query and fragment masked."""
        return redact_url(self._url)

    def params(self) -> dict[str, Any]:
        return {"url": self.url, "url_sha256": url_digest(self._url), "sha256": self.sha256}

    def output_digests(self) -> dict[BuildFile, str] | None:
        """The digest the download must have: the cache serves it by content."""
        return {self.output_file: self.sha256.strip().lower()} if self.sha256 else None

    def _invoke(self) -> None:
        path = self.output_file.get_fs_path()
        # iree.build's line, which scripts look for; only when a download happens.
        self.run_context.write_status(f"Fetching URL: {self.url} -> {path}")
        from kiln.actions._download import download  # urllib, ssl: when a fetch runs

        download(
            self._url,
            path,
            sha256=self.sha256,
            timeout=self.timeout_s,
            stall_timeout=self.stall_timeout_s,
            retries=self.retries,
            progress=lambda done, total: self.run_context.progress(self, done, total),
        )


def fetch_http(
    *,
    name: str,
    url: str,
    sha256: str | None = None,
    timeout: float | None = None,
    stall_timeout: float = 60.0,
    retries: int = 3,
    namespace: FileNamespace = FileNamespace.GEN,
) -> BuildFile:
    """Declare a download of ``url`` into the file ``name``; returns that file.

    ``timeout`` (seconds) bounds the whole download, retries included (None: no
    bound); ``stall_timeout`` fails an attempt that brings less than 1 KiB in
    that many seconds. Credentials in the URL (``user:password@``) are sent as
    HTTP Basic authentication; they and the query are masked wherever the
    URL is shown or stored."""
    context = BuildContext.current()
    output = context.allocate_file(name, namespace)
    action = FetchHttpAction(
        url=url,
        output_file=output,
        sha256=sha256,
        timeout_s=timeout,
        stall_timeout_s=stall_timeout,
        retries=retries,
        desc=f"Fetch {redact_url(url)}",  # iree.build's words
        executor=context.executor,
    )
    output.deps.add(action)
    return output
