import pytest

from vlmcache.config import GiB, VlmCacheConfig, parse_bytes
from vlmcache.errors import ConfigError


def test_defaults_are_valid_and_frozen():
    cfg = VlmCacheConfig()
    assert cfg.memory_budget == 4 * GiB
    with pytest.raises(Exception):
        cfg.memory_budget = 1  # type: ignore[misc]


@pytest.mark.parametrize("text,expected", [("4GiB", 4 * GiB), ("500MB", 500 * 10**6),
                                           ("1.5G", int(1.5e9)), (" 64 KiB ", 65536), (7, 7)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text, "memory_budget") == expected


@pytest.mark.parametrize("bad", ["lots", "-1GB", 0, True, "4 GiBs"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ConfigError, match="memory_budget"):
        parse_bytes(bad, "memory_budget")


def test_from_dict_accepts_byte_strings_and_roundtrips():
    cfg = VlmCacheConfig.from_dict({"memory_budget": "1GiB", "disk_write": "sync",
                                    "block_size": 32})
    assert cfg.memory_budget == GiB and cfg.block_size == 32
    assert VlmCacheConfig.from_dict(cfg.to_dict()) == cfg


def test_unknown_key_lists_allowed_keys():
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) \['memory'\].*memory_budget"):
        VlmCacheConfig.from_dict({"memory": "1GiB"})


@pytest.mark.parametrize("values,message", [
    ({"disk_write": "later"}, r"disk_write: must be one of \['async', 'sync'\]"),
    ({"block_size": 20}, "block_size: must be a positive multiple of 16"),
    ({"semantic_text_threshold": 1.5}, r"semantic_text_threshold: must be in \(0, 1\]"),
    ({"enable_exact": "yes"}, "enable_exact: expected bool"),
    ({"response_after_canonical": "on"}, "response_after_canonical: expected bool"),
    ({"min_load_tokens": 0}, "min_load_tokens"),
    ({"store_path": "  "}, "store_path"),
    ({"block_size": True}, "block_size: expected int or null"),
])
def test_bad_values_name_key_and_allowed(values, message):
    with pytest.raises(ConfigError, match=message):
        VlmCacheConfig.from_dict(values)


def test_from_yaml_and_extra_config_override(tmp_path):
    path = tmp_path / "vlmcache.yaml"
    path.write_text("store_path: /tmp/x\nmemory_budget: 2GiB\nblock_size: 64\n")
    cfg = VlmCacheConfig.from_yaml(path)
    assert cfg.store_path == "/tmp/x" and cfg.memory_budget == 2 * GiB
    over = VlmCacheConfig.from_extra_config({"config_file": str(path), "block_size": 32,
                                             "_vllm_private": 1})
    assert over.block_size == 32 and over.memory_budget == 2 * GiB


def test_yaml_errors_are_config_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        VlmCacheConfig.from_yaml(bad)
    with pytest.raises(ConfigError, match="cannot be read"):
        VlmCacheConfig.from_yaml(tmp_path / "missing.yaml")


def test_store_dir_expands_user(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    assert str(VlmCacheConfig(store_path="~/c").store_dir) == "/home/someone/c"


def test_disk_budget_zero_means_memory_only_and_other_budgets_stay_positive():
    from vlmcache.config import VlmCacheConfig
    from vlmcache.errors import ConfigError
    from vlmcache.store.kvstore import open_kv_store

    cfg = VlmCacheConfig.from_extra_config({"disk_budget": 0, "store_path": "/nonexistent/x"})
    assert cfg.disk_budget == 0
    store = open_kv_store(cfg)
    assert store.disk is None and store.writer is None
    import pytest

    with pytest.raises(ConfigError, match="memory_budget: must be a positive"):
        VlmCacheConfig.from_dict({"memory_budget": 0})
