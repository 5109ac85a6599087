#!/usr/bin/env python3
"""A flooding Tether client in a process of its own, for the abuse suite.

Usage: flood.py HOST PORT FRAMES_FILE COUNT

FRAMES_FILE holds a HELLO frame followed by COUNT REQUEST frames, encoded beforehand (by the
test, with Tether's own encoder). The flooder sends the HELLO, waits for the gateway's answer,
then writes every request at once while a second thread reads the answers. It prints one line,
`answered N seconds=S status=count ...`, once COUNT responses arrived or the gateway closed the
connection (S: from the first request written to the last answer). Only the frame header (PROTOCOL.md section 2) and RESPONSE's leading status
(section 4.4) are parsed here.
"""
import collections
import socket
import struct
import sys
import threading
import time

HEADER = 26
WELCOME, RESPONSE = 0x02, 0x04
STATUS = {0: "ok", 7: "resource-exhausted"}


def read_exactly(sock, count):
    chunks = []
    while count > 0:
        chunk = sock.recv(min(count, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def read_frame(sock):
    header = read_exactly(sock, HEADER)
    if header is None:
        return None, None
    frame_type = header[3]
    (length,) = struct.unpack(">I", header[18:22])
    body = read_exactly(sock, length)
    return frame_type, body


def main():
    host, port, path, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    frames = open(path, "rb").read()
    (hello_length,) = struct.unpack(">I", frames[18:22])
    hello_end = HEADER + hello_length
    sock = socket.create_connection((host, port), timeout=60)
    sock.sendall(frames[:hello_end])
    frame_type, _ = read_frame(sock)
    if frame_type != WELCOME:
        print(f"answered 0 not-welcomed={frame_type}", flush=True)
        return
    statuses = collections.Counter()

    def read_answers():
        answered = 0
        while answered < count:
            frame_type, body = read_frame(sock)
            if frame_type is None:
                break
            if frame_type == RESPONSE:
                (status,) = struct.unpack(">H", body[:2])
                statuses[STATUS.get(status, str(status))] += 1
                answered += 1

    reader = threading.Thread(target=read_answers)
    started = time.monotonic()
    reader.start()
    try:
        sock.sendall(frames[hello_end:])
    except OSError:
        pass  # the gateway closed the connection: the answers say how far it got
    reader.join()
    seconds = time.monotonic() - started
    summary = " ".join(f"{status}={n}" for status, n in sorted(statuses.items()))
    print(f"answered {sum(statuses.values())} seconds={seconds:.2f} {summary}", flush=True)


if __name__ == "__main__":
    main()
