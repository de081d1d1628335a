"""A deterministic stand-in for MiniLM in tests: hashed word counts, no model load."""

from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np


class HashedBagOfWords:
    """Unit-norm hashed bag-of-words vectors of ``dim`` dimensions."""

    name = "bow"

    def __init__(self, dim: int = 32) -> None:
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace("?", "").split():
                rows[i, zlib.crc32(w.encode()) % self.dim] += 1.0
        return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
