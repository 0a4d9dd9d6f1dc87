"""The package's layering (docs/concepts/call-path.md): each folder uses only the folders below it, no import
cycle between folders or between modules (in worker/ and benchmarks/), the benchmarks' sections share only
their harness, and test modules share helpers through tests/support/ only. Read from the source, imports
inside functions included; imports made for type checking alone (`if TYPE_CHECKING:`) do not run, and
count for the cycles of modules no more than they do for Python."""

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
    frozenset({"worker.__main__", "worker.cli", "worker.app", "worker.dev", "worker.top"}),
    frozenset({"worker.gateway"}),
    frozenset({"worker", "worker.client", "worker.watch"}),
    frozenset({"worker.queue", "worker.upstreams"}),
    # Code mode's sandbox bridge and runs, under the queue that parks and wakes programs (queue/programs.py).
    frozenset({"worker.program"}),
    frozenset({"worker.call"}),
    frozenset({"worker.http", "worker.mcp_client"}),
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
            "worker.sealing",
            "worker.json_text",
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
    ("worker.mcp_client", "worker.definitions"),
}
# The one module of queue/ the client uses: the tenant scheduler owns the tenant keys, and enqueuing for a
# tenant runs its script, which keeps the list of tenants with work in step with their lists.
ACROSS_SEAMS = {("worker.client.outbox", "worker.queue.scheduler")}
# The vault's modules, which the gateway uses too: it stores what a user granted (the OAuth callback), makes
# connect links (consent over MCP), and exchanges tokens at enqueue with the same client and directory of
# authorization servers the workers refresh with. Nothing else of call/.
VAULT_MODULES = ("worker.call.vault", "worker.call.connect", "worker.call.delegated")
GATEWAY_MODULES = (
    "worker.gateway.identity.delegation",
    "worker.gateway.rest.connections",
    "worker.gateway.identity.security",
)
ACROSS_SEAMS |= {(gateway, vault) for gateway in GATEWAY_MODULES for vault in VAULT_MODULES}
# An MCP upstream's authorization discovery: the connect link's flow at the gateway uses the endpoints a worker
# discovered (or discovers them itself, held to the same egress policy).
ACROSS_SEAMS |= {("worker.gateway.identity.delegation", "worker.call.mcp_authorization")}
# The fleet's client at an MCP upstream's authorization server: the gateway serves the metadata document whose
# URL the workers and the gateway name the client by.
ACROSS_SEAMS |= {("worker.gateway.rest.connections", "worker.call.mcp_clients")}
# The cache: the gateway answers a hit without the queue, so it finds an answer under the key the workers
# store it under, computed by the one function of the call's cache.
ACROSS_SEAMS |= {("worker.gateway.calls", "worker.call.cache")}
# ... once it has checked the call's arguments as the worker checks them (a cached answer is for valid ones only).
ACROSS_SEAMS |= {("worker.gateway.calls", "worker.call.arguments")}
# The gateway's rooms, top to bottom: the app composes the surfaces, which share the calls and the catalog,
# which use identity (who calls) and the leaves. A room is a sub-package or a top-level module.
GATEWAY_FLOORS: list[frozenset[str]] = [
    frozenset({"worker.gateway.app"}),
    frozenset({"worker.gateway.mcp", "worker.gateway.rest", "worker.gateway.console", "worker.gateway.toolserver"}),
    frozenset({"worker.gateway.calls", "worker.gateway.catalog", "worker.gateway.decisions"}),
    frozenset({"worker.gateway.identity"}),
    frozenset(
        {
            "worker.gateway",
            "worker.gateway.claims",
            "worker.gateway.withdraw",
            "worker.gateway.headers",
            "worker.gateway.health",
            "worker.gateway.metrics",
        }
    ),
]
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
BENCHMARKS = modules("benchmarks")
HARNESS = "benchmarks.harness"


def imported(path: Path, known: set[str]) -> Iterator[str]:
    """The known modules a file imports (`from package import module` names the module)."""
    yield from _imports(ast.parse(path.read_text(encoding="utf-8")), known)


def _imports(tree: ast.Module, known: set[str]) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            inner = [name for name in names if name in known]
            yield from inner or ([node.module] if node.module in known else [])


def runtime_imported(path: Path, known: set[str]) -> Iterator[str]:
    """The known modules a file imports when it runs: those under `if TYPE_CHECKING:` left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            node.body = []
    yield from _imports(tree, known)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


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


def module_cycles(tree: dict[str, Path]) -> list[list[str]]:
    """The cycles among the modules of a tree, by the imports that run (each strongly connected group once)."""
    known = set(tree)
    graph = {name: {t for t in runtime_imported(path, known) if t != name} for name, path in tree.items()}
    return [sorted(group) for group in _strongly_connected(graph) if len(group) > 1]


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's groups of modules that reach one another."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group: set[str] = set()
            member = None
            while member != node:
                member = stack.pop()
                group.add(member)
            groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


@pytest.mark.parametrize("tree", [WORKER, BENCHMARKS], ids=["worker", "benchmarks"])
def test_no_import_cycle_between_modules(tree: dict[str, Path]) -> None:
    """No two modules import each other, directly or around a circle, by imports that run."""
    assert module_cycles(tree) == []


def test_the_benchmark_sections_share_only_their_harness() -> None:
    """A section imports only benchmarks/harness/, never another section or run.py; the harness no section."""
    known = set(BENCHMARKS) - {"benchmarks"}
    crossing = [
        f"{name} -> {target}"
        for name, path in BENCHMARKS.items()
        if name != "benchmarks.run"
        for target in imported(path, known)
        if not target.startswith(HARNESS) and target != name
    ]
    assert crossing == []
    assert any(target.startswith(HARNESS) for target in imported(BENCHMARKS["benchmarks.gateway"], known))


def room(module: str) -> str:
    """The gateway room a gateway module belongs to: its sub-package or top-level module."""
    return ".".join(module.split(".")[:3])


def gateway_floor(module: str) -> int:
    return next(i for i, names in enumerate(GATEWAY_FLOORS) if room(module) in names)


def test_the_gateway_rooms_point_down() -> None:
    """Every gateway module has a floor; the app over the surfaces over calls and catalog over identity."""
    gateway = [name for name in WORKER if unit(name) == "worker.gateway"]
    assert sorted({room(name) for name in gateway} - set().union(*GATEWAY_FLOORS)) == []
    inside = [(a, b) for a, b in edges() if unit(a) == unit(b) == "worker.gateway"]
    upward = [f"{a} -> {b}" for a, b in inside if gateway_floor(b) < gateway_floor(a)]
    assert upward == []
    graph: dict[str, set[str]] = {}
    for a, b in inside:
        if room(a) != room(b):
            graph.setdefault(room(a), set()).add(room(b))
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        pytest.fail(f"import cycle between gateway rooms: {exc.args[1]}")


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
