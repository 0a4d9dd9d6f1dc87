"""Every `TOOLWORKER_*` setting, read once from the environment."""

from __future__ import annotations

import base64
import binascii
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.shards import Shards


class Settings(BaseSettings):
    # Errors never quote a value: some are secrets (tokens, webhook secrets).
    model_config = SettingsConfigDict(env_prefix="TOOLWORKER_", extra="ignore", hide_input_in_errors=True)

    redis_url: str = "redis://localhost:6379/0"
    # Several Redis deployments, `name=url` separated by spaces or commas (worker/shards.py): when set, it
    # replaces redis_url, which becomes the first shard's (the home shard: upstream-wide state).
    redis_shards: str = ""
    # The shard a worker process takes from (set by `toolworker worker` for each process it starts).
    shard: str = ""
    # How long a command that starts (worker, call, publish) waits for Redis before it says why it cannot.
    redis_connect_timeout_seconds: float = Field(5.0, gt=0)
    # With a `sentinel://host:port[;sentinel://host:port...]/db` URL: the master the Sentinels watch, the
    # Sentinels' own password (the URL's password is the primary's), TLS to both (worker/connections.py).
    redis_sentinel_master: str = "mymaster"
    redis_sentinel_password: SecretStr = SecretStr("")
    redis_sentinel_tls: bool = False
    # An enqueue (and a published result) is acknowledged only once this many replicas have it (WAIT), so
    # that a failover loses none; 0 = as soon as the primary has it.
    redis_min_replicas: int = Field(0, ge=0)
    redis_min_replicas_timeout_seconds: float = Field(2.0, gt=0)
    definitions: Path = Path("definitions")
    # "file": read `definitions` at start; "redis": serve what `toolworker publish` put in Redis, live.
    store: Literal["file", "redis"] = "file"
    store_poll_seconds: float = Field(2.0, gt=0)
    # Comma-separated hosts, *.wildcard domains, CIDRs, with optional :port; empty = generic tool off.
    egress_allow: str = ""
    log_format: Literal["json", "console"] = "json"
    log_level: str = "INFO"
    result_ttl_seconds: int = Field(86_400, ge=1)
    # Messages (a call or a batch) in progress at once in one worker process (Celery's -c).
    concurrency: int = Field(64, ge=1)
    # Worker processes started by one `toolworker worker` (each uses one core); one per core is the norm.
    processes: int = Field(1, ge=1)
    # Longest a reply stream (replyTo) grows to; older entries are trimmed.
    reply_stream_maxlen: int = Field(100_000, ge=1)
    # Comma-separated nameservers (IP or IP:port) for upstream lookups; empty = the system's resolver.
    dns_servers: str = ""
    # Celery task events (received, started, succeeded) for Flower's task views; worker events stay on.
    # They are flushed in batches, so turning them off saves little (0.1-0.2 ms of CPU per message).
    task_events: bool = True
    # Prometheus /metrics of the worker (worker/metrics.py); 0 = no metrics server.
    metrics_port: int = Field(9808, ge=0, le=65535)
    # A worker process holds a lease on the messages it took, renewed five times a lease; a holder whose lease
    # lapses is dead, and the live workers hand its messages back to their queues.
    lease_seconds: float = Field(8.0, ge=1)
    # A queue item larger than this is refused before it is decoded (dead-lettered by size and digest, and
    # answered 65 when its ends name its task id). Far above one call (arguments are capped at 1 MiB, about
    # 3 MiB once escaped twice and base64-encoded) and a batch of 100 ordinary calls.
    max_message_bytes: int = Field(8 * 1024 * 1024, ge=64 * 1024)
    # The last resort: an unacknowledged message older than this comes back even if its holder is alive.
    visibility_timeout_seconds: int = Field(86_400, ge=60)
    # The agent gateway (`toolworker gateway`, `toolworker mcp`; worker/gateway/).
    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(8780, ge=0, le=65535)
    # Comma-separated bearer tokens the gateway accepts; empty = no auth, and then loopback only.
    gateway_tokens: SecretStr = SecretStr("")
    gateway_max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024)
    # Origins a browser may call /mcp from (`http://host:*` allows any port); loopback when empty.
    gateway_allowed_origins: str = ""
    # Tools per `tools/list` page.
    gateway_page_size: int = Field(100, ge=1, le=1000)
    # How long a call waits for its envelope unless the request says otherwise.
    gateway_call_timeout_seconds: float = Field(60.0, gt=0, le=86_400)
    # Principals: named tokens, OAuth 2.1 access tokens, their grants and tenants
    # (worker/gateway/identity/principals.py).
    gateway_access: Path | None = None
    # The gateway's URL as its clients reach it (behind a load balancer: the public one); the OAuth
    # resource is this + /mcp, and the Protected Resource Metadata names it.
    gateway_public_url: str = ""
    # The vault of end users' tokens (worker/call/vault.py): comma-separated `kid:BASE64(32 bytes)` AES-GCM
    # keys; the first encrypts, every one decrypts (a rotation). Empty: `oauth2_user` upstreams cannot be used.
    vault_keys: SecretStr = SecretStr("")
    # How long a connect URL (and the authorization it starts) stays usable.
    connect_ttl_seconds: int = Field(600, ge=10, le=86_400)
    # MCP tasks (worker/gateway/mcp/tasks.py): how long a task is kept when its client asks no TTL (a client may
    # ask up to result_ttl_seconds, as long as its envelope is kept), and how often clients are told to poll.
    task_ttl_seconds: int = Field(3600, ge=1)
    task_poll_interval_ms: int = Field(1000, ge=10, le=600_000)
    # Longest the audit stream (one entry per call the gateway takes) grows to; older entries are trimmed.
    audit_stream_maxlen: int = Field(1_000_000, ge=1)
    # The operators' console (/console on the gateway): how long a signed-in session lasts without use.
    console_session_ttl_seconds: int = Field(8 * 3600, ge=60, le=30 * 86_400)
    # How long a parked call waits for a human's decision before it is answered as expired (exit 75).
    approval_ttl_seconds: int = Field(3600, ge=1, le=30 * 86_400)
    # Callbacks (worker/queue/webhooks.py): the hosts a call's `callback.url` may name, in the egress
    # allow-list's syntax (empty = callbacks refused at enqueue); each delivery also passes the egress
    # policy's connect-time address check against this list.
    callback_allow: str = ""
    # Space-separated `whsec_<base64>` secrets; each signs every delivery (several during a key rotation).
    callback_secret: SecretStr = SecretStr("")
    # How long a delivery is tried again (exponential backoff, jitter) before it is dead-lettered.
    callback_retry_seconds: float = Field(3600.0, gt=0)
    # The longest one delivery attempt may take; a worker's claim on a delivery lasts a little longer.
    callback_timeout_seconds: float = Field(10.0, gt=0, le=300)
    # Code mode (worker/program/, docs/guides/code-mode.md): `run_code` offered beside the tools in the
    # gateway's `all` and `discovery` modes (always in `code` mode).
    code_mode: bool = False
    # What the gateway's MCP clients see (`--mode` chooses too): `all` the tools, `discovery` meta-tools to
    # find and call them, `code` the meta-tools to find them and `run_code` to call them from a program.
    gateway_mode: Literal["all", "discovery", "code"] = "all"
    # Tool calls one program may make; the next one ends it (exit 75).
    code_max_calls: int = Field(50, ge=1, le=10_000)
    # Wall time of a program, from its start to its answer, its tool calls' time included (exit 75).
    code_timeout_seconds: float = Field(120.0, gt=0, le=86_400)
    # The sandbox's heap (exit 75 when a program needs more).
    code_max_memory_mb: int = Field(64, ge=1, le=4096)
    # CPU time of one stretch of a program, between two of its suspensions (exit 75).
    code_cpu_seconds: float = Field(5.0, gt=0, le=600)
    # Bytes of a program's printed output, and of its answer's JSON (exit 63 past either).
    code_max_output_bytes: int = Field(1024 * 1024, ge=1024)
    # Sandbox processes a worker process keeps (programs beyond it wait for one).
    code_sandboxes: int = Field(2, ge=1, le=64)

    @model_validator(mode="after")
    def _home_shard(self) -> Settings:
        """With shards, TOOLWORKER_REDIS_URL is ignored: every use of redis_url is the home shard's."""
        if self.redis_shards.strip():
            self.redis_url = self.shards.home.url
        if self.shard:
            self.shards.named(self.shard)  # a shard this deployment has
        return self

    @cached_property
    def shards(self) -> Shards:
        return Shards.parse(self.redis_shards) if self.redis_shards.strip() else Shards.single(self.redis_url)

    @property
    def queue_url(self) -> str:
        """The Redis this worker process takes calls from: its shard's, else redis_url."""
        return self.shards.named(self.shard).url if self.shard else self.redis_url

    @field_validator("callback_secret")
    @classmethod
    def _whsec(cls, value: SecretStr) -> SecretStr:
        """Each secret is `whsec_` followed by base64 (the error never quotes it)."""
        for number, secret in enumerate(value.get_secret_value().split(), start=1):
            if not secret.startswith("whsec_") or not _base64(secret[len("whsec_") :]):
                raise ValueError(f"secret number {number} is not of the form whsec_<base64>")
        return value

    @property
    def callback_keys(self) -> list[bytes]:
        """The signing keys of TOOLWORKER_CALLBACK_SECRET, decoded."""
        return [base64.b64decode(s[len("whsec_") :]) for s in self.callback_secret.get_secret_value().split()]

    @property
    def gateway_token_list(self) -> list[str]:
        return [t.strip() for t in self.gateway_tokens.get_secret_value().split(",") if t.strip()]

    @property
    def public_url(self) -> str:
        """The gateway's URL as users' browsers reach it (connect URLs, the OAuth callback)."""
        return (self.gateway_public_url or f"http://{self.gateway_host}:{self.gateway_port}").rstrip("/")

    @property
    def dns_server_list(self) -> list[str]:
        return [s.strip() for s in self.dns_servers.split(",") if s.strip()]


def _base64(text: str) -> bool:
    try:
        return bool(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        return False


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
