"""The per-request report: what the KV connector's ``kv_transfer_params`` say."""

from vlmcache.cascade import Resolution
from vlmcache.keys import KVRowKeys, kv_row_key
from vlmcache.report import KVReuse, build_report

NS = "a" * 64


def params(**ours):
    return {"vlmcache": {"prompt_tokens": 96, "tokens_loaded": 64, "tokens_from_prefix_cache": 0,
                         **ours}}


def test_store_keys_are_derived_from_the_offload_keys_the_connector_sent():
    sent = KVRowKeys.pack(NS, [b"k1", b"k2", b"k3"])
    kv = KVReuse.from_params(params(namespace=sent.namespace_digest,
                                    offload_keys=sent.offload_keys))
    assert kv is not None and (kv.prompt_tokens, kv.tokens_loaded) == (96, 64)
    want = tuple(kv_row_key(NS, k) for k in (b"k1", b"k2", b"k3"))
    report = build_report("r", Resolution("p", None, None, {}), kv, None, prompt_tokens=96,
                          cached_tokens=64, latency_s=0.1)
    assert report.chunk_keys == want
    assert report.tokens_loaded == 64 and report.tokens_computed == 32


def test_missing_or_malformed_keys_give_no_store_keys():
    assert KVReuse.from_params(params()).row_keys.store_keys == ()
    assert KVReuse.from_params(params(namespace=NS)).row_keys.store_keys == ()
    assert KVReuse.from_params(params(namespace=NS, offload_keys="zz,6b31")
                               ).row_keys.store_keys == ()
    assert KVReuse.from_params(params(namespace=7, offload_keys=["6b31"])
                               ).row_keys.store_keys == ()
    assert KVReuse.from_params({"other": {}}) is None and KVReuse.from_params(None) is None
