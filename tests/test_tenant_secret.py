"""The deployment secret tenant_salt (issue 33): never in argv, logs or readable files; a
random one per store when none is configured, shared by every process."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vlmcache import tenant_secret
from vlmcache.cli import main
from vlmcache.config import VlmCacheConfig
from vlmcache.errors import ConfigError
from vlmcache.keys import Namespace
from vlmcache.serving.launch import serve_command
from vlmcache.tenant_secret import SALT_ENV, SALT_FILE, deployment_salt
from vlmcache.vllm.engine_config import engine_wiring

SECRET = "sekrit-0123456789abcdef-deployment"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(SALT_ENV, raising=False)
    monkeypatch.setattr(tenant_secret, "_salts", {})  # each test reads the store afresh


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _serve(tmp_path: Path, run_dir: Path | None = None, **config):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    cfg = VlmCacheConfig(store_path=str(tmp_path / "store"), **config)
    run_dir = run_dir or cfg.store_dir / "serve" / "4242"
    return serve_command(str(model), cfg, [], "cpu", run_dir), cfg, run_dir


def test_a_configured_salt_is_in_no_argv_and_no_file_only_in_the_environment(tmp_path):
    command, _, run_dir = _serve(tmp_path, tenant_salt=SECRET)
    assert SECRET not in json.dumps(command.argv)  # vLLM logs its args, others read argv
    assert command.env[SALT_ENV] == SECRET
    for name in ("front.json", "logging.json"):
        assert SECRET not in (run_dir / name).read_text()
        assert _mode(run_dir / name) == 0o600
    front = json.loads((run_dir / "front.json").read_text())
    assert "tenant_salt" not in front["config"]


def test_without_a_configured_salt_the_store_makes_one_and_nothing_leaks_it(tmp_path):
    command, cfg, run_dir = _serve(tmp_path)
    salt = (cfg.store_dir / SALT_FILE).read_text().strip()
    assert len(salt) == 64 and int(salt, 16) >= 0  # 32 random bytes, hex
    assert SALT_ENV not in command.env
    assert salt not in json.dumps(command.argv) + (run_dir / "front.json").read_text()
    assert _mode(cfg.store_dir) == _mode(cfg.store_dir / "serve") == _mode(run_dir) == 0o700
    assert _mode(cfg.store_dir / SALT_FILE) == 0o600


def test_the_transfer_configs_vllm_prints_hold_no_salt():
    wiring = engine_wiring(VlmCacheConfig(tenant_salt=SECRET), "cpu")
    assert SECRET not in json.dumps(wiring.cli_args()) + repr(wiring)
    assert wiring.env[SALT_ENV] == SECRET


def test_a_planted_symlink_is_never_written_through(tmp_path):
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    store = tmp_path / "store"
    (store / "serve").mkdir(parents=True)
    os.symlink(elsewhere, store / "serve" / "4242")
    with pytest.raises(ConfigError, match="symbolic link"):
        _serve(tmp_path)
    assert list(elsewhere.iterdir()) == []
    os.symlink(elsewhere, tmp_path / "linked-store")
    with pytest.raises(ConfigError, match="store_path.*symbolic link"):
        deployment_salt(VlmCacheConfig(store_path=str(tmp_path / "linked-store")))
    assert list(elsewhere.iterdir()) == []


def test_a_random_salt_is_created_once_and_reused(tmp_path):
    cfg = VlmCacheConfig(store_path=str(tmp_path / "s"))
    first = deployment_salt(cfg)
    tenant_secret._salts.clear()  # a later start: read back from the store
    assert deployment_salt(VlmCacheConfig(store_path=str(tmp_path / "s"))) == first
    assert deployment_salt(VlmCacheConfig(store_path=str(tmp_path / "other"))) != first
    assert deployment_salt(VlmCacheConfig(store_path=str(tmp_path / "s"),
                                          tenant_salt=SECRET)) == SECRET


def test_processes_starting_at_once_on_one_store_agree(tmp_path):
    code = ("import sys; from vlmcache.config import VlmCacheConfig; "
            "from vlmcache.tenant_secret import deployment_salt; "
            "print(deployment_salt(VlmCacheConfig(store_path=sys.argv[1])))")
    env = {k: v for k, v in os.environ.items() if k != SALT_ENV}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "s")], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(6)]
    salts = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(salts) == 1 and salts == {(tmp_path / "s" / SALT_FILE).read_text().strip()}
    assert not [p for p in (tmp_path / "s").iterdir() if p.name != SALT_FILE]  # no temp left


def test_the_environment_supplies_the_salt_to_processes_given_none(tmp_path, monkeypatch):
    monkeypatch.setenv(SALT_ENV, SECRET)
    assert deployment_salt(VlmCacheConfig(store_path=str(tmp_path / "s"))) == SECRET
    assert not (tmp_path / "s" / SALT_FILE).exists()


def test_a_salt_file_others_can_read_or_a_symlinked_one_is_refused(tmp_path):
    store = tmp_path / "s"
    deployment_salt(VlmCacheConfig(store_path=str(store)))
    os.chmod(store / SALT_FILE, 0o644)
    tenant_secret._salts.clear()
    with pytest.raises(ConfigError, match="chmod 600"):
        deployment_salt(VlmCacheConfig(store_path=str(store)))
    os.unlink(store / SALT_FILE)
    (tmp_path / "planted").write_text("a" * 64)
    os.symlink(tmp_path / "planted", store / SALT_FILE)
    with pytest.raises(ConfigError, match="tenant_salt"):
        deployment_salt(VlmCacheConfig(store_path=str(store)))


def test_the_front_and_the_engine_derive_the_same_salt(tmp_path):
    from vlmcache.serving.front import CascadeFront
    from vlmcache.vllm.namespace import namespace_for_model

    (tmp_path / "m").mkdir()
    cfg = VlmCacheConfig(store_path=str(tmp_path / "s"), model_revision="r")
    front = CascadeFront.for_model(str(tmp_path / "m"), cfg, metrics=None)
    stored = (tmp_path / "s" / SALT_FILE).read_text().strip()
    assert front.config.tenant_salt == stored  # the rewrite's tenant salts use it
    tenant_secret._salts.clear()  # the engine: another process, same store
    assert namespace_for_model(str(tmp_path / "m"), cfg).tenant_salt == stored


def test_no_repr_or_printed_config_shows_the_salt(tmp_path, capsys):
    assert SECRET not in repr(Namespace("m", "w", "p", "l", tenant_salt=SECRET))
    assert SECRET not in repr(VlmCacheConfig(tenant_salt=SECRET))
    cfg = tmp_path / "v.yaml"
    cfg.write_text(f"tenant_salt: {SECRET}\n")
    assert main(["config", "--file", str(cfg)]) == 0
    assert SECRET not in capsys.readouterr().out


def test_serve_refuses_a_salt_on_its_own_command_line(tmp_path, capsys):
    assert main(["serve", str(tmp_path), "--vlmcache-set", f"tenant_salt={SECRET}",
                 "--vlmcache-print"]) == 2
    assert SALT_ENV in capsys.readouterr().err
