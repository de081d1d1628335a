"""Load-versus-recompute cost model for the persistent KV tier (plain Python, no vLLM).

Before the persistent tier promises a chunk, it asks :class:`CostModel` whether reading the
chunk's bytes is predicted to be faster than letting the engine recompute its tokens:

    load_s      = fixed_s + bytes / read_bytes_per_s     (the tier's own reads, learned online)
    recompute_s = tokens / prefill_tokens_per_s          (the engine's prefill, learned online)

Both rates start from configured priors and follow an exponential moving average of what is
measured, so a tier that reads slower than recompute stops being used (a 7B MHA model's
~0.5 MB per token from disk), and one that reads fast (a GQA model's ~56 KB per token from the
page cache) is used.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger(__name__)

Choice = Literal["load", "skip"]

#: Weight of a new measurement in the moving averages.
EMA_ALPHA = 0.3
#: Reads smaller than this say more about fixed cost than bandwidth: not learned from.
MIN_LEARN_BYTES = 256 * 1024
#: Prefill steps with fewer tokens are dominated by per-step overhead: not learned from.
MIN_LEARN_TOKENS = 64


@dataclass(frozen=True)
class CostPriors:
    """Starting estimates, used until the first measurements arrive."""

    read_bytes_per_s: float
    read_fixed_s: float
    prefill_tokens_per_s: float

    def __post_init__(self) -> None:
        if self.read_bytes_per_s <= 0 or self.prefill_tokens_per_s <= 0:
            raise ValueError("cost priors: rates must be positive")
        if self.read_fixed_s < 0:
            raise ValueError("cost priors: read_fixed_s must be >= 0")


@dataclass(frozen=True)
class CostDecision:
    """One load-or-skip decision and why (goes into the ReuseReport and a log line)."""

    choice: Choice
    tokens: int
    nbytes: int
    load_ms: float
    recompute_ms: float

    @property
    def reason(self) -> str:
        op = "<" if self.choice == "load" else ">="
        return (f"predicted load {self.load_ms:.1f} ms {op} recompute {self.recompute_ms:.1f} ms "
                f"({self.nbytes / 1e6:.1f} MB, {self.tokens} tokens)")


class CostModel:
    """Learns a tier's read bandwidth and the engine's prefill rate; decides load vs skip.

    Thread-safe: the tier's I/O threads report reads while the scheduler asks for decisions.
    """

    def __init__(self, priors: CostPriors, *, enabled: bool = True) -> None:
        self._lock = threading.Lock()
        self._read_bps = priors.read_bytes_per_s
        self._fixed_s = priors.read_fixed_s
        self._prefill_tps = priors.prefill_tokens_per_s
        self._enabled = enabled
        self.reads_observed = 0
        self.prefills_observed = 0

    @property
    def read_bytes_per_s(self) -> float:
        with self._lock:
            return self._read_bps

    @property
    def prefill_tokens_per_s(self) -> float:
        with self._lock:
            return self._prefill_tps

    def observe_read(self, nbytes: int, seconds: float) -> None:
        """Record one read of ``nbytes`` that took ``seconds`` (end to end, in the tier)."""
        if nbytes < MIN_LEARN_BYTES or seconds <= 0:
            return
        rate = nbytes / max(seconds - self._fixed_s, seconds * 0.5)
        with self._lock:
            self._read_bps += EMA_ALPHA * (rate - self._read_bps)
            self.reads_observed += 1

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """Record one engine step that computed ``tokens`` prompt tokens in ``seconds``."""
        if tokens < MIN_LEARN_TOKENS or seconds <= 0:
            return
        rate = tokens / seconds
        with self._lock:
            self._prefill_tps += EMA_ALPHA * (rate - self._prefill_tps)
            self.prefills_observed += 1

    def decide(self, tokens: int, nbytes: int) -> CostDecision:
        """Whether loading ``nbytes`` beats recomputing ``tokens`` (always load if disabled)."""
        with self._lock:
            load_s = self._fixed_s + nbytes / self._read_bps
            recompute_s = tokens / self._prefill_tps
        wins = load_s < recompute_s or not self._enabled
        return CostDecision("load" if wins else "skip", tokens, nbytes,
                            load_s * 1e3, recompute_s * 1e3)
