"""The package's dependency rules, checked on the source (every import counts: top-level,
function-level and TYPE_CHECKING alike). See ../shared/docs/architecture.md."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "daemon" / "toolatlas"
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 250
CLI_MODULES = {"toolatlas.cli", "toolatlas.catalog.cards_cli", "toolatlas.rift.cli", "toolatlas.evaluation.cli",
               "toolatlas.adopt.cli", "toolatlas.doctor_cli", "toolatlas.stubs.cli"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(module: str, path: Path) -> Iterator[str]:
    """Every module name `module` imports, absolute, including `from X import name` as X.name."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)


def _internal(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        deps = {d for n in _imports(module, path) if (d := _internal(n)) and d != module}
        graph[module] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_planted_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def _external(module: str) -> set[str]:
    return {n.split(".")[0] for n in _imports(module, MODULES[module]) if not n.startswith("toolatlas")}


def test_only_upstream_and_surface_import_mcp() -> None:
    allowed = ("toolatlas.upstream", "toolatlas.surface", "toolatlas.examples")
    offenders = sorted(m for m in MODULES if _external(m) & {"mcp", "mcp_types"} and not m.startswith(allowed))
    assert offenders == []


def test_surface_imports_only_the_gateway_ports() -> None:
    graph = _graph()
    offenders = sorted(
        (m, d) for m in graph if m.startswith("toolatlas.surface")
        for d in graph[m] if d.startswith("toolatlas.gateway") and d != "toolatlas.gateway.ports"
        or d == "toolatlas.app"
    )
    assert offenders == []


def test_layers_point_one_way() -> None:
    graph = _graph()
    below = {
        # a layer may not import these
        "toolatlas.catalog": ("toolatlas.retrieval", "toolatlas.rift", "toolatlas.gateway", "toolatlas.surface", "toolatlas.upstream"),
        "toolatlas.retrieval": ("toolatlas.rift", "toolatlas.gateway", "toolatlas.surface", "toolatlas.upstream"),
        "toolatlas.rift": ("toolatlas.gateway", "toolatlas.surface", "toolatlas.upstream"),
        "toolatlas.upstream": ("toolatlas.gateway", "toolatlas.surface", "toolatlas.retrieval", "toolatlas.rift"),
        "toolatlas.gateway": ("toolatlas.surface", "toolatlas.app"),
    }
    offenders = sorted(
        (m, d) for m in graph if m not in CLI_MODULES for layer, banned in below.items() if m.startswith(layer)
        for d in graph[m] if d.startswith(banned)
    )
    assert offenders == []


def test_no_library_module_imports_a_cli_module() -> None:
    graph = _graph()
    offenders = sorted((m, d) for m in graph if m not in CLI_MODULES for d in graph[m] & CLI_MODULES)
    # The console entry point may import the CLI front ends; nothing else may.
    assert [o for o in offenders if o[0] != "toolatlas.__main__"] == []


def test_module_and_class_sizes() -> None:
    big_modules = sorted((m, n) for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES)
    big_classes = sorted(
        (m, node.name, node.end_lineno - node.lineno + 1)
        for m, p in MODULES.items() for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    )
    assert big_modules == [] and big_classes == []
