"""Which calls need a human's approval: `approval:` on upstreams and tools, read and checked like any
definition, and the guide's definitions example is valid."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from worker.definitions import file_store
from worker.definitions.model import ToolSet, needs_approval
from worker.queue.approvals import resumed

GUIDE = Path(__file__).parent.parent / "docs" / "guides" / "approvals.md"
RULES = """
upstreams:
  changes:
    base_url: https://api.example.com
    approval: {methods: [post, DELETE]}
  plain:
    base_url: https://api.example.com
tools:
  - {name: get_it, upstream: changes, request: {method: GET, path: /x}}
  - {name: post_it, upstream: changes, request: {method: POST, path: /x}}
  - {name: delete_it, upstream: changes, request: {method: DELETE, path: /x}}
  - {name: put_it, upstream: changes, request: {method: PUT, path: /x}}
  - {name: post_freely, upstream: changes, approval: never, request: {method: POST, path: /x}}
  - {name: get_carefully, upstream: plain, approval: always, request: {method: GET, path: /x}}
  - {name: put_carefully, upstream: plain, approval: {methods: [PUT]}, request: {method: PUT, path: /x}}
  - {name: post_plain, upstream: plain, request: {method: POST, path: /x}}
"""


def load(tmp_path: Path, text: str) -> ToolSet:
    (tmp_path / "tools.yaml").write_text(text)
    return file_store.load([tmp_path])


def test_the_tool_rule_replaces_the_upstream_rule(tmp_path: Path) -> None:
    """Methods (any case) on the upstream; `never` and `always` and methods on a tool replace it."""
    toolset = load(tmp_path, RULES)
    assert toolset.problems == []
    needs = {name: needs_approval(tool, toolset.upstreams[tool.upstream]) for name, tool in toolset.tools.items()}
    assert needs == {
        "get_it": False,
        "post_it": True,
        "delete_it": True,
        "put_it": False,
        "post_freely": False,
        "get_carefully": True,
        "put_carefully": True,
        "post_plain": False,
    }


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("{methods: [FETCH]}", "unknown method FETCH"),
        ("{methods: []}", "methods"),
        ("sometimes", "approval"),
        ("{methods: [GET], when: later}", "when"),
    ],
)
def test_a_bad_approval_setting_is_a_problem(tmp_path: Path, setting: str, complaint: str) -> None:
    """An unknown method, an empty list, another word or an unknown key is a definitions problem."""
    text = f"upstreams:\n  u:\n    base_url: https://a.example.com\n    approval: {setting}\n"
    toolset = load(tmp_path, text)
    assert "u" not in toolset.upstreams
    assert any(complaint in str(problem) for problem in toolset.problems), toolset.problems


def test_an_approved_call_gets_its_budget_again() -> None:
    """Time spent parked does not count: the deadline goes, the timeout (or what the deadline left when
    the call was parked) starts again from the approval."""
    parked_at = datetime(2026, 1, 1, 12, 0, tzinfo=UTC).timestamp()
    with_timeout = resumed({"tool": "t", "timeoutSeconds": 20, "deadline": "2026-01-01T12:00:20+00:00"}, parked_at)
    assert with_timeout == {"tool": "t", "timeoutSeconds": 20}
    assert resumed({"tool": "t", "deadline": "2026-01-01T12:00:30Z"}, parked_at)["timeoutSeconds"] == 30
    assert resumed({"tool": "t", "deadline": "2026-01-01T12:01:00"}, parked_at)["timeoutSeconds"] == 60
    assert resumed({"tool": "t"}, parked_at) == {"tool": "t"}


def test_the_guide_definitions_are_valid(tmp_path: Path) -> None:
    """Every yaml block of docs/guides/approvals.md loads without a problem."""
    blocks = re.findall(r"```yaml\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    assert blocks
    for index, block in enumerate(blocks):
        directory = tmp_path / str(index)
        directory.mkdir()
        toolset = load(directory, block)
        assert toolset.problems == [] and toolset.tools, toolset.problems
