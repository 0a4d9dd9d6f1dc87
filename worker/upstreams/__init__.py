"""MCP upstreams' listings kept current: a refresh reads a server's `tools/list` through the MCP client,
audits what changed, withholds it under `pin`, and stores the listing every process serves; operators
accept what was withheld. Used by the workers (periodically), the gateway (REST) and the command line."""
