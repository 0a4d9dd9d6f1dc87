"""The `upstreams:` section of a native file (also what an `openapi:` entry's upstream is built from)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from worker import constants
from worker.definitions.model import CircuitPolicy, RateLimit, RetryPolicy, Source, Upstream
from worker.definitions.readers.document import StrictModel
from worker.definitions.templates import Template


class RetryModel(StrictModel):
    attempts: int = Field(1, ge=1, le=10)
    backoff_seconds: float = Field(0.2, ge=0)
    max_backoff_seconds: float = Field(10.0, ge=0)
    statuses: list[Annotated[int, Field(ge=100, le=599)]] = [502, 503, 504]
    unsafe_methods: bool = False


class CircuitModel(StrictModel):
    threshold: int = Field(constants.DEFAULT_CIRCUIT_THRESHOLD, ge=1)
    cooldown_seconds: float = Field(constants.DEFAULT_CIRCUIT_COOLDOWN_S, ge=0)


class RateLimitModel(StrictModel):
    per_second: float = Field(gt=0)
    burst: int = Field(1, ge=1)


class UpstreamModel(StrictModel):
    base_url: str
    timeout_seconds: float = Field(constants.DEFAULT_UPSTREAM_TIMEOUT_S, gt=0)
    connect_timeout_seconds: float = Field(constants.DEFAULT_CONNECT_TIMEOUT_S, gt=0)
    headers: dict[str, str] = {}
    verify_tls: bool = True
    max_concurrency: int = Field(constants.DEFAULT_MAX_CONCURRENCY, ge=1)
    retry: RetryModel = RetryModel()
    max_output_chars: int = Field(constants.DEFAULT_MAX_OUTPUT_CHARS, ge=1)
    max_response_bytes: int = Field(constants.DEFAULT_MAX_RESPONSE_BYTES, ge=1)
    queue: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    overridable_headers: list[str] = []
    allow_offsite_redirects: bool = False
    circuit: CircuitModel = CircuitModel()
    rate_limit: RateLimitModel | None = None


def build_upstream(name: str, model: UpstreamModel, source: Source) -> Upstream:
    base_url = Template.parse(model.base_url)
    if base_url.arg_names:
        raise ValueError(f"upstream {name!r}: base_url may use ${{env:...}} but not arguments")
    retry = model.retry
    return Upstream(
        name=name,
        base_url=base_url,
        timeout_s=model.timeout_seconds,
        connect_timeout_s=model.connect_timeout_seconds,
        headers={k: Template.parse(v) for k, v in model.headers.items()},
        verify_tls=model.verify_tls,
        max_concurrency=model.max_concurrency,
        retry=RetryPolicy(
            attempts=retry.attempts,
            backoff_s=retry.backoff_seconds,
            max_backoff_s=retry.max_backoff_seconds,
            statuses=frozenset(retry.statuses),
            unsafe_methods=retry.unsafe_methods,
        ),
        max_output_chars=model.max_output_chars,
        max_response_bytes=model.max_response_bytes,
        queue=model.queue,
        overridable_headers=frozenset(h.lower() for h in model.overridable_headers),
        allow_offsite_redirects=model.allow_offsite_redirects,
        circuit=CircuitPolicy(model.circuit.threshold, model.circuit.cooldown_seconds),
        rate_limit=RateLimit(model.rate_limit.per_second, model.rate_limit.burst) if model.rate_limit else None,
        source=source,
    )
