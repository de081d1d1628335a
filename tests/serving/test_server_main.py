"""``vlmcache serve``'s launcher runs vLLM's server module as ``__main__`` with the
arguments it was given, from a frame with room on CPython's frame stack."""

from __future__ import annotations

import sys

from vlmcache.serving import server_main


def test_the_server_module_runs_as_main_with_the_arguments(tmp_path, monkeypatch):
    (tmp_path / "probe_server.py").write_text(
        "import sys\n"
        "if __name__ == '__main__':\n"
        "    sys.modules['probe_seen'] = list(sys.argv[1:])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(server_main, "SERVER_MODULE", "probe_server")
    monkeypatch.setattr(sys, "argv", ["server_main", "--model", "m", "--port", "8001"])
    server_main.main()
    args = sys.modules.pop("probe_seen")
    assert args == ["--model", "m", "--port", "8001"]
    assert sys.argv == ["server_main", "--model", "m", "--port", "8001"]  # restored


def test_the_launcher_is_what_serve_runs():
    from vlmcache.serving.launch import LAUNCHER_MODULE

    assert LAUNCHER_MODULE == server_main.__name__
