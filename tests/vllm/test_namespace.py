"""Persisted KV is bound to the engine's KV layout, TP size included (no vLLM engine)."""

from types import SimpleNamespace

from vlmcache.config import VlmCacheConfig
from vlmcache.vllm.namespace import namespace_for_engine


def engine_config(tp: int, block: int = 16, dtype: str = "bfloat16") -> SimpleNamespace:
    return SimpleNamespace(
        model_config=SimpleNamespace(model="some/model", dtype=dtype, revision=None),
        cache_config=SimpleNamespace(block_size=block, cache_dtype="auto"),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1),
        load_config=SimpleNamespace(load_format="dummy"))


def test_tp_size_block_size_dtype_and_salt_each_change_the_namespace(tmp_path):
    config = VlmCacheConfig(store_path=str(tmp_path), model_revision="r1")
    base = namespace_for_engine(engine_config(1), config).digest
    others = {
        namespace_for_engine(engine_config(2), config).digest,
        namespace_for_engine(engine_config(1, block=32), config).digest,
        namespace_for_engine(engine_config(1, dtype="float16"), config).digest,
        namespace_for_engine(engine_config(1), VlmCacheConfig(
            store_path=str(tmp_path), model_revision="r1", tenant_salt="s")).digest,
        namespace_for_engine(engine_config(1), VlmCacheConfig(
            store_path=str(tmp_path), model_revision="r2")).digest,
    }
    assert base not in others and len(others) == 5
    assert namespace_for_engine(engine_config(1), config).digest == base  # stable


def test_how_the_kv_bytes_are_laid_out_changes_the_namespace(tmp_path, monkeypatch):
    """Blocks across layers or per layer, and vLLM's dimension order: bytes laid out one way
    must never load into an engine laid out another."""
    from vlmcache.vllm import compat

    monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT", raising=False)
    monkeypatch.setattr(compat, "vllm_version", lambda: (0, 26))  # cross-layer possible
    config = VlmCacheConfig(store_path=str(tmp_path), model_revision="r1")

    def digest(block_layout: str, order: str | None) -> str:
        memory = compat.kv_memory_layout(block_layout, order)
        return namespace_for_engine(engine_config(1), config, kv_memory=memory).digest

    cross, per = digest("cross_layer", "HND"), digest("per_layer", None)
    assert len({cross, per, digest("cross_layer", "NHD")}) == 3
    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", "NHD")  # the user's override wins
    assert digest("cross_layer", "HND") == digest("cross_layer", "NHD") != cross
    monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT")
    monkeypatch.setattr(compat, "vllm_version", lambda: (0, 32))  # always per layer
    assert compat.kv_memory_layout("cross_layer", "LBHNC") == "blocks=per_layer;order=LBHNC"
