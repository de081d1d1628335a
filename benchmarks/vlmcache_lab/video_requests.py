"""The video benchmark's requests (``video_serve``): one clip and one question per chat
request, sent with ``httpx``; what comes back (TTFT, e2e, the answer, what was reused)."""

from __future__ import annotations

import json
import time
from typing import Any

from vlmcache.testing.clips import CODECS, video_data_url


def body(args: Any, clip: bytes, codec: str, question: str, tenant: str,
         stream: bool = True) -> dict[str, Any]:
    """A chat request: one video, one question, greedy (streamed: TTFT is measured)."""
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    return {"model": args.model, "temperature": 0, "max_tokens": args.max_tokens,
            **extra, "cache_salt": tenant,
            "messages": [{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": video_data_url(
                    clip, CODECS[codec].mime)}},
                {"type": "text", "text": question}]}]}


def ask(url: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Send one request; TTFT (streamed), e2e, answer, and what was reused. Unstreamed
    requests get vlmcache's whole report (a stream carries no KV figures)."""
    import httpx

    row: dict[str, Any] = {"ttft_ms": None, "text": "", "report": None, "cached_tokens": 0,
                           "prompt_tokens": 0}
    t0 = time.perf_counter()
    if not payload.get("stream"):
        resp = httpx.post(url + "/v1/chat/completions", json=payload, timeout=600)
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:400]!r}")
        data = resp.json()
        _on_line(row, "data: " + json.dumps({**data, "choices": [
            {"delta": {"content": c["message"]["content"]}} for c in data["choices"]]}), t0)
        row["ttft_ms"] = None
    else:
        with httpx.stream("POST", url + "/v1/chat/completions", json=payload,
                          timeout=600) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.read()[:400]!r}")
            for line in resp.iter_lines():
                _on_line(row, line, t0)
    row["e2e_ms"] = (time.perf_counter() - t0) * 1000
    row["ttft_ms"] = row["ttft_ms"] or row["e2e_ms"]
    return row


def _on_line(row: dict[str, Any], line: str, t0: float) -> None:
    if not line.startswith("data:") or line.strip() == "data: [DONE]":
        return
    chunk = json.loads(line[5:])
    if chunk.get("error"):  # a stream that failed after its 200 is not a measured row
        raise RuntimeError(f"stream error: {chunk['error']!r}"[:400])
    for choice in chunk.get("choices") or ():
        text = (choice.get("delta") or {}).get("content")
        if text:
            row["text"] += text
        if (text or choice.get("finish_reason")) and row["ttft_ms"] is None:
            row["ttft_ms"] = (time.perf_counter() - t0) * 1000
    usage = chunk.get("usage")
    if usage:
        row["prompt_tokens"] = int(usage.get("prompt_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        row["cached_tokens"] = int(details.get("cached_tokens") or 0)
    if isinstance(chunk.get("vlmcache"), dict):
        row["report"] = chunk["vlmcache"]
