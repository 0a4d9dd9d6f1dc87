"""Message bodies decode as kombu decodes them: `kombu_loads` skips kombu's per-object hook only where the hook
would change nothing."""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kombu import serialization
from kombu.utils import json as kombu_json

from worker.protocol import kombu_loads
from worker.queue.app import app

_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=6)
    | st.datetimes()
    | st.uuids()
    | st.decimals(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["__type__", "__value__", "a"]), inner),
    max_leaves=10,
)


@given(_values)
def test_what_kombu_wrote_reads_back_as_kombu_reads_it(value: Any) -> None:
    """Whatever kombu's JSON encoder wrote (its typed values included) decodes to what kombu decodes."""
    text = kombu_json.dumps(value)
    expected = outcome(kombu_json.loads, text)
    assert outcome(kombu_loads, text) == expected
    assert outcome(kombu_loads, text.encode()) == expected


def outcome(decode: Any, text: str | bytes) -> Any:
    """The decoded value, or the type of the error decoding raised (kombu refuses some marker objects)."""
    try:
        return decode(text)
    except (ValueError, TypeError) as exc:
        return type(exc)


def test_an_escaped_type_marker_is_still_decoded() -> None:
    """A `__type__` key written with a \\u escape is seen (the text is then decoded with kombu's hook)."""
    moment = datetime.datetime(2026, 12, 3, 10, 0)
    text = '{"\\u005f_type__": "datetime", "__value__": "2026-12-03T10:00:00"}'
    assert kombu_loads(text) == kombu_json.loads(text) == moment


def test_the_worker_s_messages_are_decoded_with_it() -> None:
    """The worker's app registers it as kombu's JSON decoder: a task body with typed values reads as before."""
    assert app.conf.task_serializer == "json"
    body = kombu_json.dumps([[{"callId": "c", "when": uuid.UUID(int=7), "d": decimal.Decimal("1.5")}], {}, {}])
    decoded = serialization.loads(body, "application/json", "utf-8", accept={"application/json"})
    assert decoded == kombu_json.loads(body)
    assert serialization.registry._decoders["application/json"] is kombu_loads
