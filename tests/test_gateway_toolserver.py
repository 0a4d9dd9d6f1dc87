"""XAgent ToolServer-compatible routes: both field spellings, ToolServer's status codes, sessions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.support.gateway_stack import Gateway, Stack, auth, gateway_env, start_gateway
from worker.dev.embedded import EmbeddedRedis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def post(stack: Stack, route: str, body: Any = None, **kwargs: Any) -> httpx2.Response:
    return httpx2.post(f"{stack.url}/toolserver/{route}", json=body, headers=auth(), timeout=60, **kwargs)


def test_sessions_are_accepted_and_carry_nothing(gateway_stack: Stack) -> None:
    """get_cookie sets a node_id cookie; close_session and release_session answer as ToolServer's manager does."""
    cookie = post(gateway_stack, "get_cookie")
    assert cookie.status_code == 200 and cookie.json()["message"] == "add cookie"
    node_id = cookie.cookies["node_id"]
    closed = post(gateway_stack, "close_session", cookies={"node_id": node_id})
    released = post(gateway_stack, "release_session", cookies={"node_id": node_id})
    assert closed.json() == f"Close session: {node_id}" and released.json() == f"Release session: {node_id}"


def test_available_tools_lists_envs_tools_and_functions(gateway_stack: Stack) -> None:
    """Envs are the upstreams with their tools; tools_json entries have OpenAI's function shape."""
    body = post(gateway_stack, "get_available_tools", {}).json()
    envs = {env["name"]: env for env in body["available_envs"]}
    assert set(envs) == {"local", "held", "toolworker"}
    assert envs["local"]["total_tools"] == 7 and "echo_get" in envs["local"]["tools"]
    assert "echo_get" in body["available_tools"] and len(body["tools_json"]) == len(body["available_tools"])
    function = next(f for f in body["tools_json"] if f["name"] == "echo_get")
    assert set(function) == {"name", "description", "parameters"}
    assert function["parameters"]["required"] == ["item"]


def test_retrieving_tools_searches(gateway_stack: Stack) -> None:
    """retrieving_tools {question, top_k} answers the best matches and their functions."""
    body = post(gateway_stack, "retrieving_tools", {"question": "delete an item", "top_k": 2}).json()
    assert body["retrieved_tools"][0] == "echo_delete" and len(body["retrieved_tools"]) <= 2
    assert [f["name"] for f in body["tools_json"]] == body["retrieved_tools"]
    assert post(gateway_stack, "retrieving_tools", {"top_k": 2}).status_code == 422


@pytest.mark.parametrize("field", ["tools", "tool_names", None])
def test_schema_for_tools_in_every_spelling(gateway_stack: Stack, field: str | None) -> None:
    """`tools` (documented), `tool_names` (XAgent's client) and a bare list all name the tools."""
    names = ["echo_post", "nope"]
    body = post(gateway_stack, "get_json_schema_for_tools", {field: names} if field else names).json()
    assert [f["name"] for f in body["tools_json"]] == ["echo_post"] and body["missing_tools"] == ["nope"]


@pytest.mark.parametrize("field", ["envs", "env_names"])
def test_schema_for_envs_in_both_spellings(gateway_stack: Stack, field: str) -> None:
    """Envs by either spelling; an unknown env is listed as missing."""
    body = post(gateway_stack, "get_json_schema_for_envs", {field: ["held", "nowhere"]}).json()
    assert body["envs_json"] == [
        {
            "name": "held",
            "description": "The tools of the upstream 'held' (1).",
            "total_tools": 1,
            "tools": ["held_echo"],
        }
    ]
    assert body["missing_envs"] == ["nowhere"]


@pytest.mark.parametrize(("name_field", "args_field"), [("tool", "parameters"), ("tool_name", "arguments")])
def test_execute_tool_answers_the_tool_output(gateway_stack: Stack, name_field: str, args_field: str) -> None:
    """200: the tool's own output (its JSON), in both spellings."""
    answer = post(gateway_stack, "execute_tool", {name_field: "echo_get", args_field: {"item": "ts-1"}})
    assert answer.status_code == 200
    assert answer.json()["path"] == "/echo/items/ts-1"


def test_execute_tool_status_codes(gateway_stack: Stack) -> None:
    """404 unknown tool, 422 invalid arguments (the envelope too), 500 a failed call with its envelope."""
    unknown = post(gateway_stack, "execute_tool", {"tool_name": "no_such_tool", "arguments": {}})
    invalid = post(gateway_stack, "execute_tool", {"tool_name": "echo_get", "arguments": {"limit": 1}})
    failed = post(gateway_stack, "execute_tool", {"tool_name": "status", "arguments": {"code": 500}})
    malformed = post(gateway_stack, "execute_tool", {"arguments": {}})
    assert unknown.status_code == 404 and "no_such_tool" in unknown.json()["detail"]
    assert invalid.status_code == 422 and invalid.json()["envelope"]["exitCode"] == 65
    assert "`item`" in invalid.json()["detail"]
    assert failed.status_code == 500
    assert failed.json()["envelope"]["statusCode"] == 500 and failed.json()["envelope"]["exitCode"] == 22
    assert malformed.status_code == 422 and "tool_name" in malformed.json()["detail"]


def test_execute_tool_with_env_name(gateway_stack: Stack) -> None:
    """env_name scopes the tool to an upstream, as ToolServer's env tools are."""
    found = post(
        gateway_stack, "execute_tool", {"tool_name": "echo_get", "env_name": "local", "arguments": {"item": "e"}}
    )
    elsewhere = post(gateway_stack, "execute_tool", {"tool_name": "echo_get", "env_name": "held", "arguments": {}})
    assert found.status_code == 200 and elsewhere.status_code == 404


def test_arguments_given_as_json_text(gateway_stack: Stack) -> None:
    """XAgent's client may pass the model's arguments as JSON text; they are read as the object."""
    answer = post(gateway_stack, "execute_tool", {"tool_name": "echo_get", "arguments": json.dumps({"item": "txt"})})
    assert answer.status_code == 200 and answer.json()["path"] == "/echo/items/txt"


@pytest.fixture(scope="module")
def workerless_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose Redis has no worker: the fleet cannot take calls."""
    directory = tmp_path_factory.mktemp("workerless")
    server = EmbeddedRedis(directory / "redis").start()
    gateway = start_gateway(gateway_env(server.url), directory / "gateway.log")
    yield gateway
    gateway.stop()
    server.stop()


def test_no_worker_is_503(workerless_gateway: Gateway) -> None:
    """Without a worker to answer, execute_tool is 503 and /healthz says not ready; nothing is enqueued."""
    url = workerless_gateway.url
    answer = httpx2.post(
        f"{url}/toolserver/execute_tool", json={"tool_name": "echo_get", "arguments": {"item": "x"}}, headers=auth()
    )
    assert answer.status_code == 503 and "cannot take calls" in answer.json()["detail"]
    health = httpx2.get(f"{url}/healthz")
    assert health.status_code == 503 and health.json()["status"] == "unavailable"
    rest = httpx2.post(f"{url}/v1/calls", json={"tool": "echo_get", "arguments": {"item": "x"}}, headers=auth())
    assert rest.status_code == 503 and rest.json()["error"]["type"] == "unavailable"
