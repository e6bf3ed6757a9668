"""listing.ListingGate: local upstreams list and convert their tools one at a time (issue 19's
memory at 100,000 tools), a remote one never waits, and a slow turn holds nobody back for
long. Real anyio tasks and clocks; no timing is asserted, only who was inside when."""

from __future__ import annotations

import anyio
import pytest

from toolatlas.config import HttpUpstream, StdioUpstream
from toolatlas.upstream.listing import ListingGate

LOCAL = [StdioUpstream(name=f"local{i}", command="true") for i in range(3)]
REMOTE = HttpUpstream(name="remote", url="http://127.0.0.1:1/mcp")


async def _hold(gate: ListingGate, entered: anyio.Event, release: anyio.Event) -> None:
    async with gate.turn(LOCAL[0]):
        entered.set()
        await release.wait()


async def test_local_upstreams_take_turns_in_order() -> None:
    gate = ListingGate(hold_s=3600)
    inside: list[str] = []
    most = 0
    order: list[str] = []

    async def lister(i: int, release: anyio.Event) -> None:
        nonlocal most
        async with gate.turn(LOCAL[i]):
            inside.append(LOCAL[i].name)
            order.append(LOCAL[i].name)
            most = max(most, len(inside))
            await release.wait()
            inside.remove(LOCAL[i].name)

    releases = [anyio.Event() for _ in LOCAL]
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(lister, i, releases[i])
                await anyio.sleep(0.01)  # queued in this order
            while not inside:
                await anyio.sleep(0.01)
            for i in range(3):
                while inside != [LOCAL[i].name]:
                    await anyio.sleep(0.01)
                releases[i].set()
    assert most == 1 and order == [u.name for u in LOCAL]


async def test_a_turn_past_hold_s_lets_the_others_go_alongside_and_the_gate_still_works() -> None:
    gate = ListingGate(hold_s=0.2)
    hung = anyio.Event()  # never set while the others run: a hung upstream's listing
    entered = anyio.Event()
    went: list[str] = []

    async def other(i: int) -> None:
        async with gate.turn(LOCAL[i]):
            went.append(LOCAL[i].name)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_hold, gate, entered, hung)
            await entered.wait()
            async with anyio.create_task_group() as others:
                others.start_soon(other, 1)
                others.start_soon(other, 2)
            assert sorted(went) == ["local1", "local2"]  # while the slow turn is still held
            hung.set()
    async with gate.turn(LOCAL[1]):  # released cleanly: the next turn is taken at once
        pass


async def test_while_a_local_turn_is_held_a_remote_upstream_goes_and_a_cancelled_waiter_leaves_the_queue() -> None:
    gate = ListingGate(hold_s=3600)
    release = anyio.Event()
    entered = anyio.Event()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_hold, gate, entered, release)
            await entered.wait()
            async with gate.turn(REMOTE):  # would hang here if it took a turn
                pass
            with anyio.move_on_after(0.05) as scope:
                async with gate.turn(LOCAL[1]):
                    pytest.fail("entered while the turn was held")
            assert scope.cancelled_caught
            release.set()
        async with gate.turn(LOCAL[2]):  # the abandoned wait did not keep the gate
            pass
