"""Progress: per target, done/total ops and elapsed time.

On a TTY a redrawn line (at most ten times a second). Elsewhere (CI, nohup, a
log file) a redrawn line is noise, but silence is worse: a run whose output
is piped must still show that it is alive and how far it got, so a plain line
(target, ops done of total, elapsed) is written at least every
``LINE_EVERY`` seconds, also while the workers start and pre-fill, when no
op count moves. :meth:`Progress.heartbeat` runs a thread that writes those
lines when the caller is blocked between updates.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

#: Seconds between two plain progress lines when the output is not a terminal:
#: under ten by more than the heartbeat's tick (HEARTBEAT), so that a loaded machine
#: that wakes the heartbeat late still shows a line within 10 s.
LINE_EVERY = 9.0
#: Seconds between two checks of the heartbeat thread.
HEARTBEAT = 0.5


class Progress:
    """Writes to ``stream`` (stderr by default); ``live`` defaults to stream.isatty().

    ``clock`` (seconds, monotonic) is replaceable so that the cadence of the
    plain lines can be tested without waiting.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        line_every: float = LINE_EVERY,
    ) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.clock = clock
        self.line_every = line_every
        self._last_draw = 0.0
        self._width = 0
        self._lock = threading.RLock()
        #: What the next plain line reports: the target's label, its phase,
        #: ops done and total, and when the phase began (clock seconds).
        self._label = ""
        self._phase = ""
        self._done = 0
        self._total = 0
        self._since = clock()
        self._last_line = clock()

    def say(self, message: str) -> None:
        """A line that stays (clears a live progress line first)."""
        with self._lock:
            self._clear()
            self.stream.write(message + "\n")
            self.stream.flush()
            self._last_line = self.clock()

    def phase(self, label: str, phase: str, total: int = 0) -> None:
        """A target enters a phase without an op count yet (start-up, pre-fill)."""
        with self._lock:
            self._label, self._phase = label, phase
            self._done, self._total = 0, total
            self._since = self.clock()

    def update(self, name: str, done: int, total: int, elapsed: float, force: bool = False) -> None:
        """Record the count; redraw the live line (ten times a second at most), or
        write a plain line when ``line_every`` seconds passed since the last one."""
        with self._lock:
            if name != self._label or self._phase:
                self._label, self._phase = name, ""
            self._done, self._total = done, total
            self._since = self.clock() - elapsed
            if not self.live:
                self.tick()
                return
            now = time.monotonic()
            if not force and now - self._last_draw < 0.1:
                return
            self._last_draw = now
            self._draw(name, done, total, elapsed)

    def tick(self) -> None:
        """Write the plain line if one is due (not on a terminal: the bar is drawn there)."""
        with self._lock:
            now = self.clock()
            if self.live or not self._label or now - self._last_line < self.line_every:
                return
            self.say(self.line(now))

    def line(self, now: float) -> str:
        """``  redis: 123,456 of 808,000 ops, 12.3 s`` (or the phase, before ops count)."""
        elapsed = now - self._since
        if self._phase:
            return f"  {self._label}: {self._phase}, {elapsed:.1f} s"
        return f"  {self._label}: {self._done:,} of {self._total:,} ops, {elapsed:.1f} s"

    @contextmanager
    def heartbeat(self, period: float = HEARTBEAT) -> Iterator[None]:
        """Call :meth:`tick` every ``period`` seconds from a thread for the block's length."""
        if self.live:
            yield
            return
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(period):
                self.tick()

        thread = threading.Thread(target=beat, name="djcb-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _draw(self, name: str, done: int, total: int, elapsed: float) -> None:
        fraction = done / total if total else 1.0
        bar_width = 24
        filled = int(bar_width * min(fraction, 1.0))
        line = (
            f"  {name:<13} [{'#' * filled}{'.' * (bar_width - filled)}] "
            f"{done:>11,}/{total:,} ops  {elapsed:7.1f}s"
        )
        self._width = max(self._width, len(line))
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()

    def _clear(self) -> None:
        if self.live and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
