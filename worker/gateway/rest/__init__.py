"""The REST surface under `/v1`: the routes, the request bodies they read, and the OpenAPI document.

routes.py       the native REST API (calls, approvals, tools, health), plus `/healthz` and `/metrics`
connections.py  users' connections to upstreams that act for them, and the two pages a browser opens
bodies.py       request bodies at the trust boundary: JSON, then a pydantic model
document.py     the OpenAPI 3.1 document served at `/v1/openapi.json`
"""
