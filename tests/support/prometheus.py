"""Prometheus as the tests read it: a process's /metrics scraped and indexed, and deploy/check.py as a module."""

from __future__ import annotations

import importlib.util
import sys
import time
import urllib.request
from functools import cache
from pathlib import Path
from types import ModuleType

from prometheus_client.parser import text_string_to_metric_families

from tests.support.waiting import Budget

DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy"
Sample = tuple[str, frozenset[tuple[str, str]]]
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrape(port: int) -> dict[Sample, float]:
    """GET /metrics on 127.0.0.1 and index the samples by name and labels."""
    with _NO_PROXY.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def wait_for_sample(port: int, key: Sample, at_least: float) -> float:
    """Scrape until the sample reaches `at_least` (bounded: 20 s)."""
    budget = Budget(20)
    value = 0.0
    while not budget.exhausted():
        try:
            value = scrape(port).get(key, 0.0)
        except OSError:  # the worker is not serving yet
            value = 0.0
        if value >= at_least:
            return value
        time.sleep(0.2)
    return value


@cache
def deploy_check() -> ModuleType:
    """deploy/check.py (a script, not a package module), loaded once."""
    spec = importlib.util.spec_from_file_location("deploy_check", DEPLOY / "check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
