"""CPU per request/response over a Unix socket pair: anyio's UNIXSocketStream against the
daemon's transport stream (surface/sockstream.py).

    .venv/bin/python bench/socket_stream.py [--rounds 20000] [--repeat 3]

One process, uvloop: a task echoes every chunk it receives on one end; the bench sends a
300-byte line on the other end and waits for the echo, `--rounds` times, alternating the
two stream kinds `--repeat` times. Both ends use the kind being measured, so one round is
two sends and two receives. Prints JSON: microseconds of wall and process CPU per round,
and the median ratio transport / anyio.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from typing import Any

import anyio
import anyio.abc

from _common import emit
from toolatlas.surface.sockstream import TransportStream


async def _stream(kind: str, sock: socket.socket) -> anyio.abc.ByteStream:
    plain = await anyio.abc.UNIXSocketStream.from_socket(sock)
    return plain if kind == "anyio" else await TransportStream.adopt(plain)


async def _echo(stream: anyio.abc.ByteStream) -> None:
    while True:
        try:
            data = await stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return
        await stream.send(data)


async def one(kind: str, rounds: int) -> dict[str, float]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours, theirs = await _stream(kind, a), await _stream(kind, b)
    line = b"x" * 299 + b"\n"
    async with anyio.create_task_group() as tg:
        tg.start_soon(_echo, theirs)
        for _ in range(200):  # warm-up
            await ours.send(line)
            await ours.receive()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            await ours.send(line)
            got = await ours.receive()
            assert got == line, got
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        tg.cancel_scope.cancel()
    await ours.aclose()
    await theirs.aclose()
    return {"wall_us": round(wall / rounds * 1e6, 2), "cpu_us": round(cpu / rounds * 1e6, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    load0 = os.getloadavg()[0]
    runs: dict[str, list[dict[str, float]]] = {"anyio": [], "transport": []}
    for _ in range(a.repeat):
        for kind in runs:
            runs[kind].append(anyio.run(one, kind, a.rounds, backend_options={"use_uvloop": True}))
    med: dict[str, Any] = {k: {m: statistics.median(r[m] for r in v) for m in ("wall_us", "cpu_us")} for k, v in runs.items()}
    emit({"bench": "socket_stream", "rounds": a.rounds, "repeat": a.repeat, "runs": runs, "median": med,
          "cpu_ratio_transport_over_anyio": round(med["transport"]["cpu_us"] / med["anyio"]["cpu_us"], 3),
          "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]}, "socket_stream")


if __name__ == "__main__":
    main()
