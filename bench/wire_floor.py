"""The physical floor of a relay on this machine: one extra process hop, measured bare.

    .venv/bin/python bench/wire_floor.py [--calls 2000] [--payload 300]

Three processes and no MCP code: a line echo child (stdin -> stdout), a minimal uvloop relay
(Unix socket in, the echo child's pipes out, as the daemon's raw relay sits between a client
and a stdio upstream), and this script as a blocking client. Each round sends one JSON line
straight to an echo child over pipes ("direct") and one through the relay ("relayed"), in
alternating order, and times the round trip. `codec` rounds go through a second relay that also
decodes and re-encodes each line with msgspec (what the raw relay does at the least).

The difference of the medians is what one hop costs here before any gateway work: two more
process wake-ups each way and a socket. `execute_tool`'s overhead over a direct warm session
(`call_overhead.py`, `ab.py`) can approach this, not go under it. Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, median, pct_ms


def _echo() -> None:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        out.write(line)
        out.flush()


async def _relay(path: str, codec: bool) -> None:
    import msgspec

    dec, enc = msgspec.json.Decoder(), msgspec.json.Encoder()
    child = await asyncio.create_subprocess_exec(sys.executable, __file__, "--role", "echo",
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    stdin, stdout = child.stdin, child.stdout

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            stdin.write(enc.encode(dec.decode(line)) + b"\n" if codec else line)
            reply = await stdout.readline()
            writer.write(enc.encode(dec.decode(reply)) + b"\n" if codec else reply)

    server = await asyncio.start_unix_server(serve, path)
    async with server:
        await server.serve_forever()


def _connect(path: str, deadline_s: float = 30.0) -> socket.socket:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def measure(calls: int, payload: int) -> dict[str, object]:
    line = (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"message":"'
            + b"x" * max(0, payload - 100) + b'"}}}\n')
    tmp = Path(tempfile.mkdtemp(prefix="wire-floor-"))
    procs = []
    try:
        echo = subprocess.Popen([sys.executable, __file__, "--role", "echo"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        procs.append(echo)
        assert echo.stdin is not None and echo.stdout is not None
        paths = {name: str(tmp / f"{name}.sock") for name in ("relayed", "codec")}
        for name, path in paths.items():
            args = ["--role", "relay", "--socket", path] + (["--codec"] if name == "codec" else [])
            procs.append(subprocess.Popen([sys.executable, __file__, *args]))
        socks = {name: _connect(path) for name, path in paths.items()}
        files = {name: s.makefile("rb") for name, s in socks.items()}

        def direct() -> None:
            echo.stdin.write(line)  # type: ignore[union-attr]
            echo.stdin.flush()  # type: ignore[union-attr]
            assert echo.stdout.readline() == line  # type: ignore[union-attr]

        def via(name: str) -> None:
            socks[name].sendall(line)
            assert files[name].readline()

        paths_run = {"direct": direct, "relayed": lambda: via("relayed"), "codec": lambda: via("codec")}
        for _ in range(200):  # warm-up
            for f in paths_run.values():
                f()
        samples: dict[str, list[float]] = {k: [] for k in paths_run}
        diffs: dict[str, list[float]] = {"relayed": [], "codec": []}
        order = list(paths_run)
        for i in range(calls):
            took = {}
            for name in (order if i % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                paths_run[name]()
                took[name] = time.perf_counter() - t0
                samples[name].append(took[name])
            for name in diffs:
                diffs[name].append(took[name] - took["direct"])
        return {
            "bench": "wire_floor",
            "calls": calls,
            "line_bytes": len(line),
            "load_1m": round(os.getloadavg()[0], 2),
            **{f"{k}_median_ms": pct_ms(v, 50) for k, v in samples.items()},
            **{f"{k}_p95_ms": pct_ms(v, 95) for k, v in samples.items()},
            "hop_overhead_ms": {k: round(median(v) * 1000, 3) for k, v in diffs.items()},
            "note": "hop_overhead_ms: median of per-round differences to the direct echo",
        }
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--payload", type=int, default=300, help="bytes of the request line (about)")
    p.add_argument("--role", choices=("client", "echo", "relay"), default="client", help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    p.add_argument("--codec", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.role == "echo":
        _echo()
    elif a.role == "relay":
        import uvloop

        uvloop.run(_relay(a.socket, a.codec))
    else:
        emit(measure(a.calls, a.payload), "wire_floor")


if __name__ == "__main__":
    main()
