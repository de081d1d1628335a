"""What every entry point hands vLLM: one --kv-transfer-config on vLLM's offloading connector."""

import json

from vlmcache.config import VlmCacheConfig
from vlmcache.vllm.engine_config import engine_wiring


def test_kv_path_is_vllms_offloading_connector_with_vlmcache_spec_and_tier(tmp_path):
    config = VlmCacheConfig.from_dict({"store_path": str(tmp_path), "memory_budget": "1GiB"})
    wiring = engine_wiring(config, "cuda")
    kv = wiring.kv_transfer
    assert kv["kv_connector"] == "VlmCacheOffloadingConnector"
    assert kv["kv_load_failure_policy"] == "recompute"
    extra = kv["kv_connector_extra_config"]
    assert extra["spec_name"] == "VlmCacheOffloadingSpec"
    assert extra["spec_module_path"] == "vlmcache.vllm.offload_spec"
    assert extra["cpu_bytes_to_use"] == 1024**3
    assert extra["secondary_tiers"] == [{"type": "VlmCacheTier",
                                         "module_path": "vlmcache.vllm.offload_tier"}]
    assert VlmCacheConfig.from_dict(extra["vlmcache"]) == config
    # block hashes reproducible across restarts: fixed seed (env) + canonical serialization
    assert wiring.env["PYTHONHASHSEED"]
    cli = wiring.cli_args()
    assert cli[cli.index("--prefix-caching-hash-algo") + 1] == "sha256_cbor"
    assert json.loads(cli[cli.index("--kv-transfer-config") + 1]) == kv


def test_memory_only_has_no_persistent_tier_and_kv_off_has_no_connector(tmp_path):
    memory = engine_wiring(VlmCacheConfig(store_path=str(tmp_path), disk_budget=0), "cpu")
    assert memory.kv_transfer["kv_connector_extra_config"]["secondary_tiers"] == []
    off = engine_wiring(VlmCacheConfig(store_path=str(tmp_path), enable_kv_load=False,
                                       enable_kv_save=False, enable_encoder_cache=False), "cpu")
    assert off.kv_transfer is None and off.ec_transfer is None
