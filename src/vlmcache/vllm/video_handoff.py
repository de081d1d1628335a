"""One decode per clip: the frames the front decoded, handed to vLLM's own video loader.

Inside ``vlmcache serve`` the front decodes a ``video_url`` with vLLM's loader to name the
frames the engine will see (:func:`vlmcache.vllm.video_io.load_video`); vLLM's media
connector, in the same API-server process, then decodes the same bytes again. On a
60-frame clip that second decode is 55-100 ms of a miss (``results/video.json``); and every
later question on the same clip (vLLM 0.26 cannot take a video by its uuid alone, so its
bytes go with each) is decoded again by vLLM though nothing about it changed.

:func:`install` wraps each loader class registered in vLLM's ``VIDEO_LOADER_REGISTRY`` (a
subclass under the same name, only ``load_bytes`` changed): a decode made under
:func:`keeping` is kept in a :class:`ClipHandoff`, and every decode of the same bytes with
the same backend and arguments while it is kept gets a copy of it instead of decoding. The
key is the BLAKE3 of the bytes and the loader's arguments, so the engine gets exactly what
its own decode would have returned (a copy: nothing the engine's processing does to its
frames reaches the kept ones); anything else decodes as before. A kept clip leaves by age
(``ttl_s`` after its last use) or by the byte budget, least recently used first.

Every outcome is counted (``kept``, ``taken``, ``expired``, and ``decoded``: the engine's
loader decoded bytes itself) and can be observed (:func:`install`'s ``observe``): a miss whose
clip the engine decoded again shows as ``decoded`` beside its ``kept``, so a deployment (and
the video benchmark) can tell whether the second decode is really gone.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from blake3 import blake3

logger = logging.getLogger(__name__)

_MARK = "_vlmcache_handoff"


@dataclass
class _Kept:
    frames: Any
    metadata: dict[str, Any]
    nbytes: int
    at: float  # last use


#: What :class:`ClipHandoff` counts; the observer gets one of these per event.
OUTCOMES = ("kept", "taken", "expired", "decoded")


class ClipHandoff:
    """Decoded clips for the engine's loader: at most ``max_bytes`` of frames, each until
    ``ttl_s`` seconds after its last use. ``observe`` is told every outcome (one of
    :data:`OUTCOMES`); it must not raise (a metrics counter)."""

    def __init__(self, max_bytes: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 observe: Callable[[str], None] | None = None) -> None:
        self.max_bytes, self.ttl_s, self._clock = max_bytes, ttl_s, clock
        self._observe = observe
        self._items: OrderedDict[bytes, _Kept] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.kept = self.taken = self.expired = self.decoded = 0

    def _event(self, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        if self._observe is not None:
            try:
                self._observe(outcome)
            except Exception:  # a counter's fault is not the request's
                logger.debug("vlmcache: the handoff's observer failed", exc_info=True)

    @property
    def nbytes(self) -> int:
        """Bytes of frames kept now."""
        return self._bytes

    def put(self, key: bytes, frames: Any, metadata: dict[str, Any]) -> bool:
        """Keep one decoded clip; ``False`` when it alone is over the budget."""
        size = int(getattr(frames, "nbytes", 0))
        if size > self.max_bytes:
            return False
        with self._lock:
            self._drop(self._items.pop(key, None))
            self._items[key] = _Kept(frames, dict(metadata), size, self._clock())
            self._bytes += size
            self._event("kept")
            self._expire(force_bytes=True)
        return True

    def take(self, key: bytes, by_engine: bool = True) -> tuple[Any, dict[str, Any]] | None:
        """A copy of the clip kept under ``key`` (which stays kept, its age renewed), or
        ``None``; counted as ``taken`` when ``by_engine`` (the front's own decode of the
        same bytes is only renewed)."""
        with self._lock:
            self._expire(force_bytes=False)
            kept = self._items.get(key)
            if kept is None:
                return None
            kept.at = self._clock()
            self._items.move_to_end(key)
            if by_engine:
                self._event("taken")
            frames, metadata = kept.frames, dict(kept.metadata)
        copy = getattr(frames, "copy", None)
        return (copy() if callable(copy) else frames), metadata

    def note_decoded(self) -> None:
        """The engine's loader decoded a clip itself (nothing kept under its key)."""
        with self._lock:
            self._event("decoded")

    def _drop(self, kept: _Kept | None) -> None:
        if kept is not None:
            self._bytes -= kept.nbytes

    def _expire(self, force_bytes: bool) -> None:
        oldest_allowed = self._clock() - self.ttl_s
        while self._items:
            key, first = next(iter(self._items.items()))
            if first.at >= oldest_allowed and not (force_bytes and self._bytes > self.max_bytes):
                return
            del self._items[key]
            self._bytes -= first.nbytes
            self._event("expired")


_local = threading.local()
_handoff: ClipHandoff | None = None
_install_lock = threading.Lock()
_logged = False


@contextmanager
def keeping() -> Iterator[None]:
    """Decodes in this block (this thread) are kept for the engine's loader, when
    :func:`install` ran in this process; otherwise nothing changes."""
    if _handoff is not None:  # loaders a model registered since install()
        _wrap_registered()
    before = getattr(_local, "keep", False)
    _local.keep = True
    try:
        yield
    finally:
        _local.keep = before


def handoff_key(data: bytes, backend: str, kwargs: dict[str, Any]) -> bytes:
    """What a decode is kept under: the bytes' BLAKE3 (a third of SHA-256's time on a clip's
    MBs, paid twice a miss), the backend and its arguments."""
    args = json.dumps(kwargs, sort_keys=True, default=repr).encode()
    return blake3(data).digest() + backend.encode() + b"\0" + args


def install(max_bytes: int, ttl_s: float,
            observe: Callable[[str], None] | None = None) -> bool:
    """Wrap every video loader vLLM has registered so far (again later: loaders registered
    since are wrapped too); ``False`` when vLLM has no loader registry or ``max_bytes`` is
    0. Call it only in the process where vLLM's server decodes requests' videos.
    ``observe`` is told each outcome (:data:`OUTCOMES`)."""
    global _handoff
    if max_bytes <= 0:
        return False
    if _registry() is None:
        return False
    with _install_lock:
        if _handoff is None:
            _handoff = ClipHandoff(max_bytes, ttl_s, observe=observe)
    _wrap_registered()
    logger.info("vlmcache: videos the front decodes are handed to vLLM's loader "
                "(up to %d MiB for %g s)", max_bytes // 2**20, ttl_s)
    return True


def uninstall() -> None:
    """Undo :func:`install` (tests): the registry's own classes back, nothing kept."""
    global _handoff
    registry = _registry()
    with _install_lock:
        _handoff = None
        for name, cls in list(getattr(registry, "name2class", {}).items()):
            if getattr(cls, _MARK, False):
                registry.name2class[name] = cls.__mro__[1]


def _wrap_registered() -> None:
    registry = _registry()
    with _install_lock:
        for name, cls in list(registry.name2class.items()):
            if not getattr(cls, _MARK, False):
                registry.name2class[name] = _wrapped(name, cls)


def current() -> ClipHandoff | None:
    """The process's handoff (``None`` until :func:`install`)."""
    return _handoff


def _registry() -> Any:
    try:
        from vllm.multimodal.video import VIDEO_LOADER_REGISTRY
    except ImportError:
        return None
    return VIDEO_LOADER_REGISTRY if hasattr(VIDEO_LOADER_REGISTRY, "name2class") else None


def _log_taken(handoff: ClipHandoff, backend: str) -> None:
    # the first one at INFO: a deployment's log shows the handoff works in its layout
    global _logged
    log = logger.debug if _logged else logger.info
    _logged = True
    log("vlmcache: vLLM's %s video loader took the front's decode (clip decoded once; "
        "%d taken, %d kept, %d expired, %d decoded by the engine)", backend, handoff.taken,
        handoff.kept, handoff.expired, handoff.decoded)


def _wrapped(name: str, cls: type) -> type:
    """``cls`` with a ``load_bytes`` that first takes a kept decode of the same bytes."""

    def load_bytes(klass: type, data: bytes, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        handoff, keep = _handoff, getattr(_local, "keep", False)
        if handoff is None or not (keep or handoff.nbytes):  # nothing to take: no hashing
            if handoff is not None:
                handoff.note_decoded()
            return super(wrapper, klass).load_bytes(data, **kwargs)
        key = handoff_key(data, name, kwargs)
        found = handoff.take(key, by_engine=not keep)
        if found is not None:
            if not keep:
                _log_taken(handoff, name)
            return found
        found = super(wrapper, klass).load_bytes(data, **kwargs)
        if keep:  # the front's decode: what the engine's loader takes
            handoff.put(key, *found)
        else:
            handoff.note_decoded()
        return found

    wrapper = type(cls.__name__, (cls,), {
        "load_bytes": classmethod(load_bytes), _MARK: True,
        "__module__": cls.__module__, "__doc__": cls.__doc__,
        "__qualname__": getattr(cls, "__qualname__", cls.__name__)})
    return wrapper
