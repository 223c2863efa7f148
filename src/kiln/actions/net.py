"""``fetch_http``: download a file (http, https or file URL) into the build."""

from __future__ import annotations

import urllib.parse
from typing import Any

from kiln.actions._download import download
from kiln.graph import ActionConcurrency, BuildAction, BuildContext, BuildFile, FileNamespace


class FetchHttpAction(BuildAction):
    """Streams ``url`` to the output through a temporary file, retrying transient
    failures and checking ``sha256`` when given. Keyed by URL and checksum only, so
    an intact earlier download is never fetched again."""

    def __init__(
        self,
        *,
        url: str,
        output_file: BuildFile,
        sha256: str | None = None,
        timeout_s: float = 60.0,
        retries: int = 3,
        **kwargs: Any,
    ):
        super().__init__(concurrency=ActionConcurrency.THREAD, **kwargs)
        self.url = url
        self.output_file = output_file
        self.sha256 = sha256
        self.timeout_s = timeout_s
        self.retries = retries

    def params(self) -> dict[str, Any]:
        return {"url": self.url, "sha256": self.sha256}

    def _invoke(self) -> None:
        reporter = self.executor.reporter
        path = self.output_file.get_fs_path()
        # iree.build's line, which scripts look for; only when a download happens.
        self.executor.write_status(f"Fetching URL: {redact_url(self.url)} -> {path}")
        download(
            self.url,
            path,
            sha256=self.sha256,
            timeout=self.timeout_s,
            retries=self.retries,
            progress=lambda done, total: reporter.progress(self, done, total),
        )


def redact_url(url: str) -> str:
    """``url`` fit to print: its user name, password, query and fragment (where
    tokens and signatures travel) replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((
        parts.scheme, netloc, parts.path,
        "***" if parts.query else "", "***" if parts.fragment else "",
    ))  # fmt: skip


def fetch_http(
    *,
    name: str,
    url: str,
    sha256: str | None = None,
    timeout: float = 60.0,
    retries: int = 3,
    namespace: FileNamespace = FileNamespace.GEN,
) -> BuildFile:
    """Declare a download of ``url`` into the file ``name``; returns that file."""
    context = BuildContext.current()
    output = context.allocate_file(name, namespace)
    action = FetchHttpAction(
        url=url,
        output_file=output,
        sha256=sha256,
        timeout_s=timeout,
        retries=retries,
        desc=f"Fetching {url}",
        executor=context.executor,
    )
    output.deps.add(action)
    return output
