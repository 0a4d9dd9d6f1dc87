"""An OpenAPI spec's security schemes as an `auth:` skeleton for `toolworker import-openapi`.

The secrets become `${env:...}` placeholders named after the upstream (`PETSTORE_API_KEY`, ...); the
operator sets them, and `toolworker validate` says which are unset. The scheme used is the first one the
spec's top-level `security` names, else the first one it defines that toolworker can use.
"""

from __future__ import annotations

import re
from typing import Any


def auth_skeleton(spec: dict[str, Any], upstream: str) -> dict[str, Any] | None:
    schemes = _schemes(spec)
    preferred = [name for req in spec.get("security") or [] if isinstance(req, dict) for name in req]
    for name in [*preferred, *schemes]:
        scheme = schemes.get(name)
        auth = _auth(scheme, _env_prefix(upstream)) if isinstance(scheme, dict) else None
        if auth is not None:
            return auth
    return None


def _schemes(spec: dict[str, Any]) -> dict[str, Any]:
    components = spec.get("components")
    found = components.get("securitySchemes") if isinstance(components, dict) else spec.get("securityDefinitions")
    return found if isinstance(found, dict) else {}


def _env_prefix(upstream: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", upstream).strip("_").upper() or "UPSTREAM"


def _auth(scheme: dict[str, Any], env: str) -> dict[str, Any] | None:
    kind = scheme.get("type")
    if kind == "apiKey" and scheme.get("in") in {"header", "query"} and scheme.get("name"):
        return {"type": "api_key", "in": scheme["in"], "name": scheme["name"], "value": f"${{env:{env}_API_KEY}}"}
    if kind == "basic" or (kind == "http" and str(scheme.get("scheme", "")).lower() == "basic"):
        return {"type": "basic", "username": f"${{env:{env}_USERNAME}}", "password": f"${{env:{env}_PASSWORD}}"}
    if kind == "http" and str(scheme.get("scheme", "")).lower() == "bearer":
        return {"type": "bearer", "token": f"${{env:{env}_TOKEN}}"}
    if kind == "oauth2":
        return _client_credentials(scheme, env)
    return None


def _client_credentials(scheme: dict[str, Any], env: str) -> dict[str, Any] | None:
    flows = scheme.get("flows")
    flow = flows.get("clientCredentials") if isinstance(flows, dict) else None
    if flow is None and scheme.get("flow") == "application":  # Swagger 2.0
        flow = scheme
    if not isinstance(flow, dict) or not isinstance(flow.get("tokenUrl"), str):
        return None
    auth = {
        "type": "oauth2_client_credentials",
        "token_url": flow["tokenUrl"],
        "client_id": f"${{env:{env}_CLIENT_ID}}",
        "client_secret": f"${{env:{env}_CLIENT_SECRET}}",
    }
    scopes = flow.get("scopes")
    if isinstance(scopes, dict) and scopes:
        auth["scope"] = " ".join(scopes)
    return auth
