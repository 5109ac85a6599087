#!/usr/bin/env python3
"""A gRPC peer not written in Swift: Python's grpcio, with stubs generated here from the
repository's protos (Protos/tether/v1) by grpcio-tools, as any backend team would.

    grpc_peer.py backend --protos DIR --port P
        Serves the Backend service (backend.proto): the token "py-token" is the client "py",
        the method "py.reverse" answers its body reversed, "py.refuse" fails with
        tether-status 1001, messages are kept by idempotency key, disconnects noted. Prints
        "backend listening", then one JSON line per event it handled.

    grpc_peer.py api --protos DIR --port P --key KEY
        Calls the ServerAPI service (server_api.proto) as a backend would and prints one JSON
        object: what each call answered, or its status code and message.
"""

import argparse
import json
import os
import sys
import tempfile
from concurrent import futures


def stubs(protos):
    """Generates the Python stubs of the protos into a temporary folder and imports them."""
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="tether-grpc-peer-")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    status = protoc.main(
        [
            "protoc",
            "-I" + protos,
            "-I" + include,
            "--python_out=" + out,
            "--grpc_python_out=" + out,
            "tether/v1/server_api.proto",
            "tether/v1/backend.proto",
        ]
    )
    if status != 0:
        sys.exit("protoc failed on the protos in " + protos)
    sys.path.insert(0, out)
    from tether.v1 import backend_pb2, backend_pb2_grpc, server_api_pb2, server_api_pb2_grpc

    return backend_pb2, backend_pb2_grpc, server_api_pb2, server_api_pb2_grpc


def say(event):
    print(json.dumps(event), flush=True)


def serve_backend(protos, port):
    import grpc

    backend_pb2, backend_pb2_grpc, _, _ = stubs(protos)
    processed = {}

    class Backend(backend_pb2_grpc.BackendServicer):
        def Connect(self, request, context):
            if request.token != b"py-token":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "not a py token")
            say({"event": "connect", "client": request.client})
            return backend_pb2.Identity(client="py", info="Python", rooms=backend_pb2.Names(names=["py-room"]))

        def Request(self, request, context):
            say({"event": "request", "method": request.method, "client": request.client})
            if request.method == "py.reverse":
                return backend_pb2.RequestReply(data=request.data[::-1])
            if request.method == "py.refuse":
                context.set_trailing_metadata((("tether-status", "1001"),))
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "refused in Python")
            context.abort(grpc.StatusCode.NOT_FOUND, "no such method")

        def Message(self, request, context):
            first = request.idempotency_key not in processed
            processed[request.idempotency_key] = request.data.decode()
            say({"event": "message", "key": request.idempotency_key, "first": first, "sequence": request.sequence})
            return backend_pb2.MessageReply()

        def Disconnect(self, request, context):
            say({"event": "disconnect", "client": request.client, "reason": request.reason})
            return backend_pb2.DisconnectReply()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    backend_pb2_grpc.add_BackendServicer_to_server(Backend(), server)
    server.add_insecure_port("127.0.0.1:%d" % port)
    server.start()
    say({"event": "backend listening", "port": port})
    server.wait_for_termination()


def call_api(protos, port, key):
    import grpc

    _, _, api_pb2, api_pb2_grpc = stubs(protos)
    channel = grpc.insecure_channel("127.0.0.1:%d" % port)
    api = api_pb2_grpc.ServerAPIStub(channel)
    auth = (("authorization", "Bearer " + key),)
    results = {}

    def attempt(name, call):
        try:
            results[name] = call()
        except grpc.RpcError as error:
            results[name] = {"code": error.code().name, "message": error.details()}

    def publish():
        reply = api.Publish(api_pb2.Publication(client="py", topic="hello", data=b"from python"), metadata=auth, timeout=10)
        return {"delivered": reply.delivered}

    def send(key_):
        def call():
            reply = api.SendMessage(
                api_pb2.SendMessageRequest(client="py", topic="invoice", data=b"7", idempotency_key=key_),
                metadata=auth,
                timeout=10,
            )
            return {"duplicate": reply.duplicate, "sequence": reply.sequence}

        return call

    def connections():
        reply = api.ClientConnections(api_pb2.ClientConnectionsRequest(client="py"), metadata=auth, timeout=10)
        return {"count": len(reply.connections), "user_agent": reply.connections[0].user_agent if reply.connections else None}

    attempt("publish", publish)
    attempt("message", send("py-invoice-7"))
    attempt("message again", send("py-invoice-7"))
    attempt("connections", connections)
    attempt("no target", lambda: api.Publish(api_pb2.Publication(topic="t"), metadata=auth, timeout=10) and {})
    attempt("no key", lambda: api.Publish(api_pb2.Publication(client="py", topic="t"), timeout=10) and {})
    print(json.dumps(results), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["backend", "api"])
    parser.add_argument("--protos", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key")
    arguments = parser.parse_args()
    if arguments.mode == "backend":
        serve_backend(arguments.protos, arguments.port)
    else:
        call_api(arguments.protos, arguments.port, arguments.key)


if __name__ == "__main__":
    main()
