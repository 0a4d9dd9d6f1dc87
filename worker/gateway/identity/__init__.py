"""Who calls the gateway and what they may do: tokens, OAuth, end users' tokens, and the audit trail.

principals.py  principals, their grants and tenants, the access file that names them, static tokens
oauth.py       OAuth 2.1 access tokens (JWT) checked as a resource server; Protected Resource Metadata
security.py    what every HTTP request passes first: bearer tokens, the Origin of `/mcp`, body caps
delegation.py  end users' tokens: connections, connect links, token exchange and revocation
audit.py       one record per call taken and per decision, in a capped Redis stream and the logs
"""
