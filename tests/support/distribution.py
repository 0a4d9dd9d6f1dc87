"""How `make test` spreads the suite over pytest-xdist's processes (`--dist loadgroup`).

A module-scoped fixture (a stack of processes, a browser) is made once per process that runs one of its
tests: the tests of a module that use one go to the same process, as one unit (an `xdist_group` named
after the module, unless the test names a group of its own). The rest go one by one to whichever process
is free. Slow modules are handed out first, so that the last minutes are not one long module alone.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests that share a module's fixtures; under xdist, slow modules first."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if config.getoption("dist", "no") != "no":
        rank = {}
        for item in items:
            module = item.nodeid.split("::")[0]
            rank[module] = min(rank.get(module, 2), _rank(item))
        items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: a module's order is kept


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values() if defs)


def _rank(item: pytest.Item) -> int:
    """0 for a slow test, 1 for another integration test, 2 for a unit test."""
    if item.get_closest_marker("slow") is not None:
        return 0
    return 1 if item.get_closest_marker("integration") is not None else 2
