"""The only place aiohttp lives: the transport, the egress policy, Retry-After."""
