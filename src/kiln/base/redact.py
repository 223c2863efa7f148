"""Hiding the secrets URLs carry, wherever kiln shows or stores a URL.

A URL's user information (``user:password@``, a token as user name), its query
(``?token=...``, signatures) and its fragment may be credentials: each is
replaced whole by ``***``. Progress lines,
messages, logs, the manifest and the build state get ``redact_url``'s form;
only an action's key sees the whole URL, through ``url_digest``.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse

MASK = "***"
# A URL inside free text (a command line): scheme://, then anything up to a space or quote.
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


def redact_url(url: str) -> str:
    """``url`` with its user information, query and fragment masked; a URL with
    none of them is returned unchanged. Whatever its shape: any scheme, a known one
    misspelt (``htps://alice:pw@h``), none at all (``alice:pw@h/x``), a single slash
    (``http:/alice:pw@h``); a text that does not parse as a URL shows nothing."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # not parseable as a URL: show nothing of it
        return MASK
    query = MASK if parts.query else ""
    fragment = MASK if parts.fragment else ""
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    elif not netloc:
        # No authority as URLs spell it, yet "user:password@host" may lead the path:
        # everything up to its last "@" goes, the scheme (perhaps the user) with it.
        lead, slash, rest = parts.path.lstrip("/").partition("/")
        if "@" in lead:
            host = lead.rpartition("@")[2]
            return urllib.parse.urlunsplit(("", "", f"{MASK}@{host}{slash}{rest}", query, fragment))
    if (netloc, query, fragment) == (parts.netloc, parts.query, parts.fragment):
        return url
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def redact_urls(text: str) -> str:
    """``text`` with every URL in it redacted (for command lines shown to the user)."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def url_digest(url: str) -> str:
    """The SHA-256 of the whole URL, secrets included: what keys a download."""
    return hashlib.sha256(url.encode()).hexdigest()
