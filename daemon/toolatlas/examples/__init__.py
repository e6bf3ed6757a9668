"""Example MCP servers bundled for `make run` and the test suite."""
