"""A tool's input schema as calls meet it: arguments jsonschema-rs accepts go on, those it refuses are explained
by jsonschema (and accepted when jsonschema finds nothing wrong), and no schema makes the worker fetch a URL."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from worker.call.arguments import ArgumentSchema
from worker.constants import MAX_ARGUMENTS_DEPTH
from worker.errors import InvalidArguments, ToolMisconfigured

TICKET = {
    "type": "object",
    "properties": {"ticket_id": {"type": "string", "minLength": 3}, "limit": {"type": "integer", "maximum": 50}},
    "required": ["ticket_id"],
    "additionalProperties": False,
}


def accepted(schema: ArgumentSchema, arguments: dict[str, Any]) -> bool:
    try:
        return schema.check(arguments) is arguments
    except InvalidArguments:
        return False


def test_conforming_arguments_pass_as_they_are() -> None:
    """Arguments that conform pass as they are."""
    assert accepted(ArgumentSchema(TICKET), {"ticket_id": "TICKET-1", "limit": 5})


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({}, "`ticket_id` is required"),
        ({"ticket_id": "ab"}, "`ticket_id`: 'ab' is too short"),
        ({"ticket_id": "abc", "limit": 51}, "`limit`: 51 is greater than the maximum of 50"),
        ({"ticket_id": "abc", "extra": 1}, "Additional properties are not allowed ('extra' was unexpected)"),
    ],
)
def test_arguments_that_do_not_conform_are_explained(arguments: dict[str, Any], said: str) -> None:
    """What is wrong is told in jsonschema's words, field by field."""
    with pytest.raises(InvalidArguments) as caught:
        ArgumentSchema(TICKET).check(arguments)
    assert said in caught.value.message


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["ticket_id", "limit", "x"]), inner),
    max_leaves=8,
)


@given(st.dictionaries(st.sampled_from(["ticket_id", "limit", "extra"]), _json))
def test_the_two_validators_agree_on_a_plain_schema(arguments: dict[str, Any]) -> None:
    """Whatever the arguments, the quick answer is the judge's where the specification leaves no doubt."""
    assert accepted(ArgumentSchema(TICKET), arguments) == Draft202012Validator(TICKET).is_valid(arguments)


@pytest.mark.parametrize(
    "value", ["\ud800", float("nan"), 2**200], ids=["lone surrogate", "NaN", "an integer past 128 bits"]
)
def test_values_rust_cannot_hold_are_judged_by_jsonschema(value: Any) -> None:
    """A value jsonschema-rs cannot take in is not an error of its own: jsonschema says whether it conforms."""
    schema = ArgumentSchema({"type": "object", "properties": {"v": {"type": ["number", "string"]}}})
    expected = not isinstance(value, str)  # a lone surrogate is refused as text that is not Unicode
    assert accepted(schema, {"v": value}) is expected
    assert not accepted(schema, {"v": [value]})


def test_a_schema_jsonschema_rs_does_not_compile_is_served_by_jsonschema() -> None:
    """A draft-4 schema (a boolean exclusiveMinimum) is no 2020-12 schema to jsonschema-rs; jsonschema reads it."""
    schema = ArgumentSchema({"type": "object", "properties": {"n": {"minimum": 5, "exclusiveMinimum": True}}})
    assert accepted(schema, {"n": 6})
    with pytest.raises(InvalidArguments, match="`n`: 4 is less than the minimum of 5"):
        schema.check({"n": 4})


def test_a_mapping_schema_is_compiled_as_the_dict_it_reads_as() -> None:
    """A schema held as read-only mappings and tuples conforms the same."""
    frozen = MappingProxyType({"type": "object", "required": ("a",), "properties": MappingProxyType({})})
    assert accepted(ArgumentSchema(frozen), {"a": 1})
    with pytest.raises(InvalidArguments, match="`a` is required"):
        ArgumentSchema(frozen).check({})


def test_what_only_jsonschema_rs_accepts_is_accepted() -> None:
    """0.07 is a multiple of 0.01 (jsonschema's float division says it is not)."""
    schema = ArgumentSchema({"type": "object", "properties": {"p": {"multipleOf": 0.01}}})
    assert accepted(schema, {"p": 0.07})
    assert not accepted(schema, {"p": 0.075})


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A loopback port that records every connection made to it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    seen: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            seen.append(b"connected")
            connection.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], seen
    stop.set()
    thread.join(5)
    server.close()


def test_a_remote_ref_is_never_fetched(listener: tuple[int, list[bytes]]) -> None:
    """A `$ref` to a URL is not retrieved by either validator: the tool cannot be used, and says why."""
    port, seen = listener
    schema = ArgumentSchema({"type": "object", "properties": {"a": {"$ref": f"http://127.0.0.1:{port}/a.json"}}})
    assert accepted(schema, {})
    with pytest.raises(ToolMisconfigured, match=rf"refers to 'http://127\.0\.0\.1:{port}/a\.json'"):
        schema.check({"a": 1})
    assert seen == []


def test_arguments_nested_too_deep_for_either_validator_are_refused_first() -> None:
    """Arguments past MAX_ARGUMENTS_DEPTH never reach a validator (jsonschema-rs recurses in Rust, whose stack a
    recursive schema and 100,000 levels of arguments would exhaust)."""
    recursive = ArgumentSchema(
        {"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}}}, "properties": {"a": {"$ref": "#/$defs/a"}}}
    )
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidArguments, match=f"more than {MAX_ARGUMENTS_DEPTH} levels deep"):
        recursive.check({"a": deep})
    within: list[Any] = []
    for _ in range(MAX_ARGUMENTS_DEPTH - 2):
        within = [within]
    assert accepted(recursive, {"a": within})
