"""Sealed call headers at their seam: the client's message carries them sealed, bound to the callId; the
worker opens them with its keys, refuses them (78) without, and another call's record does not open."""

from __future__ import annotations

import base64

import pytest

from worker import errors
from worker.call.call_headers import opened
from worker.client.messages import message
from worker.protocol import parse_call
from worker.sealing import Keyring

KEYS = Keyring.parse("k1:" + base64.b64encode(b"s" * 32).decode())
OTHER_KEYS = Keyring.parse("k9:" + base64.b64encode(b"o" * 32).decode())
HEADERS = {"x-user-token": "tok-31c9"}


def test_headers_travel_sealed_and_open_in_the_worker() -> None:
    """With keys the message has no `headers`, only a sealed record; the worker's copy has them back."""
    written = message(("t", {}, HEADERS), "call-1", {}, KEYS)
    assert "headers" not in written and "tok-31c9" not in str(written)
    call = opened(parse_call(written, "call-1"), KEYS)
    assert call.headers == HEADERS and call.sealed_headers is None


def test_without_keys_headers_travel_as_before() -> None:
    """Without vault keys the headers are in the message as they were given."""
    assert message(("t", {}, HEADERS), "call-1", {}, Keyring([]))["headers"] == HEADERS


@pytest.mark.parametrize("keys, call_id", [(OTHER_KEYS, "call-1"), (Keyring([]), "call-1"), (KEYS, "call-2")])
def test_a_record_no_key_opens_is_refused(keys: Keyring, call_id: str) -> None:
    """Another key, no key, or the record copied into another call: 78, never the headers."""
    written = message(("t", {}, HEADERS), "call-1", {}, KEYS)
    with pytest.raises(errors.ToolMisconfigured):
        opened(parse_call({**written, "callId": call_id}, call_id), keys)
