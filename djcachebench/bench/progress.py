"""The terminal progress line: per backend, done/total ops and elapsed time.

Drawn only on a TTY (a redrawn line in a log file is noise); elsewhere only a
one-line summary per backend is written, so CI logs still show what ran.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Writes to ``stream`` (stderr by default); ``live`` defaults to stream.isatty()."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._last_draw = 0.0
        self._width = 0

    def say(self, message: str) -> None:
        """A line that stays (clears a live progress line first)."""
        self._clear()
        self.stream.write(message + "\n")
        self.stream.flush()

    def update(self, name: str, done: int, total: int, elapsed: float, force: bool = False) -> None:
        """Redraw the live line, at most ten times a second."""
        if not self.live:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
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
