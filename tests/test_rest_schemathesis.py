"""Schemathesis (a property-based API tester that reads only the document) over the whole of
`/v1/openapi.json`, against a real worker and gateway: no 5xx, every answer as the document describes it,
schema-valid requests accepted and invalid ones refused, 405s with their Allow header.

Every operation the document lists is covered, routes added later included; the examples per operation are
bounded (and seeded) so that the run stays within a couple of minutes on two cores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from tests.support.gateway_stack import TOKEN, Stack, auth

pytestmark = pytest.mark.integration

MAX_EXAMPLES = os.environ.get("TEST_SCHEMATHESIS_EXAMPLES", "40")
SEED = os.environ.get("TEST_SCHEMATHESIS_SEED", "29")


def schemathesis(stack: Stack, report: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    # One worker thread: hypothesis parses a module's source to describe a lambda filter (schemathesis's own),
    # and CPython 3.11 keeps the AST builder's depth counter per interpreter, so two threads parsing at once
    # fail with "SystemError: AST constructor recursion depth mismatch", a crash that says nothing of the API.
    argv = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{stack.url}/v1/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        MAX_EXAMPLES,
        "--seed",
        SEED,
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--header",
        f"Authorization: Bearer {TOKEN}",
        "--report",
        "junit",
        "--report-dir",
        str(report),
        "--no-color",
        *extra,
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": ""}
    # From the test's own folder: schemathesis keeps a cache of what it found in the working directory.
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, check=False, cwd=report)


@pytest.mark.timeout(600)
def test_schemathesis_finds_nothing_over_the_whole_document(gateway_stack: Stack, tmp_path: Path) -> None:
    """Every operation of /v1/openapi.json passes all of schemathesis's checks."""
    operations = httpx2.get(f"{gateway_stack.url}/v1/openapi.json", headers=auth(), timeout=10).json()["paths"]
    assert len(operations) >= 7  # what it covers is what the document lists
    run = schemathesis(gateway_stack, tmp_path)
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]


def test_every_405_names_the_methods_of_its_path(gateway_stack: Stack) -> None:
    """TRACE (or any method a path does not take) is a 405 JSON error with an Allow header naming every
    method the path takes, on every path of the document."""
    document = httpx2.get(f"{gateway_stack.url}/v1/openapi.json", headers=auth(), timeout=10).json()
    for path, item in document["paths"].items():
        concrete = path.replace("{callId}", "some-call").replace("{name}", "echo_get")
        answer = httpx2.request("TRACE", gateway_stack.url + concrete, headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 405, (path, answer.status_code)
        allowed = {m.strip().lower() for m in answer.headers["allow"].split(",")}
        assert {m for m in item if m in {"get", "post", "delete", "put", "patch"}} <= allowed, (path, allowed)
        assert answer.json()["error"]["type"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("path", "methods"),
    [("/v1/openapi.json", {"GET"}), ("/metrics", {"GET"}), ("/toolserver/execute_tool", {"POST"}), ("/mcp", {"POST"})],
)
def test_a_405_off_the_document_names_its_methods_too(gateway_stack: Stack, path: str, methods: set[str]) -> None:
    """The routes the document does not list (the document itself, metrics, ToolServer, MCP) answer a
    method they do not take with 405 and Allow as well."""
    answer = httpx2.request("TRACE", gateway_stack.url + path, headers=auth())
    assert answer.status_code == 405, answer.text
    assert methods <= {m.strip().upper() for m in answer.headers["allow"].split(",")}
