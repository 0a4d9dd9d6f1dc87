"""The MCP client's room: one session per MCP server per process, kept open, through the `mcp` SDK's own
client and transports (Streamable HTTP, or the 2024-11-05 HTTP+SSE transport); the SDK's failures mapped
onto the exit-code tree. Knows nothing of tool definitions: it is given a `ServerSpec`."""
