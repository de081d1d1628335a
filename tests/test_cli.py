import json

import torch

from vlmcache.cli import main
from vlmcache.store.disk import DiskStore

KEY = "ab" * 32


def _store(tmp_path):
    disk = DiskStore(tmp_path / "kv", 1 << 20)
    disk.put(KEY, {"l0": torch.ones(4, 4)})
    disk.put("cd" * 32, {"l0": torch.zeros(4, 4)})
    disk.close()
    return disk


def test_stats_json(tmp_path, capsys):
    _store(tmp_path)
    assert main(["stats", "--store", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_chunks"] == 2 and out["kv_bytes"] == 2 * 64


def test_verify_finds_and_removes_corrupt_chunk(tmp_path, capsys):
    disk = _store(tmp_path)
    path = disk.path_for(KEY)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert main(["verify", "--store", str(tmp_path)]) == 1
    assert "1 good, 1 corrupt" in capsys.readouterr().out
    assert not path.exists()
    assert main(["verify", "--store", str(tmp_path)]) == 0


def test_missing_store_is_a_clear_error(tmp_path, capsys):
    assert main(["stats", "--store", str(tmp_path / "nope")]) == 2
    assert "no vlmcache store" in capsys.readouterr().err


def test_clear_needs_yes(tmp_path, capsys):
    _store(tmp_path)
    assert main(["clear", "--store", str(tmp_path)]) == 2
    assert (tmp_path / "kv").exists()
    assert main(["clear", "--store", str(tmp_path), "--yes"]) == 0
    assert not (tmp_path / "kv").exists()


def test_config_validates_file(tmp_path, capsys):
    bad = tmp_path / "c.yaml"
    bad.write_text("disk_write: eventually\n")
    assert main(["config", "--file", str(bad)]) == 2
    assert "disk_write: must be one of ['async', 'sync']" in capsys.readouterr().err


def test_serve_prints_a_wired_vllm_command(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    cfg = tmp_path / "v.yaml"
    cfg.write_text(f"store_path: {tmp_path / 'store'}\nblock_size: 32\n")
    assert main(["serve", str(model), "--vlmcache-config", str(cfg), "--vlmcache-set",
                 "enable_semantic_text=true", "--vlmcache-run-dir", str(tmp_path / "run"),
                 "--vlmcache-print", "--max-model-len", "1024"]) == 0
    out = json.loads(capsys.readouterr().out)
    argv, env = out["argv"], out["env"]
    assert argv[1:3] == ["-m", "vlmcache.serving.server_main"]  # vLLM's server, roomy stack
    assert argv[argv.index("--model") + 1] == str(model)
    assert argv[argv.index("--middleware") + 1] == "vlmcache.serving.asgi.VlmCacheMiddleware"
    assert "--kv-transfer-config" in argv and argv[-2:] == ["--max-model-len", "1024"]
    front = json.loads(open(env["VLMCACHE_FRONT_CONFIG"]).read())
    assert front["model"] == str(model) and front["config"]["enable_semantic_text"] is True
    assert front["config"]["block_size"] == 32
    logging_cfg = json.loads(open(env["VLLM_LOGGING_CONFIG_PATH"]).read())
    assert logging_cfg["loggers"]["vlmcache"]["level"] == "INFO"


def test_serve_refuses_bad_keys_and_wiring_flags(tmp_path, capsys):
    assert main(["serve", str(tmp_path), "--vlmcache-set", "stor_path=/x",
                 "--vlmcache-print"]) == 2
    assert "stor_path" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--vlmcache-set", f"store_path={tmp_path}",
                 "--vlmcache-print", "--kv-transfer-config", "{}"]) == 2
    assert "--kv-transfer-config is set by vlmcache serve" in capsys.readouterr().err


def test_serve_refuses_more_than_one_api_server(tmp_path, capsys):
    base = ["serve", str(tmp_path), "--vlmcache-set", f"store_path={tmp_path / 's'}",
            "--vlmcache-print"]
    for flag in (["--api-server-count", "4"], ["--api-server-count=2"]):
        assert main([*base, *flag]) == 2
        err = capsys.readouterr().err
        assert "--api-server-count" in err and "vlmcache proxy --workers" in err
    assert main([*base, "--api-server-count", "1"]) == 0
