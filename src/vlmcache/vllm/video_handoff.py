"""One decode per clip: the frames the front decoded, handed to vLLM's own video loader.

Inside ``vlmcache serve`` the front decodes a ``video_url`` with vLLM's loader to name the
frames the engine will see (:func:`vlmcache.vllm.video_io.load_video`); vLLM's media
connector, in the same API-server process, then decodes the same bytes again. On a
60-frame clip that second decode is 55-100 ms of a miss (``results/video.json``).

:func:`install` wraps each loader class registered in vLLM's ``VIDEO_LOADER_REGISTRY`` (a
subclass under the same name, only ``load_bytes`` changed): a decode made under
:func:`keeping` is kept in a :class:`ClipHandoff`, and the next decode of the same bytes with
the same backend and arguments takes it instead of decoding. The key is the BLAKE3 of the
bytes and the loader's arguments, so the engine gets exactly what its own decode would have
returned; anything else decodes as before. A kept clip the engine never asks for (an answer
from the response tier) leaves by age or by the byte budget.
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


@dataclass(frozen=True)
class _Kept:
    frames: Any
    metadata: dict[str, Any]
    nbytes: int
    at: float


class ClipHandoff:
    """Decoded clips waiting for the engine's loader: at most ``max_bytes`` of frames, each
    for at most ``ttl_s`` seconds, taken once."""

    def __init__(self, max_bytes: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes, self.ttl_s, self._clock = max_bytes, ttl_s, clock
        self._items: OrderedDict[bytes, _Kept] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.kept = self.taken = self.expired = 0

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
            self.kept += 1
            self._expire(force_bytes=True)
        return True

    def take(self, key: bytes) -> tuple[Any, dict[str, Any]] | None:
        """The clip kept under ``key`` (removed), or ``None``."""
        with self._lock:
            self._expire(force_bytes=False)
            kept = self._items.pop(key, None)
            if kept is None:
                return None
            self._bytes -= kept.nbytes
            self.taken += 1
        return kept.frames, dict(kept.metadata)

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
            self.expired += 1


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


def install(max_bytes: int, ttl_s: float) -> bool:
    """Wrap every video loader vLLM has registered so far (again later: loaders registered
    since are wrapped too); ``False`` when vLLM has no loader registry or ``max_bytes`` is
    0. Call it only in the process where vLLM's server decodes requests' videos."""
    global _handoff
    if max_bytes <= 0:
        return False
    if _registry() is None:
        return False
    with _install_lock:
        if _handoff is None:
            _handoff = ClipHandoff(max_bytes, ttl_s)
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
        "%d taken, %d kept, %d expired)", backend, handoff.taken, handoff.kept,
        handoff.expired)


def _wrapped(name: str, cls: type) -> type:
    """``cls`` with a ``load_bytes`` that first takes a kept decode of the same bytes."""

    def load_bytes(klass: type, data: bytes, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        handoff, keep = _handoff, getattr(_local, "keep", False)
        if handoff is None or not (keep or handoff.nbytes):  # nothing to take: no hashing
            return super(wrapper, klass).load_bytes(data, **kwargs)
        key = handoff_key(data, name, kwargs)
        found = handoff.take(key)
        if found is None:
            found = super(wrapper, klass).load_bytes(data, **kwargs)
        elif not keep:
            _log_taken(handoff, name)
        if keep:  # the front's decode: what the engine's loader takes next
            handoff.put(key, *found)
        return found

    wrapper = type(cls.__name__, (cls,), {
        "load_bytes": classmethod(load_bytes), _MARK: True,
        "__module__": cls.__module__, "__doc__": cls.__doc__,
        "__qualname__": getattr(cls, "__qualname__", cls.__name__)})
    return wrapper
