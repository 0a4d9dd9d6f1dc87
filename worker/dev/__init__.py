"""The local stack of `make run`: an embedded Redis-compatible server and a demo upstream."""
