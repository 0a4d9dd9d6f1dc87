"""The package's layering (docs/concepts/call-path.md): each folder uses only the folders below it, no import
cycle, and test modules share helpers through tests/support/ only. Read from the source, imports inside
functions included."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Top to bottom: the path of a call. A module may import its own layer's modules and any layer below.
LAYERS: list[frozenset[str]] = [
    frozenset({"worker.__main__", "worker.cli", "worker.app", "worker.dev"}),
    frozenset({"worker.gateway"}),
    frozenset({"worker", "worker.client"}),
    frozenset({"worker.queue"}),
    frozenset({"worker.call"}),
    frozenset({"worker.http"}),
    frozenset({"worker.definitions"}),
    frozenset(
        {
            "worker.settings",
            "worker.constants",
            "worker.errors",
            "worker.envelope",
            "worker.protocol",
            "worker.redaction",
            "worker.connections",
            "worker.logs",
            "worker.loop",
            "worker.metrics",
            "worker.tracing",
            "worker.heap",
            "worker.shards",
        }
    ),
]
# Skips that the layering alone would allow: the gateway reaches the fleet through the client, the client
# needs nothing of the worker's queue or calls, and the transport knows nothing of tool definitions (a leaf).
SEAMS = {
    ("worker.gateway", "worker.call"),
    ("worker.client", "worker.queue"),
    ("worker.client", "worker.call"),
    ("worker.http", "worker.definitions"),
}
# The one module of queue/ the client uses: the tenant scheduler owns the tenant keys, and enqueuing for a
# tenant runs its script, which keeps the list of tenants with work in step with their lists.
ACROSS_SEAMS = {("worker.client.outbox", "worker.queue.scheduler")}
# The vault's modules, which the gateway uses too: it stores what a user granted (the OAuth callback), makes
# connect links (consent over MCP), and exchanges tokens at enqueue with the same client and directory of
# authorization servers the workers refresh with. Nothing else of call/.
VAULT_MODULES = ("worker.call.vault", "worker.call.connect", "worker.call.delegated")
GATEWAY_MODULES = ("worker.gateway.delegation", "worker.gateway.connections", "worker.gateway.security")
ACROSS_SEAMS |= {(gateway, vault) for gateway in GATEWAY_MODULES for vault in VAULT_MODULES}
# The cache: the gateway answers a hit without the queue, so it finds an answer under the key the workers
# store it under, computed by the one function of the call's cache.
ACROSS_SEAMS |= {("worker.gateway.calls", "worker.call.cache")}
# The OpenAPI reader's modules, each using only those before it.
OPENAPI = "worker.definitions.readers.openapi"
OPENAPI_ORDER = ["refs", "schemas", "operations", "tools", "importer", "entries"]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: str) -> dict[str, Path]:
    folder = ROOT.joinpath(*package.split("."))
    return {module_name(path): path for path in sorted(folder.rglob("*.py"))}


WORKER = modules("worker")


def imported(path: Path, known: set[str]) -> Iterator[str]:
    """The known modules a file imports (`from package import module` names the module)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            inner = [name for name in names if name in known]
            yield from inner or ([node.module] if node.module in known else [])


def unit(module: str) -> str:
    """The layer entry a module belongs to: its top-level module or sub-package."""
    return ".".join(module.split(".")[:2])


def layer(module: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if unit(module) in names)


@cache
def edges() -> list[tuple[str, str]]:
    """Every import of one worker module by another."""
    known = set(WORKER)
    return [(name, target) for name, path in WORKER.items() for target in imported(path, known) if target != name]


def test_every_module_has_a_layer() -> None:
    """A new module or folder must be placed in the layer map before it can be imported anywhere."""
    placed = set().union(*LAYERS)
    assert sorted({unit(name) for name in WORKER} - placed) == []
    assert sorted(placed - {unit(name) for name in WORKER}) == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    """gateway -> client -> queue -> call -> http -> definitions -> shared leaves, never upward."""
    upward = [f"{a} -> {b}" for a, b in edges() if layer(b) < layer(a)]
    assert upward == []


def test_no_import_skips_a_seam() -> None:
    """The gateway does not reach into call/, the client not into queue/ or call/, http/ not into definitions/."""
    skips = [f"{a} -> {b}" for a, b in edges() if (unit(a), unit(b)) in SEAMS and (a, b) not in ACROSS_SEAMS]
    assert skips == []


def test_no_import_cycle_between_units() -> None:
    """Sub-packages and top-level modules form no cycle (a module-level cycle inside one is its own business)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges():
        if unit(a) != unit(b):
            graph.setdefault(unit(a), set()).add(unit(b))
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        pytest.fail(f"import cycle: {exc.args[1]}")
    assert order


def test_the_openapi_reader_reads_top_down() -> None:
    """refs <- schemas <- operations <- tools <- importer, entries: no module of the reader uses a later one."""
    inside = {f"{OPENAPI}.{name}": index for index, name in enumerate(OPENAPI_ORDER)}
    assert set(inside) | {OPENAPI} == {name for name in WORKER if name.startswith(OPENAPI)}
    later = [f"{a} -> {b}" for a, b in edges() if a in inside and b in inside and inside[b] >= inside[a]]
    assert later == []


def test_test_modules_share_helpers_through_support_only() -> None:
    """No test module imports another test module; tests/support/ imports none either."""
    tests = modules("tests")
    test_modules = {name for name in tests if name.rpartition(".")[2].startswith("test_")}
    found = [
        f"{name} -> {target}"
        for name, path in tests.items()
        for target in imported(path, test_modules)
        if target != name
    ]
    assert found == []
