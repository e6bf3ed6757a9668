"""One error root, grouped by what the caller does about it.

Library code raises these; the CLI turns them into exit codes and the MCP surface into
JSON-RPC errors or `isError` results. Messages are whole sentences naming the offending value.
"""

from __future__ import annotations


class ToolatlasError(Exception):
    """Root of every error toolatlas raises on purpose."""


class ConfigError(ToolatlasError):
    """The configuration is invalid; the message names the key. CLI exit code 78."""


class BadInput(ToolatlasError):
    """A client sent something we cannot act on (unknown tool, bad arguments).

    `logged`, when given, is the message as events and the audit trail keep it: the message
    itself goes to the caller and may quote what the caller sent (an argument's value)."""

    def __init__(self, message: str, logged: str | None = None) -> None:
        super().__init__(message)
        self.logged = message if logged is None else logged


class UpstreamUnavailable(ToolatlasError):
    """The upstream that owns a tool is not connected right now."""


class UpstreamTimeout(ToolatlasError):
    """An upstream operation exceeded its configured timeout."""

    def __init__(self, upstream: str, operation: str, seconds: float, *, asking: bool = False) -> None:
        self.upstream = upstream
        self.operation = operation
        self.seconds = seconds
        # A tool call cut by its timeout was sent: a model that retries must know it may have run.
        ran = "; it may still have run: call it again only if that is safe" if operation.startswith("tools/call") else ""
        if asking:  # the upstream was not slow: it was waiting for the user
            super().__init__(f"upstream {upstream!r} did not finish {operation} within {seconds:g} s: it was waiting "
                             f"for the answer to its question, and the time the user takes to answer counts against "
                             f"its timeouts.call{ran}")
        else:
            super().__init__(f"upstream {upstream!r} did not answer {operation} within {seconds:g} s{ran}")


class UpstreamProtocolError(ToolatlasError):
    """An upstream answered with something that is not valid MCP, or an error; `code` is
    the JSON-RPC error code when the upstream answered with one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NotFound(BadInput):
    """A resource or prompt the caller named does not exist (or the caller may not use it)."""


class RelayRefused(ToolatlasError):
    """A request from an upstream to the user (elicitation) cannot be relayed; the message
    says which side cannot carry it and why."""


class SignatureError(ToolatlasError):
    """A capability card's signature or schema hash does not verify."""


class DaemonUnreachable(ToolatlasError):
    """The CLI could not reach the daemon's socket."""
