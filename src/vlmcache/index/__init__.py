"""Vector indexes for the similarity tiers (FAISS, persisted crash-safely)."""

from vlmcache.index.faiss_index import IndexEntry, SearchHit, VectorIndex

__all__ = ["IndexEntry", "SearchHit", "VectorIndex"]
