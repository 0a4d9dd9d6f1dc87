"""Helpers shared by the test modules (servers, stacks, waits); no test module imports another."""
