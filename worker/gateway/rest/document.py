"""The OpenAPI 3.1 document of the REST API, served at `/v1/openapi.json`.

Written out rather than generated, so that it reads as the contract: other agent platforms import the
gateway from it, and so does `toolworker import-openapi` (one tool per operation, named by operationId).
"""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]


def _ref(name: str) -> JSON:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: JSON, description: str) -> JSON:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS = {
    "400": _json(_ref("Error"), "The body is not JSON."),
    "401": _json(_ref("Error"), "A bearer token is required."),
    "422": _json(_ref("Error"), "The body or a parameter has the wrong shape."),
}
_CALL_ID = {"name": "callId", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 256}}
_WAIT = {
    "name": "waitSeconds",
    "in": "query",
    "description": "How long to wait for the envelope before answering 202 (default: do not wait).",
    "schema": {"type": "number", "minimum": 0, "maximum": 3600},
}
_FORMAT = {
    "name": "format",
    "in": "query",
    "description": "summary (light rows), or an export for an LLM API.",
    "schema": {"type": "string", "enum": ["summary", "openai", "anthropic", "mcp"], "default": "summary"},
}

SCHEMAS: JSON = {
    "CallRequest": {
        "type": "object",
        "required": ["tool"],
        "additionalProperties": False,
        "properties": {
            "tool": {"type": "string", "minLength": 1, "maxLength": 256, "description": "The tool's name."},
            "arguments": {"type": "object", "description": "The tool's arguments, as its input schema says."},
            "headers": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Per-call headers; kept only where the tool's upstream lists them as overridable.",
            },
            "callId": {
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": 256,
                "description": "Names the call: sent again, it is answered from the same call.",
            },
            "timeoutSeconds": {
                "type": ["number", "null"],
                "exclusiveMinimum": 0,
                "maximum": 86400,
                "description": "The call's whole budget.",
            },
            "wait": {"type": "boolean", "default": True, "description": "false: answer 202 with the callId at once."},
            "waitSeconds": {"type": ["number", "null"], "minimum": 0, "maximum": 3600},
            "callback": {"anyOf": [_ref("Callback"), {"type": "null"}]},
        },
    },
    "Callback": {
        "type": "object",
        "required": ["url"],
        "additionalProperties": False,
        "description": "Where the envelope is POSTed once published, signed per Standard Webhooks (webhook-id, "
        "webhook-timestamp, webhook-signature), retried with backoff; the host must be on the gateway's "
        "TOOLWORKER_CALLBACK_ALLOW, else the call is refused (403 callback_refused; in a batch, that call's "
        "envelope says exitCode 77).",
        "properties": {
            "url": {
                "type": "string",
                "minLength": 1,
                "maxLength": 2048,
                "description": "An absolute http:// or https:// URL (checked against the allow-list).",
            }
        },
    },
    "BatchRequest": {
        "type": "object",
        "required": ["calls"],
        "additionalProperties": False,
        "properties": {
            "calls": {"type": "array", "items": _ref("CallRequest"), "minItems": 1, "maxItems": 1000},
            "wait": {"type": "boolean", "default": True},
            "waitSeconds": {"type": ["number", "null"], "minimum": 0, "maximum": 3600},
        },
    },
    "Envelope": {
        "type": "object",
        "description": "The result envelope of a call (exitCode 0: the upstream answered 2xx).",
        "properties": {
            "callId": {"type": "string"},
            "tool": {"type": "string"},
            "method": {"type": ["string", "null"]},
            "url": {"type": ["string", "null"]},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": ["string", "null"]},
            "statusCode": {"type": ["integer", "null"]},
            "contentType": {"type": ["string", "null"]},
            "result": {"type": "string", "description": "What the model reads."},
            "error": {
                "type": ["object", "null"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
            "exitCode": {"type": "integer"},
            "truncated": {"type": "boolean"},
            "attempts": {"type": "integer"},
            "durationMs": {"type": "number"},
            "structuredContent": {
                "description": "The JSON body parsed (as `result` reads, cut or not), when it arrived whole and "
                "conforms to the tool's output schema; null otherwise (see `note`).",
            },
            "truncation": {"type": ["string", "null"], "description": "What a JSON-aware cut kept."},
            "note": {"type": ["string", "null"], "description": "What else the model should know of this answer."},
            "pages": {"type": ["integer", "null"], "description": "Pages read (paginated tools)."},
            "next_cursor": {
                "type": ["string", "null"],
                "description": "More pages remain: pass this as the tool's pagination argument to continue.",
            },
            "cached": {"type": "boolean", "description": "Answered from the cache, without an upstream request."},
            "age": {"type": ["integer", "null"], "description": "Seconds since a cached answer was stored."},
        },
    },
    "Pending": {
        "type": "object",
        "properties": {
            "callId": {"type": "string"},
            "status": {
                "type": "string",
                "enum": ["pending", "awaiting_approval"],
                "description": "awaiting_approval: the tool needs a human's approval; the call is parked.",
            },
            "location": {"type": "string"},
        },
    },
    "Decision": {
        "type": "object",
        "required": ["decision"],
        "additionalProperties": False,
        "properties": {
            "decision": {"type": "string", "enum": ["approve", "deny"]},
            "reason": {"type": "string", "maxLength": 1000, "description": "In the audit trail; a denial's envelope."},
        },
    },
    "Decided": {
        "type": "object",
        "properties": {
            "callId": {"type": "string"},
            "tool": {"type": "string"},
            "decision": {"type": "string", "enum": ["approve", "deny"]},
            "decidedBy": {"type": "string"},
            "reason": {"type": "string"},
        },
    },
    "ParkedCall": {
        "type": "object",
        "description": "A call waiting for a human's approval (header values never shown).",
        "properties": {
            "callId": {"type": "string"},
            "tool": {"type": "string"},
            "principal": {"type": ["string", "null"], "description": "Who made it (null: a queue producer)."},
            "tenant": {"type": "string"},
            "method": {"type": "string"},
            "target": {"type": "string", "description": "Method, upstream and path with its arguments."},
            "arguments": {"type": "object"},
            "headers": {"type": "object", "additionalProperties": {"type": "string", "enum": ["[redacted]"]}},
            "since": {"type": ["string", "null"], "format": "date-time"},
            "expires": {"type": ["string", "null"], "format": "date-time"},
        },
    },
    "Error": {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            }
        },
    },
    "ToolSummary": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "method": {"type": "string"},
            "path": {"type": "string"},
            "summary": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "upstream": {"type": "string"},
        },
    },
    "Connection": {
        "type": "object",
        "description": "A user's grant to an upstream that acts for them (never a token).",
        "properties": {
            "upstream": {"type": "string"},
            "scopes": {"type": "array", "items": {"type": "string"}},
            "expiresAt": {"type": ["string", "null"], "format": "date-time"},
        },
    },
    "ToolList": {
        "type": "object",
        "properties": {"version": {"type": "integer"}, "tools": {"type": "array", "items": {"type": "object"}}},
    },
}


def _operation(operation_id: str, summary: str, responses: JSON, **extra: Any) -> JSON:
    return {"operationId": operation_id, "summary": summary, "tags": ["toolworker"], "responses": responses, **extra}


def _paths() -> JSON:
    call_body = {"required": True, "content": {"application/json": {"schema": _ref("CallRequest")}}}
    batch_body = {"required": True, "content": {"application/json": {"schema": _ref("BatchRequest")}}}
    return {
        "/v1/calls": {
            "post": _operation(
                "createCall",
                "Run a tool call through the queue and answer with its envelope (or its callId)",
                {
                    "200": _json(_ref("Envelope"), "The call's envelope (whatever its exitCode)."),
                    "202": _json(_ref("Pending"), "Not answered yet (wait false, or waitSeconds ran out)."),
                    "404": _json(_ref("Error"), "No such tool."),
                    "409": _json(_ref("Error"), "The callId names another call."),
                    "503": _json(_ref("Error"), "The fleet cannot take calls now."),
                    "403": _json(_ref("Error"), "The callback URL is not allowed (callback_refused)."),
                    **_ERRORS,
                },
                requestBody=call_body,
            )
        },
        "/v1/calls/{callId}": {
            "get": _operation(
                "getCall",
                "The envelope of a call, optionally waiting for it",
                {
                    "200": _json(_ref("Envelope"), "The call's envelope."),
                    "202": _json(_ref("Pending"), "Queued or running."),
                    "404": _json(_ref("Error"), "No call of this id is known."),
                    **_ERRORS,
                },
                parameters=[_CALL_ID, _WAIT],
            ),
            "delete": _operation(
                "withdrawCall",
                "Take a call that no worker has started off the queue",
                {
                    "200": _json({"type": "object"}, "Withdrawn: it will not run."),
                    "404": _json(_ref("Error"), "No such call is waiting."),
                    "409": _json(_ref("Error"), "A worker took it already; it runs to its end."),
                    **_ERRORS,
                },
                parameters=[_CALL_ID],
            ),
        },
        "/v1/batches": {
            "post": _operation(
                "createBatch",
                "Run many calls at once; the answers come in order",
                {
                    "200": _json(
                        {"type": "object", "properties": {"results": {"type": "array", "items": {"type": "object"}}}},
                        "One envelope (or pending entry) per call.",
                    ),
                    "503": _json(_ref("Error"), "The fleet cannot take calls now."),
                    **_ERRORS,
                },
                requestBody=batch_body,
            )
        },
        "/v1/tools": {
            "get": _operation(
                "listTools",
                "The tools the gateway offers, optionally by tag",
                {"200": _json(_ref("ToolList"), "Light summaries, or the chosen export."), **_ERRORS},
                parameters=[
                    {
                        "name": "tag",
                        "in": "query",
                        "description": "Only the tools with this tag (repeat for any of several).",
                        "schema": {"type": "array", "items": {"type": "string", "minLength": 1}},
                    },
                    _FORMAT,
                ],
            )
        },
        "/v1/tools/search": {
            "get": _operation(
                "searchTools",
                "The tools that best match a question, best first",
                {"200": _json(_ref("ToolList"), "Summaries with a score, or the chosen export."), **_ERRORS},
                parameters=[
                    {
                        "name": "question",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string", "minLength": 1, "pattern": "\\S"},
                    },
                    {"name": "top_k", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 50}},
                    _FORMAT,
                ],
            )
        },
        "/v1/tools/{name}": {
            "get": _operation(
                "getTool",
                "One tool's full definition, input schema included",
                {
                    "200": _json({"type": "object"}, "The definition."),
                    "404": _json(_ref("Error"), "No such tool."),
                    **_ERRORS,
                },
                parameters=[{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
            )
        },
        "/healthz": {
            "get": _operation(
                "health",
                "Whether the fleet can take calls (a worker answers a ping)",
                {
                    "200": _json({"type": "object"}, "Ready."),
                    "503": _json({"type": "object"}, "Redis or every worker is away."),
                },
                security=[],
            )
        },
    }


_FORBIDDEN = {"403": _json(_ref("Error"), "The principal's grants lack `approve`.")}


def _approval_paths() -> JSON:
    """Deciding on calls parked for a human's approval (docs/guides/approvals.md)."""
    listing = {"type": "object", "properties": {"approvals": {"type": "array", "items": _ref("ParkedCall")}}}
    decision = {"required": True, "content": {"application/json": {"schema": _ref("Decision")}}}
    return {
        "/v1/approvals": {
            "get": _operation(
                "listApprovals",
                "The calls waiting for a human's approval, oldest expiry first",
                {"200": _json(listing, "What waits."), **_FORBIDDEN, "401": _ERRORS["401"]},
            )
        },
        "/v1/approvals/{callId}": {
            "post": _operation(
                "decideApproval",
                "Approve (it runs once) or deny (answered with exit code 77) a parked call",
                {
                    "200": _json(_ref("Decided"), "Decided."),
                    **_FORBIDDEN,
                    "404": _json(_ref("Error"), "No call of this id waits or was decided."),
                    "409": _json(_ref("Error"), "The call was decided already (or expired): error.state says."),
                    **_ERRORS,
                },
                parameters=[_CALL_ID],
                requestBody=decision,
            )
        },
    }


_UPSTREAM = {"name": "upstream", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
_HTML = {"description": "A short page for the user.", "content": {"text/html": {"schema": {"type": "string"}}}}


def _connection_paths() -> JSON:
    """Users' connections (connections.py): the caller's own, and the two pages a user's browser opens."""
    listing = {"type": "object", "properties": {"connections": {"type": "array", "items": _ref("Connection")}}}
    removed = {
        "type": "object",
        "properties": {
            "upstream": {"type": "string"},
            "removed": {"type": "boolean"},
            "revokedAtServer": {"type": "boolean"},
        },
    }
    malformed = {**_HTML, "description": "The link or the redirect names no ticket or state."}
    refused = {**_HTML, "description": "The link or the authorization is not valid (unknown, used, expired)."}
    return {
        "/v1/connections": {
            "get": _operation(
                "listConnections",
                "The caller's connections to upstreams that act for it: upstream, scopes, expiry",
                {"200": _json(listing, "The caller's own connections."), **_ERRORS},
            )
        },
        "/v1/connections/{upstream}": {
            "delete": _operation(
                "revokeConnection",
                "Revoke the caller's grant at the authorization server (RFC 7009) and remove the connection",
                {
                    "200": _json(removed, "Removed; revokedAtServer says whether the server took the revocation."),
                    "404": _json(_ref("Error"), "The caller has no connection to this upstream."),
                    **_ERRORS,
                },
                parameters=[_UPSTREAM],
            )
        },
        "/v1/connections/{upstream}/authorize": {
            "get": _operation(
                "openConnectLink",
                "A connect link (single use, for one user): redirects the browser to the authorization server",
                {
                    "302": {"description": "To the authorization server (state and PKCE S256)."},
                    "400": malformed,
                    "403": refused,
                    "404": {**_HTML, "description": "No upstream of this name acts for its users here."},
                    "502": {**_HTML, "description": "The authorization server cannot be reached."},
                },
                parameters=[
                    _UPSTREAM,
                    {"name": "ticket", "in": "query", "required": True, "schema": {"type": "string", "minLength": 1}},
                ],
                security=[],
            )
        },
        "/v1/connections/callback": {
            "get": _operation(
                "connectCallback",
                "The authorization server's redirect back: the code is exchanged and the connection stored",
                {"200": _HTML, "400": malformed, "403": refused},
                parameters=[
                    {
                        "name": name,
                        "in": "query",
                        "required": name == "state",
                        "schema": {"type": "string", "minLength": 1},
                    }
                    for name in ("state", "code", "iss", "error")
                ],
                security=[],
            )
        },
    }


def document(server_url: str, version: str) -> JSON:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "toolworker gateway",
            "version": version,
            "description": "Tool calls for LLM agents, run by a fleet of workers through a queue.",
        },
        "servers": [{"url": server_url}],
        # A gateway without tokens (`make run`: TOOLWORKER_GATEWAY_TOKENS empty, no access file) serves
        # loopback only and asks for no Authorization: hence the empty alternative.
        "security": [{"bearer": []}, {}],
        "paths": {**_paths(), **_approval_paths(), **_connection_paths()},
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token of TOOLWORKER_GATEWAY_TOKENS or of the access file, or an OAuth 2.1 "
                    "access token. A gateway started without any (`make run`) binds to loopback only and needs "
                    "no Authorization header.",
                }
            },
        },
    }
