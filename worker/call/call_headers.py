"""A call's sealed headers, opened by the worker that sends it (worker/sealing.py seals them at the producer).

The opened headers live in this worker's memory for the call's life only: the queue, a parked call and a
dead letter hold them sealed.
"""

from __future__ import annotations

from worker import errors
from worker.protocol import ToolCall
from worker.sealing import Keyring, open_headers


def opened(call: ToolCall, keyring: Keyring) -> ToolCall:
    """The call with its headers in the clear; raises ToolMisconfigured (78) when no key of this worker's
    ring opens them (the producer holds TOOLWORKER_VAULT_KEYS the workers do not)."""
    if call.sealed_headers is None:
        return call
    headers = open_headers(keyring, call.sealed_headers, call.call_id)
    if headers is None:
        raise errors.ToolMisconfigured(
            "The call's headers are sealed with a key this worker does not hold (TOOLWORKER_VAULT_KEYS)."
        )
    return call.model_copy(update={"headers": {**call.headers, **headers}, "sealed_headers": None})
