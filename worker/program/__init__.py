"""Code mode: a program run in a sandbox, its tool calls sent as child calls of the queue (SPEC 19)."""
