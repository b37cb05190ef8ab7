"""The Python floor for one hop: a trio TCP pipe that only copies bytes both ways.

    .venv/bin/python bench/pipe.py --listen-port PORT --upstream HOST:PORT

No framing, no parsing: what kproxy would cost if it did nothing but forward.
Prints ``ready PORT`` on stdout once listening (port 0 picks a free one).
"""

from __future__ import annotations

import argparse
import socket

import trio

READ_SIZE = 256 * 1024  # the same read size as kproxy's default (limits.read_size)


async def copy(src: trio.SocketStream, dst: trio.SocketStream) -> None:
    try:
        while data := await src.receive_some(READ_SIZE):
            await dst.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def handle(client: trio.SocketStream, host: str, port: int) -> None:
    async with client:
        try:
            upstream = await trio.open_tcp_stream(host, port)
        except OSError:
            return
        async with upstream:
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
            async with trio.open_nursery() as nursery:
                async def one_way(a: trio.SocketStream, b: trio.SocketStream) -> None:
                    await copy(a, b)
                    nursery.cancel_scope.cancel()  # either side closing ends both

                nursery.start_soon(one_way, client, upstream)
                nursery.start_soon(one_way, upstream, client)


async def main(listen_port: int, host: str, port: int) -> None:
    listeners = await trio.open_tcp_listeners(listen_port, host="127.0.0.1")
    print(f"ready {listeners[0].socket.getsockname()[1]}", flush=True)
    async def handler(stream: trio.abc.Stream) -> None:
        assert isinstance(stream, trio.SocketStream)
        await handle(stream, host, port)

    await trio.serve_listeners(handler, listeners)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen-port", type=int, default=0)
    parser.add_argument("--upstream", required=True, help="HOST:PORT")
    args = parser.parse_args()
    up_host, _, up_port = args.upstream.rpartition(":")
    trio.run(main, args.listen_port, up_host, int(up_port))
