"""vlmcache's log lines in vLLM's server log.

vLLM configures only its own ``vllm`` logger; vlmcache's loggers would have no handler
(their INFO lines lost). ``vlmcache serve`` hands every vLLM process (API server,
EngineCore, workers) a logging config that adds a ``vlmcache`` logger on vLLM's handler
(``VLLM_LOGGING_CONFIG_PATH``); :func:`attach_to_vllm_logging` does the same in one
process when vLLM was started some other way (vlmcache's connectors call it in every engine
process they run in: ``CachedLLM``, a plain ``vllm serve`` with the flag).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

LOGGER = "vlmcache"


def vllm_logging_config(level: str = "INFO") -> dict[str, object]:
    """vLLM's default logging config plus a ``vlmcache`` logger on the same handler."""
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    config = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    config["loggers"][LOGGER] = {"handlers": list(config["loggers"]["vllm"]["handlers"]),
                                 "level": level, "propagate": False}
    return config


def write_logging_config(path: Path, level: str = "INFO") -> Path:
    """Write :func:`vllm_logging_config` as JSON to ``path`` (for VLLM_LOGGING_CONFIG_PATH),
    a private file that never follows a symlink planted in the (shared) run directory."""
    from vlmcache.store.chunkfile import write_private_file

    write_private_file(path, json.dumps(vllm_logging_config(level), indent=1).encode(),
                       stem="logging", sync=False)
    return path


def attach_to_vllm_logging(level: int = logging.INFO) -> None:
    """Show the ``vlmcache`` logger's lines through vLLM's handlers (idempotent), unless
    logging is configured already: the logger has handlers, or the root logger has (an
    application's, a test runner's), whose choice then stands. Once attached, records no
    longer propagate: a library that later calls ``logging.basicConfig`` in an engine
    process (one does, on vLLM 0.26 GPU engines) would otherwise print every line twice."""
    ours = logging.getLogger(LOGGER)
    if ours.handlers or logging.getLogger().handlers:
        return
    for handler in logging.getLogger("vllm").handlers:
        ours.addHandler(handler)
    if ours.handlers:
        ours.setLevel(level)
        ours.propagate = False
