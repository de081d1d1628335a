"""The lookup cascade: which tiers are asked, in which order, and what a hit does.

This is the only module that knows the tier order. Tiers only look up; the cascade turns a
hit into a rewrite of the request (canonicalize, then cache exactly below) and reports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

from vlmcache.tiers.exact import ExactRecord, ExactTextTier

TierStatus = Literal["hit", "miss", "skip"]

#: Status names in the order the cascade consults them (the seeds' log-line order).
STATUS_ORDER = ("exact_text", "kv_cache")


@dataclass(frozen=True)
class Resolution:
    """A request after the cascade: what to send to vLLM, and why."""

    prompt: str
    hit_tier: str | None
    similarity: float | None
    statuses: dict[str, TierStatus] = field(default_factory=dict)
    matched: ExactRecord | None = None

    @property
    def rewritten(self) -> bool:
        return self.matched is not None


class Cascade:
    """Exact tier first; later tiers (semantic, image) slot in here, in order."""

    def __init__(self, exact: ExactTextTier | None) -> None:
        self.exact = exact

    def resolve(self, prompt: str, image_hashes: Sequence[str],
                tenant: str | None) -> Resolution:
        """Side-effect free: the request as it should reach vLLM."""
        if self.exact is None:
            return Resolution(prompt, None, None, {"exact_text": "skip"})
        record = self.exact.lookup(prompt, image_hashes, tenant)
        if record is None:
            return Resolution(prompt, None, None, {"exact_text": "miss"})
        return Resolution(record.canonical_prompt, "text:exact", 1.0,
                          {"exact_text": "hit"}, record)

    def capture(self, prompt: str, image_hashes: Sequence[str], tenant: str | None,
                chunk_keys: Sequence[str], prompt_tokens: int) -> None:
        """Record a served request so later ones can be canonicalized to it."""
        if self.exact is not None:
            self.exact.record(prompt, image_hashes, tenant, chunk_keys, prompt_tokens)
