"""Tests of kiln.base.redact: the one place URL secrets are masked."""

from __future__ import annotations

import pytest

from kiln.base.redact import redact_url, redact_urls, url_digest


@pytest.mark.parametrize(
    "url, shown",
    [
        ("https://example.com/m.onnx", "https://example.com/m.onnx"),
        ("http://127.0.0.1:8000/a/b.bin", "http://127.0.0.1:8000/a/b.bin"),
        ("file:///tmp/x.bin", "file:///tmp/x.bin"),
        ("https://ada:pw@host/x", "https://***@host/x"),
        ("https://TOKEN@github.com/o/r", "https://***@github.com/o/r"),
        ("https://h/x?token=abc&v=1", "https://h/x?***"),
        ("https://h/x?abc", "https://h/x?***"),
        ("https://h/x#secret", "https://h/x#***"),
        ("http://u:p@[::1]:81/x?s=1", "http://***@[::1]:81/x?***"),
        ("https://a@b@host/x", "https://***@host/x"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_unparseable_url_shows_nothing() -> None:
    assert redact_url("http://[::1/x?token=s") == "***"


def test_urls_in_a_command_line() -> None:
    line = "curl -o out 'https://u:SECRET@h/x?k=SECRET2' http://plain/y"
    shown = redact_urls(line)
    assert "SECRET" not in shown
    assert "https://***@h/x?***" in shown and "http://plain/y" in shown


def test_digest_sees_the_whole_url() -> None:
    assert url_digest("https://h/x?t=1") != url_digest("https://h/x?t=2")
    assert len(url_digest("https://h/x")) == 64
