"""input_required passthrough (MCP 2026-07-28): an upstream's elicitation reaches the client,
the client's answer goes back to the same upstream, and the gateway's requestState cannot be
forged or replayed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.results import text as _text
from toolatlas.surface.unix import unix_client


async def answer_ada(ctx: object, params: types.ElicitRequestParams) -> types.ElicitResult:
    assert "name" in params.message
    return types.ElicitResult(action="accept", content={"name": "Ada"})


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with Daemon(tmp_path_factory.mktemp("ir"), stdio_testserver("asker") + stdio_testserver("other")) as d:
        yield d


async def test_elicitation_round_trip_reaches_the_same_upstream(gateway: Daemon) -> None:
    pid = int(gateway.tool("asker__pid", {})["content"][0]["text"])
    with anyio.fail_after(30):
        async with Client(unix_client(gateway.socket), elicitation_callback=answer_ada) as client:
            assert client.protocol_version == "2026-07-28"
            via_meta = await client.call_tool("execute_tool", {"name": "asker__greet_user", "arguments": {}})
            direct = await client.call_tool("asker__greet_user", {})
    assert _text(via_meta) == _text(direct) == f"Hello, Ada! (pid {pid})"


async def test_tampered_replayed_or_misdirected_state_is_refused(gateway: Daemon) -> None:
    with anyio.fail_after(30):
        async with Client(unix_client(gateway.socket)) as client:
            first = await client.session.call_tool("asker__greet_user", {}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult) and first.request_state
            (key,) = first.input_requests
            answer = {key: types.ElicitResult(action="accept", content={"name": "Grace"})}
            state = first.request_state

            flipped = state[:-3] + ("A" if state[-3] != "A" else "B") + state[-2:]
            forged = await client.session.call_tool(
                "asker__greet_user", {}, input_responses=answer, request_state=flipped, allow_input_required=True)
            assert forged.is_error and "not issued by this gateway or was altered" in _text(forged)

            other = await client.session.call_tool(
                "other__greet_user", {}, input_responses=answer, request_state=state, allow_input_required=True)
            assert other.is_error and "another tool call" in _text(other)

            ok = await client.session.call_tool(
                "asker__greet_user", {}, input_responses=answer, request_state=state, allow_input_required=True)
            assert _text(ok).startswith("Hello, Grace!")

            replay = await client.session.call_tool(
                "asker__greet_user", {}, input_responses=answer, request_state=state, allow_input_required=True)
            assert replay.is_error and "already used" in _text(replay)

            bare = await client.session.call_tool(
                "asker__greet_user", {}, input_responses=answer, allow_input_required=True)
            assert bare.is_error and "need the requestState" in _text(bare)


async def test_another_caller_cannot_use_a_state(gateway: Daemon, tmp_path: Path) -> None:
    """The state is bound to the caller: a token principal is not the socket user."""
    from toolatlas.gateway import Gateway  # noqa: F401  (the sealer is the gateway's)
    from toolatlas.errors import BadInput
    from toolatlas.inputstate import InputStateSealer

    sealer = InputStateSealer()
    token = sealer.seal(upstream="asker", tool="asker__greet_user", principal="uid:1000", upstream_state="s")
    with pytest.raises(BadInput, match="another caller"):
        sealer.open(token, tool="asker__greet_user", principal="token:ci-bot")
    assert sealer.open(token, tool="asker__greet_user", principal="uid:1000") == ("asker", "s")
    expired = InputStateSealer(ttl=-1)
    old = expired.seal(upstream="asker", tool="t", principal="p", upstream_state=None)
    with pytest.raises(BadInput, match="expired"):
        expired.open(old, tool="t", principal="p")
