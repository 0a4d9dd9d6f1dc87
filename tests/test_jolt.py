"""JOLT transforms, checked against examples from bazaarvoice/jolt's own javadoc and test fixtures.

Sources (repository bazaarvoice/jolt): the class javadoc of jolt-core/src/main/java/com/bazaarvoice/jolt/
Shiftr.java, Defaultr.java and Removr.java, and the fixtures under jolt-core/src/test/resources/json/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker.definitions.file_store import load
from worker.definitions.jolt import SUPPORTED_OPERATIONS, jolt_transform
from worker.definitions.transforms import TransformError


def shift(spec: dict[str, Any], data: Any) -> Any:
    return jolt_transform([{"operation": "shift", "spec": spec}])(data)


def test_shift_javadoc_rating_example() -> None:
    """Shiftr javadoc: literal keys, `*`, `&1` and `$` move ratings into SecondaryRatings."""
    data = {
        "rating": {
            "primary": {"value": 3, "max": 5},
            "quality": {"value": 3, "max": 5},
            "sharpness": {"value": 7, "max": 10},
        }
    }
    spec = {
        "rating": {
            "primary": {"value": "Rating", "max": "RatingRange"},
            "*": {
                "value": "SecondaryRatings.&1.Value",
                "max": "SecondaryRatings.&1.Range",
                "$": "SecondaryRatings.&1.Id",
            },
        }
    }
    assert shift(spec, data) == {
        "Rating": 3,
        "RatingRange": 5,
        "SecondaryRatings": {
            "quality": {"Range": 5, "Value": 3, "Id": "quality"},
            "sharpness": {"Range": 10, "Value": 7, "Id": "sharpness"},
        },
    }


def test_shift_javadoc_list_of_input_keys() -> None:
    """Shiftr javadoc: `$` writes each matched key, and repeated writes build an array."""
    data = {"rating": {"primary": {"value": 3, "max": 5}, "quality": {"value": 3, "max": 7}}}
    assert shift({"rating": {"*": {"$": "ratings"}}}, data) == {"ratings": ["primary", "quality"]}


def test_shift_javadoc_hash_writes_a_constant() -> None:
    """Shiftr javadoc: a scalar input value is matched as a key, and `#disabled` writes a constant."""
    spec = {"hidden": {"true": {"#disabled": "clients.clientId"}}}
    assert shift(spec, {"hidden": True}) == {"clients": {"clientId": "disabled"}}
    assert shift(spec, {"hidden": False}) is None


def test_shift_javadoc_output_arrays_with_references() -> None:
    """Shiftr javadoc: `Photos[&(0,1)].Url` puts data at an index captured by `*`, padding with null."""
    data = {"photo-1-id": "327704", "photo-1-url": "http://bob.com/0001/327704/photo.jpg"}
    spec = {"photo-1-id": "Photos[1].Id", "photo-*-url": "Photos[&(0,1)].Url"}
    assert shift(spec, data) == {"Photos": [None, {"Id": "327704", "Url": "http://bob.com/0001/327704/photo.jpg"}]}


def test_shift_javadoc_input_arrays_are_maps_with_numeric_keys() -> None:
    """Shiftr javadoc and fixture shiftr/explicitArrayKey.json: "1" picks the second element."""
    assert shift({"Photos": {"1": "photo-&-url"}}, {"Photos": ["AAA.jpg", "BBB.jpg"]}) == {"photo-1-url": "BBB.jpg"}


def test_shift_javadoc_list_of_output_paths() -> None:
    """Shiftr javadoc: a list on the right-hand side writes the value to every path."""
    assert shift({"foo": ["bar", "baz"]}, {"foo": 3}) == {"bar": 3, "baz": 3}


def test_shift_javadoc_implicit_array() -> None:
    """Shiftr javadoc: two values written to one place become an array."""
    assert shift({"foo": "baz", "tuna": "baz"}, {"foo": "bar", "tuna": "marlin"}) == {"baz": ["bar", "marlin"]}


def test_shift_at_copies_the_value_beside_its_key() -> None:
    """Fixture shiftr/specialKeys.json: `@` writes each value, `$` each key, in input order."""
    spec = {"*": {"@": "a.b.originalValues", "$": "a.b.originalKeys"}}
    data = {"foo": 3, "bar": 14, "baz": 15, "tuna": 9}
    assert shift(spec, data) == {
        "a": {"b": {"originalKeys": ["foo", "bar", "baz", "tuna"], "originalValues": [3, 14, 15, 9]}}
    }


def test_shift_append_and_dollar_captures() -> None:
    """Fixture shiftr/declaredOutputArray.json: `[]` appends, and `$(0,1)` writes what `*` captured."""
    spec = {
        "foo-*": "listOfFooValues[]",
        "tuna-*": {"@": "listOfTunaValues[]", "$(0,1)": ["listOfTunaIds[]", "sillyListOfTunaIds[].id"]},
        "axis-*": {"@": "listOfAxisValues[]", "$(0,1)": "listOfAxisIds[]"},
    }
    data = {"tuna-a": "A", "tuna-b": "B", "foo-a": "bar", "axis-x": "horizontal"}
    assert shift(spec, data) == {
        "listOfFooValues": ["bar"],
        "listOfTunaValues": ["A", "B"],
        "listOfTunaIds": ["a", "b"],
        "sillyListOfTunaIds": [{"id": "a"}, {"id": "b"}],
        "listOfAxisValues": ["horizontal"],
        "listOfAxisIds": ["x"],
    }


def test_shift_transpose_reads_keys_from_the_input() -> None:
    """Fixture shiftr/transposeSimple1.json: `@clientName` as data and `@clientId` as the output key."""
    data = {"data": {"clientId": "1234", "clientName": "Acme"}}
    assert shift({"data": {"@clientName": "@clientId"}}, data) == {"1234": "Acme"}


def test_shift_hash_index_numbers_matches() -> None:
    """SentinelAI's JoltTest (PhonePe/sentinel-ai): `fields[#2]` numbers rows as they match."""
    spec = {
        "rows": {
            "*": {"field": "fields[#2].field", "type": "fields[#2].type", "queryState": "fields[#2].queryState"},
            "fields": "[&1]",
        }
    }
    data = {
        "headers": [{"maxLength": 21, "name": "creationDate"}],
        "rows": [
            {"creationDate": "30/04/2024 01:05:47", "field": "app", "queryState": "NON_QUERYABLE", "type": "KEYWORD"},
            {"field": "date.dayOfMonth", "queryState": "QUERYABLE", "type": "LONG"},
        ],
    }
    assert shift(spec, data) == {
        "fields": [
            {"field": "app", "type": "KEYWORD", "queryState": "NON_QUERYABLE"},
            {"field": "date.dayOfMonth", "type": "LONG", "queryState": "QUERYABLE"},
        ]
    }


def test_shift_escaped_dots_stay_in_keys() -> None:
    """Fixture shiftr/simpleRHSEscape.json: `\\.` keeps a dot inside an output key and an `@(...)` path."""
    data = {"rating": {"primary": {"value": 4}}, "foo.bar": "baz", "test": {"use_as_path": "path"}}
    spec = {
        "rating": {"primary": {"value": "data.rating\\.primary"}},
        "test": {"use_as_path": "test.@(2,foo\\.bar)"},
    }
    assert shift(spec, data) == {"data": {"rating.primary": 4}, "test": {"baz": "path"}}


def test_shift_literal_keys_win_over_wildcards() -> None:
    """Shiftr javadoc: a literal key matches before `*`, which then sees only the other keys."""
    spec = {"id": "identifier", "*": "others.&"}
    assert shift(spec, {"id": 1, "a": 2}) == {"identifier": 1, "others": {"a": 2}}


def test_shift_skips_huge_indexes_taken_from_the_input() -> None:
    """An array index read from the response is capped, so a hostile key cannot pad memory with nulls."""
    assert shift({"*": "a[&0]"}, {"99999999999": "x", "1": "y"}) == {"a": [None, "y"]}


def test_shift_with_nothing_matched_is_null() -> None:
    """JOLT's Shiftr returns null when no spec key matched the input."""
    assert shift({"missing": "x"}, {"present": 1}) is None


def test_default_javadoc_example() -> None:
    """Defaultr javadoc: literal, `a|b` and `*` keys fill in what is missing, never overwriting."""
    data = {
        "Rating": 3,
        "SecondaryRatings": {
            "quality": {"Range": 7, "Value": 3, "Id": "quality"},
            "sharpness": {"Value": 4, "Id": "sharpness"},
        },
    }
    spec = {
        "RatingRange": 5,
        "SecondaryRatings": {
            "quality|value": {
                "ValueLabel": None,
                "Label": None,
                "MaxLabel": "Great",
                "MinLabel": "Terrible",
                "DisplayType": "NORMAL",
            },
            "*": {
                "Range": 5,
                "ValueLabel": None,
                "Label": None,
                "MaxLabel": "High",
                "MinLabel": "Low",
                "DisplayType": "NORMAL",
            },
        },
    }
    out = jolt_transform([{"operation": "default", "spec": spec}])(data)
    assert out == {
        "Rating": 3,
        "RatingRange": 5,
        "SecondaryRatings": {
            "quality": {
                "Range": 7,
                "Value": 3,
                "Id": "quality",
                "ValueLabel": None,
                "Label": None,
                "MaxLabel": "Great",
                "MinLabel": "Terrible",
                "DisplayType": "NORMAL",
            },
            "sharpness": {
                "Range": 5,
                "Value": 4,
                "Id": "sharpness",
                "ValueLabel": None,
                "Label": None,
                "MaxLabel": "High",
                "MinLabel": "Low",
                "DisplayType": "NORMAL",
            },
        },
    }


def test_default_arrays() -> None:
    """Fixture defaultr/photosArray.json: `photos[]` children are indexes; literals grow the array."""
    spec = {
        "photos[]": {
            "*": {"url": "http://default.com", "caption": "Default Caption"},
            "0|3": {"caption": "Or-ed caption."},
            "3": {"url": "http://tuna.com", "caption": "The Best"},
        }
    }
    data = {
        "photos": [
            {"url": "http://slashdot.org"},
            {"url": "http://bazaarvoice.com", "caption": "Review all the things."},
        ]
    }
    assert jolt_transform([{"operation": "default", "spec": spec}])(data) == {
        "photos": [
            {"url": "http://slashdot.org", "caption": "Or-ed caption."},
            {"url": "http://bazaarvoice.com", "caption": "Review all the things."},
            {"url": "http://default.com", "caption": "Default Caption"},
            {"url": "http://tuna.com", "caption": "The Best"},
        ]
    }


def test_remove_javadoc_example() -> None:
    """Removr javadoc: keys named with "" are removed, nested objects are walked."""
    data = {
        "~emVersion": "2",
        "id": "123124",
        "productId": "31231231",
        "submissionId": "34343",
        "this": "stays",
        "configured": {"a": "b", "c": "d"},
    }
    spec = {"~emVersion": "", "productId": "", "submissionId": "", "configured": {"c": ""}}
    out = jolt_transform([{"operation": "remove", "spec": spec}])(data)
    assert out == {"id": "123124", "this": "stays", "configured": {"a": "b"}}


def test_remove_wildcards_and_array_indexes() -> None:
    """Removr javadoc: `*` and `ratings_*` match many keys; an index removes an array element."""
    data = {"ratings_new": {"Set1": {"a": 1}, "Set2": {"a": 2, "b": 3}}, "list": [1, 2, 3]}
    spec = {"ratings_*": {"Set1": "", "*": {"b": ""}}, "list": {"1": ""}}
    assert jolt_transform([{"operation": "remove", "spec": spec}])(data) == {
        "ratings_new": {"Set2": {"a": 2}},
        "list": [1, 3],
    }


def test_chain_runs_operations_in_order_from_json_text() -> None:
    """A chain given as JSON text runs shift, then default, then remove, like JOLT's Chainr."""
    spec = json.dumps(
        [
            {"operation": "shift", "spec": {"location": "userLocation", "secret": "secret"}},
            {"operation": "default", "spec": {"country": "IN"}},
            {"operation": "remove", "spec": {"secret": ""}},
        ]
    )
    data = {"location": "Bangalore", "secret": "x", "noise": 1}
    assert jolt_transform(spec)(data) == {"userLocation": "Bangalore", "country": "IN"}


def test_java_class_names_of_supported_operations() -> None:
    """Chainr also names operations by their Java class, like com.bazaarvoice.jolt.Shiftr."""
    transform = jolt_transform([{"operation": "com.bazaarvoice.jolt.Shiftr", "spec": {"a": "b"}}])
    assert transform({"a": 1}) == {"b": 1}


@pytest.mark.parametrize(
    "operation",
    ["modify-overwrite-beta", "modify-default-beta", "cardinality", "sort", "com.example.CustomTransform"],
)
def test_other_operations_are_refused_by_name(operation: str) -> None:
    """Any other operation is refused at load time, naming it and listing the supported ones."""
    with pytest.raises(TransformError) as error:
        jolt_transform([{"operation": operation, "spec": {}}])
    assert operation in str(error.value)
    assert all(name in str(error.value) for name in SUPPORTED_OPERATIONS)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("[{", "not valid JSON"),
        ([], "non-empty list"),
        ([{"spec": {}}], "'operation'"),
        ([{"operation": "shift", "spec": ["a"]}], "must be an object"),
        ([{"operation": "shift", "spec": {"a": "&3"}}], "levels up"),
        ([{"operation": "shift", "spec": {"a": "x.&(0,1)"}}], "wildcard 1"),
        ([{"operation": "shift", "spec": {"a": "x.*"}}], "may not contain"),
        ([{"operation": "shift", "spec": {"@": {"a": "b"}}}], "cannot have children"),
        ([{"operation": "shift", "spec": {"a": 5}}], "a shift value"),
        ([{"operation": "default", "spec": {"a[]": {"x": 1}}}], "must be indexes"),
        ([{"operation": "remove", "spec": {"a": "yes"}}], "must be"),
    ],
)
def test_invalid_specs_are_refused_at_load(spec: Any, message: str) -> None:
    """Malformed chains and specs raise TransformError when compiled, not when a response arrives."""
    with pytest.raises(TransformError, match=message):
        jolt_transform(spec)


@pytest.mark.parametrize(
    "jolt",
    [
        [{"operation": "shift", "spec": {"weatherValue": "weather"}}],
        '[{"operation": "shift", "spec": {"weatherValue": "weather"}}]',
    ],
)
def test_native_format_accepts_jolt_transforms(tmp_path: Path, jolt: Any) -> None:
    """The native format's `transform: {jolt: ...}` takes the spec list or its JSON text."""
    definition = {
        "upstreams": {"weather": {"base_url": "https://weather.example.com"}},
        "tools": [
            {
                "name": "weather",
                "upstream": "weather",
                "request": {"path": "/now"},
                "response": {"transform": {"jolt": jolt}},
            }
        ],
    }
    path = tmp_path / "weather.json"
    path.write_text(json.dumps(definition))
    toolset = load([path], {})
    assert toolset.problems == []
    transform = toolset.tools["weather"].transform
    assert transform is not None
    assert transform({"weatherValue": "sunny", "location": "Bangalore"}) == {"weather": "sunny"}


def test_native_format_reports_unsupported_jolt_operation(tmp_path: Path) -> None:
    """An unsupported JOLT operation in a native file is a load problem at the tool's line."""
    path = tmp_path / "tools.yaml"
    path.write_text(
        "upstreams:\n"
        "  u: {base_url: 'https://u.example.com'}\n"
        "tools:\n"
        "  - name: t\n"
        "    upstream: u\n"
        "    response:\n"
        "      transform:\n"
        "        jolt: [{operation: modify-overwrite-beta, spec: {}}]\n"
    )
    toolset = load([path], {})
    assert "t" not in toolset.tools
    [problem] = toolset.problems
    assert problem.source.line == 4
    assert "modify-overwrite-beta" in problem.message
