"""The deployment secret ``tenant_salt``: where it comes from, and private files and dirs.

Every tenant's ``cache_salt`` and image identities are derived from the deployment's salt
(:func:`~vlmcache.keys.tenant_cache_salt`); anyone who knows it computes every tenant's
salt from the tenant's name. So it comes, in this order, from:

1. ``tenant_salt`` in the vlmcache config (a YAML file the operator keeps private);
2. the environment variable :data:`SALT_ENV`;
3. the store's own salt file ``<store>/tenant_salt``: 32 random bytes (hex), 0600, created
   at the first start (published with ``link``, so two processes starting at once agree)
   and read by every later start and every process of the server.

It never goes on a command line, into a log line or into a file other users can read:
vlmcache's transfer configs for vLLM (which vLLM prints) and ``front.json`` carry no salt;
an explicitly configured salt reaches vLLM's processes through the environment.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from vlmcache.errors import ConfigError

if TYPE_CHECKING:
    from vlmcache.config import VlmCacheConfig

logger = logging.getLogger(__name__)

SALT_ENV = "VLMCACHE_TENANT_SALT"
SALT_FILE = "tenant_salt"
MASK = "***"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_salts: dict[str, str] = {}
_lock = threading.Lock()


def deployment_salt(config: "VlmCacheConfig") -> str:
    """The deployment's salt: the config's, else ``$VLMCACHE_TENANT_SALT``, else the store's
    salt file (created with a random salt when missing)."""
    if config.tenant_salt:
        return config.tenant_salt
    if os.environ.get(SALT_ENV):
        return os.environ[SALT_ENV]
    store = config.store_dir
    with _lock:
        if str(store) not in _salts:
            _salts[str(store)] = _read_or_create(store)
        return _salts[str(store)]


def with_deployment_salt(config: "VlmCacheConfig") -> "VlmCacheConfig":
    """``config`` with its ``tenant_salt`` resolved (:func:`deployment_salt`)."""
    salt = deployment_salt(config)
    return config if salt == config.tenant_salt else dataclasses.replace(config, tenant_salt=salt)


def public_config(config: "VlmCacheConfig") -> dict[str, object]:
    """The config as plain values without the salt: what may be written or logged."""
    values = config.to_dict()
    values.pop("tenant_salt", None)
    return values


def _read_or_create(store: Path) -> str:
    try:
        ensure_private_dir(store, "store_path")
        path = store / SALT_FILE
        if not os.path.lexists(path):
            _publish(store, secrets.token_hex(32))
        return _read(path)
    except OSError as exc:
        raise ConfigError(f"tenant_salt: cannot read or create the store's salt file in "
                          f"{store} ({exc}); set store_path to a writable directory or pass "
                          f"the salt in the environment variable {SALT_ENV}") from None


def _publish(store: Path, salt: str) -> None:
    """Write ``salt`` to a private temp file and link it into place: the first process to
    link wins, the others read its salt (a reader never sees a half-written file)."""
    tmp = store / f".{SALT_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(salt + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, store / SALT_FILE)
            logger.info("vlmcache: created a random tenant_salt in %s (0600)", store / SALT_FILE)
        except FileExistsError:
            pass  # another process published first: its salt is the store's
    finally:
        os.unlink(tmp)


def _read(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)  # a planted symlink: ELOOP, an OSError
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ConfigError(f"tenant_salt: {path} must be a regular file of this user, "
                              f"readable by it alone (chmod 600); it is mode "
                              f"{stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}")
        salt = f.read().strip()
    if len(salt) < 32:
        raise ConfigError(f"tenant_salt: {path} holds no salt (remove it: a new one is made)")
    return salt


def ensure_private_dir(path: Path, what: str) -> None:
    """Create ``path`` (and missing parents) 0700; refuse a symlink, a non-directory or a
    directory of another user at ``path`` (never written through)."""
    missing = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for part in reversed(missing):
        try:
            os.mkdir(part, 0o700)
        except FileExistsError:
            pass  # made by a process starting beside this one: checked below
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{what}: {path} is a symbolic link; vlmcache does not write "
                          "through links: name the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what}: {path} exists and is not a directory")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{what}: {path} belongs to uid {st.st_uid}, not to this user "
                          f"(uid {os.geteuid()}); use a directory of your own")


def write_private_file(directory: Path, name: str, text: str) -> Path:
    """Write ``text`` to ``directory/name``, 0600, through a fresh temp file (``O_EXCL``,
    ``O_NOFOLLOW``) renamed into place: never through a planted file or link."""
    tmp = directory / f".{name}.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, directory / name)
    return directory / name
