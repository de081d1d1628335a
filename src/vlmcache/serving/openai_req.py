"""OpenAI request bodies as the cascade sees them, and the rewrite back into a body.

:func:`parse_request` validates a chat-completions or completions body, decodes each
image once and identifies it by its pixels (:func:`~vlmcache.keys.image_content_hash`);
its text becomes a *transcript* (JSON of the messages' roles and text parts, ``<image>``
for each image) that the exact and paraphrase tiers key on. :func:`rewrite_body` turns
the cascade's resolution back into the body vLLM gets: canonical texts, canonical pixels,
image identities minted by vlmcache (``vlmc-...``, tenant-scoped) and the tenant's
``cache_salt``. Errors are :class:`~vlmcache.errors.RequestError` naming the field.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from vlmcache.config import VlmCacheConfig
from vlmcache.errors import RequestError
from vlmcache.serving.images import DecodedImages, ImageLimits
from vlmcache.serving.videos import DecodedVideos, VideoLimits
from vlmcache.serving.wire import load_json
from vlmcache.tiers.video import VideoQuery
from vlmcache.vllm.video_io import VideoSampling

Endpoint = Literal["chat", "completions"]
IMAGE_MARK = "<image>"
VIDEO_MARK = "<video>"
MEDIA_MARK = "<media>"  # audio parts: sent as they are, not identified by the front
PART_SEP = "\n<|p|>\n"
_MSG_RE = re.compile(r"(?:^|\n)<\|m:([^|>\n]*)\|>\n")
TENANT_HEADER = "x-vlmcache-tenant"
IMAGE_TYPES = ("image_url", "input_image")
VIDEO_TYPES = ("video_url",)
EMBED_TYPES = ("image_embeds", "audio_embeds", "video_embeds", "prompt_embeds")
OPTION_KEYS = ("bypass", "response_cache")
#: Decoded data URLs of this process (a repeat skips the decode).
DECODED = DecodedImages()
#: Decoded video data URLs of this process (identity only, not frames).
DECODED_VIDEOS = DecodedVideos()
#: Deepest JSON nesting a request body may have (OpenAI bodies, tool schemas included, are
#: far shallower); deeper bodies get a 400, never a RecursionError (a 500) in a parser.
MAX_JSON_DEPTH = 128


@dataclass(frozen=True)
class FrontOptions:
    """Per-request vlmcache options (``"vlmcache": {...}`` in the body)."""

    bypass: bool = False
    response_cache: bool = True


@dataclass(frozen=True)
class ImageRef:
    """One image of a request: where it is in the body, its pixels and its identity."""

    message: int
    part: int
    image: Any
    content_hash: str
    client_uuid: str | None = None


@dataclass(frozen=True)
class VideoRef:
    """One video of a request: where it is in the body, what the tiers see of it (its
    identity, sampling and frame thumbnails) and the URL vLLM gets."""

    message: int
    part: int
    query: VideoQuery
    fetched: bool = False  # a remote video the front fetched: ``query.url`` is its data
    client_uuid: str | None = None
    pixels: int = 0  # of all its sampled frames: what the engine processes

    @property
    def content_hash(self) -> str:
        return self.query.content_hash

    @property
    def frames(self) -> int:
        return self.query.signature.frames


@dataclass(frozen=True)
class ParsedRequest:
    """A validated request: the body, its tenant, images, transcript and question."""

    endpoint: Endpoint
    body: dict[str, Any]
    tenant: str | None
    options: FrontOptions
    images: tuple[ImageRef, ...]
    transcript: str | None  # None: the cascade cannot see this request (e.g. token prompts)
    question: str | None
    videos: tuple[VideoRef, ...] = ()

    @property
    def image_hashes(self) -> tuple[str, ...]:
        return tuple(ref.content_hash for ref in self.images)

    @property
    def video_hashes(self) -> tuple[str, ...]:
        return tuple(ref.content_hash for ref in self.videos)

    @property
    def video_frames(self) -> tuple[int, ...]:
        return tuple(ref.frames for ref in self.videos)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def identity_body(self) -> dict[str, Any]:
        """The body with each image replaced by its content identity (response-tier key)."""
        return self.identity_of(self.body, self.image_hashes, self.video_hashes)

    def identity_of(self, body: Mapping[str, Any], image_hashes: tuple[str, ...],
                    video_hashes: tuple[str, ...]) -> dict[str, Any]:
        """``body`` (this request's own, or the body forwarded for it, whose media parts sit
        where this request's do) with its ``cache_salt`` dropped and each image and video
        part replaced by the given content identity: one normalization for the as-sent and
        the canonical response-tier keys, so a canonical request's stored answer is found."""
        out = {k: v for k, v in body.items() if k != "cache_salt"}
        if self.endpoint == "chat" and (self.images or self.videos):
            out["messages"] = copy.deepcopy(out["messages"])
            for ref, image_hash in zip(self.images, image_hashes, strict=True):
                out["messages"][ref.message]["content"][ref.part] = {
                    "type": "image", "sha256": image_hash}
            for vid, video_hash in zip(self.videos, video_hashes, strict=True):
                out["messages"][vid.message]["content"][vid.part] = {
                    "type": "video", "blake3": video_hash}
        return out


def load_body(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; :class:`RequestError` when it is not valid JSON (NaN
    and the infinities are not), not an object, or nested deeper than
    :data:`MAX_JSON_DEPTH`."""
    try:
        body = load_json(raw)
    except RecursionError:
        raise RequestError(f"body: JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise RequestError(f"body: not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise RequestError("body: expected a JSON object")
    if _too_deep(body, MAX_JSON_DEPTH):
        raise RequestError(f"body: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return body


def _too_deep(value: object, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` containers (iterative: no recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else (
            item if isinstance(item, list) else None)
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def parse_request(endpoint: Endpoint, body: object, headers: Mapping[str, str],
                  config: VlmCacheConfig,
                  sampling: VideoSampling | None = None) -> ParsedRequest:
    """Validate and decode one request body; :class:`RequestError` names what is wrong.

    ``sampling``: how the engine samples videos (the server's ``--media-io-kwargs`` and the
    model's video processor); ``None``: vLLM's defaults."""
    if not isinstance(body, dict):
        raise RequestError("body: expected a JSON object")
    tenant = request_tenant(body, headers)
    options = _options(body)
    if endpoint == "chat":
        media = _Media(config, sampling or VideoSampling(), body)
        try:
            transcript, question = _parse_chat(body, config, media)
        except RequestError:
            for ref in media.videos:  # decoded (and memoized) before the error: let go
                ref.query.thumbs.start_rest()
            raise
        return ParsedRequest(endpoint, body, tenant, options, tuple(media.images), transcript,
                             question, tuple(media.videos))
    return ParsedRequest(endpoint, body, tenant, options, (), _completion_prompt(body, config),
                         None)


def request_tenant(body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
    """The tenant a request names (its ``cache_salt`` or the tenant header, which must agree)."""
    salt = body.get("cache_salt")
    header = headers.get(TENANT_HEADER)
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise RequestError("cache_salt: expected a non-empty string (the tenant)")
    if header is not None and salt is not None and header != salt:
        raise RequestError(f"cache_salt: differs from the {TENANT_HEADER} header")
    return salt if salt is not None else (header or None)


def _options(body: dict[str, Any]) -> FrontOptions:
    raw = body.get("vlmcache", {})
    if not isinstance(raw, dict):
        raise RequestError("vlmcache: expected an object of options "
                           f"(allowed: {list(OPTION_KEYS)})")
    unknown = sorted(set(raw) - set(OPTION_KEYS))
    if unknown:
        raise RequestError(f"vlmcache: unknown option(s) {unknown}; allowed: {list(OPTION_KEYS)}")
    for key in OPTION_KEYS:
        if key in raw and not isinstance(raw[key], bool):
            raise RequestError(f"vlmcache.{key}: expected true or false")
    legacy = body.get("kv_transfer_params")
    legacy_bypass = isinstance(legacy, dict) and isinstance(legacy.get("vlmcache"), dict) \
        and legacy["vlmcache"].get("bypass") is True
    return FrontOptions(bypass=bool(raw.get("bypass", False)) or legacy_bypass,
                        response_cache=bool(raw.get("response_cache", True)))


def _limits(config: VlmCacheConfig) -> ImageLimits:
    return ImageLimits(config.max_image_bytes, config.max_image_pixels, config.remote_images,
                       config.remote_image_timeout_s)


class _Media:
    """The media of one chat request as its parts are read (images, videos, in order)."""

    def __init__(self, config: VlmCacheConfig, sampling: VideoSampling,
                 body: dict[str, Any]) -> None:
        self.config, self.sampling = config, sampling
        self.images: list[ImageRef] = []
        self.videos: list[VideoRef] = []
        io_kwargs = body.get("media_io_kwargs")
        if io_kwargs is not None and not isinstance(io_kwargs, dict):
            raise RequestError("media_io_kwargs: expected an object")
        runtime = (io_kwargs or {}).get("video")
        if runtime is not None and not isinstance(runtime, dict):
            raise RequestError("media_io_kwargs.video: expected an object")
        self.runtime = runtime
        proc = body.get("mm_processor_kwargs")
        if proc is not None and not isinstance(proc, dict):
            raise RequestError("mm_processor_kwargs: expected an object")
        self.processor_kwargs = proc

    def add_video(self, i: int, j: int, field: str, url: object, uuid: object) -> None:
        if len(self.videos) >= self.config.max_videos_per_request:
            raise RequestError(f"{field}: more than the {self.config.max_videos_per_request} "
                               "videos allowed per request (max_videos_per_request)")
        video = DECODED_VIDEOS.get(url, field, VideoLimits.from_config(self.config),
                                   self.sampling, self.runtime, self.processor_kwargs,
                                   thumbs=self.config.enable_video_near_duplicates)
        sent = video.data_url or url
        assert isinstance(sent, str)  # checked by the decode
        query = VideoQuery(video.content_hash, video.signature, video.thumbs, sent)
        self.videos.append(VideoRef(i, j, query, video.data_url is not None,
                                    str(uuid) if uuid is not None else None,
                                    video.frames * video.width * video.height))


def _parse_chat(body: dict[str, Any], config: VlmCacheConfig,
                media: _Media) -> tuple[str, str | None]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: expected a non-empty list")
    images = media.images
    transcript: list[list[Any]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise RequestError(f"messages[{i}]: expected an object with a role")
        content = msg.get("content")
        if content is None or isinstance(content, str):
            transcript.append([msg["role"], content or ""])
            continue
        if not isinstance(content, list):
            raise RequestError(f"messages[{i}].content: expected a string or a list of parts")
        parts = [_part(i, j, part, config, media) for j, part in enumerate(content)]
        transcript.append([msg["role"], parts])
    if len(images) > config.max_images_per_request:
        raise RequestError(f"messages: {len(images)} images, more than the "
                           f"{config.max_images_per_request} allowed per request")
    return encode_transcript(transcript), _question(transcript)


def encode_transcript(messages: list[list[Any]]) -> str:
    """Messages as the text the exact and paraphrase tiers key on (decodable again).

    No JSON: normalization keeps quoted spans verbatim, so the layout uses line markers
    (``<|m:user|>``, ``<|p|>`` between parts) after which a sentence starts.
    """
    out = []
    for role, content in messages:
        parts = [content] if isinstance(content, str) else [
            MEDIA_MARK if p is None else p for p in content]
        out.append(f"<|m:{role}|>\n" + PART_SEP.join(parts))
    return "\n".join(out)


def decode_transcript(text: str) -> list[tuple[str, list[str]]] | None:
    """Inverse of :func:`encode_transcript` (roles and their parts); ``None`` if unreadable."""
    if not text.startswith("<|m:"):
        return None
    pieces = _MSG_RE.split(text)
    if pieces[0] != "" or len(pieces) % 2 != 1:
        return None
    return [(pieces[k], pieces[k + 1].split(PART_SEP)) for k in range(1, len(pieces), 2)]


def _part(i: int, j: int, part: object, config: VlmCacheConfig,
          media: _Media) -> str | None:
    """The transcript entry of one content part (``None``: not text, not an image)."""
    field = f"messages[{i}].content[{j}]"
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise RequestError(f"{field}: expected an object")
    kind = part.get("type") or ("image_url" if "image_url" in part else None)
    if kind == "text":
        return str(part.get("text") or "")
    if kind in EMBED_TYPES or any(k in part for k in EMBED_TYPES):
        if not config.allow_embeds:
            raise RequestError(f"{field}: embedding inputs are not accepted from clients "
                               "(the deployment sets allow_embeds for trusted callers)")
        return None
    uuid = part.get("uuid")
    if uuid is not None and config.client_image_uuids == "refuse":
        raise RequestError(f"{field}.uuid: client-chosen media identities are not accepted")
    if kind in IMAGE_TYPES:
        url = _part_url(part, "image_url", field, "an image part must carry the image")
        if not isinstance(url, str) or not url:
            raise RequestError(f"{field}.image_url: expected an image URL string")
        image, pixel_hash = DECODED.get(url, f"{field}.image_url", _limits(config))
        media.images.append(ImageRef(i, j, image, pixel_hash,
                                     str(uuid) if uuid is not None else None))
        return IMAGE_MARK
    if kind in VIDEO_TYPES:
        url = _part_url(part, "video_url", field, "a video part must carry the video")
        media.add_video(i, j, f"{field}.video_url", url, uuid)
        return VIDEO_MARK
    return None  # other media (audio) go to vLLM as they are, minus client uuids


def _part_url(part: dict[str, Any], key: str, field: str, missing: str) -> object:
    """A media part's URL (``{key: {"url": ...}}`` or ``{key: "..."}``); a part with none
    (a uuid alone) is refused."""
    url = part.get(key)
    url = url.get("url") if isinstance(url, dict) else url
    if url is None:
        raise RequestError(f"{field}.{key}: {missing} (a uuid alone is not accepted)")
    return url


def _question(transcript: list[list[Any]]) -> str | None:
    """The last text of the last user message: what a paraphrase tier may replace."""
    for role, content in reversed(transcript):
        if role != "user":
            continue
        texts = [content] if isinstance(content, str) else [
            p for p in content if isinstance(p, str) and p not in (IMAGE_MARK, VIDEO_MARK)]
        return texts[-1] if texts and texts[-1].strip() else None
    return None


def _completion_prompt(body: dict[str, Any], config: VlmCacheConfig) -> str | None:
    if "prompt_embeds" in body and body["prompt_embeds"] is not None and not config.allow_embeds:
        raise RequestError("prompt_embeds: embedding inputs are not accepted from clients "
                           "(the deployment sets allow_embeds for trusted callers)")
    prompt = body.get("prompt")
    if prompt is None:
        raise RequestError("prompt: required")
    return prompt if isinstance(prompt, str) else None
