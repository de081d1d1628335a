"""The :class:`~vlmcache.keys.Namespace` of a running vLLM engine."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from vlmcache.config import VlmCacheConfig
from vlmcache.errors import ConfigError
from vlmcache.keys import Namespace, processor_digest, weights_revision
from vlmcache.tenant_secret import deployment_salt

logger = logging.getLogger(__name__)


def resolve_model_dir(model: str, revision: str | None) -> Path | None:
    """The local directory holding ``model``'s files, without any download."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, revision=revision, local_files_only=True))
    except Exception as exc:  # not cached locally: the caller decides
        logger.debug("model %s is not a local directory or cached snapshot: %s", model, exc)
        return None


def namespace_for_model(model: str, config: VlmCacheConfig, *, revision: str | None = None,
                        kv_layout: str = "", dummy_weights: bool = False) -> Namespace:
    """Namespace of ``model`` (a directory or a locally cached hub id) under ``config``."""
    salt = deployment_salt(config)  # first: creates the store 0700 with its salt file
    model_dir = resolve_model_dir(model, revision)
    model_id = model_dir.name if model_dir is not None and Path(model).is_dir() else model
    if config.model_revision is not None:
        weights = f"declared:{config.model_revision}"
    elif dummy_weights:
        raise ConfigError("load_format='dummy' gives random weights vlmcache cannot "
                          "identify: set model_revision in the vlmcache config")
    elif model_dir is None:
        raise ConfigError(f"cannot read the weights of {model!r} to identify them: pass a "
                          "local model directory or set model_revision in the vlmcache config")
    else:
        weights = weights_revision(model_dir, config.store_dir / "weights-digests.json")
    processor = processor_digest(model_dir) if model_dir is not None else "unknown"
    return Namespace(model_id=model_id, weights_revision=weights, processor_digest=processor,
                     kv_layout=kv_layout, tenant_salt=salt)


def namespace_for_engine(vllm_config: Any, config: VlmCacheConfig, *,
                         encoder: bool = False, kv_memory: str = "") -> Namespace:
    """Namespace of the engine ``vllm_config`` describes (its KV, whose bytes are laid out
    as ``kv_memory`` says, or its encoder outputs)."""
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    parallel = vllm_config.parallel_config
    if encoder:
        layout = f"encoder;dtype={model_config.dtype};tp={parallel.tensor_parallel_size}"
    else:
        layout = (f"block={cache_config.block_size};kv_dtype={cache_config.cache_dtype};"
                  f"dtype={model_config.dtype};tp={parallel.tensor_parallel_size};"
                  f"pp={parallel.pipeline_parallel_size}" + (f";{kv_memory}" if kv_memory else ""))
    load_format = str(getattr(vllm_config.load_config, "load_format", ""))
    return namespace_for_model(model_config.model, config,
                               revision=getattr(model_config, "revision", None),
                               kv_layout=layout, dummy_weights=load_format == "dummy")
