"""Read cost of a remote tier, learned from its own reads (for the load-vs-recompute choice)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

SMALL_READ_BYTES = 64 * 1024
_ALPHA = 0.2


@dataclass(frozen=True)
class ReadCost:
    """Measured cost of one read: ``latency_s + nbytes / bytes_per_s`` (``samples`` = 0:
    nothing measured yet, both figures are 0 and :meth:`predict_s` returns ``None``)."""

    latency_s: float
    bytes_per_s: float
    samples: int

    def predict_s(self, nbytes: int) -> float | None:
        """Predicted seconds to read ``nbytes``, or ``None`` before any large read."""
        if self.samples == 0 or self.bytes_per_s <= 0:
            return None
        return self.latency_s + nbytes / self.bytes_per_s


class ReadMeter:
    """Exponentially weighted latency (from small operations) and bandwidth (from reads of
    at least :data:`SMALL_READ_BYTES`, after taking the latency off)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latency = 0.0
        self._bandwidth = 0.0
        self._small = self._large = 0

    def observe(self, seconds: float, nbytes: int) -> None:
        """One completed round trip that moved ``nbytes`` of payload in ``seconds``."""
        with self._lock:
            if nbytes < SMALL_READ_BYTES:
                self._latency = seconds if self._small == 0 else _ewma(self._latency, seconds)
                self._small += 1
                return
            transfer = max(seconds - self._latency, seconds * 0.05, 1e-9)
            rate = nbytes / transfer
            self._bandwidth = rate if self._large == 0 else _ewma(self._bandwidth, rate)
            self._large += 1

    def cost(self) -> ReadCost:
        with self._lock:
            if self._large == 0:
                return ReadCost(self._latency, 0.0, 0)
            return ReadCost(self._latency, self._bandwidth, self._large)


def _ewma(old: float, new: float) -> float:
    return (1 - _ALPHA) * old + _ALPHA * new
