"""Structured results checked against their tool's outputSchema, safely, on every path.

The SDK client checks a successful `tools/call` result against the tool's outputSchema
(`ClientSession.validate_tool_result`) with jsonschema on the event loop: `pattern` runs on
`re`, so an upstream advertising `"pattern": "^(a+)+$"` and answering `"aaaa...!"` kept the
daemon's loop busy for minutes, every client of every upstream with it. `harden` replaces
that method on a session with `OutputChecks.validate_tool_result`: the same decisions and
messages, checked by catalog/validate.OutputValidator (no `$ref` fetched, patterns on `regex`
within a budget, slow checks in a worker thread). The SDK path (`call_tool` calls the method
on the session) and the raw relay (`check`) share it.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import mcp_types
from mcp.client.session import ClientSession

from toolatlas.catalog.validate import OutputValidator

log = logging.getLogger(__name__)

_CHECKS: weakref.WeakKeyDictionary[ClientSession, OutputChecks] = weakref.WeakKeyDictionary()


class OutputChecks:
    """One session's output checks (see the module docstring)."""

    def __init__(self, session: ClientSession) -> None:
        self._session = weakref.ref(session)
        self.validator = OutputValidator()

    async def validate_tool_result(self, name: str, result: mcp_types.CallToolResult) -> None:
        """`ClientSession.validate_tool_result`'s contract: RuntimeError when the result does not conform."""
        content = result.structured_content
        await self.check(name, content, content is not None or "structured_content" in result.model_fields_set)

    async def check(self, name: str, content: Any, present: bool) -> None:
        """Raise RuntimeError (the SDK's message) unless `content` (`present`: the result has
        the field) conforms to tool `name`'s outputSchema; a tool without one passes."""
        session = self._session()
        if session is None:
            return
        schemas = session._tool_output_schemas  # noqa: SLF001 (mcp==2.3.0): what the SDK's check reads
        if name not in schemas:
            await session.list_tools()  # as the SDK does: the tool may be newer than the last listing
        if name not in schemas:
            log.warning("Tool %s not listed by server, cannot validate any structured content", name)
            return
        schema = schemas[name]
        if schema is None:
            return
        if not present:
            raise RuntimeError(f"Tool {name} has an output schema but did not return structured content")
        problem = await self.validator.check_async(name, schema, content)
        if problem is not None:
            raise RuntimeError(problem)


def harden(session: ClientSession) -> OutputChecks:
    """Route `session`'s output checks through an `OutputChecks` (once per session)."""
    checks = _CHECKS.get(session)
    if checks is None:
        checks = _CHECKS[session] = OutputChecks(session)
        session.validate_tool_result = checks.validate_tool_result  # type: ignore[method-assign]
    return checks


__all__ = ["OutputChecks", "harden"]
