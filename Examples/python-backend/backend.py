#!/usr/bin/env python3
"""A Tether backend in Python, standard library only.

`tether serve --backend http://127.0.0.1:5000 --backend-connect --backend-request 'order.*'
--backend-message 'chat.*' --api-port 8090` hands this process:

- POST /tether/connect            a client's credentials: who is it? (users below)
- POST /tether/request/order.*    a client's request: answered here (order.create)
- POST /tether/message/chat.*     a client's reliable message: processed once, whatever the
                                  retries, because its Idempotency-Key is kept in SQLite in the
                                  same transaction as the message's effect
- POST /tether/messages           several reliable messages at once (--backend-message-batch N):
                                  each processed once as above, one result each, in order
- POST /tether/authorize          may a client use a channel (--backend-channel)? Channels
                                  starting with "staff." are for alice only
- POST /tether/disconnect         a client's connection closed (--backend-disconnect): noted
                                  (who is online, for /stats)

and it publishes through the gateway's server API (TETHER_API, TETHER_API_KEY): each order is
published to the channel `orders`. Run: python3 backend.py --port 5000 --db backend.sqlite
"""

import argparse
import base64
import json
import os
import sqlite3
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The users and their tokens. A real backend checks its own sessions here.
USERS = {"alice-token": ("alice", "Alice"), "bob-token": ("bob", "Bob")}


class Backend:
    def __init__(self, db_path, api, api_key):
        self.db_path = db_path
        self.api = api
        self.api_key = api_key
        self.local = threading.local()
        with self.db() as db:
            db.executescript(
                """
                PRAGMA journal_mode = WAL;
                CREATE TABLE IF NOT EXISTS processed (key TEXT PRIMARY KEY);
                CREATE TABLE IF NOT EXISTS messages (
                    key TEXT PRIMARY KEY, client TEXT, conversation TEXT, sequence INTEGER, topic TEXT, body BLOB);
                CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY AUTOINCREMENT, client TEXT, item TEXT);
                """
            )

    def db(self):
        if not hasattr(self.local, "db"):
            self.local.db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        return self.local.db

    def publish(self, publication):
        """POSTs to the gateway's server API; returns its JSON answer."""
        request = urllib.request.Request(
            self.api + "/v1/publish",
            data=json.dumps(publication).encode(),
            headers={"Authorization": "Bearer " + self.api_key, "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the gateway keeps a pool of connections
    backend: Backend = None
    disconnects = []  # (client, connection, reason), in the order they came
    disconnects_lock = threading.Lock()
    largest_batch = 0  # the most messages one /tether/messages call brought

    def log_message(self, format, *args):
        pass

    def answer(self, status, body=b"", content_type="application/octet-stream", headers=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            content_type = "application/json"
        elif isinstance(body, str):
            body = body.encode()
            content_type = "text/plain; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/stats":
            db = self.backend.db()
            processed = db.execute("SELECT count(*) FROM processed").fetchone()[0]
            orders = db.execute("SELECT count(*) FROM orders").fetchone()[0]
            conversations = {
                conversation: {"messages": count, "distinct": distinct, "last": last}
                for conversation, count, distinct, last in db.execute(
                    "SELECT conversation, count(*), count(DISTINCT sequence), max(sequence) FROM messages GROUP BY conversation"
                )
            }
            with self.disconnects_lock:
                disconnects = [{"client": c, "connection": n, "reason": r} for c, n, r in self.disconnects]
                largest_batch = Handler.largest_batch
            return self.answer(
                200,
                {
                    "processed": processed,
                    "orders": orders,
                    "conversations": conversations,
                    "disconnects": disconnects,
                    "largest_batch": largest_batch,
                },
            )
        self.answer(404, "no such page")

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        path = urllib.parse.unquote(self.path)
        if path == "/tether/connect":
            return self.on_connect(json.loads(body))
        if path.startswith("/tether/request/"):
            return self.on_request(path[len("/tether/request/"):], body)
        if path.startswith("/tether/message/"):
            return self.on_message(path[len("/tether/message/"):], body)
        if path == "/tether/messages":
            return self.on_messages(json.loads(body)["messages"])
        if path == "/tether/authorize":
            event = json.loads(body)
            if event["channel"].startswith("staff.") and event["client"] != "alice":
                return self.answer(403, {"message": "staff channels are for staff"})
            return self.answer(200, {"allowed": True})
        if path == "/tether/disconnect":
            event = json.loads(body)
            with self.disconnects_lock:
                self.disconnects.append((event["client"], event["connection"], event["reason"]))
            return self.answer(200, {"noted": True})
        self.answer(404, "no such event")

    def on_connect(self, event):
        user = USERS.get(event.get("token") or "")
        if user is None:
            return self.answer(401, {"message": "unknown token"})
        client, name = user
        if event["client"] != client:
            return self.answer(403, {"message": "this token is " + client + "'s"})
        self.answer(200, {"client": client, "info": json.dumps({"name": name})})

    def on_request(self, method, body):
        client = urllib.parse.unquote(self.headers["Tether-Client"])
        if method == "order.create":
            try:
                item = json.loads(body)["item"]
            except (ValueError, KeyError, TypeError):
                return self.answer(400, "an order is JSON with an item")
            db = self.backend.db()
            order = db.execute("INSERT INTO orders (client, item) VALUES (?, ?)", (client, item)).lastrowid
            if self.backend.api:
                self.backend.publish({"channel": "orders", "data": json.dumps({"order": order, "item": item, "client": client})})
            return self.answer(200, {"order": order, "item": item})
        if method == "order.slow":
            time.sleep(0.2)
            return self.answer(200, body)
        if method == "order.reject":
            return self.answer(409, "out of stock", headers={"Tether-Status": "1001"})
        self.answer(404, "no method " + method)

    def on_message(self, topic, body):
        key = urllib.parse.unquote(self.headers["Idempotency-Key"])
        client = urllib.parse.unquote(self.headers["Tether-Client"])
        conversation = urllib.parse.unquote(self.headers["Tether-Conversation"])
        sequence = int(self.headers["Tether-Sequence"])
        if body == b"refuse me":
            return self.answer(422, "refused by the backend")
        self.process(key, client, conversation, sequence, topic, body)
        self.answer(200)

    def on_messages(self, messages):
        """The batch event: one result per message, in order. Each message is processed in a
        transaction of its own, so that a refusal or a failure of one leaves the others done."""
        with self.disconnects_lock:
            Handler.largest_batch = max(Handler.largest_batch, len(messages))
        results = []
        for message in messages:
            body = base64.b64decode(message["data_base64"]) if "data_base64" in message else message["data"].encode()
            if body == b"refuse me":
                results.append({"status": 422, "message": "refused by the backend"})
                continue
            self.process(
                message["idempotency_key"], message["client"], message["conversation"], message["sequence"], message["topic"], body
            )
            results.append({"status": 200})
        self.answer(200, {"results": results})

    def process(self, key, client, conversation, sequence, topic, body):
        db = self.backend.db()
        # The key and the message's effect in one transaction: a retried message (the same key)
        # finds its key and changes nothing; either both are written or neither.
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT 1 FROM processed WHERE key = ?", (key,)).fetchone() is None:
                db.execute("INSERT INTO processed (key) VALUES (?)", (key,))
                db.execute(
                    "INSERT INTO messages (key, client, conversation, sequence, topic, body) VALUES (?, ?, ?, ?, ?, ?)",
                    (key, client, conversation, sequence, topic, body),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--db", default="backend.sqlite")
    arguments = parser.parse_args()
    Handler.backend = Backend(arguments.db, os.environ.get("TETHER_API", ""), os.environ.get("TETHER_API_KEY", ""))
    server = ThreadingHTTPServer(("127.0.0.1", arguments.port), Handler)
    server.daemon_threads = True
    print("backend listening on", server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
