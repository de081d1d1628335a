"""Load-versus-encode decision for the encoder-output tier (plain Python, no vLLM).

The KV tier's :class:`~vlmcache.vllm.cost.CostModel`, applied to encoder outputs: an output
in the store's memory is always loaded (a copy to the device beats any encoder pass); one on
disk only when its read is predicted faster than encoding the item again:

    load_s   = fixed_s + bytes / read_bytes_per_s        (learned from the workers' reads)
    encode_s = embeds / encoder_embeds_per_s             (``encoder_embeds_per_s_prior``)

A video's output can be hundreds of MB, so on a slow disk it is re-encoded. The embeds of a
stored output come from its size (``bytes_per_embed``: the language model's hidden size times
its dtype's bytes), so the decision reads nothing but the store's index.
"""

from __future__ import annotations

import logging
from typing import Callable

from vlmcache.vllm.cost import CostDecision, CostModel

logger = logging.getLogger(__name__)

Locate = Callable[[str], "tuple[str, int] | None"]


class EncoderGate:
    """Whether a stored encoder output is worth loading (its cost model learns the read rate
    from the workers' timed reads: :meth:`EncoderPlanner.observe_reads`)."""

    def __init__(self, cost: CostModel, locate: Locate, bytes_per_embed: int) -> None:
        if bytes_per_embed <= 0:
            raise ValueError("bytes_per_embed must be positive")
        self.cost = cost
        self._locate = locate
        self._bytes_per_embed = bytes_per_embed
        self.skipped = 0
        self._logged_skip = False

    def decide(self, key: str) -> CostDecision | None:
        """The decision for a disk-resident output; ``None`` when it is in memory or absent
        (nothing to decide: load it, or the lookup misses)."""
        where = self._locate(key)
        if where is None or where[0] == "memory":
            return None
        nbytes = where[1]
        decision = self.cost.decide(max(1, nbytes // self._bytes_per_embed), nbytes)
        if decision.choice == "skip":
            self.skipped += 1
            log = logger.debug if self._logged_skip else logger.info
            self._logged_skip = True
            log("vlmcache encoder tier: encoding instead of loading %s: %s", key[:16],
                decision.reason)
        return decision
