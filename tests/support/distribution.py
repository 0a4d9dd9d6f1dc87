"""How `make test` spreads the suite over pytest-xdist's processes (`--dist loadfile`).

Each module goes to one process as a unit, in its own order: a module-scoped fixture (a stack of processes,
a browser) is made once, and a test that reads what the module's earlier tests left runs after them.
(`--dist loadgroup` would split a module finer, but pytest 9.2 keeps a node's id where xdist 3.8's group
suffix no longer reaches, so its groups are not formed.) Slow modules are handed out first, so that the last
minutes are not one long module alone.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, slow modules first (a module's own order kept)."""
    if config.getoption("dist", "no") != "no":
        rank: dict[str, int] = {}
        for item in items:
            module = item.nodeid.split("::")[0]
            rank[module] = min(rank.get(module, 2), _rank(item))
        items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: a module's order is kept


def _rank(item: pytest.Item) -> int:
    """0 for a slow test, 1 for another integration test, 2 for a unit test."""
    if item.get_closest_marker("slow") is not None:
        return 0
    return 1 if item.get_closest_marker("integration") is not None else 2
