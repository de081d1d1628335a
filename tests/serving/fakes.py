"""A CPU stand-in for vLLM's OpenAI app: records what it receives, answers like vLLM."""

from __future__ import annotations

import base64
import contextlib
import io
import asyncio
import json
import threading
import time

from PIL import Image


def data_url(image: Image.Image, fmt: str = "PNG", **save_args) -> str:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **save_args)
    mime = "jpeg" if fmt == "JPEG" else fmt.lower()
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def image(seed: int, size: int = 32) -> Image.Image:
    im = Image.new("RGB", (size, size), (seed * 40 % 256, 80, 160))
    im.putpixel((seed % size, 3), (255, 255, 255))
    return im


def chat(question: str, *images: Image.Image, tenant: str | None = None, **extra) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": data_url(im)}} for im in images]
    body = {"model": "m", "messages": [{"role": "user", "content": [
        *parts, {"type": "text", "text": question}]}], "temperature": 0, "max_tokens": 4}
    if tenant is not None:
        body["cache_salt"] = tenant
    body.update(extra)
    return body


class FakeEngineApp:
    """Answers chat/completions with text derived from the body it got (so a rewrite
    shows in the answer) and a ``kv_transfer_params`` block like vlmcache's connector.

    As vLLM's server does, it aborts a request whose client leaves before the answer
    starts going out: ``bodies`` holds the requests it answered, ``aborted`` the others."""

    def __init__(self, status: int = 200, latency_s: float = 0.0,
                 processor_cache: bool = True, null_video_raises: bool = False) -> None:
        self.bodies: list[dict] = []
        self.aborted: list[dict] = []
        self.refused: list[dict] = []
        self.status = status
        self.latency_s = latency_s  # the engine's time before its answer starts
        # vLLM's processor cache: media it processed, by uuid; one named without its data
        # and not held is refused with vLLM's own 400
        self.processor_cache: set[str] | None = set() if processor_cache else None
        # vLLM 0.26's parser on a video named without data: an exception in its server
        self.null_video_raises = null_video_raises
        self.raised: list[dict] = []

    async def __call__(self, scope, receive, send):
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        body = json.loads(raw)
        answer = asyncio.ensure_future(self._answer(body, send))
        left = asyncio.ensure_future(_disconnected(receive))
        done, _ = await asyncio.wait({answer, left}, return_when=asyncio.FIRST_COMPLETED)
        if answer in done:
            left.cancel()
            answer.result()
            return
        answer.cancel()
        self.aborted.append(body)

    async def _answer(self, body, send):
        await asyncio.sleep(self.latency_s)
        if self.null_video_raises and _null_parts(body, "video_url"):
            self.raised.append(body)
            raise AssertionError("Expected code to be unreachable, but got: None")
        if self._cache_miss(body):
            self.refused.append(body)
            await self._send(send, 400, b'{"error": {"message": "Cache miss for image at '
                             b'index 0 but data is not provided.", "code": 400}}',
                             b"application/json", None)
            return
        if self.status != 200:
            await self._send(send, self.status, b'{"error": {"message": "bad", "code": 400}}',
                             b"application/json", body)
            return
        text = "answer:" + json.dumps(body.get("messages") or body.get("prompt"))[-24:]
        if body.get("stream"):
            chunks = [{"id": "c1", "object": "chat.completion.chunk", "created": 1,
                       "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                        "content": ""}}]},
                      {"id": "c1", "object": "chat.completion.chunk", "created": 1,
                       "model": "m", "choices": [{"index": 0, "delta": {"content": text}}]},
                      {"id": "c1", "object": "chat.completion.chunk", "created": 1,
                       "model": "m", "choices": [{"index": 0, "delta": {},
                                                  "finish_reason": "stop"}]}]
            data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            self.bodies.append(body)
            await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                        "more_body": False})
            return
        out = {"id": f"chatcmpl-{len(self.bodies) + 1}", "object": "chat.completion",
               "created": 1, "model": "m",
               "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": text}}],
               "usage": {"prompt_tokens": 96, "completion_tokens": 2, "total_tokens": 98},
               "kv_transfer_params": {"vlmcache": {"prompt_tokens": 96, "tokens_loaded": 64,
                                                   "namespace": "n" * 64,
                                                   "offload_keys": "6b31,6b32"}}}
        await self._send(send, 200, json.dumps(out).encode(), b"application/json", body)

    def _cache_miss(self, body) -> bool:
        parts = [p for m in body.get("messages") or [] if isinstance(m.get("content"), list)
                 for p in m["content"] if isinstance(p, dict) and p.get("uuid")]
        kinds = [(p, p.get("type")) for p in parts if p.get("type") in ("image_url",
                                                                        "video_url")]
        if any(p.get(k) is None and (self.processor_cache is None
                                     or p["uuid"] not in self.processor_cache)
               for p, k in kinds):
            return True
        if self.processor_cache is not None:
            self.processor_cache.update(p["uuid"] for p, _ in kinds)
        return False

    async def _send(self, send, status, raw, ctype, body):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype),
                                (b"content-length", str(len(raw)).encode())]})
        if body is not None:
            self.bodies.append(body)
        await send({"type": "http.response.body", "body": raw})


def _null_parts(body, kind: str) -> list[dict]:
    return [p for m in body.get("messages") or [] if isinstance(m.get("content"), list)
            for p in m["content"] if isinstance(p, dict) and p.get("type") == kind
            and p.get(kind) is None]


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def clip_frames(seed: int = 0, n: int = 12, h: int = 64, w: int = 96):
    """``n`` RGB frames of a square moving right on a seed-coloured background."""
    import numpy as np

    frames = np.zeros((n, h, w, 3), np.uint8)
    frames[:] = (30 + seed * 50 % 200, 60, 90)
    for t in range(n):
        frames[t, 10:40, 5 + 4 * t:25 + 4 * t] = (200, 50, 50)
    return frames


def clip_bytes(frames, codec: str = "ffv1", fps: float = 10.0) -> bytes:
    """The frames as a video file (``vlmcache.testing.clips`` presets; ffv1, huffyuv and
    png are lossless)."""
    from vlmcache.testing.clips import write_clip

    return write_clip(None, frames, fps, codec)


def video_url(data: bytes, mime: str = "video/x-msvideo") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def video_chat(question: str, *clips: bytes, tenant: str | None = None, **extra) -> dict:
    parts = [{"type": "video_url", "video_url": {"url": video_url(c)}} for c in clips]
    body = {"model": "m", "messages": [{"role": "user", "content": [
        *parts, {"type": "text", "text": question}]}], "temperature": 0, "max_tokens": 4}
    if tenant is not None:
        body["cache_salt"] = tenant
    body.update(extra)
    return body


def sse_events(response) -> list[str]:
    """The ``data:`` payloads of a streamed (server-sent events) response, in order."""
    return [line[6:] for line in response.text.split("\n\n") if line.startswith("data: ")]


def delta_text(chunks: list[dict]) -> str:
    """The answer text streamed chat chunks carry."""
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c["choices"])


@contextlib.contextmanager
def serving(app):
    """Serve the ASGI ``app`` on a free loopback port (a uvicorn thread); yields its URL."""
    import uvicorn

    from vlmcache.testing.server import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
