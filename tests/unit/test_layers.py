"""The house's rules, read from the imports (docs/ARCHITECTURE.md, "What may import what"):
imports point down the layers only, no module is part of an import circle (imports made only for
type checking included), no domain package knows protobuf, and no module outgrows one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "agent_rewind"
TESTS = Path(__file__).resolve().parents[1]

# Lowest first: a unit may import units of lower layers and itself, never a higher one.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset(
        {"__init__", "errors", "faults", "metrics", "tracing", "tasks", "config", "logs", "sandbox", "api"}
    ),
    frozenset({"store", "transcript", "access", "client"}),
    frozenset({"workspace_paths", "retries", "snapshots", "storage", "events", "replicas", "webhooks"}),
    frozenset({"sessions"}),
    frozenset({"rewind"}),
    frozenset({"rpc", "testing"}),
    frozenset({"agents", "components", "server"}),
    frozenset({"cli"}),
)
# What knows nothing of the wire: only the RPC layer (and the composition and tools above it)
# touches generated protobuf code.
DOMAIN = frozenset(
    {
        "store",
        "transcript",
        "snapshots",
        "storage",
        "events",
        "webhooks",
        "sessions",
        "rewind",
        "sandbox",
        "replicas",
    }
)
MAX_MODULE_LINES = 600
MAX_TEST_MODULE_LINES = 1000


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        if "api" in path.relative_to(SRC).parts[:1]:
            continue
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(("agent_rewind", *parts))
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of the service's own modules, every import statement (inside
    functions and `if TYPE_CHECKING:` too)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up) + (f".{base}" if base else "")
                if not base.startswith("agent_rewind"):
                    continue
                for alias in node.names:
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("agent_rewind"))
        graph[name] = {t for t in targets if t != name}
    return graph


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(unit: str) -> int:
    for rank, layer in enumerate(LAYERS):
        if unit in layer:
            return rank
    raise AssertionError(f"{unit!r} is in no layer: add it to LAYERS and to docs/ARCHITECTURE.md")


def test_imports_point_down_the_layers_only() -> None:
    graph = _imports(_modules())
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if _unit(target) != _unit(module) and _layer(_unit(target)) > _layer(_unit(module))
    )
    assert upward == []


def test_no_module_is_part_of_an_import_circle() -> None:
    graph = _imports(_modules())
    circles = _circles(graph)
    assert circles == [], "\n".join(" -> ".join(sorted(c)) for c in circles)


def test_no_domain_package_imports_generated_protobuf_code() -> None:
    graph = _imports(_modules())
    wired = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if _unit(module) in DOMAIN and target.startswith("agent_rewind.api")
    )
    assert wired == []


def test_every_module_reads_in_one_sitting() -> None:
    long = {
        str(path.relative_to(SRC)): n
        for path in SRC.rglob("*.py")
        if "api" not in path.relative_to(SRC).parts[:1]
        and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    long_tests = {
        str(path.relative_to(TESTS)): n
        for path in TESTS.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_TEST_MODULE_LINES
    }
    assert (long, long_tests) == ({}, {})


@pytest.mark.parametrize(
    ("graph", "circles"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [{"a", "b"}]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}, [{"a", "b", "c"}]),
    ],
)
def test_the_circle_finder_finds_circles(graph: dict[str, set[str]], circles: list[set[str]]) -> None:
    assert [set(c) for c in _circles(graph)] == circles


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
                continue
            if child not in graph and child not in index:
                continue
            if child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found
