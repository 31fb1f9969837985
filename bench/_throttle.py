"""A throttling TCP proxy for benchmarks: a bandwidth cap per connection and added latency.

Real links are slower than loopback and CDNs cap each connection (commonly
20-100 MB/s), which is why parallel downloaders open several. This proxy
imitates such a link in front of a server on 127.0.0.1:

- every accepted connection gets its own upstream connection;
- bytes from the server to the client are paced to ``rate`` bytes per second
  per connection (no burst credit: a connection that idled does not send faster
  afterwards);
- each direction is a delay line of ``rtt / 2`` (a chunk is forwarded that long
  after it arrived), and a new connection waits one ``rtt`` before its first
  byte is relayed (the TCP handshake);
- each direction buffers at most about one bandwidth-delay product (at least
  256 KiB), so a fast server is held back by the client's pace, as TCP's window
  would.

It is plain TCP: HTTP keep-alive, ranges and redirects pass through unchanged.
Run as a script it prints ``http://127.0.0.1:PORT`` on its first line, then
serves until killed::

    python bench/_throttle.py --upstream 127.0.0.1:8080 --rate-mbps 50 --rtt-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

#: Largest piece relayed at once (fewer, larger writes keep the proxy's own CPU cost low).
CHUNK = 256 << 10
#: Stream buffer limit (asyncio's default of 64 KiB makes many small reads).
LIMIT = 1 << 20


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    rate: float | None,
    delay: float,
    buffer_bytes: int,
) -> None:
    """Relay ``reader`` to ``writer`` through a delay line, paced to ``rate`` bytes/s."""
    # Pieces of at most 10 ms at the capped rate, so pacing stays smooth.
    piece = CHUNK if rate is None else max(16 << 10, min(CHUNK, int(rate / 100)))
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(
        maxsize=max(4, buffer_bytes // piece)
    )

    async def receive() -> None:
        try:
            while data := await reader.read(piece):
                await queue.put((time.monotonic() + delay, data))
        except (ConnectionError, OSError):
            pass
        finally:
            await queue.put(None)

    receiver = asyncio.create_task(receive())
    next_send = 0.0
    try:
        while (item := await queue.get()) is not None:
            due, data = item
            now = time.monotonic()
            if rate is not None:
                next_send = max(next_send, now)
                due = max(due, next_send)
                next_send += len(data) / rate
            if due > now:
                await asyncio.sleep(due - now)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
    except (ConnectionError, OSError):
        pass
    finally:
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await receiver


async def serve(
    upstream: tuple[str, int], rate: float | None, rtt: float, ready: asyncio.Future[int]
) -> None:
    buffer_bytes = max(256 << 10, int((rate or 0) * rtt * 2))

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            await asyncio.sleep(rtt)  # the handshake
            server_r, server_w = await asyncio.open_connection(*upstream, limit=LIMIT)
        except OSError:
            client_w.close()
            return
        try:
            await asyncio.gather(
                _pipe(client_r, server_w, rate=None, delay=rtt / 2, buffer_bytes=buffer_bytes),
                _pipe(server_r, client_w, rate=rate, delay=rtt / 2, buffer_bytes=buffer_bytes),
            )
        finally:
            for w in (server_w, client_w):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=256, limit=LIMIT)
    ready.set_result(int(server.sockets[0].getsockname()[1]))
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the server")
    parser.add_argument(
        "--rate-mbps", type=float, default=0, help="MB/s per connection (0: no cap)"
    )
    parser.add_argument("--rtt-ms", type=float, default=0, help="added round-trip time")
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    rate = args.rate_mbps * 1e6 if args.rate_mbps > 0 else None

    async def run() -> None:
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve((host, int(port)), rate, args.rtt_ms / 1000, ready))
        print(f"http://127.0.0.1:{await ready}", flush=True)
        await task

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    main()
