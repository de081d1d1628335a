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


def test_the_encoder_tier_is_left_out_where_it_would_move_vllm_off_its_runner(tmp_path,
                                                                             monkeypatch,
                                                                             caplog):
    import vlmcache.vllm.engine_config as engine_config

    config = VlmCacheConfig(store_path=str(tmp_path))
    monkeypatch.setattr(engine_config, "ec_transfer_costs_runner", lambda device: True)
    with caplog.at_level("WARNING"):
        left_out = engine_wiring(config, "cuda")
    assert left_out.ec_transfer is None and left_out.kv_transfer is not None
    assert "--ec-transfer-config" not in left_out.cli_args()
    assert "encoder_cache_v1_runner" in caplog.text
    from vlmcache.vllm.engine_config import wired_config

    assert not wired_config(config, "cuda").enable_encoder_cache  # what the front reports
    forced = engine_wiring(VlmCacheConfig(store_path=str(tmp_path),
                                          encoder_cache_v1_runner=True), "cuda")
    assert forced.ec_transfer["ec_connector"] == "VlmCacheECConnector"
    monkeypatch.setattr(engine_config, "ec_transfer_costs_runner", lambda device: False)
    assert engine_wiring(config, "cuda").ec_transfer is not None


def test_vlmcache_serve_leaves_the_tier_out_of_argv_and_the_fronts_config(tmp_path,
                                                                         monkeypatch):
    import vlmcache.vllm.engine_config as engine_config
    from vlmcache.serving.launch import serve_command

    monkeypatch.setattr(engine_config, "ec_transfer_costs_runner", lambda device: True)
    (tmp_path / "model").mkdir()
    config = VlmCacheConfig(store_path=str(tmp_path / "store"))
    command = serve_command(str(tmp_path / "model"), config, [], "cuda", tmp_path / "run")
    assert "--ec-transfer-config" not in command.argv
    assert "--kv-transfer-config" in command.argv
    front = json.loads((tmp_path / "run" / "front.json").read_text())
    assert front["config"]["enable_encoder_cache"] is False
