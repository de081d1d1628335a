"""How a vLLM engine is wired to vlmcache: the one place that builds vLLM's transfer configs.

Every entry point that starts an engine (``CachedLLM``, ``vlmcache serve``, the benchmarks)
asks :func:`engine_wiring` for the ``--kv-transfer-config`` / ``--ec-transfer-config`` values,
the block size and the environment the engine needs, so the KV data path is configured in one
place whichever way the engine is started.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vlmcache.config import VlmCacheConfig

CONNECTOR_NAME = "VlmCacheConnector"
CONNECTOR_MODULE = "vlmcache.vllm.connector"
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
    env: dict[str, str] = field(default_factory=dict)

    def llm_kwargs(self, block_size: bool = True) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` (vLLM's config objects); ``block_size=False``
        leaves the block size out (a caller's own choice wins)."""
        args: dict[str, Any] = {}
        if block_size and self.block_size is not None:
            args["block_size"] = self.block_size
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
        if self.kv_transfer is not None:
            args += ["--kv-transfer-config", json.dumps(self.kv_transfer)]
        if self.ec_transfer is not None:
            args += ["--ec-transfer-config", json.dumps(self.ec_transfer)]
        return args


def engine_wiring(config: VlmCacheConfig, device_type: str) -> EngineWiring:
    """The engine wiring ``config`` asks for on a ``device_type`` (``"cuda"``, ``"cpu"``)."""
    extra = config.to_dict()
    kv = {"kv_connector": CONNECTOR_NAME, "kv_connector_module_path": CONNECTOR_MODULE,
          "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
          "kv_connector_extra_config": extra}
    ec = None
    if config.enable_encoder_cache:
        ec = {"ec_connector": EC_CONNECTOR_NAME, "ec_connector_module_path": EC_CONNECTOR_MODULE,
              "ec_role": "ec_both", "ec_buffer_device": device_type,
              "ec_connector_extra_config": extra}
    return EngineWiring(kv, ec, config.block_size)
