"""Default deny at the edge: what the front does with each route of vLLM's OpenAI server.

:data:`ROUTE_TABLE` is the one place that decides, from vLLM 0.32's routers (every router
``vllm.entrypoints.launchers.app.build_app`` can include), what a request on a route gets:

- ``front``: the whole cascade (``/v1/chat/completions``, ``/v1/completions``);
- ``bound``: the route reaches the engine and vLLM reads a ``cache_salt`` from its body: the
  front drops the client's salt and sets the tenant's own (as it does for chat), so no client
  chooses whose cache it reads; client media identities and embeds are refused there;
- ``render``: renderer-only routes (tokenize, render): the client's salt is dropped, the
  identity guard applies, nothing reaches the engine's caches;
- ``passes``: read-only routes that never reach the engine's caches (health, models, docs);
- ``refused``: everything else, and every route this table does not know (one a later vLLM
  adds): 403 (known) or 404 (unknown) with a JSON error naming the route. An operator opens
  a refused route with the config key ``open_routes`` (it then passes untouched).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

RouteKind = Literal["front", "bound", "render", "passes", "refused"]
READ = frozenset({"GET", "HEAD"})
POST = frozenset({"POST"})


@dataclass(frozen=True)
class RoutePolicy:
    """What the front does with one route: its kind, the methods it serves, and why."""

    kind: RouteKind
    methods: frozenset[str]
    why: str


def _p(kind: RouteKind, methods: frozenset[str], why: str) -> RoutePolicy:
    return RoutePolicy(kind, methods, why)


_GEN = "reaches the engine; vLLM reads cache_salt from the body"
_RENDER = "renderer only (no engine cache); the client's cache_salt is dropped"
_RO = "read-only; never reaches the engine's caches"
_ADMIN = "administers the engine (caches, weights, sleep, scaling): operators only"
_POOL = "pooling/scoring on the engine; vlmcache serves generative VLMs"

#: route path (FastAPI syntax) -> policy. ``websocket`` routes use the method WEBSOCKET.
ROUTE_TABLE: dict[str, RoutePolicy] = {
    "/v1/chat/completions": _p("front", POST, "the cascade: tenant bound, identities minted"),
    "/v1/completions": _p("front", POST, "the cascade: tenant bound"),
    "/v1/responses": _p("bound", POST, _GEN),
    "/invocations": _p("bound", POST, _GEN + " (SageMaker: dispatched to chat/completions)"),
    "/v1/messages": _p("bound", POST, _GEN + " (Anthropic API)"),
    "/v1/chat/completions/batch": _p("bound", POST, _GEN),
    "/v1/systemone": _p("bound", POST, _GEN + " (structured decisions)"),
    "/generative_scoring": _p("bound", POST, _GEN),
    "/inference/v1/generate": _p("bound", POST, _GEN + " (token in, token out)"),
    "/tokenize": _p("render", POST, _RENDER),
    "/detokenize": _p("render", POST, _RENDER),
    "/v1/messages/count_tokens": _p("render", POST, _RENDER),
    "/v1/chat/completions/render": _p("render", POST, _RENDER),
    "/v1/completions/render": _p("render", POST, _RENDER),
    "/v1/responses/render": _p("render", POST, _RENDER),
    "/v1/messages/render": _p("render", POST, _RENDER),
    "/v1/chat/completions/derender": _p("render", POST, _RENDER),
    "/v1/completions/derender": _p("render", POST, _RENDER),
    "/health": _p("passes", READ, _RO), "/ping": _p("passes", READ | POST, _RO + " (health)"),
    "/load": _p("passes", READ, _RO), "/version": _p("passes", READ, _RO),
    "/metrics": _p("passes", READ, _RO), "/v1/models": _p("passes", READ, _RO),
    "/openapi.json": _p("passes", READ, _RO), "/docs": _p("passes", READ, _RO),
    "/docs/oauth2-redirect": _p("passes", READ, _RO), "/redoc": _p("passes", READ, _RO),
    "/v1/responses/{response_id}": _p("passes", READ, _RO + " (a stored response by its "
                                      "unguessable id)"),
    "/v1/responses/{response_id}/cancel": _p("passes", POST, "cancels a background response "
                                             "by its unguessable id"),
    "/v1/realtime": _p("refused", frozenset({"WEBSOCKET"}), "audio on the engine over a "
                       "websocket: no tenant binding"),
    "/v1/audio/transcriptions": _p("refused", POST, "audio on the engine: no tenant binding"),
    "/v1/audio/translations": _p("refused", POST, "audio on the engine: no tenant binding"),
    "/cohere/v2/chat": _p("refused", POST, "generation without the front's tenant binding"),
    **{path: _p("refused", POST, _POOL) for path in (
        "/pooling", "/classify", "/score", "/rerank", "/v1/embeddings", "/v1/score",
        "/v1/rerank", "/v2/rerank", "/v2/embed")},
    **{path: _p("refused", POST, _ADMIN) for path in (
        "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/collective_rpc",
        "/sleep", "/wake_up", "/release_kv_cache_memory", "/pause", "/resume",
        "/abort_requests", "/inference/v1/abort_requests", "/init_weight_transfer_engine",
        "/shutdown_weight_transfer_engine", "/start_weight_update",
        "/start_draft_weight_update", "/update_weights", "/finish_weight_update",
        "/update_weight_version", "/weight_checker", "/scale_elastic_ep",
        "/is_scaling_elastic_ep", "/fault_tolerance/apply", "/start_profile",
        "/stop_profile", "/v1/load_lora_adapter", "/v1/unload_lora_adapter")},
    "/adapters": _p("refused", POST, _ADMIN + " (SageMaker LoRA adapters)"),
    "/adapters/{adapter_name}": _p("refused", frozenset({"DELETE"}),
                                  _ADMIN + " (SageMaker LoRA adapters)"),
    **{path: _p("refused", READ, _ADMIN + " (engine internals)") for path in (
        "/server_info", "/is_sleeping", "/is_paused", "/weight_info", "/get_world_size",
        "/kv_event_sources", "/fault_tolerance/status", "/tokenizer_info")},
}

UNKNOWN = RoutePolicy("refused", frozenset(), "not a route vlmcache's front knows (default "
                      "deny: a route a later vLLM adds stays closed until it is classified)")
OPEN = RoutePolicy("passes", frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE",
                                        "WEBSOCKET"}), "opened by open_routes")


def _pattern(path: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", path)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts)
                      + r"\Z")


_TEMPLATES = [(path, _pattern(path), policy) for path, policy in ROUTE_TABLE.items()
              if "{" in path]


def table_entry(path: str) -> tuple[str, RoutePolicy] | None:
    """The table's entry (its path template and policy) for a request path, if any."""
    if path in ROUTE_TABLE:
        return path, ROUTE_TABLE[path]
    for template, pattern, policy in _TEMPLATES:
        if pattern.match(path):
            return template, policy
    return None


def route_policy(method: str, path: str, open_routes: frozenset[str] = frozenset()
                 ) -> RoutePolicy:
    """The policy for ``method`` on ``path``; a method a route does not serve is refused."""
    entry = table_entry(path)
    if entry is None:
        return OPEN if path in open_routes else UNKNOWN
    template, policy = entry
    if policy.kind == "refused" and template in open_routes:
        return OPEN
    if method == "OPTIONS" and policy.kind != "refused":  # a CORS preflight: no body, no
        return RoutePolicy("passes", frozenset({"OPTIONS"}), "CORS preflight")  # engine
    if method not in policy.methods:
        return RoutePolicy("refused", policy.methods, f"{method} is not served on this route")
    return policy


def parse_open_routes(value: str) -> frozenset[str]:
    """``open_routes`` (comma-separated paths) as a set; :class:`ValueError` names a bad one."""
    routes = frozenset(p.strip() for p in value.split(",") if p.strip())
    for path in routes:
        entry = table_entry(path)
        if not path.startswith("/"):
            raise ValueError(f"{path!r} is not a route path (it must start with '/')")
        if entry is not None and entry[1].kind != "refused":
            raise ValueError(f"{path!r} is already served ({entry[1].kind}: {entry[1].why}); "
                             "only refused or unknown routes can be opened")
    return routes


def refusal_message(method: str, path: str, policy: RoutePolicy) -> str:
    """The error a refused request gets: the route, why, and how an operator opens it."""
    return (f"route: {method} {path} is refused by vlmcache's front ({policy.why}); an "
            f"operator who trusts every client can open it with the vlmcache config key "
            f"open_routes: \"{path}\"")
