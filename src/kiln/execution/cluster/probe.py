"""Is a Dask scheduler listening at this address? Asked before Dask's client connects.

Dask's client waits without end for a server that accepts the connection and says
nothing (an HTTP server, a TLS port, a silent listener) and takes the first eight
bytes of any other as the length of a message to allocate. A Dask scheduler
speaks first: on a new connection it sends its handshake, one small framed
message (eight bytes of length, then frames counted by another eight). ``probe``
connects and reads that handshake within one total deadline, checking that it
has Dask's shape, so that a wrong address is a clear error within the deadline,
never a hang and never a huge allocation.
"""

from __future__ import annotations

import socket
import struct
import time

from kiln.base.errors import UsageError

# The largest handshake kiln accepts (a scheduler's is a few hundred bytes).
_MAX_HANDSHAKE = 64 << 10
_MAX_FRAMES = 64


def probe(address: str, timeout_s: float) -> None:
    """Return when a Dask scheduler answers at ``address`` (``tcp://HOST:PORT``)
    within ``timeout_s`` seconds, all told; else UsageError naming it and why."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            head = _read(sock, 8, deadline)
            (size,) = struct.unpack("<Q", head)
            if not 8 < size <= _MAX_HANDSHAKE:
                raise _NotDask(repr(head))
            body = _read(sock, size, deadline)
            (frames,) = struct.unpack("<Q", body[:8])
            if not 0 < frames <= _MAX_FRAMES:
                raise _NotDask(repr(head + body[:24]))
    except _NotDask as e:
        raise UsageError(
            f"--executor: {address} is not a Dask scheduler: it answered {e.answer}; "
            "give the scheduler's address (dask scheduler prints it as tcp://HOST:PORT)"
        ) from None
    except TimeoutError:
        raise UsageError(
            f"--executor: nothing at {address} answered as a Dask scheduler within "
            f"{timeout_s:g} s (a Dask scheduler speaks first; an HTTP server, a TLS port "
            "or a busy host does not): check the address, or raise --executor-timeout"
        ) from None
    except (OSError, ValueError) as e:
        why = "connection refused" if isinstance(e, ConnectionRefusedError) else str(e)
        raise UsageError(
            f"--executor: cannot reach the Dask scheduler at {address}: {why}"
        ) from None


class _NotDask(Exception):
    """The server answered, not as a Dask scheduler does."""

    def __init__(self, answer: str):
        super().__init__()
        self.answer = answer[:80]


def _read(sock: socket.socket, count: int, deadline: float) -> bytes:
    """Exactly ``count`` bytes by ``deadline`` (TimeoutError), or what came before the
    server closed (_NotDask)."""
    data = b""
    while len(data) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise _NotDask(f"{data!r}, then closed the connection" if data else "nothing")
        data += chunk
    return data
