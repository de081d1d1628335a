"""A warning that is logged at once, then summarized: faults that repeat per chunk (a full
disk, a full queue) must not write one log line per chunk."""

from __future__ import annotations

import logging
import threading
import time

WARN_INTERVAL_S = 10.0


class RateLimitedWarning:
    """Log the first event at once, then at most one summary line per ``interval_s``."""

    def __init__(self, log: logging.Logger, message: str, interval_s: float = WARN_INTERVAL_S):
        self._log, self._message, self._interval = log, message, interval_s
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._suppressed = 0

    def event(self, detail: str) -> None:
        """Count one event; log it (with the number of silent ones before it) when due."""
        now = time.monotonic()
        with self._lock:
            if now - self._last < self._interval:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        more = f" ({suppressed} more since the last report)" if suppressed else ""
        self._log.warning("%s: %s%s", self._message, detail, more)

    def flush(self) -> None:
        """Log the events suppressed since the last line, if any (e.g. on close)."""
        with self._lock:
            suppressed, self._suppressed = self._suppressed, 0
            self._last = float("-inf") if suppressed else self._last
        if suppressed:
            self._log.warning("%s: %d more since the last report", self._message, suppressed)
