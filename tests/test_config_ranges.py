"""Config errors are ConfigErrors naming the key and what is allowed (issue 33, item 8).

Before: mixed int/str keys raised ``TypeError``, a NUL in ``store_path`` a ``ValueError``
from deep inside ``CachedLLM``, ``CachedLLM(model, 42)`` a ``TypeError``; a negative or zero
``image_embedder_dim``, a ``store_path`` naming a file and ``disk_write_queue`` above
``memory_budget`` were accepted. Every numeric key now has a range in one table.
"""

from __future__ import annotations

import dataclasses
import math
from typing import get_type_hints

import pytest

from vlmcache.api import CachedLLM
from vlmcache.config import GiB, VlmCacheConfig
from vlmcache.config_ranges import RANGES
from vlmcache.errors import ConfigError


class NoEngine:
    def generate(self, *args, **kwargs):  # pragma: no cover - must never be reached
        raise AssertionError("a bad config reached the engine")


def no_engine_llm(tmp_path, config):
    return CachedLLM(str(tmp_path), config, enabled=False, engine=NoEngine())


@pytest.mark.parametrize("values", [{1: "x", "store_path": "/tmp/a"}, {None: 1}, {(1,): 2}])
def test_non_string_keys_are_a_config_error_naming_them(values):
    with pytest.raises(ConfigError, match="config keys must be strings") as err:
        VlmCacheConfig.from_dict(values)
    bad = next(k for k in values if not isinstance(k, str))
    assert f"{bad!r} ({type(bad).__name__})" in str(err.value)
    with pytest.raises(ConfigError, match="config keys must be strings"):
        VlmCacheConfig.from_extra_config(values)


def test_yaml_with_mixed_int_and_str_keys(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text("store_path: /tmp/a\n1: x\n")
    with pytest.raises(ConfigError, match="config keys must be strings.*1 \\(int\\)"):
        VlmCacheConfig.from_yaml(path)


def test_cached_llm_with_a_config_of_the_wrong_type(tmp_path):
    for bad in (42, 4.2, ["store_path"], b"cfg.yaml"):
        with pytest.raises(ConfigError, match="config: expected a VlmCacheConfig, a mapping "
                                              "of its keys or a YAML path"):
            no_engine_llm(tmp_path, bad)


@pytest.mark.parametrize("key", ["store_path", "image_embedder_path", "calibration_file",
                                 "redis_tls_ca_file"])
def test_a_nul_in_a_path_is_a_config_error(tmp_path, key):
    with pytest.raises(ConfigError, match=f"{key}: must not contain a NUL"):
        VlmCacheConfig.from_dict({key: "/tmp/a\0b"})
    if key == "store_path":
        with pytest.raises(ConfigError, match="store_path: must not contain a NUL"):
            no_engine_llm(tmp_path, {"store_path": "/tmp/a\0b"})


def test_a_nul_in_a_yaml_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="config_file .* cannot be read"):
        VlmCacheConfig.from_yaml(str(tmp_path / "a\0b.yaml"))
    with pytest.raises(ConfigError, match="config_file .* cannot be read"):
        no_engine_llm(tmp_path, str(tmp_path / "a\0b.yaml"))


def test_store_path_naming_an_existing_file_is_refused(tmp_path):
    afile = tmp_path / "store"
    afile.write_text("not a directory")
    with pytest.raises(ConfigError, match="store_path: .* is a file, not a directory"):
        VlmCacheConfig(store_path=str(afile))
    with pytest.raises(ConfigError, match="store_path"):
        no_engine_llm(tmp_path, {"store_path": str(afile)})
    with pytest.raises(ConfigError, match="store_path: .*store' is a file, not a directory"):
        VlmCacheConfig(store_path=str(afile / "below" / "it"))
    assert afile.read_text() == "not a directory"
    VlmCacheConfig(store_path=str(tmp_path))  # an existing directory is fine
    VlmCacheConfig(store_path=str(tmp_path / "not" / "yet"))  # created on first use


@pytest.mark.parametrize("dim", [-5, 0, 10**9])
def test_image_embedder_dim_out_of_range(dim):
    with pytest.raises(ConfigError, match=r"image_embedder_dim: must be in \[1, 65536\] or "
                                          r"null \(from the embedder\), got"):
        VlmCacheConfig(image_embedder_dim=dim)
    assert VlmCacheConfig(image_embedder_dim=512).image_embedder_dim == 512


def test_disk_write_queue_never_above_memory_budget():
    with pytest.raises(ConfigError, match="disk_write_queue: must be at most memory_budget "
                                          r"\(8388608 B\), got 16777216"):
        VlmCacheConfig.from_dict({"memory_budget": "8MiB", "disk_write_queue": "16MiB"})
    assert VlmCacheConfig(memory_budget=8 * 1024**2).disk_write_queue == 8 * 1024**2
    assert VlmCacheConfig().disk_write_queue == GiB  # the default: min(1 GiB, memory_budget)
    small = VlmCacheConfig(memory_budget=8 * 1024**2)
    assert VlmCacheConfig.from_dict(small.to_dict()) == small


def _numeric_fields():
    hints = get_type_hints(VlmCacheConfig)
    for f in dataclasses.fields(VlmCacheConfig):
        if {int, float} & set(getattr(hints[f.name], "__args__", (hints[f.name],))):
            yield f.name


def test_every_numeric_key_has_a_range():
    assert set(_numeric_fields()) == set(RANGES), "add the new key to config_ranges.RANGES"


@pytest.mark.parametrize("key", sorted(RANGES))
def test_each_range_is_enforced_and_named(key):
    rng = RANGES[key]
    default = getattr(VlmCacheConfig(), key)
    assert default is None or rng.holds(default)
    for bad in rng.examples_outside():
        with pytest.raises(ConfigError, match=rf"^{key}: must be ") as err:
            VlmCacheConfig(**{key: bad})
        assert rng.describe() in str(err.value)


@pytest.mark.parametrize("key", [k for k, r in RANGES.items() if r.is_float])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_floats_must_be_finite(key, bad):
    with pytest.raises(ConfigError, match=rf"^{key}: must be a finite number"):
        VlmCacheConfig(**{key: bad})


def test_a_mistyped_tenant_salt_is_not_echoed():
    with pytest.raises(ConfigError, match="tenant_salt: expected str, got int") as err:
        VlmCacheConfig.from_dict({"tenant_salt": 987654321})
    assert "987654321" not in str(err.value)
    assert VlmCacheConfig(tenant_salt="a\0b").tenant_salt == "a\0b"  # a secret: any string
