"""A minimal RESP2 client over one socket: what the cross-host transport needs, no more.

Why not redis-py's ``PubSub``: it reconnects and resubscribes on its own after a
dropped connection. For a cache client that is a kindness; for invalidations it
hides exactly the event that matters (messages published while the connection
was down are gone). Here every socket error is raised to the caller, which
stops serving L1 hits and resynchronises before it serves again. The protocol
subset is small: commands as arrays of bulk strings, and the five reply types.

This module imports nothing from Django.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["RespConnection", "RespError", "ServerAddress", "parse_url"]


class RespError(Exception):
    """The server answered with an error reply (``-ERR ...``)."""


@dataclass(frozen=True)
class ServerAddress:
    """Where a redis server listens and how to log in."""

    host: str
    port: int
    username: str | None = None
    password: str | None = None


def parse_url(url: str) -> ServerAddress:
    """``redis://[[user]:password@]host[:port][/db]`` -> :class:`ServerAddress`.

    The database number is accepted and ignored: pub/sub channels are global to
    a server, whatever database a client selected. Raises ``ValueError`` naming
    what is wrong.
    """
    parts = urlsplit(url)
    if parts.scheme != "redis":
        raise ValueError(f"{url!r}: only redis:// URLs are supported, got scheme {parts.scheme!r}")
    if not parts.hostname:
        raise ValueError(f"{url!r}: no host")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{url!r}: bad port") from exc
    if port is None:
        port = 6379
    elif port == 0:  # no server listens there; it must not read as the default
        raise ValueError(f"{url!r}: bad port 0")
    return ServerAddress(parts.hostname, port,
                         unquote(parts.username) if parts.username else None,
                         unquote(parts.password) if parts.password else None)


def _encode(args: tuple[bytes | str | int, ...]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RespConnection:
    """One blocking TCP connection to a redis server.

    Every wait is bounded by ``timeout`` (``socket.timeout`` is an ``OSError``);
    any ``OSError`` or a closed connection leaves this object unusable: make a
    new one.
    """

    def __init__(self, address: ServerAddress, timeout: float) -> None:
        self.sock = socket.create_connection((address.host, address.port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        if address.password is not None:
            if address.username:
                self.call("AUTH", address.username, address.password)
            else:
                self.call("AUTH", address.password)

    def send(self, *args: bytes | str | int) -> None:
        self.sock.sendall(_encode(args))

    def call(self, *args: bytes | str | int) -> Any:
        """Send one command and return its reply (an error reply raises)."""
        self.send(*args)
        return self.reply()

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    # --- replies -------------------------------------------------------------

    def fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("the redis server closed the connection")
        self._buf += chunk

    def _line(self) -> bytes:
        while True:
            end = self._buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self._buf[:end])
                del self._buf[:end + 2]
                return line
            self.fill()

    def _exactly(self, n: int) -> bytes:
        while len(self._buf) < n + 2:
            self.fill()
        data = bytes(self._buf[:n])
        del self._buf[:n + 2]
        return data

    def buffered(self) -> bool:
        """Is a reply (or part of one) already read from the socket?"""
        return bool(self._buf)

    def reply(self) -> Any:
        """The next reply: bytes, int, list, None; an error reply raises RespError."""
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exactly(n)
        if kind == b"*" or kind == b">":  # an array, or a RESP3 push (measurements)
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        if kind == b"%":  # a RESP3 map, as a flat list
            return [self.reply() for _ in range(2 * int(rest))]
        if kind == b"_":
            return None
        if kind == b"-":
            raise RespError(rest.decode("utf-8", "replace"))
        raise ConnectionError(f"unexpected reply from the redis server: {line[:40]!r}")
