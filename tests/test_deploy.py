"""deploy/check.py: the names a dashboard or a rule uses must be series the worker or the gateway exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.prometheus import deploy_check

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


check = deploy_check()


def test_names_come_from_the_syntax_tree() -> None:
    query = (
        'sum by (tool, exit_code) (rate(toolworker_calls_total{exit_code!="0", tool=~"a.*"}[5m])) '
        "/ on (tool) group_left sum by (tool) (rate(toolworker_calls_total[5m] offset 1h)) > bool 0.2 "
        'and absent(up{job="toolworker"}) or {__name__="toolworker_queue_depth"}'
    )
    assert check.metric_names(query) == {"toolworker_calls_total", "up", "toolworker_queue_depth"}


def test_exported_series_follow_each_type() -> None:
    exported = check.exported_series()
    assert {"toolworker_calls_total", "toolworker_call_duration_seconds_bucket", "toolworker_circuit_state"} <= exported
    assert {"toolworker_queue_depth", "toolworker_queue_in_flight", "toolworker_gateway_call_seconds_count"} <= exported
    assert "toolworker_calls" not in exported  # a counter is served with its _total
    assert "toolworker_circuit_state_total" not in exported


def test_the_dashboard_and_the_rules_pass() -> None:
    assert check.main([]) == 0


def test_a_misspelled_metric_is_caught_in_a_panel_a_variable_and_a_rule(tmp_path: Path) -> None:
    dashboard = json.loads(check.DASHBOARD.read_text())
    dashboard["panels"][1]["targets"][0]["expr"] = "sum(rate(toolworker_call_total[$__rate_interval]))"
    dashboard["templating"]["list"][1]["query"]["query"] = "label_values(toolworker_tools_total, tool)"
    rules = yaml.safe_load(check.RULES.read_text())
    rules["groups"][0]["rules"][1]["expr"] = "max by (upstream) (toolworker_circuit) == 2"
    (tmp_path / "dashboard.json").write_text(json.dumps(dashboard))
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    found = check.problems([*check.dashboard_queries(dashboard), *check.rule_queries(rules)], check.exported_series())
    assert [problem.split(": ")[1] for problem in found] == [
        "toolworker_call_total is not a series the worker or the gateway exports",
        "toolworker_tools_total is not a series the worker or the gateway exports",
        "toolworker_circuit is not a series the worker or the gateway exports",
    ]
    assert check.main(["--dashboard", str(tmp_path / "dashboard.json"), "--rules", str(tmp_path / "rules.yml")]) == 1


@pytest.mark.parametrize("query", ["sum(rate(toolworker_calls_total[5m])", "rate(toolworker_calls_total)[5m]"])
def test_a_query_that_does_not_parse_is_a_problem(query: str) -> None:
    (problem,) = check.problems([("panel 'x' A", query)], check.exported_series())
    assert problem.startswith("panel 'x' A: does not parse")
