#!/usr/bin/env python3
"""A Tether peer written from PROTOCOL.md alone, over WebSocket, with the `websockets` library.

Usage: websocket_peer.py URL CA_FILE ORIGIN_REFUSED

URL is ws://HOST:PORT/PATH or wss://HOST:PORT/PATH; CA_FILE the PEM of the CA that signed the
gateway's certificate (ignored for ws://); ORIGIN_REFUSED an Origin the gateway refuses.
The gateway must route `echo` to a handler that returns the request's body.

It checks, in order, and prints one JSON object per line, {"check": ..., "ok": ..., "detail": ...}:
  upgrade     the upgrade succeeds with subprotocol tether.v1
  handshake   a HELLO it frames itself gets a WELCOME
  request     a REQUEST `echo` gets a RESPONSE with status 0 and the same body
  ping        a WebSocket PING gets a PONG
  fragments   a REQUEST sent as a message of three fragments gets its RESPONSE (RFC 6455 5.4)
  fragments-1 a REQUEST sent one byte per fragment gets its RESPONSE
  fragments-ping  a REQUEST in two fragments with a PING between them gets the PONG and its RESPONSE
  close-code  a binary message that is not a Tether frame gets ERROR, then close code 1002
  text-1003   a text message after a handshake gets close code 1003 (PROTOCOL.md 11.3)
  http-404    a GET on another path gets HTTP 404
  http-426    a GET on the path without `Upgrade: websocket` gets HTTP 426
  http-400    an upgrade without the tether.v1 subprotocol gets HTTP 400
  http-403    an upgrade from the refused origin gets HTTP 403
  channel-subscribe   with the channels feature, SUBSCRIBE `py.room` gets SUBSCRIBED ok with a
                      non-zero epoch
  channel-publication a REQUEST `publish` (the gateway publishes its body to `py.room`) brings
                      a PUBLICATION at offset 1, with this peer's client id as publisher
  channel-recovery    on a new connection, SUBSCRIBE recovering from (epoch, 0) gets SUBSCRIBED
                      starting after 0 without gap, then the publication at offset 1 again
The gateway must also route `publish` to a handler that publishes the request's body to the
channel `py.room`. Only the frame header (section 2), CRC-32C (2.2), HELLO (4.1), REQUEST
(4.3), RESPONSE (4.4), ERROR (4.9), the channel frames (4.15-4.17) and the WebSocket binding
("Transport bindings") are implemented here.
"""
import asyncio
import json
import socket
import ssl
import struct
import sys
import urllib.parse

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

MAGIC, VERSION, HEADER = b"TH", 1, 26
HELLO, WELCOME, REQUEST, RESPONSE, ERROR = 0x01, 0x02, 0x03, 0x04, 0x0A
SUBSCRIBE, SUBSCRIBED, PUBLICATION = 0x20, 0x21, 0x22
CHECKSUM_FLAG = 0x0001
FEATURE_CHECKSUM, FEATURE_CHANNELS = 0x01, 0x20


def crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


TABLE = crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def frame(frame_type, frame_id, body, checksum=True):
    flags = CHECKSUM_FLAG if checksum else 0
    head = MAGIC + struct.pack(">BBHIQI", VERSION, frame_type, flags, 0, frame_id, len(body))
    crc = crc32c(head + body) if checksum else 0
    return head + struct.pack(">I", crc) + body


def parse(data):
    if len(data) < HEADER or data[:2] != MAGIC:
        raise ValueError("not a Tether frame: %r" % data[:8])
    frame_type, flags = data[3], struct.unpack(">H", data[4:6])[0]
    (frame_id,) = struct.unpack(">Q", data[10:18])
    (length,) = struct.unpack(">I", data[18:22])
    (checksum,) = struct.unpack(">I", data[22:26])
    body = data[HEADER:]
    if len(body) != length:
        raise ValueError("length %d but %d body bytes" % (length, len(body)))
    if flags & CHECKSUM_FLAG and crc32c(data[:22] + body) != checksum:
        raise ValueError("checksum mismatch")
    return frame_type, frame_id, body


def tlv(tag, value):
    return struct.pack(">HH", tag, len(value)) + value


def hello_body(client_id, features=0):
    # min version, max version, features, max body size, fields: client id, user agent
    return struct.pack(">BBII", 1, 1, features, 1 << 20) + tlv(1, client_id.encode()) + tlv(3, b"websocket_peer.py")


def string(text):
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def read_string(body, offset):
    (length,) = struct.unpack(">H", body[offset:offset + 2])
    return body[offset + 2:offset + 2 + length].decode(), offset + 2 + length


def subscribe_body(channel, position=None):
    if position is None:
        return string(channel) + struct.pack(">BQQ", 0, 0, 0)
    return string(channel) + struct.pack(">BQQ", 1, position[0], position[1])


def parse_subscribed(body):
    (status,) = struct.unpack(">H", body[:2])
    message, offset = read_string(body, 2)
    epoch, starting_after, gap = struct.unpack(">QQB", body[offset:offset + 17])
    return status, message, epoch, starting_after, gap


def parse_publication(body):
    channel, offset = read_string(body, 0)
    epoch, position = struct.unpack(">QQ", body[offset:offset + 16])
    publisher, offset = read_string(body, offset + 16)
    return channel, epoch, position, publisher, body[offset:]


def request_body(method, payload, timeout_ms=5000):
    return struct.pack(">IH", timeout_ms, len(method)) + method.encode() + payload


def report(check, ok, detail=""):
    print(json.dumps({"check": check, "ok": bool(ok), "detail": str(detail)}), flush=True)


def ssl_context(url, ca_file):
    if not url.startswith("wss://"):
        return None
    context = ssl.create_default_context(cafile=ca_file)
    return context


async def conversation(url, context):
    async with connect(url, subprotocols=["tether.v1"], ssl=context, open_timeout=10) as ws:
        report("upgrade", ws.subprotocol == "tether.v1", "subprotocol=%s" % ws.subprotocol)
        await ws.send(frame(HELLO, 0, hello_body("python-peer")))
        frame_type, _, _ = parse(await asyncio.wait_for(ws.recv(), 10))
        report("handshake", frame_type == WELCOME, "first frame type 0x%02x" % frame_type)
        await ws.send(frame(REQUEST, 7, request_body("echo", b"hi from python"), checksum=False))
        frame_type, frame_id, body = parse(await asyncio.wait_for(ws.recv(), 10))
        status = struct.unpack(">H", body[:2])[0] if len(body) >= 2 else None
        (message_length,) = struct.unpack(">H", body[2:4]) if len(body) >= 4 else (0,)
        payload = body[4 + message_length:]
        report(
            "request",
            frame_type == RESPONSE and frame_id == 7 and status == 0 and payload == b"hi from python",
            "type 0x%02x id %d status %s payload %r" % (frame_type, frame_id, status, payload),
        )
        pong = await ws.ping(b"are you there")
        await asyncio.wait_for(pong, 10)
        report("ping", True, "PONG received")
        await echo_in_fragments(ws, "fragments", 8, lambda data: [data[:10], data[10:30], data[30:]])
        await echo_in_fragments(ws, "fragments-1", 9, lambda data: [data[i:i + 1] for i in range(len(data))])

        async def with_ping(data):
            yield data[:20]
            pong = await ws.ping(b"between fragments")
            yield data[20:]
            await asyncio.wait_for(pong, 10)

        await echo_in_fragments(ws, "fragments-ping", 10, with_ping)
        await ws.send(b"this is not a Tether frame")
        got_error = False
        try:
            while True:
                frame_type, _, _ = parse(await asyncio.wait_for(ws.recv(), 10))
                got_error = got_error or frame_type == ERROR
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            report("close-code", got_error and code == 1002, "ERROR frame: %s, close code %s" % (got_error, code))


async def next_of(ws, wanted):
    """The next frame of type `wanted`, skipping others (a RESPONSE, a PING's answer)."""
    while True:
        frame_type, frame_id, body = parse(await asyncio.wait_for(ws.recv(), 10))
        if frame_type == wanted:
            return frame_id, body


async def channels(url, context):
    features = FEATURE_CHECKSUM | FEATURE_CHANNELS
    async with connect(url, subprotocols=["tether.v1"], ssl=context, open_timeout=10) as ws:
        await ws.send(frame(HELLO, 0, hello_body("python-peer-channels", features)))
        frame_type, _, body = parse(await asyncio.wait_for(ws.recv(), 10))
        (negotiated,) = struct.unpack(">I", body[1:5]) if frame_type == WELCOME else (0,)
        await ws.send(frame(SUBSCRIBE, 41, subscribe_body("py.room")))
        frame_id, body = await next_of(ws, SUBSCRIBED)
        status, message, epoch, starting_after, gap = parse_subscribed(body)
        report(
            "channel-subscribe",
            negotiated & FEATURE_CHANNELS and frame_id == 41 and status == 0 and epoch != 0 and gap == 0,
            "features 0x%x id %d status %d %r epoch %x after %d gap %d" % (negotiated, frame_id, status, message, epoch, starting_after, gap),
        )
        await ws.send(frame(REQUEST, 42, request_body("publish", b"hello channel")))
        _, body = await next_of(ws, PUBLICATION)
        channel, got_epoch, offset, publisher, payload = parse_publication(body)
        report(
            "channel-publication",
            channel == "py.room" and got_epoch == epoch and offset == starting_after + 1
            and publisher == "python-peer-channels" and payload == b"hello channel",
            "%s %x/%d by %r: %r" % (channel, got_epoch, offset, publisher, payload),
        )
    async with connect(url, subprotocols=["tether.v1"], ssl=context, open_timeout=10) as ws:
        await ws.send(frame(HELLO, 0, hello_body("python-peer-channels", features)))
        parse(await asyncio.wait_for(ws.recv(), 10))
        await ws.send(frame(SUBSCRIBE, 1, subscribe_body("py.room", (epoch, starting_after))))
        _, body = await next_of(ws, SUBSCRIBED)
        status, _, again, after, gap = parse_subscribed(body)
        _, body = await next_of(ws, PUBLICATION)
        _, _, offset, _, payload = parse_publication(body)
        report(
            "channel-recovery",
            status == 0 and again == epoch and after == starting_after and gap == 0
            and offset == starting_after + 1 and payload == b"hello channel",
            "status %d epoch %x after %d gap %d, then offset %d %r" % (status, again, after, gap, offset, payload),
        )


async def echo_in_fragments(ws, check, request_id, split):
    """Sends an `echo` REQUEST as one message in the fragments `split` makes of its frame."""
    payload = ("fragmented %d" % request_id).encode()
    await ws.send(split(frame(REQUEST, request_id, request_body("echo", payload))))
    frame_type, frame_id, body = parse(await asyncio.wait_for(ws.recv(), 10))
    (message_length,) = struct.unpack(">H", body[2:4]) if len(body) >= 4 else (0,)
    report(
        check,
        frame_type == RESPONSE and frame_id == request_id and body[4 + message_length:] == payload,
        "type 0x%02x id %d payload %r" % (frame_type, frame_id, body[4 + message_length:]),
    )


def raw_http(url, context, request_line, headers):
    parts = urllib.parse.urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname=parts.hostname)
    lines = [request_line, "Host: %s:%d" % (parts.hostname, parts.port)] + headers + ["", ""]
    sock.sendall("\r\n".join(lines).encode())
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    sock.close()
    status_line = data.split(b"\r\n", 1)[0].decode(errors="replace")
    fields = status_line.split(" ")
    return (int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None), status_line


async def text_message(url, context):
    async with connect(url, subprotocols=["tether.v1"], ssl=context, open_timeout=10) as ws:
        await ws.send(frame(HELLO, 0, hello_body("python-peer-text")))
        frame_type, _, _ = parse(await asyncio.wait_for(ws.recv(), 10))
        await ws.send("a text message")
        try:
            while True:
                await asyncio.wait_for(ws.recv(), 10)
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            report("text-1003", frame_type == WELCOME and code == 1003, "WELCOME: %s, close code %s" % (frame_type == WELCOME, code))


async def refused_upgrade(url, context, **options):
    try:
        async with connect(url, ssl=context, open_timeout=10, **options):
            return None, "upgraded"
    except InvalidStatus as error:
        return error.response.status_code, error.response.reason_phrase


async def main():
    url, ca_file, refused_origin = sys.argv[1], sys.argv[2], sys.argv[3]
    context = ssl_context(url, ca_file)
    try:
        await conversation(url, context)
    except Exception as error:  # report and go on to the HTTP checks
        report("conversation", False, repr(error))
    try:
        await text_message(url, context)
    except Exception as error:
        report("text-1003", False, repr(error))
    try:
        await channels(url, context)
    except Exception as error:
        report("channels", False, repr(error))
    path = urllib.parse.urlsplit(url).path
    status, line = raw_http(url, context, "GET /not-tether HTTP/1.1", ["Connection: close"])
    report("http-404", status == 404, line)
    status, line = raw_http(url, context, "GET %s HTTP/1.1" % path, ["Connection: close"])
    report("http-426", status == 426, line)
    status, reason = await refused_upgrade(url, context)
    report("http-400", status == 400, "%s %s" % (status, reason))
    status, reason = await refused_upgrade(url, context, subprotocols=["tether.v1"], origin=refused_origin)
    report("http-403", status == 403, "%s %s" % (status, reason))


asyncio.run(main())
