"""A small MCP server for `make run`, made with the `mcp` SDK's `MCPServer`: the support desk's tickets as
MCP tools, served to agents through the fleet as the MCP upstream `desk` (definitions/demo.yaml)."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

from worker.dev.demo import TICKETS


class Ticket(BaseModel):
    id: str
    status: str
    priority: str
    title: str


def build() -> MCPServer:
    server = MCPServer("toolworker-demo-desk")

    @server.tool(description="The status, priority and title of a support ticket, e.g. TICKET-123.")
    def ticket_status(ticket_id: str) -> Ticket:
        found = TICKETS.get(ticket_id)
        if found is None:
            raise ToolError(f"There is no ticket {ticket_id}.")  # its text reaches the model
        return Ticket(**found)

    @server.tool(description="The ids of the tickets that are still open.")
    def open_tickets() -> list[str]:
        return [ticket["id"] for ticket in TICKETS.values() if ticket["status"] == "open"]

    return server


def serve(host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(build().streamable_http_app(host=host), host=host, port=port, log_level="warning")
