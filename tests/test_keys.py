import numpy as np
import pytest
from PIL import Image

from vlmcache.errors import ConfigError
from vlmcache.keys import (
    KVRowKeys,
    MultiModalSpan,
    Namespace,
    block_keys,
    image_content_hash,
    kv_row_key,
    processor_digest,
    tenant_scope,
    weights_revision,
)


def ns(**over):
    base = dict(model_id="m", weights_revision="w", processor_digest="p", kv_layout="bs=32")
    return Namespace(**{**base, **over})


def test_namespace_digest_depends_on_every_field():
    digests = {ns().digest, ns(model_id="m2").digest, ns(weights_revision="w2").digest,
               ns(processor_digest="p2").digest, ns(kv_layout="bs=16").digest,
               ns(tenant_salt="s").digest}
    assert len(digests) == 6
    assert "tenant_salt" not in ns(tenant_salt="secret").describe()


TOKENS = list(range(100))


def test_block_keys_are_chained_prefix_keys():
    scope = tenant_scope(ns().digest, None)
    keys = block_keys(scope, TOKENS, (), 32)
    assert len(keys) == 3  # 100 tokens -> 3 full blocks
    changed = TOKENS.copy()
    changed[40] = 999  # inside block 1
    keys2 = block_keys(scope, changed, (), 32)
    assert keys2[0] == keys[0] and keys2[1] != keys[1] and keys2[2] != keys[2]
    assert block_keys(scope, TOKENS, (), 32, num_blocks=2) == keys[:2]


def test_images_behind_same_placeholders_never_alias():
    scope = tenant_scope(ns().digest, None)
    a = block_keys(scope, TOKENS, (MultiModalSpan("imgA", 10, 40),), 32)
    b = block_keys(scope, TOKENS, (MultiModalSpan("imgB", 10, 40),), 32)
    assert a[0] != b[0] and a[1] != b[1]
    # an image only in block 2 leaves blocks 0-1 shared
    c = block_keys(scope, TOKENS, (MultiModalSpan("imgC", 70, 10),), 32)
    plain = block_keys(scope, TOKENS, (), 32)
    assert c[:2] == plain[:2] and c[2] != plain[2]


def test_tenants_and_namespaces_never_alias():
    t1 = block_keys(tenant_scope(ns().digest, "t1"), TOKENS, (), 32)
    t2 = block_keys(tenant_scope(ns().digest, "t2"), TOKENS, (), 32)
    none = block_keys(tenant_scope(ns().digest, None), TOKENS, (), 32)
    empty = block_keys(tenant_scope(ns().digest, ""), TOKENS, (), 32)
    other = block_keys(tenant_scope(ns(weights_revision="w2").digest, "t1"), TOKENS, (), 32)
    assert len({t1[0], t2[0], none[0], empty[0], other[0]}) == 5


def test_image_content_hash_is_pixel_based():
    arr = np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    a, b = Image.fromarray(arr), Image.fromarray(arr.copy())
    b.info["comment"] = "metadata does not count"
    assert image_content_hash(a) == image_content_hash(b)
    arr[0, 0, 0] ^= 1
    assert image_content_hash(Image.fromarray(arr)) != image_content_hash(a)
    with pytest.raises(TypeError, match="PIL"):
        image_content_hash(arr)


def test_weights_revision_reads_bytes_and_memoizes(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"abc" * 1000)
    memo = tmp_path / "memo.json"
    r1 = weights_revision(model, memo)
    assert memo.is_file() and weights_revision(model, memo) == r1
    (model / "model.safetensors").write_bytes(b"abd" * 1000)  # same name, new bytes
    assert weights_revision(model, memo) != r1
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="model_revision"):
        weights_revision(empty, None)


def test_processor_digest_tracks_processor_files(tmp_path):
    d0 = processor_digest(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text('{"size": 224}')
    d1 = processor_digest(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text('{"size": 336}')
    assert len({d0, d1, processor_digest(tmp_path)}) == 3


def test_kv_row_keys_are_bound_to_the_namespace_and_kept_in_order():
    assert kv_row_key("a" * 64, b"k0") != kv_row_key("b" * 64, b"k0")
    assert kv_row_key("a" * 64, b"k0") != kv_row_key("a" * 64, b"k1")
    packed = KVRowKeys.pack("a" * 64, [b"\x00k0", b"k1"])
    assert packed.offload_keys == "006b30,6b31"
    assert packed.store_keys == (kv_row_key("a" * 64, b"\x00k0"), kv_row_key("a" * 64, b"k1"))
    assert KVRowKeys.pack("a" * 64, []).store_keys == ()
