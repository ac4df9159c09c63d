"""A progress line on a terminal for long work (streaming a checkpoint's weights, optimizing a
model's programs): rewritten in place at most ten times a second, and nothing at all when
stderr is not a terminal (a log, CI) or EQSAT_QUIET=1."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO


class ProgressLine:
    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None):
        self.stream = stream or sys.stderr
        if enabled is None:
            enabled = self.stream.isatty() and os.environ.get("EQSAT_QUIET", "0") != "1"
        self.enabled = enabled
        self._last = 0.0
        self._width = 0

    def show(self, text: str, force: bool = False) -> None:
        """Replace the line with `text` (skipped when the last one is under 0.1 s old)."""
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < 0.1):
            return
        self._last = now
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def done(self, text: str = "") -> None:
        """End the line (with a last `text`), so that other output starts on a new one."""
        if not self.enabled or not (text or self._width):
            return
        if text:
            self.show(text, force=True)
        self.stream.write("\n")
        self.stream.flush()
        self._width = 0


def bytes_text(done: int, total: int, seconds: float) -> str:
    rate = done / seconds / 1e9 if seconds > 0 else 0.0
    return f"{done / 1e9:.2f} of {total / 1e9:.2f} GB, {rate:.2f} GB/s"
