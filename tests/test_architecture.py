"""The import rules of docs/architecture.md, checked on the source (no imports executed)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "vlmcache"

#: docs/architecture.md's layers, bottom first: a package may import its own layer or below.
LAYERS = (("config", "config_ranges", "cpu_share", "errors", "routes", "tenant_secret"),
          ("store", "embedders", "index"),
          ("keys", "tiers"),
          ("shared",), ("cascade", "vllm"), ("report",),
          ("api", "api_media", "serving", "models", "testing"), ("bench",), ("cli",))


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = ("vlmcache", *path.relative_to(SRC).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            found |= {base, *(f"{base}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: {t for t in _imports(m, p) if t in mods and t != m} for m, p in mods.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_import_circle():
    assert _cycle(_graph()) is None


def test_no_package_import_circle():
    packages: dict[str, set[str]] = {}
    for mod, targets in _graph().items():
        packages.setdefault(_package(mod), set()).update(
            _package(t) for t in targets if _package(t) != _package(mod))
    assert _cycle(packages) is None


def test_packages_import_only_their_layer_or_below():
    rank = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
    wrong = sorted(f"{mod} -> {t}" for mod, targets in _graph().items() for t in targets
                   if _package(mod) in rank and _package(t) in rank
                   and rank[_package(t)] > rank[_package(mod)])
    assert not wrong


def test_every_package_has_a_layer():
    packages = {_package(m) for m in _modules()} - {""}
    assert packages <= {pkg for layer in LAYERS for pkg in layer}


def test_store_never_imports_shared():
    assert not [(m, t) for m, ts in _graph().items() for t in ts
                if _package(m) == "store" and _package(t) == "shared"]


def test_the_package_never_imports_the_laboratory():
    mods = _modules()
    assert not [m for m, p in mods.items()
                if any(t.split(".")[0] == "vlmcache_lab" for t in _imports(m, p))]
