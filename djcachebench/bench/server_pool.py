"""The loopback servers of a run (or of a whole sweep): started on first need, stopped once.

Apart from the runner: the sweep, the http and stampede commands and the
plain-loop cross-check share one pool across their runs.
"""

from __future__ import annotations

from djcachebench.bench.servers import (
    LoopbackServer,
    MemcachedServer,
    RedisServer,
    ServerUnavailable,
)
from djcachebench.bench.signals import deferred_signals
from djcachebench.bench.targets import Target

__all__ = ["SERVER_CLASSES", "ServerPool"]

SERVER_CLASSES: dict[str, type[LoopbackServer]] = {
    "memcached": MemcachedServer,
    "redis": RedisServer,
}


class ServerPool:
    """The loopback servers of a run (or of a whole sweep), each started on first need.

    A server that will not start is remembered with its reason, so every
    target that needs it is skipped with the same reason without retrying.
    """

    def __init__(self) -> None:
        self.servers: dict[str, LoopbackServer] = {}
        self.errors: dict[str, str] = {}

    def need(self, target: Target) -> str | None:
        """Start what ``target`` needs; the skip reason if a server is unavailable."""
        for kind in target.servers:
            if kind not in self.servers and kind not in self.errors:
                server = SERVER_CLASSES[kind]()
                try:
                    self.servers[kind] = server.start()
                except ServerUnavailable as exc:
                    self.errors[kind] = f"server unavailable: {exc}"
            if kind in self.errors:
                return self.errors[kind]
        return None

    def locations(self) -> dict[str, str]:
        return {kind: server.location for kind, server in self.servers.items()}

    def stop(self) -> None:
        """Stop every started server, by PID (idempotent), with SIGINT/SIGTERM held."""
        with deferred_signals():
            for server in self.servers.values():
                server.stop()
            self.servers.clear()
