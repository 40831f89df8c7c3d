"""A TCP relay that delays every byte by a fixed time each way, for hosts whose kernel has no tc
netem (sch_netem). Order is kept: each chunk read is written DELAY later, in the order read.

    python3 delay_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_S

Prints "listening" once it accepts connections. Bounded: at most 64 connections at once, and it
exits by itself after 600 s (a test that forgets it leaves nothing running for long).
"""

import asyncio
import sys
import time

MAX_CONNECTIONS = 64
LIFETIME_S = 600


async def pump(reader, writer, delay):
    queue = asyncio.Queue()

    async def read():
        while True:
            data = await reader.read(65536)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    async def write():
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    try:
        await asyncio.gather(read(), write())
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main():
    listen, target, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
    lhost, lport = listen.rsplit(":", 1)
    thost, tport = target.rsplit(":", 1)
    open_now = [0]

    async def serve(client_r, client_w):
        if open_now[0] >= MAX_CONNECTIONS:
            client_w.close()
            return
        open_now[0] += 1
        try:
            server_r, server_w = await asyncio.open_connection(thost, int(tport))
        except OSError:
            client_w.close()
            open_now[0] -= 1
            return
        try:
            await asyncio.gather(pump(client_r, server_w, delay), pump(server_r, client_w, delay))
        finally:
            open_now[0] -= 1

    server = await asyncio.start_server(serve, lhost, int(lport))
    print("listening", flush=True)
    async with server:
        await asyncio.sleep(LIFETIME_S)


if __name__ == "__main__":
    asyncio.run(main())
