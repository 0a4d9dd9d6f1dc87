"""The `toolworker` command line.

commands.py     the table of commands (a row each: name, help, arguments, handler), the parser built
                from it, and main (what a command raises, as an exit status)
serve.py        the long-running commands: worker, dev, gateway, mcp
calls.py        call
definitions.py  tools, schema, import-openapi, publish, validate
fleet.py        queue, shards, health
operators.py    audit, dead-letters, approvals, connections
checks.py       the checks commands make before they start (Redis answers, the vault's keys parse)
output.py       tables and progress lines
"""

from worker.cli.commands import main, parser

__all__ = ["main", "parser"]
