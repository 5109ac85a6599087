#!/usr/bin/env python3
"""A WebSocket peer that begins a message and never ends it, with the `websockets` library.

Usage: websocket_slow.py URL

It sends the first fragment of a binary message (the start of a Tether frame), then nothing,
and waits up to 20 seconds for the gateway to end the connection. It prints one JSON object,
{"check": "unfinished-message", "ok": ..., "detail": ...}: ok when the gateway closed with code
1013 (try again later: PROTOCOL.md 11.3 for ERROR `resource exhausted`) after sending that
ERROR in a binary message.
"""
import asyncio
import json
import sys
import time

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

ERROR = 0x0A


async def main():
    url = sys.argv[1]
    started = time.monotonic()
    async with connect(url, subprotocols=["tether.v1"], open_timeout=10) as ws:

        async def unfinished():
            yield b"TH\x01\x03"  # a frame's first bytes, in a message's first fragment
            await asyncio.sleep(60)
            yield b"never sent"

        sending = asyncio.create_task(ws.send(unfinished()))
        error = False
        code = None
        try:
            while True:
                message = await asyncio.wait_for(ws.recv(), 20)
                error = error or (isinstance(message, bytes) and len(message) > 3 and message[3] == ERROR)
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
        except asyncio.TimeoutError:
            pass
        sending.cancel()
        elapsed = time.monotonic() - started
        ok = error and code == 1013
        print(json.dumps({"check": "unfinished-message", "ok": ok, "detail": "ERROR %s, close code %s after %.1f s" % (error, code, elapsed)}), flush=True)


asyncio.run(main())
