"""The cascade's resolution, written back into the OpenAI body vLLM receives.

Text: an exact or prompt-layer hit replaces the message texts by the cached request's
(decoded from its transcript); a question-layer hit replaces only the question. Images:
every image part gets the identity vlmcache mints from its (canonical) pixels and the
tenant, and the canonical pixels when a near-duplicate was canonicalized; every video part
the identity of its sampled frames and the tenant. The tenant
becomes vLLM's ``cache_salt``.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from vlmcache.cascade import Resolution
from vlmcache.config import VlmCacheConfig
from vlmcache.keys import image_uuid, tenant_cache_salt
from vlmcache.serving.images import PngUrls
from vlmcache.serving.openai_req import (IMAGE_MARK, MEDIA_MARK, VIDEO_MARK, ParsedRequest,
                                         decode_transcript)
from vlmcache.tiers.semantic_text import QUESTION_LAYER

logger = logging.getLogger(__name__)

#: Canonical (and fetched) pixels' PNG data URLs of this process: a hit re-sends them.
PNG_URLS = PngUrls()


def rewrite_body(req: ParsedRequest, res: Resolution | None,
                 config: VlmCacheConfig) -> dict[str, Any]:
    """The body to forward: canonical texts and images, minted identities, tenant salt."""
    body = copy.deepcopy({k: v for k, v in req.body.items() if k != "vlmcache"})
    if res is not None and req.transcript is not None and res.prompt != req.transcript:
        _rewrite_text(body, req, res)
    if req.endpoint == "chat":
        _rewrite_images(body, req, res, config)
        _rewrite_videos(body, req, res, config)
        _strip_media_uuids(body, req, config)
    body.pop("cache_salt", None)
    if req.tenant is not None:
        body["cache_salt"] = tenant_cache_salt(config.tenant_salt, req.tenant)
    body["kv_transfer_params"] = _transfer_params(body.get("kv_transfer_params"), req, config)
    return body


def sent_media_hashes(req: ParsedRequest,
                      res: Resolution | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The content identities of the images and videos the forwarded body carries: the
    canonical ones where the cascade canonicalized them, else the request's own."""
    images = res.image_hashes if res is not None and res.image_hashes else req.image_hashes
    videos = res.video_hashes if res is not None and res.video_hashes else req.video_hashes
    return images, videos


def forward_identity(req: ParsedRequest, res: Resolution | None,
                     forward: dict[str, Any]) -> dict[str, Any]:
    """The response-tier identity of what the engine is sent for ``req``: ``forward`` (the
    :func:`rewrite_body` of ``req`` and ``res``) normalized as
    :meth:`ParsedRequest.identity_body` normalizes a body as sent. For a request the cascade
    left alone this equals the as-sent identity; for a canonicalized one it is the identity
    of the canonical request, so its stored answer is found (tenant, sampling fields and
    media identities stay in it)."""
    return req.identity_of(forward, *sent_media_hashes(req, res))


def bind_tenant(body: dict[str, Any], tenant: str | None,
                config: VlmCacheConfig) -> dict[str, Any]:
    """A body for a route outside the cascade (``/v1/responses``, ``/invocations``, ...):
    the client's ``cache_salt`` and ``vlmcache`` options dropped, the tenant's own salt set
    (``tenant=None``: none), and a ``kv_transfer_params`` the client sent given the
    ``vlmcache`` entry of the front (no client charges its bytes to another tenant)."""
    out = {k: v for k, v in body.items() if k not in ("cache_salt", "vlmcache")}
    if tenant is not None:
        out["cache_salt"] = tenant_cache_salt(config.tenant_salt, tenant)
    if "kv_transfer_params" in out:
        ours: dict[str, Any] = {"bypass": False}
        if tenant is not None:
            ours["tenant"] = tenant
        sent = out["kv_transfer_params"]
        out["kv_transfer_params"] = {**(sent if isinstance(sent, dict) else {}), "vlmcache": ours}
    return out


def _transfer_params(sent: object, req: ParsedRequest,
                     config: VlmCacheConfig) -> dict[str, Any]:
    """``kv_transfer_params`` for vLLM: the client's other keys, and a ``vlmcache`` entry
    that is ours alone (a client cannot charge its bytes to another tenant)."""
    params = dict(sent) if isinstance(sent, dict) else {}
    ours: dict[str, Any] = {"bypass": req.options.bypass}
    if req.tenant is not None:
        ours["tenant"] = req.tenant
    if scoped_media(req, config):
        ours["scoped_media"] = True
    params["vlmcache"] = ours
    return params


def scoped_media(req: ParsedRequest, config: VlmCacheConfig) -> bool:
    """Whether the front minted every medium of ``req``: then each identifier vLLM derives
    for them (hashing in ``--media-io-kwargs``) is tenant-scoped, and the encoder-output
    tier may store it. Not with trusted client uuids, nor with other media (audio,
    embeddings: ``MEDIA_MARK``) that vLLM names by content."""
    if req.endpoint != "chat" or not (req.images or req.videos) or req.transcript is None:
        return False
    return config.client_image_uuids != "trust" and MEDIA_MARK not in req.transcript


def _rewrite_text(body: dict[str, Any], req: ParsedRequest, res: Resolution) -> None:
    rw = res.rewrite
    if req.endpoint == "completions":
        body["prompt"] = res.prompt
        return
    if res.hit_tier == QUESTION_LAYER and rw is not None and rw.canonical_question \
            and req.question is not None:
        _replace_question(body, req.question, rw.canonical_question)
        return
    canonical = decode_transcript(res.prompt)
    if canonical is None or not _apply_transcript(body["messages"], canonical):
        logger.warning("front: cached transcript does not fit the request; sent as it came")


def _apply_transcript(messages: list[Any], canonical: list[tuple[str, list[str]]]) -> bool:
    """Copy the cached texts into ``messages`` if both have the same shape."""
    if len(canonical) != len(messages):
        return False
    updates: list[tuple[dict[str, Any], int | None, str]] = []
    for msg, (role, texts) in zip(messages, canonical):
        if role != msg["role"]:
            return False
        content = msg.get("content")
        if content is None or isinstance(content, str):
            if len(texts) != 1:
                return False
            updates.append((msg, None, texts[0]))
            continue
        if len(texts) != len(content):
            return False
        for j, (part, text) in enumerate(zip(content, texts)):
            marked = text in (IMAGE_MARK, VIDEO_MARK, MEDIA_MARK)
            if _is_text(part):
                if marked and _text(part) != text:
                    return False
                updates.append((msg, j, text))
            elif not marked:
                return False
    for msg, j, text in updates:
        _set_text(msg, j, text)
    return True


def _replace_question(body: dict[str, Any], question: str, canonical: str) -> None:
    for msg in reversed(body["messages"]):
        if msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            msg["content"] = content.replace(question, canonical, 1)
            return
        for j in range(len(content) - 1, -1, -1):
            if _is_text(content[j]) and _text(content[j]) == question:
                _set_text(msg, j, canonical)
                return
        return


def _is_text(part: object) -> bool:
    return isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")


def _text(part: object) -> str:
    return part if isinstance(part, str) else str(part.get("text") or "")  # type: ignore[union-attr]


def _set_text(msg: dict[str, Any], j: int | None, text: str) -> None:
    if j is None:
        msg["content"] = text
    elif isinstance(msg["content"][j], str):
        msg["content"][j] = text
    else:
        msg["content"][j] = {**msg["content"][j], "text": text}


def _rewrite_images(body: dict[str, Any], req: ParsedRequest, res: Resolution | None,
                    config: VlmCacheConfig) -> None:
    hashes = sent_media_hashes(req, res)[0]
    pixels = res.images if res is not None else None
    for k, ref in enumerate(req.images):
        part = body["messages"][ref.message]["content"][ref.part]
        url = part["image_url"]
        url = url.get("url") if isinstance(url, dict) else url
        if pixels is not None and hashes[k] != ref.content_hash:
            url = PNG_URLS.get(pixels[k])  # the canonical image's own pixels
        elif not str(url).startswith("data:"):
            url = PNG_URLS.get(ref.image)  # fetched once here: vLLM gets these pixels
        if config.client_image_uuids == "trust" and ref.client_uuid is not None:
            uuid = ref.client_uuid
        else:
            uuid = image_uuid(config.tenant_salt, req.tenant, hashes[k])
        body["messages"][ref.message]["content"][ref.part] = {
            "type": "image_url", "image_url": {"url": url}, "uuid": uuid}


def _rewrite_videos(body: dict[str, Any], req: ParsedRequest, res: Resolution | None,
                    config: VlmCacheConfig) -> None:
    """Each video part gets the identity of its sampled frames (tenant-scoped): a re-muxed
    copy of a clip then reaches vLLM's caches, and ours, as the clip already seen; a
    verified near-duplicate gets the canonical clip's bytes and identity."""
    hashes = sent_media_hashes(req, res)[1]
    urls = res.video_urls if res is not None and res.video_urls else (None,) * len(hashes)
    for k, ref in enumerate(req.videos):
        url = urls[k] or ref.query.url  # canonical bytes, or (fetched) the request's own
        if config.client_image_uuids == "trust" and ref.client_uuid is not None \
                and urls[k] is None:
            uuid = ref.client_uuid
        else:
            uuid = image_uuid(config.tenant_salt, req.tenant, hashes[k])
        body["messages"][ref.message]["content"][ref.part] = {
            "type": "video_url", "video_url": {"url": url}, "uuid": uuid}


def _strip_media_uuids(body: dict[str, Any], req: ParsedRequest,
                       config: VlmCacheConfig) -> None:
    """Client uuids on other media parts go: vLLM then hashes their content."""
    if config.client_image_uuids == "trust":
        return
    ours = {(ref.message, ref.part) for ref in (*req.images, *req.videos)}
    for i, msg in enumerate(body["messages"]):
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and (i, j) not in ours:
                part.pop("uuid", None)
