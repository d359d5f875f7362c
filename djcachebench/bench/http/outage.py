"""``djcachebench http --l2-outage SECONDS``: the cache's server hung and continued, in windows.

Each route's ``--duration`` is cut into windows of SECONDS, outage first,
then healthy, alternately, and ending healthy (whole cycles). Before an outage
window the target's server (redis or memcached, by the PID the harness
started it with) is stopped with SIGSTOP: it keeps its connections and
answers nothing, as a hung server does; before a healthy window it is
continued with SIGCONT. It is always continued at the end, after an error or
an interrupt too.

How the request rate is split: wrk reports totals only, so every window is
one wrk run of its own, and each window's figures are wrk's (requests/s,
latency percentiles, error responses, socket errors). Why not per-second
counts recorded by the site: the site sees only the requests that reached a
worker, not those queued behind workers waiting on the hung server, and its
latencies would leave that queue out; wrk's are the clients'. What the
windows leave out, alike for every target: requests still waiting when a
window's wrk ends (at most ``--connections``): wrk drops them, so they are
neither counted as served nor as errors, but the site still serves them, in
the next window, before that window's own requests; and the few milliseconds
between windows while wrk restarts.

Summaries (:func:`summarize`) add up the windows of one kind: requests/s is
their requests over their seconds; p50 is the median of the windows' p50s and
p99 the highest window p99 (percentiles are never averaged), over the windows
that served at least one request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from djcachebench.bench.http.wrk import run_wrk
from djcachebench.bench.servers import LoopbackServer
from djcachebench.bench.signals import deferred_signals
from djcachebench.bench.stats import percentile

__all__ = ["KINDS", "cycle_error", "run_windows", "summarize"]

#: Window kinds, in the order the report shows them.
KINDS = ("outage", "healthy")


def cycle_error(duration: int, every: int) -> str | None:
    """Why ``--duration`` cannot be cut into whole outage-and-recovery cycles, or None."""
    cycle = 2 * every
    if duration % cycle:
        return (f"--duration {duration} is not a whole number of outage cycles: "
                f"--l2-outage {every} stops the server for {every} s and continues it for "
                f"{every} s, so --duration must be a multiple of {cycle}")
    return None


def run_windows(url: str, duration: int, every: int, connections: int,
                servers: Sequence[LoopbackServer],
                headers: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Load ``url`` for ``duration`` seconds in windows of ``every`` seconds, the
    ``servers`` stopped in every other one; each window's wrk figures, in order."""
    windows: list[dict[str, Any]] = []
    try:
        for index in range(duration // every):
            outage = index % 2 == 0
            for server in servers:
                if outage:
                    server.pause()
                else:
                    server.resume()
            figures, _ = run_wrk(url, every, connections, headers=headers)
            windows.append({"kind": KINDS[0] if outage else KINDS[1], **figures.to_dict()})
    finally:
        with deferred_signals():
            for server in servers:
                server.resume()
    return windows


def summarize(windows: Iterable[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    """The windows of ``kind`` added up (see the module's docstring); None: there are none."""
    chosen = [w for w in windows if w["kind"] == kind]
    if not chosen:
        return None
    seconds = sum(w["seconds"] for w in chosen)
    requests = sum(w["requests"] for w in chosen)
    non_2xx = sum(w["non_2xx"] for w in chosen)
    served = [w for w in chosen if w["requests"]]
    p50s = sorted(w["p50_ms"] for w in served)
    return {
        "windows": len(chosen), "seconds": seconds, "requests": requests,
        "requests_per_s": requests / seconds if seconds else 0.0,
        # Error responses are answered fast by a site whose cache fails fast:
        # the rate of good answers is the figure a visitor feels.
        "ok_per_s": (requests - non_2xx) / seconds if seconds else 0.0,
        "non_2xx": non_2xx, "socket_errors": sum(w["socket_errors"] for w in chosen),
        "p50_ms": float(percentile(p50s, 50)) if p50s else None,
        "p99_ms": max((w["p99_ms"] for w in served), default=None),
    }
