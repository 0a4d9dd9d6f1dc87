"""Checks the dashboard and the alerting rules against what the worker and the gateway export.

    python deploy/check.py [--promtool PATH]

Every metric name in a dashboard query or a rule must be a series the worker or the gateway serves
(`up`, Prometheus's own, aside); names are read from the PromQL's syntax tree (promql-parser), and
the series from the metric definitions themselves (prometheus-client's registries and the queue depth
and age collectors). With `--promtool`, every dashboard query is also checked by promtool's parser, as a
recording rule. `make check-deploy` runs this after `promtool check rules` and `promtool test rules`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import promql_parser
import redis
import yaml
from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric

import worker.metrics
from worker.gateway import metrics as gateway_metrics
from worker.queue.ages import QueueAges
from worker.queue.depth import QueueDepth

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE / "grafana" / "toolworker-dashboard.json"
RULES = HERE / "prometheus" / "toolworker-alerts.yml"
PROMETHEUS_OWN = frozenset({"up"})
# The series prometheus-client writes for a family of each type (counters and histograms: `_created` too).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}
# Grafana's variables, replaced by values of the right kind before a query is parsed.
_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}")
_VARIABLES = re.compile(r"\$\{?(\w+)\}?")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.+),)?\s*(\w+)\s*\)\s*$")


def exported_series() -> set[str]:
    """Every series name the worker and the gateway can serve."""
    assert worker.metrics.CALLS  # imported for its metrics, registered on the default registry
    families: list[Metric] = [*REGISTRY.collect(), *gateway_metrics.REGISTRY.collect()]
    families += QueueDepth(redis.Redis(), []).describe()  # never connects
    families += QueueAges(redis.Redis(), []).describe()
    return {family.name + suffix for family in families for suffix in SUFFIXES[family.type]}


def metric_names(query: str) -> set[str]:
    """The metric names a PromQL query selects (by name or by a `__name__` matcher)."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            names.update(m.value for m in node.matchers.matchers if m.name == "__name__")

    promql_parser.walk(promql_parser.parse(query), visit)
    return names


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and query variable, Grafana's variables filled in."""
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield f"panel {panel.get('title')!r} {target.get('refId')}", _filled(target["expr"])
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        match = _LABEL_VALUES.match(text)
        selector = match.group(1) if match else text
        if selector:
            yield f"variable {variable.get('name')!r}", _filled(selector)


def _panels(panels: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its panels


def _filled(query: str) -> str:
    return _VARIABLES.sub(".*", _INTERVALS.sub("5m", query))


def rule_queries(rules: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            yield f"rule {rule.get('alert') or rule.get('record')!r}", rule["expr"]


def problems(queries: Iterable[tuple[str, str]], exported: set[str]) -> list[str]:
    found = []
    for where, query in queries:
        try:
            names = metric_names(query)
        except ValueError as exc:
            found.append(f"{where}: does not parse: {exc}")
            continue
        for name in sorted(names - exported - PROMETHEUS_OWN):
            found.append(f"{where}: {name} is not a series the worker or the gateway exports")
    return found


def promtool_problems(promtool: str, queries: list[tuple[str, str]]) -> list[str]:
    """promtool's own parser on each dashboard query, written as a recording rule."""
    recorded = [{"record": f"dashboard_query_{i}", "expr": query} for i, (_, query) in enumerate(queries)]
    rules = {"groups": [{"name": "dashboard", "rules": recorded}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as file:
        yaml.safe_dump(rules, file)
        file.flush()
        checked = subprocess.run([promtool, "check", "rules", file.name], capture_output=True, text=True)
    return [] if checked.returncode == 0 else [f"promtool on the dashboard's queries: {checked.stdout}{checked.stderr}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--promtool", help="also parse the dashboard's queries with this promtool")
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD)
    parser.add_argument("--rules", type=Path, default=RULES)
    args = parser.parse_args(argv)
    panels = list(dashboard_queries(json.loads(args.dashboard.read_text())))
    rules = list(rule_queries(yaml.safe_load(args.rules.read_text())))
    found = problems(panels + rules, exported_series())
    if args.promtool:
        found += promtool_problems(args.promtool, panels)
    for problem in found:
        print(problem, file=sys.stderr)
    if not found:
        print(f"{len(panels)} dashboard queries and {len(rules)} rules name only exported series")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
