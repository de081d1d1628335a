"""How a vLLM engine is wired to vlmcache: the one place that builds vLLM's transfer configs.

Every entry point that starts an engine (``CachedLLM``, ``vlmcache serve``, the benchmarks)
asks :func:`engine_wiring` for the ``--kv-transfer-config`` / ``--ec-transfer-config`` values,
the block size and the environment the engine needs, so the KV data path is configured in one
place whichever way the engine is started.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from vlmcache.config import VlmCacheConfig
from vlmcache.tenant_secret import SALT_ENV, public_config
from vlmcache.vllm.compat import ec_transfer_costs_runner

logger = logging.getLogger(__name__)

CONNECTOR_NAME = "VlmCacheOffloadingConnector"
CONNECTOR_MODULE = "vlmcache.vllm.offload_connector"
#: vLLM's offloading connector loads the spec by name from this module (no vLLM import here).
SPEC_NAME = "VlmCacheOffloadingSpec"
SPEC_MODULE = "vlmcache.vllm.offload_spec"
TIER_TYPE = "VlmCacheTier"
TIER_MODULE = "vlmcache.vllm.offload_tier"
#: vLLM's block hashes, which persisted keys build on, are reproducible across restarts only
#: with a fixed PYTHONHASHSEED (it seeds their root) and a canonical serialization.
HASH_SEED = "0"
HASH_ALGO = "sha256_cbor"
EC_CONNECTOR_NAME = "VlmCacheECConnector"
EC_CONNECTOR_MODULE = "vlmcache.vllm.ec_connector"


@dataclass(frozen=True)
class EngineWiring:
    """What an engine needs to run with vlmcache underneath.

    ``kv_transfer`` / ``ec_transfer`` are vLLM's ``KVTransferConfig`` / ``ECTransferConfig``
    fields as plain values (``None``: that connector is off); ``env`` must be set in the
    engine's environment before it starts (its child processes inherit it).
    """

    kv_transfer: dict[str, Any] | None
    ec_transfer: dict[str, Any] | None
    block_size: int | None
    env: dict[str, str] = field(default_factory=dict, repr=False)  # may hold the salt
    hash_algo: str | None = None

    def llm_kwargs(self, block_size: bool = True) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` (vLLM's config objects); ``block_size=False``
        leaves the block size out (a caller's own choice wins)."""
        args: dict[str, Any] = {}
        if block_size and self.block_size is not None:
            args["block_size"] = self.block_size
        if self.hash_algo is not None:
            args["prefix_caching_hash_algo"] = self.hash_algo
        if self.kv_transfer is not None:
            from vllm.config import KVTransferConfig

            args["kv_transfer_config"] = KVTransferConfig(**self.kv_transfer)
        if self.ec_transfer is not None:
            from vllm.config import ECTransferConfig

            args["ec_transfer_config"] = ECTransferConfig(**self.ec_transfer)
        return args

    def cli_args(self) -> list[str]:
        """The same as command-line arguments of vLLM's OpenAI server."""
        args: list[str] = []
        if self.block_size is not None:
            args += ["--block-size", str(self.block_size)]
        if self.hash_algo is not None:
            args += ["--prefix-caching-hash-algo", self.hash_algo]
        if self.kv_transfer is not None:
            args += ["--kv-transfer-config", json.dumps(self.kv_transfer)]
        if self.ec_transfer is not None:
            args += ["--ec-transfer-config", json.dumps(self.ec_transfer)]
        return args


def kv_extra_config(config: VlmCacheConfig) -> dict[str, Any]:
    """``kv_connector_extra_config`` of vlmcache's KV path: vLLM's tiering offloader whose CPU
    primary tier holds ``memory_budget`` bytes and whose secondary tier is vlmcache's
    persistent store (none when ``disk_budget`` is 0: memory only)."""
    tiers = [{"type": TIER_TYPE, "module_path": TIER_MODULE}] if config.disk_budget else []
    return {"spec_name": SPEC_NAME, "spec_module_path": SPEC_MODULE,
            "cpu_bytes_to_use": config.memory_budget, "secondary_tiers": tiers,
            "vlmcache": public_config(config)}


def wired_config(config: VlmCacheConfig, device_type: str) -> VlmCacheConfig:
    """``config`` as an engine on ``device_type`` runs it: the encoder-output tier off where
    wiring it would move vLLM off its default model runner (unless
    ``encoder_cache_v1_runner``), with a warning that says so."""
    if config.enable_encoder_cache and not config.encoder_cache_v1_runner \
            and ec_transfer_costs_runner(device_type):
        logger.warning("vlmcache: the encoder-output tier is left out of this engine: "
                       "vLLM's default model runner (V2) does not take its EC transfer here, "
                       "and wiring it would run the whole engine on the V1 runner; set "
                       "encoder_cache_v1_runner to wire it anyway")
        return dataclasses.replace(config, enable_encoder_cache=False)
    return config


def engine_wiring(config: VlmCacheConfig, device_type: str) -> EngineWiring:
    """The engine wiring ``config`` asks for on a ``device_type`` (``"cuda"``, ``"cpu"``)."""
    config = wired_config(config, device_type)
    kv = None
    if config.enable_kv_load or config.enable_kv_save:
        kv = {"kv_connector": CONNECTOR_NAME, "kv_connector_module_path": CONNECTOR_MODULE,
              "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
              "kv_connector_extra_config": kv_extra_config(config)}
    ec = None
    if config.enable_encoder_cache:
        ec = {"ec_connector": EC_CONNECTOR_NAME, "ec_connector_module_path": EC_CONNECTOR_MODULE,
              "ec_role": "ec_both", "ec_buffer_device": device_type,
              "ec_connector_extra_config": public_config(config)}
    env = {"PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", HASH_SEED)}
    if config.tenant_salt:  # never in the transfer configs: vLLM prints them (issue 33)
        env[SALT_ENV] = config.tenant_salt
    return EngineWiring(kv, ec, config.block_size, env, HASH_ALGO)
