"""Default deny at the edge (issue 33): every route vLLM's server mounts is classified, and
no route outside the cascade forwards a client's ``cache_salt``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_front_asgi import Rig  # noqa: E402

from vlmcache.errors import ConfigError  # noqa: E402
from vlmcache.keys import tenant_cache_salt  # noqa: E402
from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.routes import ROUTE_TABLE, route_policy  # noqa: E402

#: Builds vLLM's real FastAPI app (no engine) with every router it can include: all tasks,
#: dev mode, LoRA updating, Cohere, tokenizer info, fault tolerance, a pooling model.
_LIST_ROUTES = textwrap.dedent("""
    import json, types, typing
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.tasks import SupportedTask
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--model", "m", "--enable-tokenizer-info-endpoint"])
    args.enable_fault_tolerance = True

    class PoolingModel:
        io_processor_plugin = None
        hf_config = types.SimpleNamespace(num_labels=1)

        def get_pooling_task(self, supported):
            return "embed"

    app = build_app(args, tuple(typing.get_args(SupportedTask)), PoolingModel())
    out = []
    for r in app.routes:
        kind = type(r).__name__
        methods = getattr(r, "methods", None) or (
            ["WEBSOCKET"] if "WebSocket" in kind else ["GET"])
        out.append([r.path, sorted(methods), kind])
    print("ROUTES=" + json.dumps(out))
""")


def _vllm_routes() -> list[tuple[str, list[str], str]]:
    pytest.importorskip("vllm.entrypoints.launchers.app")
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
           "VLLM_ENABLE_COHERE_API": "1"}
    done = subprocess.run([sys.executable, "-c", _LIST_ROUTES], env=env, capture_output=True,
                          text=True, timeout=300)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("ROUTES=")]
    assert lines, done.stderr[-3000:]
    return [tuple(r) for r in json.loads(lines[0][len("ROUTES="):])]


def test_every_route_the_server_mounts_is_bound_refused_or_an_explicit_pass():
    routes = _vllm_routes()
    paths = {path for path, _, _ in routes}
    assert {"/v1/chat/completions", "/v1/responses", "/invocations", "/v1/messages",
            "/v1/embeddings", "/v1/realtime", "/reset_prefix_cache"} <= paths
    unclassified = []
    for path, methods, kind in routes:
        for method in methods:
            if method == "HEAD":
                continue
            policy = route_policy(method, path)
            if policy.kind == "refused" and method not in policy.methods:
                unclassified.append(f"{method} {path} ({kind})")  # unknown or not listed
    assert unclassified == []
    # routes mounted only with an optional package (cohere) or a profiler config
    assert set(ROUTE_TABLE) - paths <= {"/cohere/v2/chat", "/start_profile", "/stop_profile"}


@pytest.mark.parametrize("path", ["/v1/responses", "/invocations", "/v1/messages",
                                  "/v1/chat/completions/batch", "/inference/v1/generate"])
def test_bound_routes_never_forward_the_client_salt(tmp_path, path):
    rig = Rig(tmp_path, tenant_salt="deploy-secret")
    stolen = tenant_cache_salt("", "a")  # a's salt as anyone could compute it before
    body = {"model": "m", "input": "hi", "cache_salt": stolen,
            "kv_transfer_params": {"vlmcache": {"tenant": "a"}}}
    assert rig.post(body, path).status_code == 200
    sent = rig.engine.bodies[-1]
    assert sent["cache_salt"] == tenant_cache_salt("deploy-secret", stolen) != stolen
    assert sent["kv_transfer_params"]["vlmcache"] == {"bypass": False, "tenant": stolen}
    rig.post({"model": "m", "input": "hi"}, path, headers={"x-vlmcache-tenant": "a"})
    assert rig.engine.bodies[-1]["cache_salt"] == tenant_cache_salt("deploy-secret", "a")
    rig.post({"model": "m", "input": "hi"}, path)
    assert "cache_salt" not in rig.engine.bodies[-1]


def test_renderer_routes_drop_the_client_salt(rig_salted):
    rig_salted.post({"model": "m", "prompt": "hi", "cache_salt": "x"}, "/tokenize")
    assert rig_salted.engine.bodies[-1] == {"model": "m", "prompt": "hi"}


@pytest.fixture
def rig_salted(tmp_path):
    return Rig(tmp_path, tenant_salt="deploy-secret")


@pytest.mark.parametrize("method,path,status", [
    ("POST", "/v1/embeddings", 403), ("POST", "/reset_prefix_cache", 403),
    ("POST", "/v1/audio/transcriptions", 403), ("POST", "/v1/brand_new_route", 404),
    ("GET", "/v1/chat/completions", 405), ("GET", "/server_info", 403)])
def test_other_routes_are_refused_with_an_error_naming_the_route(rig_salted, method, path,
                                                                 status):
    async def go():
        import httpx

        transport = httpx.ASGITransport(app=rig_salted.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.request(method, path, json={"input": "hi", "cache_salt": "x"})
    r = asyncio.run(go())
    assert r.status_code == status
    error = r.json()["error"]
    assert path in error["message"] and "open_routes" in error["message"]
    assert error["param"] == "route" and rig_salted.engine.bodies == []


def test_read_only_routes_pass_and_open_routes_opens_a_refused_one(tmp_path):
    rig = Rig(tmp_path, open_routes="/v1/embeddings, /v1/brand_new_route")
    rig.post({"input": "hi", "cache_salt": "x"}, "/v1/embeddings")
    rig.post({"input": "hi"}, "/v1/brand_new_route")
    assert rig.engine.bodies == [{"input": "hi", "cache_salt": "x"}, {"input": "hi"}]
    rig.post({"input": "hi"}, "/ping")
    assert rig.engine.bodies[-1] == {"input": "hi"}


def test_a_cors_preflight_passes_only_where_the_route_is_served():
    assert route_policy("OPTIONS", "/v1/chat/completions").kind == "passes"
    assert route_policy("OPTIONS", "/v1/responses").kind == "passes"
    assert route_policy("OPTIONS", "/v1/embeddings").kind == "refused"
    assert route_policy("OPTIONS", "/v1/brand_new_route").kind == "refused"


def test_open_routes_must_name_a_refused_or_unknown_route():
    with pytest.raises(ConfigError, match="open_routes.*already served"):
        VlmCacheConfig(open_routes="/v1/responses")
    with pytest.raises(ConfigError, match="open_routes.*start with"):
        VlmCacheConfig(open_routes="v1/embeddings")


def test_a_websocket_route_is_closed_before_it_opens(rig_salted):
    sent = []

    async def receive():
        return {"type": "websocket.connect"}

    async def send(message):
        sent.append(message)
    scope = {"type": "websocket", "path": "/v1/realtime", "headers": []}
    asyncio.run(rig_salted.app(scope, receive, send))
    assert sent == [{"type": "websocket.close", "code": 1008}]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses",
                                  "/tokenize"])
@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"a":' * 50_000,
                                 json.dumps({"model": "m", "x": [[[[[[[[[[[[1]]]]]]]]]]]] * 1,
                                             "y": json.loads("[" * 130 + "]" * 130)}).encode()],
                         ids=["list-100000", "object-50000", "list-131-in-a-body"])
def test_deeply_nested_json_gets_a_400_not_a_500(rig, path, raw):
    r = rig.post(raw, path, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "nested deeper" in r.json()["error"]["message"] or "not valid JSON" in \
        r.json()["error"]["message"]
    assert rig.engine.bodies == []


@pytest.fixture
def rig(tmp_path):
    return Rig(tmp_path)
