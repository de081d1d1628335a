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
    """Write :func:`vllm_logging_config` as JSON to ``path`` (for VLLM_LOGGING_CONFIG_PATH)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(vllm_logging_config(level), indent=1))
    return path


def attach_to_vllm_logging(level: int = logging.INFO) -> None:
    """Give the ``vlmcache`` logger vLLM's handlers if it has none (idempotent). Its records
    still reach the root logger where that has handlers of its own (an application's, a test
    runner's); in vLLM's processes it has none, and nothing is printed twice."""
    ours = logging.getLogger(LOGGER)
    if ours.handlers:
        return
    for handler in logging.getLogger("vllm").handlers:
        ours.addHandler(handler)
    if ours.handlers:
        ours.setLevel(level)
        ours.propagate = bool(logging.getLogger().handlers)
