"""A one-line progress bar per stage, on stderr (a new line per tenth when stderr is not a terminal)."""

from __future__ import annotations

import sys
from collections import Counter
from typing import TextIO


class Progress:
    def __init__(self, stage: str, total: int, stream: TextIO | None = None, width: int = 24) -> None:
        self.stage = stage
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.done = 0
        self.counts: Counter[str] = Counter()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_tenth = 0

    def update(self, outcome: str) -> None:
        self.done += 1
        self.counts[outcome] += 1
        tenth = self.done * 10 // max(self.total, 1)
        if self._tty or tenth != self._last_tenth or self.done == self.total:
            self._last_tenth = tenth
            self._draw()

    def close(self) -> None:
        if self.total == 0:
            self._draw()
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()

    def line(self) -> str:
        filled = self.width * self.done // max(self.total, 1) if self.total else self.width
        bar = "#" * filled + "-" * (self.width - filled)
        counts = "  ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        return f"[{self.stage:<10}] [{bar}] {self.done}/{self.total}  {counts}".rstrip()

    def _draw(self) -> None:
        self.stream.write(("\r" + self.line()) if self._tty else self.line() + "\n")
        self.stream.flush()
