"""How a request reaches the remote cache's server: straight, or through the proxy
the environment names, as ``fetch_http`` (urllib) reaches a server.

A URL of any valid shape is reached at its own host and port: an IPv6 address
with or without a port (``http://[::1]/c`` is port 80 of ``::1``), user
information aside (it is the server's basic auth, never part of where to
connect). ``http_proxy``/``HTTP_PROXY`` (``https_proxy`` for https) name a proxy,
unless ``no_proxy`` covers the host (urllib's own ``proxy_bypass``, asked with the
host and port as urllib asks, and with the bare host, so that an IPv6 entry
counts), or the host is this machine's loopback (``localhost`` and names under
it, 127.0.0.0/8 in any spelling a resolver takes, ``::1``, an IPv4-mapped
loopback): a proxy elsewhere cannot reach it, and kiln's own CAS of a
``dask-local`` build lives there (``kiln.cache.cas_server``), as Go's HTTP
client, for one, never proxies a loopback host. Through an HTTP proxy a request
names the whole URL; an https one goes through a ``CONNECT`` tunnel, its TLS with
the server itself. A proxy's user information becomes ``Proxy-Authorization``.
"""

from __future__ import annotations

import base64
import ipaddress
import socket
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from kiln.base.redact import redact_url


@dataclass(frozen=True)
class Route:
    """Where to connect (``host``, ``port``) and what to send there for the server of
    a URL. ``prefix`` goes before each request's path (the URL's scheme and host,
    through an HTTP proxy); ``tunnel`` is the ``CONNECT`` target through a proxy to an
    https server; ``headers`` go with each request (``Host``, the proxy's
    credentials); ``tunnel_headers`` with the ``CONNECT``; ``server_name`` is the
    name TLS checks the certificate against."""

    host: str
    port: int
    server_name: str
    prefix: str = ""
    tunnel: tuple[str, int] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    tunnel_headers: dict[str, str] = field(default_factory=dict)


def route(parts: urllib.parse.SplitResult) -> Route:
    """The route to the server of the checked URL ``parts``; ValueError for a proxy
    kiln cannot use."""
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    bracketed = f"[{host}]" if ":" in host else host
    netloc = bracketed if parts.port is None else f"{bracketed}:{parts.port}"
    headers = {"Host": netloc}
    proxy = _proxy(parts.scheme, netloc, host)
    if proxy is None:
        return Route(host, port, host, headers=headers)
    proxy_host, proxy_port, credentials = proxy
    if parts.scheme == "https":
        return Route(
            proxy_host,
            proxy_port,
            host,
            tunnel=(bracketed, port),
            headers=headers,
            tunnel_headers=credentials,
        )
    return Route(
        proxy_host,
        proxy_port,
        host,
        prefix=f"{parts.scheme}://{netloc}",
        headers={**headers, **credentials},
    )


def loopback(host: str) -> bool:
    """Whether ``host`` (a URL's, IPv6 without brackets) names this machine's
    loopback, by its spelling alone (no name is looked up)."""
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name.partition("%")[0])
    except ValueError:
        try:  # 127.1, 0x7f.0.0.1, 2130706433: what a resolver reads as 127.x
            return socket.inet_aton(name)[0] == 127
        except OSError:
            return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _proxy(scheme: str, netloc: str, host: str) -> tuple[str, int, dict[str, str]] | None:
    """The proxy the environment names for ``scheme`` and does not bypass for the
    server (``netloc``, ``host``): its host, port and credential headers."""
    url = urllib.request.getproxies().get(scheme)
    if not url or loopback(host):
        return None
    if urllib.request.proxy_bypass(netloc) or urllib.request.proxy_bypass(host):
        return None
    where = f"the {scheme}_proxy of the environment, {redact_url(url)},"
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port or 80
    except ValueError:
        raise ValueError(f"{where} has no valid port") from None
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{where} is not an http:// proxy with a host")
    headers = {}
    if parts.username is not None:
        pair = (
            f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        )
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    return parts.hostname, port, headers
