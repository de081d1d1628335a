"""Server-sent events of OpenAI streaming responses: read a stream, write one back.

:class:`StreamAccumulator` rebuilds the non-streaming response body from vLLM's chunks
(what the response tier stores and the cascade captures); :func:`stream_events` replays a
stored body as the chunks vLLM would have sent: a role chunk, the content, the finish
reason, usage when asked for, ``[DONE]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator

DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    role: str = "assistant"


class StreamAccumulator:
    """Feed it the bytes of an SSE stream; :meth:`response` is the equivalent full body."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._buffer = b""
        self._choices: dict[int, _Choice] = {}
        self._head: dict[str, Any] = {}
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: dict[str, Any] | None = None

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while b"\n\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n\n", 1)
            for line in raw.split(b"\n"):
                if line.startswith(b"data:"):
                    self._on_data(line[5:].strip())

    def _on_data(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            return
        if not isinstance(chunk, dict):
            return
        if "error" in chunk:
            self.error = chunk["error"]
            return
        for key in ("id", "created", "model"):
            self._head.setdefault(key, chunk.get(key))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for c in chunk.get("choices") or ():
            self._add(c)

    def _add(self, c: dict[str, Any]) -> None:
        choice = self._choices.setdefault(int(c.get("index", 0)), _Choice())
        if self.endpoint == "chat":
            delta = c.get("delta") or {}
            choice.role = delta.get("role") or choice.role
            if delta.get("content"):
                choice.text.append(delta["content"])
        elif c.get("text"):
            choice.text.append(c["text"])
        if c.get("finish_reason"):
            choice.finish_reason = c["finish_reason"]

    def response(self) -> dict[str, Any] | None:
        """The full body, or ``None`` if the stream did not finish cleanly."""
        if not self.done or self.error is not None or not self._choices:
            return None
        choices = []
        for index, ch in sorted(self._choices.items()):
            text = "".join(ch.text)
            if self.endpoint == "chat":
                choices.append({"index": index, "finish_reason": ch.finish_reason,
                                "message": {"role": ch.role, "content": text}})
            else:
                choices.append({"index": index, "finish_reason": ch.finish_reason,
                                "text": text})
        obj = "chat.completion" if self.endpoint == "chat" else "text_completion"
        return {**self._head, "object": obj, "choices": choices, "usage": self.usage}


def stream_events(endpoint: str, body: dict[str, Any], include_usage: bool,
                  continuous_usage: bool = False) -> Iterator[bytes]:
    """The SSE events of a stored (non-streaming) body, ending with ``[DONE]``.

    ``continuous_usage`` (``stream_options.continuous_usage_stats``, with ``include_usage``)
    puts usage on every chunk as vLLM does: ``completion_tokens`` 0 on the role chunk, the
    stored answer's on the content and finish chunks (a client that times the first token
    by usage sees it on the content chunk, as on a streamed miss)."""
    obj = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
    head = {"id": body.get("id"), "object": obj, "created": body.get("created"),
            "model": body.get("model")}
    usage = body.get("usage") if include_usage and continuous_usage else None
    first = {**usage, "completion_tokens": 0,
             "total_tokens": usage.get("prompt_tokens", 0)} if usage else None
    for choice in body.get("choices") or ():
        for chunk_choice, chunk_usage in _choice_chunks(endpoint, choice, first, usage):
            chunk = {**head, "choices": [chunk_choice]}
            yield event({**chunk, "usage": chunk_usage} if chunk_usage else chunk)
    if include_usage and body.get("usage") is not None:
        yield event({**head, "choices": [], "usage": body["usage"]})


def _choice_chunks(endpoint: str, choice: dict[str, Any], first: dict[str, Any] | None,
                   usage: dict[str, Any] | None
                   ) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
    """One stored choice as (chunk choice, chunk usage) pairs."""
    index = choice.get("index", 0)
    if endpoint == "chat":
        message = choice.get("message") or {}
        yield {"index": index, "delta": {"role": message.get("role", "assistant"),
                                         "content": ""}, "finish_reason": None}, first
        yield {"index": index, "delta": {"content": message.get("content") or ""},
               "finish_reason": None}, usage
        yield {"index": index, "delta": {},
               "finish_reason": choice.get("finish_reason")}, usage
    else:
        yield {"index": index, "text": choice.get("text", ""), "finish_reason": None}, usage
        yield {"index": index, "text": "", "finish_reason": choice.get("finish_reason")}, usage
