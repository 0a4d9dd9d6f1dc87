"""Webhooks without processes: the callback check, the backoff, the secrets' form, the dead letter's shape."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from worker.errors import CallbackRefused
from worker.http.egress import EgressPolicy, check_callback
from worker.protocol import redacted_repr
from worker.queue.dead_letter import _hidden
from worker.queue.webhooks import Delivery, backoff_s
from worker.settings import Settings

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_an_empty_allow_list_refuses_every_callback() -> None:
    """Callbacks are off while TOOLWORKER_CALLBACK_ALLOW is empty, and the error says so."""
    with pytest.raises(CallbackRefused, match="TOOLWORKER_CALLBACK_ALLOW is empty"):
        check_callback(EgressPolicy.parse(""), "https://hooks.example.com/x")


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://hooks.example.com/x?token=1", True),
        ("https://a.internal.example.com:8443/x", True),
        ("https://a.internal.example.com/x", False),  # the entry names port 8443
        ("https://evil.example.net/x", False),
        ("ftp://hooks.example.com/x", False),
        ("/relative", False),
        ("http://127.0.0.1:9000/x", False),
    ],
)
def test_the_allow_list_decides_which_callbacks_are_taken(url: str, allowed: bool) -> None:
    """The egress syntax: names, *.domain with a port; other schemes, relative URLs and unlisted hosts refused."""
    policy = EgressPolicy.parse("hooks.example.com,*.internal.example.com:8443")
    if allowed:
        check_callback(policy, url)
    else:
        with pytest.raises(CallbackRefused, match="callback URL is refused"):
            check_callback(policy, url)


def test_backoff_doubles_with_jitter_up_to_five_minutes() -> None:
    """Each wait lies between half and all of 1 s, 2 s, 4 s, ... capped at 300 s."""
    for attempts in range(1, 20):
        ceiling = min(300.0, 2.0 ** (attempts - 1))
        assert all(ceiling / 2 <= backoff_s(attempts) <= ceiling for _ in range(50))


def test_secrets_must_be_whsec_base64_and_the_error_never_quotes_them() -> None:
    """A secret that is not `whsec_<base64>` fails the settings, naming its position only."""
    assert len(Settings(callback_secret=f"{SECRET} {SECRET}").callback_keys) == 2  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as raised:
        Settings(callback_secret=f"{SECRET} not-a-secret-value")  # type: ignore[arg-type]
    assert "secret number 2" in str(raised.value) and "not-a-secret-value" not in str(raised.value)


def test_a_dead_letter_holds_what_a_replay_needs() -> None:
    """callId, URL, webhook-id, the envelope itself and the reason; nothing else of the worker's."""
    delivery = Delivery("c-1", "https://hooks.example.com/x", "msg_c-1", b'{"callId": "c-1"}', 1_000, 3)
    letter = json.loads(delivery.letter("the receiver answered HTTP 503"))
    assert letter["kind"] == "webhook" and letter["callId"] == "c-1" and letter["webhookId"] == "msg_c-1"
    assert letter["url"] == "https://hooks.example.com/x" and json.loads(letter["envelope"]) == {"callId": "c-1"}
    assert letter["attempts"] == 3 and letter["firstAttemptAt"] == 1.0 and "503" in letter["reason"]


def test_flower_and_dead_letters_show_a_callback_url_without_its_path_or_query() -> None:
    """A callback URL's path and query may carry the receiver's token: Flower sees its origin, a dead letter
    of a rejected message nothing of it."""
    call = {"tool": "t", "callback": {"url": "https://u:pw@hooks.example.com:8443/in?token=abc"}}
    shown = redacted_repr([call])
    assert "hooks.example.com:8443" in shown and "abc" not in shown and "pw" not in shown
    assert _hidden({"body": [[call]]}) == {"body": [[{"tool": "t", "callback": {"url": "[redacted]"}}]]}
