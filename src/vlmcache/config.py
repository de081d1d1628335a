"""vlmcache's one configuration object. Every default lives here.

A :class:`VlmCacheConfig` is frozen and validated once, when it is built. It can be built from
a dict, a YAML file, or vLLM's ``kv_connector_extra_config`` (flat keys, plus an optional
``config_file`` naming a YAML file whose values the other keys override).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping, get_args, get_type_hints

from vlmcache.config_ranges import RANGES, check_range
from vlmcache.errors import ConfigError

GiB = 1024**3
DiskWrite = Literal["async", "sync"]
ImageEmbedderName = Literal["colour-layout", "efficientnet-lite0", "phash", "sscd", "clip"]
ClientUuidPolicy = Literal["replace", "refuse", "trust"]  # issue 12
RemoteImagePolicy = Literal["refuse", "fetch"]  # issue 12
AdmissionName = Literal["always", "second_sight"]  # issue 14A
EvictionName = Literal["lru", "reuse"]  # issue 14A
KvBlockLayout = Literal["per_layer", "cross_layer"]  # issue 11
ProxyRouting = Literal["affinity", "round_robin"]  # issue 35

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
               "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


def parse_bytes(value: object, key: str) -> int:
    """``4294967296``, ``"4GiB"``, ``"500MB"`` or ``"1.5G"`` -> bytes; errors name ``key``."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a byte size such as 4GiB or 500MB, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and (m := _SIZE_RE.match(value)):
        unit = (m.group(2) or "").lower().rstrip("b")
        n = int(float(m.group(1)) * _SIZE_UNITS[unit])
    else:
        raise ConfigError(f"{key}: expected a byte size such as 4GiB or 500MB, got {value!r}")
    if n < 0 or (n == 0 and key != "disk_budget"):  # disk_budget 0: memory only
        raise ConfigError(f"{key}: must be a positive byte size, got {value!r}")
    return n


@dataclass(frozen=True)
class VlmCacheConfig:
    """Settings of one vlmcache deployment (all tiers, all stores).

    Attributes:
        store_path: directory of the persistent store (chunks, manifests, tier indexes).
        memory_budget: bytes of CPU memory the in-memory chunk tier may hold.
        disk_budget: bytes the on-disk chunk tier may hold; 0 keeps KV in memory only.
        disk_write: ``"async"`` writes chunks to disk behind the request (default);
            ``"sync"`` finishes the write before the step returns.
        block_size: KV block size in tokens passed to vLLM; ``None`` keeps vLLM's default.
        enable_exact: the exact normalized-prompt tier (L0.5).
        enable_kv_load: load stored KV blocks into vLLM (a lookup that finds nothing is a miss).
        enable_kv_save: capture newly computed full KV blocks into the store.
        enable_encoder_cache: persist vision-encoder outputs and load them instead of
            running the encoder (L1.5).
        encoder_cache_v1_runner: where vLLM's default model runner cannot take the encoder
            tier's EC transfer (vLLM 0.26's V2 runner on GPUs), wire the tier anyway: the
            whole engine then runs vLLM's V1 model runner. Off: the tier is left out there
            (a warning says so) and the engine runs as vLLM alone would.
        encoder_memory_budget: bytes of CPU memory for encoder outputs.
        encoder_disk_budget: bytes of disk for encoder outputs.
        semantic_text_threshold: cosine similarity a paraphrase must reach (L1).
        image_threshold: cosine similarity an image candidate must reach (L2); each
            candidate is then verified (``image_verify_threshold``).
        max_false_hit_rate: the false-hit rate the calibrated thresholds are picked for
            (from the curves in the calibration file, measured by the fidelity benchmark).
        image_verify_threshold: largest verifier distance (aligned RGB thumbnails, 0-1)
            a candidate image may have; ``None`` picks it from the calibration file.
        image_candidates: image candidates verified per lookup.
        image_candidate_shift: when none of the image's own candidates is verified, the
            search is repeated with the image shifted by this many 64ths of its side left,
            right, up and down (moving video frames), for up to ``image_candidates`` more;
            0: no second search (e.g. for a slow embedder).
        semantic_facet_threshold: lower cosine a paraphrase may have when its facets
            (question kind, negation, colour, shape, number, side) all agree; ``None``
            picks it from the calibration file.
        calibration_file: JSON written by ``benchmarks/fidelity.py --calibration-out``;
            ``None`` uses the one shipped with vlmcache.
        prompt_threshold: cosine similarity a whole prompt must reach (L2 prompt layer).
        enable_image_embedding: the near-duplicate image tier (L2, needs ``[vision]``).
        enable_semantic_text: the paraphrase tiers (L1 and L2 prompt, needs ``[semantic]``).
        enable_gates: refuse paraphrase hits differing in negation/colour/shape/number/side.
        image_embedder: ``colour-layout``, ``efficientnet-lite0``, ``phash``, ``sscd`` or
            ``clip`` (local weights).
        image_embedder_path: local weights for ``sscd`` (optional) or ``clip`` (required).
        image_embedder_dim: embedding size of a ``clip`` model.
        image_store_budget: bytes of disk for canonical images (a quarter of it, at most
            256 MiB, in memory); evicted images leave the index.
        vector_index_hnsw_threshold: entries past which an index switches from exact
            search to HNSW.
        tenant_salt: a deployment-wide secret folded into every key.
        model_revision: overrides the weights digest (only for weights vlmcache cannot read,
            e.g. ``load_format="dummy"`` benchmarks).
        min_load_tokens: a stored prefix shorter than this is not worth loading.
        exact_max_entries: how many prompts the exact tier remembers (LRU beyond).
        log_requests: log the per-request reuse line at INFO.
        enable_response_cache: serve deterministic repeats (greedy or seeded, one choice)
            from stored responses without the engine (the front only).
        response_ttl_s: seconds a stored response may be served.
        response_memory_budget: bytes of memory for stored responses (LRU beyond).
        response_max_entry_bytes: larger responses are not stored.
        response_after_canonical: when the cascade canonicalizes a request (exact-tier
            normalization, near-duplicate image or video, paraphrase), look the response
            tier up again under the canonical request's key (what the engine would be
            sent) and answer with its stored answer; an engine answer to a canonicalized
            request is then stored under both keys. On by default: on the serving
            benchmark's trace both settings gave the same answer to each of 1,200 requests,
            and on sent 120 of them to the engine instead of 330 (docs/serving.md,
            *Response tier*). Off: only the request as sent is looked up.
        client_image_uuids: what the front does with a client's ``uuid`` on an image part:
            ``replace`` it by a content- and tenant-derived identity (default), ``refuse``
            the request, or ``trust`` it (only for callers you trust: it is vLLM's cache key).
        allow_embeds: let clients send ``image_embeds`` / ``prompt_embeds`` parts (trusted
            callers only: vLLM runs them unchecked).
        remote_images: ``refuse`` http(s) image URLs with a 400 (default), or ``fetch`` them
            in the front within ``remote_image_timeout_s`` and ``max_image_bytes``.
        remote_image_timeout_s: time limit of one remote image fetch.
        max_image_bytes: largest encoded image the front accepts.
        max_image_pixels: largest decoded image (width x height) the front accepts.
        proxy_routing: which upstream ``vlmcache proxy`` sends a request to: ``affinity``
            (default: the upstream that rendezvous hashing picks for the tenant's canonical
            media identities, else prompt prefix, so that the replica whose prefix and
            encoder caches hold that image serves it) or ``round_robin``.
        proxy_affinity_slack, proxy_affinity_factor: under affinity, the preferred upstream
            is passed over (for the next in the key's order, then the least loaded) while it
            has more than ``factor * least + slack`` requests in flight, ``least`` being the
            least loaded live upstream's count.
        proxy_down_s: under affinity, how long an upstream that refused a connection is
            passed over.
        proxy_workers: front processes of ``vlmcache proxy`` on its one port (one process
            tops out near 80 image misses per second); more than 1 needs ``redis_url``
            (with ``redis_share_records``): the workers share their tiers through it.
        record_wait_ms: longest a lookup waits for the records of answers already sent
            (so that a sequential client's next request finds them); past it the lookup goes
            on (a variant of a request still being recorded may miss), counted in
            ``vlmcache_front_record_waits_cut_total``.
        max_images_per_request: most images one request may carry.
        max_video_bytes: largest encoded video (``video_url`` part) the front accepts.
        max_video_frames: most frames the model's sampling may take from one video.
        max_video_pixels: largest video frame (width x height) the front accepts.
        max_video_duration_s: longest video (seconds, as its container states) accepted.
        max_videos_per_request: most videos one request may carry.
        enable_video_near_duplicates: canonicalize a near-duplicate video (a lossy
            re-encode, a resized copy) to the one already served, after every frame passes
            the image verifier in the same order and count (``image_verify_threshold``).
        video_store_budget: bytes of memory for canonical videos (their frames' thumbnails
            and bytes; least recently used out, one tenant at most half).
        video_handoff_budget: bytes of decoded frames the front keeps for vLLM's video
            loader in its own process (``vlmcache serve``), so a clip is decoded once, and
            later questions on it (whose bytes vLLM 0.26 must get again) are not decoded
            again; least recently used out; 0: vLLM decodes each clip again.
        video_handoff_ttl_s: how long a kept decode stays after its last use.
        max_request_bytes: largest request body the front accepts.
        miss_overlap_max_inflight: while the front has fewer engine calls in flight than
            this (per process), a request the response tier missed is sent to the engine
            on its own identity while the similarity tiers (image, paraphrase, video) still
            look; the call is kept when they find nothing, and aborted before any of its
            output is sent when they canonicalize the request. Hides their time on a miss
            when the engine has room; under load nothing is sent twice. 0: never.
        held_media_bytes: media the engine's processor cache holds (those this front
            process sent and vLLM answered, estimated at 12 bytes per pixel, least
            recently used out within this budget, below vLLM's ``--mm-processor-cache-gb``)
            are sent by their identity alone, so vLLM's server does not fetch, decode and
            process them again; a refusal (evicted, restarted) resends the full body.
            Never for clients' own uuids (``client_image_uuids: trust``). 0: always in full.
        engine_cpus: CPUs of this host the front leaves to vLLM's own processes (its API
            server, its engine core's launch loop): the front's helper threads and
            ``vlmcache proxy``'s workers run on the others, so the front's compute never
            starves the GPU's feeder. Not applied on a host that would leave the front
            fewer than 2 CPUs; 0: no partition.
        front_thread_nice: how much lower (Linux niceness) the helper threads
            (verification, thumbnails, embeddings, records) of ``vlmcache proxy``'s
            processes run: under contention vLLM's processes win the CPU; 0: the same
            priority. Never applied inside vLLM's API server (``vlmcache serve``), where a
            deprioritized thread holding the GIL would stall vLLM's own event loop.
        metrics_tenant_label: label metrics by tenant (off: one label for all tenants).
        open_routes: comma-separated server routes the front refuses by default (admin,
            pooling, audio, unknown) that an operator opens to every client, untouched
            (issue 33; the table is ``vlmcache.routes``). Default: none.
        redis_url: ``redis://host:port/db`` (``rediss://`` for TLS, ``unix:///path``) of a
            Redis shared by every replica; ``None`` (default) keeps everything local. The
            password never goes in the URL: it is read from ``redis_password_env``.
        redis_password_env: environment variable holding the Redis password (if any).
        redis_tls_ca_file: CA bundle to verify a ``rediss://`` server (default: system CAs).
        redis_prefix: first component of every Redis key vlmcache writes.
        redis_timeout_ms: socket timeout of one Redis operation (a lookup past it is a miss).
        redis_connect_timeout_ms: time limit of opening a connection.
        redis_backoff_max_s: longest pause between reconnect attempts while Redis is down.
        redis_kv_budget: bytes of KV chunks vlmcache keeps in Redis (all replicas together).
        redis_encoder_budget: bytes of encoder outputs in Redis.
        redis_image_budget: bytes of shared canonical images in Redis.
        redis_response_budget: bytes of shared responses (response tier) in Redis.
        redis_chunk_ttl_s: expiry of chunk values in Redis (lets ``maxmemory-policy
            volatile-lru`` evict chunks, never vlmcache's indexes).
        redis_write_queue_bytes: bytes of chunks waiting to be written to Redis; past it,
            writes are dropped (counted).
        redis_share_records: share exact/image/paraphrase records across replicas.
        redis_log_max_entries: length bound of each shared record log (Redis stream).
        redis_sync_interval_s: how often a replica publishes and reads shared records.
        tenant_quota: share of each memory tier's budget (KV, encoder outputs) one tenant
            may hold, in (0, 1]; 1.0 (default): no per-tenant quota. A tenant over its quota
            evicts its own entries, never another tenant's.
        kv_block_layout: how vLLM lays out the GPU KV cache under vlmcache's connector:
            ``cross_layer`` (what vLLM 0.26's offloading connector asks for: one tensor,
            all layers of a block together, heads outermost) or ``per_layer`` (one tensor
            per layer in the attention backend's own layout, as vLLM without a connector,
            and vLLM 0.32's offloading connector). vLLM >= 0.32 always uses ``per_layer``.
        admission_memory: ``second_sight`` (default) or ``always``: keep a chunk in memory
            only the second time it is offered (one-off content never displaces anything).
            On the KV path this is vLLM's CPU offload region: with ``second_sight`` a
            prompt's first miss copies nothing to the CPU; its blocks are captured when they
            are computed again (a hit in vLLM's GPU prefix cache counts only where the
            persistent tier would write them: copying them out delays that hit). Measured on
            an H100 (LLaVA-1.5-7B shape): ``always`` costs 21-24% of batch prefill
            throughput on misses, ``second_sight`` none (``docs/kv-path.md``).
        admission_disk: the same for writes to the disk tier.
        admission_ghost_entries: fingerprints the second-sight filter remembers per tier.
        eviction: ``reuse`` (default): entries hit at least once are evicted only after every
            never-reused entry (segmented LRU); ``lru``: plain LRU.
        disk_write_queue: bytes of KV chunks (at most ``memory_budget``; ``None``, the
            default: ``min(1 GiB, memory_budget)``) that may wait for the disk writer with
            ``disk_write: async``; past it, a put writes the chunk itself (backpressure), so
            a crash never loses more than the queue. The persistent KV tier stages up to
            this many bytes of copied rows, never more than ``memory_budget`` (so vLLM's
            store jobs finish at once); past it, rows are written before their job
            finishes. A crash loses what is queued, and the next start reports it (see
            docs/reliability.md).
    """

    store_path: str = "~/.cache/vlmcache"
    memory_budget: int = 4 * GiB
    disk_budget: int = 50 * GiB
    disk_write: DiskWrite = "async"
    block_size: int | None = None
    enable_exact: bool = True
    enable_kv_load: bool = True
    enable_kv_save: bool = True
    enable_encoder_cache: bool = True
    # never slower than vLLM alone: the tier is not worth the engine's whole runner
    encoder_cache_v1_runner: bool = False
    encoder_memory_budget: int = 1 * GiB
    encoder_disk_budget: int = 20 * GiB
    semantic_text_threshold: float = 0.85
    image_threshold: float = 0.8  # issue 13: the candidate floor of colour-layout
    prompt_threshold: float = 0.85
    enable_image_embedding: bool = False
    enable_semantic_text: bool = False
    enable_gates: bool = True
    # issue 13: colour-layout (no weights) proposes candidates, the verifier decides; on
    # the fidelity benchmark its top-4 held the source image for 99-100% of benign
    # variants (pHash: 67% of 2-3 px shifts), see docs/similarity.md.
    image_embedder: ImageEmbedderName = "colour-layout"
    image_embedder_path: str | None = None
    image_embedder_dim: int | None = None
    image_store_budget: int = 1 * GiB
    vector_index_hnsw_threshold: int = 20_000
    tenant_salt: str = field(default="", repr=False)
    model_revision: str | None = None
    min_load_tokens: int = 1
    exact_max_entries: int = 100_000
    log_requests: bool = True
    # --- issue 13: verified similarity, thresholds from a false-hit bound ---
    max_false_hit_rate: float = 0.01
    image_verify_threshold: float | None = None  # None: from the calibration file
    image_candidates: int = 4
    image_candidate_shift: int = 5
    semantic_facet_threshold: float | None = None  # None: from the calibration file
    calibration_file: str | None = None  # None: the one shipped with vlmcache
    # --- end issue 13 ---
    # --- issue 12: the serving front (response tier, identity, request limits) ---
    enable_response_cache: bool = True
    response_ttl_s: float = 3600.0
    response_memory_budget: int = 256 * 1024**2
    response_max_entry_bytes: int = 1024**2
    response_after_canonical: bool = True  # issue 35: benchmarks/results/canonical-answers.json
    client_image_uuids: ClientUuidPolicy = "replace"
    allow_embeds: bool = False
    remote_images: RemoteImagePolicy = "refuse"
    remote_image_timeout_s: float = 5.0
    max_image_bytes: int = 20 * 1024**2
    max_image_pixels: int = 4096 * 4096
    max_images_per_request: int = 8
    max_video_bytes: int = 32 * 1024**2  # issue 34: video through the front
    max_video_frames: int = 256
    max_video_pixels: int = 3840 * 2160
    max_video_duration_s: float = 900.0
    max_videos_per_request: int = 2
    enable_video_near_duplicates: bool = False
    video_store_budget: int = 256 * 1024**2
    video_handoff_budget: int = 1024**3
    video_handoff_ttl_s: float = 120.0
    max_request_bytes: int = 64 * 1024**2
    engine_cpus: int = 4
    front_thread_nice: int = 5
    metrics_tenant_label: bool = True
    open_routes: str = ""  # issue 33: default deny on every other route
    # --- end issue 12 ---
    # --- issue 35: the proxy's routing over several replicas ---
    proxy_routing: ProxyRouting = "affinity"
    proxy_affinity_slack: int = 8
    proxy_affinity_factor: float = 2.0
    proxy_down_s: float = 5.0
    proxy_workers: int = 1
    # under load the record queue can outgrow the recorder, and every lookup waited for
    # all of it; a bound keeps that a tax of at most this much
    record_wait_ms: float = 100.0
    # the similarity lookups are most of a miss's front time: hidden behind the engine's
    # start while the engine has room (serve-gpu.json's lowest-rate miss TTFT)
    miss_overlap_max_inflight: int = 2
    # vLLM's server decodes and processes every media item again on each request; the
    # ones its processor cache holds can go by identity alone (serving/held_media.py)
    held_media_bytes: int = 1 * GiB
    # --- end issue 35 ---
    # --- issue 14B: the shared Redis tier ---
    redis_url: str | None = None
    redis_password_env: str = "VLMCACHE_REDIS_PASSWORD"
    redis_tls_ca_file: str | None = None
    redis_prefix: str = "vlmcache"
    # 5 ms timed out against a healthy loopback Redis under the GPU host's load (proxy
    # workers, engine, clients on 16 cores), each time taking the link down: 20 ms
    redis_timeout_ms: float = 20.0
    redis_connect_timeout_ms: float = 20.0
    redis_backoff_max_s: float = 5.0
    redis_kv_budget: int = 4 * GiB
    redis_encoder_budget: int = 1 * GiB
    redis_image_budget: int = 512 * 1024**2
    redis_response_budget: int = 256 * 1024**2
    redis_chunk_ttl_s: int = 7 * 86400
    redis_write_queue_bytes: int = 256 * 1024**2
    redis_share_records: bool = True
    redis_log_max_entries: int = 100_000
    redis_sync_interval_s: float = 0.2
    # --- end issue 14B ---
    # --- issue 11: the KV path on vLLM's offloading connector + load-vs-recompute cost model ---
    kv_cost_model: bool = True  # False: always load what the persistent tier holds
    kv_read_bytes_per_s_prior: float = 2e9  # tier read bandwidth until measured
    kv_read_fixed_s: float = 0.0001  # fixed cost of one chunk read (reads run in parallel)
    kv_prefill_tokens_per_s_prior: float = 20_000.0  # engine prefill rate until measured
    # issue 34: encoder outputs on disk are loaded only when the read beats this encode rate
    # (CLIP-L on an H200: 576 embeds in 6.6 ms, results/encoder-tier.json)
    encoder_embeds_per_s_prior: float = 80_000.0
    kv_io_threads: int = 4  # persistent tier reader/writer threads (beside the scheduler)
    kv_block_layout: KvBlockLayout = "cross_layer"
    # --- end issue 11 ---
    # --- issue 14A: tenant fairness and the write-behind bound ---
    tenant_quota: float = 1.0
    admission_memory: AdmissionName = "second_sight"
    admission_disk: AdmissionName = "always"
    admission_ghost_entries: int = 65_536
    eviction: EvictionName = "reuse"
    disk_write_queue: int | None = None  # resolved to min(1 GiB, memory_budget)
    # --- end issue 14A ---

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def store_dir(self) -> Path:
        """``store_path`` with ``~`` and environment variables expanded."""
        return Path(os.path.expandvars(os.path.expanduser(self.store_path)))

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> "VlmCacheConfig":
        """Build from a mapping; unknown keys and bad values raise :class:`ConfigError`."""
        _check_keys(values)
        allowed = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise ConfigError(
                f"unknown config key(s) {unknown}; allowed keys: {sorted(allowed)}"
            )
        return cls(**_coerce_all(dict(values)))

    @classmethod
    def from_yaml(cls, path: str | Path) -> "VlmCacheConfig":
        """Build from a YAML file holding one mapping of config keys."""
        return cls.from_dict(_read_yaml(Path(path)))

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, object] | None) -> "VlmCacheConfig":
        """Build from vLLM's ``kv_connector_extra_config``.

        ``config_file`` (optional) names a YAML file; the other keys override its values.
        Keys vLLM or other connectors put there are ignored only if they start with ``_``.
        """
        _check_keys(extra or {})
        values = {k: v for k, v in dict(extra or {}).items() if not k.startswith("_")}
        config_file = values.pop("config_file", None)
        base = _read_yaml(Path(str(config_file))) if config_file else {}
        return cls.from_dict({**base, **values})

    def to_dict(self) -> dict[str, object]:
        """The config as plain values (round-trips through :meth:`from_dict`)."""
        return dataclasses.asdict(self)


def _read_yaml(path: Path) -> dict[str, object]:
    import yaml

    try:
        text = path.read_text()
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"config_file {str(path)!r} cannot be read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config_file {str(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config_file {str(path)!r} must hold a mapping of config keys")
    return data


_BYTE_KEYS = ("memory_budget", "disk_budget", "encoder_memory_budget", "encoder_disk_budget",
              "image_store_budget",
              # issue 12
              "response_memory_budget", "response_max_entry_bytes", "max_image_bytes",
              "max_request_bytes",
              # issue 14B
              "redis_kv_budget", "redis_encoder_budget", "redis_image_budget",
              "redis_response_budget",
              "redis_write_queue_bytes",
              # issue 14A
              "disk_write_queue")


def _check_keys(values: object) -> None:
    """A mapping whose keys are all strings (YAML turns ``1:`` into an int key)."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"config: expected a mapping of config keys, "
                          f"got {type(values).__name__}")
    bad = [k for k in values if not isinstance(k, str)]
    if bad:
        named = ", ".join(f"{repr(k)[:40]} ({type(k).__name__})" for k in bad[:5])
        raise ConfigError(f"config keys must be strings (names of config keys); got {named}")


def _coerce_all(values: dict[str, object]) -> dict[str, object]:
    for key in _BYTE_KEYS:
        if values.get(key) is not None:  # disk_write_queue may be null (the default)
            values[key] = parse_bytes(values[key], key)
    return values


def _validate(cfg: VlmCacheConfig) -> None:
    hints = get_type_hints(VlmCacheConfig)
    for f in dataclasses.fields(cfg):
        _check_type(f.name, getattr(cfg, f.name), hints[f.name])
        _check_no_nul(f.name, getattr(cfg, f.name))
    for key in RANGES:
        check_range(key, getattr(cfg, key))
    _resolve_write_queue(cfg)
    if cfg.block_size is not None and cfg.block_size % 16:
        raise ConfigError(
            f"block_size: must be a positive multiple of 16 (the CPU backend needs a "
            f"multiple of 32) or null for vLLM's default, got {cfg.block_size}"
        )
    if cfg.image_embedder == "clip" and (not cfg.image_embedder_path
                                         or not cfg.image_embedder_dim):
        raise ConfigError("image_embedder: 'clip' needs image_embedder_path (local weights) "
                          "and image_embedder_dim")
    _validate_redis(cfg)  # issue 14B
    _validate_store_path(cfg)
    _validate_open_routes(cfg)


def _check_no_nul(key: str, value: object) -> None:
    """No NUL in a string key: a path or name with one fails deep inside ``os`` calls."""
    if isinstance(value, str) and "\0" in value and key not in _SECRET_KEYS:  # any secret
        raise ConfigError(f"{key}: must not contain a NUL character")


def _resolve_write_queue(cfg: VlmCacheConfig) -> None:
    """``disk_write_queue``: ``None`` -> min(1 GiB, memory_budget); above the budget: refused
    (the write-behind queue holds copies in memory, within ``memory_budget``)."""
    if cfg.disk_write_queue is None:
        object.__setattr__(cfg, "disk_write_queue", min(GiB, cfg.memory_budget))
    elif cfg.disk_write_queue > cfg.memory_budget:
        raise ConfigError(f"disk_write_queue: must be at most memory_budget "
                          f"({cfg.memory_budget} B), got {cfg.disk_write_queue}")


def _validate_store_path(cfg: VlmCacheConfig) -> None:
    """A directory, existing or not yet created; never an existing file."""
    if not cfg.store_path.strip():
        raise ConfigError("store_path: must name a directory, got an empty string")
    path = cfg.store_dir
    existing = next((p for p in (path, *path.parents) if os.path.exists(p)), None)
    if existing is not None and not os.path.isdir(existing):  # the path or an ancestor
        raise ConfigError(f"store_path: {str(existing)!r} is a file, not a directory "
                          "(must name a directory, existing or to be created)")


_REDIS_SCHEMES = ("redis", "rediss", "unix")


def _validate_redis(cfg: VlmCacheConfig) -> None:
    """The shared Redis tier's settings (issue 14B); the URL never carries a password."""
    from urllib.parse import urlsplit

    if cfg.redis_url is not None:
        try:
            url = urlsplit(cfg.redis_url)
            _ = url.port  # raises ValueError on a malformed port
        except ValueError as exc:
            raise ConfigError(f"redis_url: not a valid URL ({exc})") from None
        if url.scheme not in _REDIS_SCHEMES:
            raise ConfigError(f"redis_url: scheme must be one of {list(_REDIS_SCHEMES)}, "
                              f"got {url.scheme!r}")
        if url.password is not None or "password=" in url.query:
            raise ConfigError("redis_url: must not contain a password; put it in the "
                              f"environment variable {cfg.redis_password_env!r} "
                              "(redis_password_env)")
    if not cfg.redis_prefix or not cfg.redis_prefix.isprintable() or " " in cfg.redis_prefix:
        raise ConfigError(f"redis_prefix: must be a non-empty printable string without "
                          f"spaces, got {cfg.redis_prefix!r}")


#: Keys whose values never appear in an error message (it may reach a log).
_SECRET_KEYS = frozenset({"tenant_salt"})


def _check_type(key: str, value: object, hint: object) -> None:
    args = get_args(hint)
    if args and all(isinstance(a, str) for a in args):  # a Literal
        if value not in args:
            raise ConfigError(f"{key}: must be one of {list(args)}, got {value!r}")
        return
    allowed = tuple(a for a in args if isinstance(a, type)) or (hint,)
    if value is None and type(None) in allowed:
        return
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return
    if (bool not in allowed and isinstance(value, bool)) or not isinstance(value, allowed):
        shown = type(value).__name__ if key in _SECRET_KEYS else repr(value)[:200]
        raise ConfigError(f"{key}: expected {_names(allowed)}, got {shown}")


def _names(types: tuple[object, ...]) -> str:
    return " or ".join(getattr(t, "__name__", str(t)).replace("NoneType", "null") for t in types)


def _validate_open_routes(cfg: VlmCacheConfig) -> None:
    """``open_routes`` names only refused or unknown routes (issue 33)."""
    from vlmcache.routes import parse_open_routes

    try:
        parse_open_routes(cfg.open_routes)
    except ValueError as exc:
        raise ConfigError(f"open_routes: {exc}") from None


# --- issue 12: a misspelled keyword is a ConfigError naming it, not a bare TypeError ---
_dataclass_init = VlmCacheConfig.__init__


def _checked_init(self: VlmCacheConfig, *args: object, **kwargs: object) -> None:
    allowed = {f.name for f in dataclasses.fields(VlmCacheConfig)}
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        import difflib

        hints = {k: difflib.get_close_matches(k, allowed, n=1) for k in unknown}
        named = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "")
                          for k, h in hints.items())
        raise ConfigError(f"unknown config key(s) {named}; allowed keys: {sorted(allowed)}")
    _dataclass_init(self, *args, **kwargs)  # type: ignore[arg-type]


VlmCacheConfig.__init__ = _checked_init  # type: ignore[method-assign]
