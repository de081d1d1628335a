"""The serving front: vlmcache's cascade in front of vLLM's OpenAI server.

- :mod:`.front` — :class:`~vlmcache.serving.front.CascadeFront`, the plain logic (no HTTP);
- :mod:`.asgi` — the ASGI middleware for ``python -m vllm.entrypoints.openai.api_server
  --middleware vlmcache.serving.asgi.VlmCacheMiddleware`` (what ``vlmcache serve`` starts);
- :mod:`.proxy` — the same front as a standalone proxy before vLLM servers;
- :mod:`.metrics` — Prometheus metrics; :mod:`.launch` — ``vlmcache serve``.
"""
