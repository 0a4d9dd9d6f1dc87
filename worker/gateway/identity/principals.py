"""Who calls the gateway: principals, what each is granted, and the access file that names them.

A principal is a name, a tenant and a grant. It comes from a static bearer token (the access file's
`tokens:`, or `TOOLWORKER_GATEWAY_TOKENS` as `token-1`, `token-2`, ... with every tool) or from an OAuth
2.1 access token (oauth.py maps its claims and scopes). A grant is tool names and tags (`*` for every
tool); the catalog a principal sees and the tools it may call are those its grant allows, on every
surface. Without any token the gateway serves loopback only, to the `local` principal with every tool.

    TOOLWORKER_GATEWAY_ACCESS=/etc/toolworker/access.yaml

    tokens:
      ci-bot: {token: "${env:CI_BOT_TOKEN}", tenant: ci, tags: [support]}
      ops: {token: "${env:OPS_TOKEN}", tools: ["*"], grants: [operate, approve]}
    oauth:
      issuer: https://idp.example.com/
      scopes: {tools.support: {tags: [support]}, tools.all: {tools: ["*"]}, ops: {grants: [approve]}}

Besides tools, a grant names actions (`grants:`): `approve` decides parked calls, `operate` opens the
console. `TOOLWORKER_GATEWAY_TOKENS` tokens and the local principal hold every action.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.types import Scope

from worker.constants import DEFAULT_TENANT, TENANT_PATTERN
from worker.definitions.model import Tool
from worker.definitions.templates import Env, MissingEnv, Template, TemplateSyntaxError, resolve_env
from worker.settings import Settings

EVERY_TOOL = "*"
# What a principal may do besides calling tools: decide parked calls, operate the console.
Action = Literal["approve", "operate"]
EVERY_ACTION: frozenset[str] = frozenset(get_args(Action))
# The principal of a request, as the Guard found it (ASGI scopes take custom keys).
PRINCIPAL_SCOPE_KEY = "toolworker.principal"
# The request's OAuth access token, once validated (for token exchange; never a static token).
ACCESS_TOKEN_SCOPE_KEY = "toolworker.access_token"
# Signature algorithms an access token may use unless the access file says otherwise: asymmetric only.
DEFAULT_ALGORITHMS = ("RS256", "PS256", "ES256", "EdDSA")
_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"})


class AccessFileError(ValueError):
    """The access file cannot be read, or says something the gateway cannot do."""


@dataclass(frozen=True)
class Grant:
    """What a principal may see and call (tools by name, tools by tag, or every tool: `*`), and do."""

    tools: frozenset[str] = frozenset()
    tags: frozenset[str] = frozenset()
    actions: frozenset[str] = frozenset()

    @property
    def everything(self) -> bool:
        return EVERY_TOOL in self.tools

    @property
    def empty(self) -> bool:
        return not self.tools and not self.tags and not self.actions

    def allows(self, tool: Tool) -> bool:
        return self.everything or tool.name in self.tools or not self.tags.isdisjoint(tool.tags)

    def may(self, action: Action) -> bool:
        return action in self.actions

    def __or__(self, other: Grant) -> Grant:
        return Grant(self.tools | other.tools, self.tags | other.tags, self.actions | other.actions)


EVERYTHING = Grant(frozenset({EVERY_TOOL}), actions=EVERY_ACTION)
NOTHING = Grant()


@dataclass(frozen=True)
class Principal:
    """A caller of the gateway: its name and tenant travel with its calls (never its token)."""

    name: str
    tenant: str = DEFAULT_TENANT
    grant: Grant = EVERYTHING


# Loopback without tokens, and `toolworker mcp` on stdio: the operator's own machine.
LOCAL = Principal("local")


def principal_of(scope: Scope) -> Principal:
    """The principal the Guard admitted for this request (the local one when the gateway has no tokens)."""
    found = scope.get(PRINCIPAL_SCOPE_KEY)
    return found if isinstance(found, Principal) else LOCAL


def access_token_of(scope: Scope) -> str | None:
    """The validated OAuth access token the request carried, if it carried one (not a static token)."""
    found = scope.get(ACCESS_TOKEN_SCOPE_KEY)
    return found if isinstance(found, str) else None


# --- the access file ---------------------------------------------------------------------------------


class GrantSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tags: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    grants: list[Action] = Field(default_factory=list)

    def grant(self) -> Grant:
        return Grant(frozenset(self.tools), frozenset(self.tags), frozenset(self.grants))


class TokenSpec(GrantSpec):
    """A named static bearer token; the token itself is a template (`${env:...}`, `${file:...}`)."""

    token: str = Field(min_length=1)
    tenant: str = Field(DEFAULT_TENANT, pattern=TENANT_PATTERN)


class OAuthSpec(BaseModel):
    """The authorization server whose access tokens (JWT) the gateway accepts, and what their scopes grant."""

    model_config = ConfigDict(extra="forbid")

    issuer: str = Field(pattern=r"^https?://")
    # The resource the tokens must be issued for (their `aud`); default: TOOLWORKER_GATEWAY_PUBLIC_URL + /mcp.
    audience: str | None = Field(None, pattern=r"^https?://")
    principal_claim: str = "sub"
    tenant_claim: str | None = None
    scopes: dict[str, GrantSpec] = Field(default_factory=dict)
    algorithms: list[str] = Field(default_factory=lambda: list(DEFAULT_ALGORITHMS), min_length=1)
    # Clock skew allowed on `exp`/`nbf`/`iat`.
    leeway_seconds: float = Field(30.0, ge=0, le=300)
    # The issuer's keys are kept this long; a token signed by a key not among them (a rotation) fetches
    # them again, at most once per `jwks_refetch_min_seconds` (a stream of made-up `kid`s costs nothing).
    jwks_max_age_seconds: float = Field(600.0, gt=0)
    jwks_refetch_min_seconds: float = Field(10.0, ge=0)
    fetch_timeout_seconds: float = Field(5.0, gt=0, le=60)

    @field_validator("algorithms")
    @classmethod
    def _asymmetric_only(cls, algorithms: list[str]) -> list[str]:
        # `none` and HS* would let anyone holding the public key (or nothing) sign a token.
        refused = [a for a in algorithms if a not in _ALGORITHMS]
        if refused:
            raise ValueError(f"algorithms must be among {', '.join(sorted(_ALGORITHMS))}; not {', '.join(refused)}")
        return algorithms


class AccessFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: dict[str, TokenSpec] = Field(default_factory=dict)
    oauth: OAuthSpec | None = None


def load_access(path: Path) -> AccessFile:
    """The access file, validated; raises AccessFileError saying what is wrong (never a secret's value)."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        access = AccessFile.model_validate(raw)
    except OSError as exc:
        raise AccessFileError(f"{path}: cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise AccessFileError(f"{path}: not YAML ({exc})") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False))
        raise AccessFileError(f"{path}: {problems}") from None
    for name, spec in access.tokens.items():
        if spec.grant().empty:
            raise AccessFileError(f"{path}: tokens.{name} grants nothing (give tags, tools, tools: ['*'] or grants)")
    return access


def resolve_secret(text: str, where: str, environ: Mapping[str, str] | None = None) -> str:
    """A secret's template (`${env:NAME}`, `${file:/path}`, literal text) as its value."""
    try:
        template = Template.parse(text)
        values = [_secret_part(part, environ if environ is not None else os.environ) for part in template.parts]
    except (TemplateSyntaxError, MissingEnv) as exc:
        raise AccessFileError(f"{where}: {exc.args[0]} is not available") from None
    value = "".join(values)
    if not value:
        raise AccessFileError(f"{where}: the token is empty")
    return value


def _secret_part(part: Any, environ: Mapping[str, str]) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, Env):
        return resolve_env(part, environ)
    raise TemplateSyntaxError(f"${{{part.name}}} (a token has no arguments)")


# --- static tokens -----------------------------------------------------------------------------------


class StaticTokens:
    """Named bearer tokens, each compared in constant time, every one of them every time."""

    def __init__(self, entries: Iterable[tuple[str, Principal]]) -> None:
        self._entries = [(token.encode(), principal) for token, principal in entries]

    def __bool__(self) -> bool:
        return bool(self._entries)

    def match(self, given: bytes) -> Principal | None:
        found = None
        for token, principal in self._entries:  # no early exit: the time says nothing of which matched
            if hmac.compare_digest(given, token):
                found = principal
        return found


def static_tokens(settings: Settings, access: AccessFile | None) -> StaticTokens:
    """`TOOLWORKER_GATEWAY_TOKENS` (principals `token-1`, ...: every tool, tenant default) and the access
    file's named tokens."""
    legacy = [(token, Principal(f"token-{n}")) for n, token in enumerate(settings.gateway_token_list, start=1)]
    named = [
        (resolve_secret(spec.token, f"tokens.{name}.token"), Principal(name, spec.tenant, spec.grant()))
        for name, spec in (access.tokens.items() if access else ())
    ]
    return StaticTokens([*legacy, *named])


def read_access(settings: Settings) -> AccessFile | None:
    """The access file `TOOLWORKER_GATEWAY_ACCESS` names, if any."""
    return None if settings.gateway_access is None else load_access(settings.gateway_access)


def audience(settings: Settings, spec: OAuthSpec) -> str:
    """The resource access tokens must be issued for."""
    if spec.audience:
        return spec.audience
    if not settings.gateway_public_url:
        raise AccessFileError("oauth.audience is unset and so is TOOLWORKER_GATEWAY_PUBLIC_URL (the gateway's URL)")
    return settings.gateway_public_url.rstrip("/") + "/mcp"


def access_problems(settings: Settings) -> list[str]:
    """What stops the gateway from using its access file (`toolworker validate`): nothing when it has none."""
    try:
        access = read_access(settings)
        static_tokens(settings, access)
        if access is not None and access.oauth is not None:
            audience(settings, access.oauth)
    except AccessFileError as exc:
        return [f"access: {exc}"]
    return []
