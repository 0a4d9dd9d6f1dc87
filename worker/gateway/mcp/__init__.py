"""The MCP surface: `/mcp` over Streamable HTTP and `toolworker mcp` on stdio, one `mcp` SDK server.

server.py      the server's handlers: tools/list, tools/call, list changes; the command line's Options
results.py     a call's `CallToolResult` (text, notes, `_meta`), the one shape tools/call and tasks answer
output.py      structured output in each protocol generation (`outputSchema`, `structuredContent`)
tasks.py       MCP tasks, both generations; task_store.py their shared records in Redis
asking.py      asking the human through the client (approval, a page to visit); consent.py connect first
discovery.py   discovery mode's meta-tools, for catalogs too large to list
code_mode.py   code mode's meta-tools (search, schemas with Python signatures) and `run_code`
stdio.py       `toolworker mcp`: the same server on standard input and output
"""
