"""Run Debian's ``wrk`` against one URL and read its report.

wrk's own latency percentiles (``--latency``: 50/75/90/99%) and its maximum are
taken as it prints them: wrk measures each request from its own event loop,
so its figures include the client's share, the same for every backend.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}
_DURATION = r"([\d.]+)(us|ms|s|m)"


class WrkError(RuntimeError):
    """wrk failed or printed something this parser does not know."""


@dataclass(frozen=True)
class WrkResult:
    """One wrk run: latencies in milliseconds."""

    requests: int
    seconds: float
    requests_per_s: float
    p50_ms: float
    p75_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    non_2xx: int
    socket_errors: int

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def wrk_missing() -> str | None:
    if shutil.which("wrk") is None:
        return "wrk is not installed (apt-get install wrk; the README's set-up does it as root)"
    return None


def _ms(value: str, unit: str) -> float:
    return float(value) * _UNITS[unit]


def parse(output: str) -> WrkResult:
    """The figures of a ``wrk --latency`` report."""
    def need(pattern: str) -> re.Match[str]:
        found = re.search(pattern, output, re.MULTILINE)
        if found is None:
            raise WrkError(f"wrk output without {pattern!r}: {output[-400:]}")
        return found

    percentiles = {}
    for pct in ("50", "75", "90", "99"):
        m = need(rf"^\s+{pct}(?:\.0+)?%\s+{_DURATION}\s*$")
        percentiles[pct] = _ms(m.group(1), m.group(2))
    latency = need(rf"^\s+Latency\s+{_DURATION}\s+{_DURATION}\s+{_DURATION}")
    done = need(r"^\s+(\d+) requests in ([\d.]+)(us|ms|s|m)")
    rate = need(r"^Requests/sec:\s+([\d.]+)")
    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                        output)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return WrkResult(
        requests=int(done.group(1)),
        seconds=_ms(done.group(2), done.group(3)) / 1e3,
        requests_per_s=float(rate.group(1)),
        p50_ms=percentiles["50"],
        p75_ms=percentiles["75"],
        p90_ms=percentiles["90"],
        p99_ms=percentiles["99"],
        max_ms=_ms(latency.group(5), latency.group(6)),
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        socket_errors=sum(int(g) for g in sockets.groups()) if sockets else 0,
    )


def run_wrk(url: str, duration: float, connections: int, threads: int = 2,
            headers: tuple[str, ...] = ()) -> tuple[WrkResult, str]:
    """Load ``url`` for ``duration`` seconds; (figures, wrk's own text)."""
    if not url.startswith("http://127.0.0.1:"):
        raise WrkError(f"refusing to load {url}: only the loopback site is measured")
    cmd = ["wrk", f"-t{max(1, min(threads, connections))}", f"-c{connections}",
           f"-d{max(1, round(duration))}s", "--latency", "--timeout", "30s"]
    for header in headers:
        cmd += ["-H", header]
    cmd.append(url)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
    if proc.returncode != 0:
        raise WrkError(f"wrk exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return parse(proc.stdout), proc.stdout
