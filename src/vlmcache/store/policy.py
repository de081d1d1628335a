"""How one store tier shares its bytes among tenants (issue 14, seed 004).

Global LRU lets a tenant that never reuses anything (a flood of unique images) evict another
tenant's hot catalog. Three independent remedies, each configurable per tier:

* **per-tenant byte quota**: the bytes a tenant is guaranteed. A tenant may use free space
  beyond it, but once the tier is full, victims come from the tenant furthest above its
  quota, so a tenant within its quota is never evicted by another's churn;
* **admission on second sight**: a chunk is stored only the second time it is offered (the
  first offer leaves a fingerprint in a bounded ghost list), so one-off content never
  displaces anything;
* **eviction favouring reuse** (segmented LRU): an entry hit at least once moves to a
  protected segment (at most ``protected_fraction`` of the capacity) that is evicted only
  after every never-reused entry.

:class:`TenantLedger` holds the order and the per-tenant accounting; it is a plain class the
stores drive under their own lock (it is not thread-safe on its own).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from vlmcache.config import VlmCacheConfig

Admission = Literal["always", "second_sight"]
Tenant = str | None
MAX_TRACKED_TENANTS = 10_000  # counters of idle tenants beyond this are forgotten


@dataclass(frozen=True)
class TierPolicy:
    """Sharing rules of one tier. The defaults are plain global LRU admitting everything.

    Attributes:
        tenant_quota_bytes: bytes of this tier each tenant is guaranteed (see the module
            docstring); 0: no quota.
        admission: ``"always"`` or ``"second_sight"`` (store on the second offer only).
        ghost_entries: fingerprints the second-sight filter remembers (oldest forgotten).
        protect_reused: segmented LRU (entries with a hit outlive never-reused ones).
        protected_fraction: share of the capacity the protected segment may hold.
    """

    tenant_quota_bytes: int = 0
    admission: Admission = "always"
    ghost_entries: int = 65_536
    protect_reused: bool = False
    protected_fraction: float = 0.8

    def __post_init__(self) -> None:
        if self.tenant_quota_bytes < 0:
            raise ValueError(f"tenant_quota_bytes must be >= 0, got {self.tenant_quota_bytes}")
        if self.admission not in ("always", "second_sight"):
            raise ValueError(f"admission must be 'always' or 'second_sight', "
                             f"got {self.admission!r}")
        if self.ghost_entries < 1:
            raise ValueError(f"ghost_entries must be >= 1, got {self.ghost_entries}")
        if not 0.0 < self.protected_fraction <= 1.0:
            raise ValueError(f"protected_fraction must be in (0, 1], "
                             f"got {self.protected_fraction}")


@dataclass(frozen=True)
class TenantStats:
    """One tenant's counters in one tier (``tenant`` None: requests without a tenant)."""

    tenant: Tenant
    hits: int
    misses: int
    evictions: int
    entries: int
    occupancy_bytes: int
    bytes_read: int
    bytes_written: int
    not_admitted: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


@dataclass
class _Counters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    occupancy: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    not_admitted: int = 0


@dataclass
class _Meta:
    tenant: Tenant
    nbytes: int
    protected: bool = False


@dataclass
class _Segments:
    """A tenant's keys in LRU order, never-reused and protected apart."""

    probation: OrderedDict[str, None] = field(default_factory=OrderedDict)
    protected: OrderedDict[str, None] = field(default_factory=OrderedDict)


class GhostFilter:
    """Admission on second sight: remembers fingerprints of keys offered once (bounded)."""

    def __init__(self, entries: int) -> None:
        self._entries = entries
        self._seen: OrderedDict[int, None] = OrderedDict()

    def second_sight(self, key: str) -> bool:
        """``True`` when ``key`` was offered before (and forget it); else remember it."""
        mark = hash(key)  # a collision only admits a chunk early: harmless
        if mark in self._seen:
            del self._seen[mark]
            return True
        self._seen[mark] = None
        if len(self._seen) > self._entries:
            self._seen.popitem(last=False)
        return False


class TenantLedger:
    """Eviction order, admission and per-tenant accounting of one tier (caller locks)."""

    def __init__(self, policy: TierPolicy, capacity_bytes: int) -> None:
        self.policy = policy
        self.capacity_bytes = capacity_bytes
        self._meta: dict[str, _Meta] = {}
        self._all = _Segments()
        self._tenants: dict[Tenant, _Segments] = {}
        self._counters: dict[Tenant, _Counters] = {}
        self._holders: dict[Tenant, None] = {}  # tenants holding entries (ordered: ties)
        self._protected_bytes = 0
        self._ghost = GhostFilter(policy.ghost_entries)

    def fits(self, nbytes: int) -> bool:
        """Whether a chunk of ``nbytes`` can ever be kept (capacity and quota)."""
        quota = self.policy.tenant_quota_bytes
        return nbytes <= self.capacity_bytes and (not quota or nbytes <= quota)

    def admit(self, key: str, tenant: Tenant) -> bool:
        """Whether to store ``key`` now (replacing a stored key is always admitted)."""
        if self.policy.admission == "always" or key in self._meta:
            return True
        if self._ghost.second_sight(key):
            return True
        self._count(tenant).not_admitted += 1
        return False

    def add(self, key: str, tenant: Tenant, nbytes: int) -> None:
        """Record a stored key as most recently used (call :meth:`remove` first if present)."""
        self._meta[key] = _Meta(tenant, nbytes)
        self._all.probation[key] = None
        self._segments(tenant).probation[key] = None
        counters = self._count(tenant)
        counters.entries += 1
        counters.occupancy += nbytes
        counters.bytes_written += nbytes
        self._holders[tenant] = None

    def remove(self, key: str) -> bool:
        """Forget ``key`` (an explicit delete or a replacement); ``True`` if it was known."""
        meta = self._meta.pop(key, None)
        if meta is None:
            return False
        segment = "protected" if meta.protected else "probation"
        del getattr(self._all, segment)[key]
        del getattr(self._segments(meta.tenant), segment)[key]
        if meta.protected:
            self._protected_bytes -= meta.nbytes
        counters = self._count(meta.tenant)
        counters.entries -= 1
        counters.occupancy -= meta.nbytes
        if not counters.entries:
            self._holders.pop(meta.tenant, None)
            del self._tenants[meta.tenant]
        return True

    def hit(self, key: str) -> None:
        """Count a hit on ``key``; it becomes most recently used (protected if so configured)."""
        meta = self._meta[key]
        counters = self._count(meta.tenant)
        counters.hits += 1
        counters.bytes_read += meta.nbytes
        if meta.protected:
            self._all.protected.move_to_end(key)
            self._segments(meta.tenant).protected.move_to_end(key)
        elif self.policy.protect_reused:
            self._protect(key, meta)
        else:
            self._all.probation.move_to_end(key)
            self._segments(meta.tenant).probation.move_to_end(key)

    def miss(self, tenant: Tenant) -> None:
        self._count(tenant).misses += 1

    def victims(self, tenant: Tenant, nbytes: int, occupancy: int) -> list[str]:
        """Keys to evict (already forgotten here) so ``nbytes`` of ``tenant`` fit.

        Only when the tier is full: each victim comes from the tenant furthest above its
        quota (the incoming chunk counted), else from everyone; within that set, never-reused
        entries go before protected ones, least recently used first.
        """
        out: list[str] = []
        while occupancy + nbytes > self.capacity_bytes:
            over = self._most_over_quota(tenant, nbytes)
            key = (_oldest(self._segments(over)) if over is not None else None) \
                or _oldest(self._all)
            if key is None:
                break
            occupancy -= self._evict(key)
            out.append(key)
        return out

    def _most_over_quota(self, incoming: Tenant, nbytes: int) -> Tenant | None:
        """The tenant furthest above its quota (counting the incoming chunk), if any."""
        quota = self.policy.tenant_quota_bytes
        if not quota:
            return None
        worst, excess = None, 0
        for tenant in self._holders:
            used = self._counters[tenant].occupancy + (nbytes if tenant == incoming else 0)
            if used - quota > excess:
                worst, excess = tenant, used - quota
        if incoming not in self._holders and nbytes - quota > excess:
            worst = incoming
        return worst

    def order(self) -> list[str]:
        """Keys in eviction order (next victim first, ignoring quotas)."""
        return list(self._all.probation) + list(self._all.protected)

    def tenant_stats(self) -> list[TenantStats]:
        """Per-tenant counters, tenants in first-seen order."""
        return [TenantStats(t, c.hits, c.misses, c.evictions, c.entries, c.occupancy,
                            c.bytes_read, c.bytes_written, c.not_admitted)
                for t, c in self._counters.items()]

    def _evict(self, key: str) -> int:
        meta = self._meta[key]
        self.remove(key)
        self._count(meta.tenant).evictions += 1
        return meta.nbytes

    def _protect(self, key: str, meta: _Meta) -> None:
        """Move a first-hit entry to the protected segment, demoting its overflow."""
        del self._all.probation[key]
        del self._segments(meta.tenant).probation[key]
        meta.protected = True
        self._all.protected[key] = None
        self._segments(meta.tenant).protected[key] = None
        self._protected_bytes += meta.nbytes
        limit = self.policy.protected_fraction * self.capacity_bytes
        while self._protected_bytes > limit and len(self._all.protected) > 1:
            old, _ = self._all.protected.popitem(last=False)
            old_meta = self._meta[old]
            del self._segments(old_meta.tenant).protected[old]
            old_meta.protected = False
            self._protected_bytes -= old_meta.nbytes
            self._all.probation[old] = None  # demoted: most recently used of the probation
            self._segments(old_meta.tenant).probation[old] = None

    def _segments(self, tenant: Tenant) -> _Segments:
        segments = self._tenants.get(tenant)
        if segments is None:
            segments = self._tenants[tenant] = _Segments()
        return segments

    def _count(self, tenant: Tenant) -> _Counters:
        counters = self._counters.get(tenant)
        if counters is None:
            if len(self._counters) >= MAX_TRACKED_TENANTS:  # e.g. a new tenant per request
                self._forget_an_idle_tenant()
            counters = self._counters[tenant] = _Counters()
        return counters

    def _forget_an_idle_tenant(self) -> None:
        """Drop the counters of the oldest tenant holding nothing (bounds the memory)."""
        for tenant in self._counters:
            if tenant not in self._holders:
                del self._counters[tenant]
                return


@dataclass(frozen=True)
class TenantOccupancy:
    """One tenant's share of a store that keeps its own eviction order (the disk tier)."""

    tenant: Tenant
    entries: int
    occupancy_bytes: int
    evictions: int


class TenantBytes:
    """Per-tenant bytes of a store with its own LRU order, for quotas (caller locks).

    ``quota``: bytes each tenant is guaranteed (0: none); victims then come from the tenant
    furthest above it, as in :class:`TenantLedger`.
    """

    def __init__(self, quota: int) -> None:
        if quota < 0:
            raise ValueError(f"tenant quota must be >= 0, got {quota}")
        self.quota = quota
        self._bytes: dict[Tenant, int] = {}
        self._entries: dict[Tenant, int] = {}
        self._evictions: dict[Tenant, int] = {}

    def fits(self, nbytes: int, capacity: int) -> bool:
        return nbytes <= capacity and (not self.quota or nbytes <= self.quota)

    def add(self, tenant: Tenant, nbytes: int) -> None:
        self._bytes[tenant] = self._bytes.get(tenant, 0) + nbytes
        self._entries[tenant] = self._entries.get(tenant, 0) + 1

    def remove(self, tenant: Tenant, nbytes: int) -> None:
        left = self._entries.get(tenant, 0) - 1
        if left <= 0:
            self._bytes.pop(tenant, None)
            self._entries.pop(tenant, None)
        else:
            self._entries[tenant] = left
            self._bytes[tenant] -= nbytes

    def evicted(self, tenant: Tenant) -> None:
        if tenant in self._evictions or len(self._evictions) < MAX_TRACKED_TENANTS:
            self._evictions[tenant] = self._evictions.get(tenant, 0) + 1

    def clear(self) -> None:
        """Forget occupancy (before a recount); eviction counts stay."""
        self._bytes.clear()
        self._entries.clear()

    def most_over_quota(self, incoming: Tenant, nbytes: int) -> Tenant | None:
        """The tenant furthest above its quota (counting the incoming chunk), if any."""
        if not self.quota:
            return None
        worst, excess = None, 0
        for tenant, used in self._bytes.items():
            used += nbytes if tenant == incoming else 0
            if used - self.quota > excess:
                worst, excess = tenant, used - self.quota
        if incoming not in self._bytes and nbytes - self.quota > excess:
            worst = incoming
        return worst

    def snapshot(self) -> list[TenantOccupancy]:
        tenants = list(self._bytes) + [t for t in self._evictions if t not in self._bytes]
        return [TenantOccupancy(t, self._entries.get(t, 0), self._bytes.get(t, 0),
                                self._evictions.get(t, 0)) for t in tenants]


def _oldest(segments: _Segments) -> str | None:
    for order in (segments.probation, segments.protected):
        for key in order:
            return key
    return None


def tenant_quota_bytes(config: "VlmCacheConfig", budget: int) -> int:
    """Each tenant's guaranteed bytes of a tier of ``budget`` bytes (0: no quota)."""
    return 0 if config.tenant_quota >= 1.0 else max(1, int(config.tenant_quota * budget))


def memory_policy(config: "VlmCacheConfig", budget: int) -> TierPolicy:
    """The memory tier policy ``config`` asks for, for a tier of ``budget`` bytes."""
    quota = tenant_quota_bytes(config, budget)
    return TierPolicy(tenant_quota_bytes=quota, admission=config.admission_memory,
                      ghost_entries=config.admission_ghost_entries,
                      protect_reused=config.eviction == "reuse")
