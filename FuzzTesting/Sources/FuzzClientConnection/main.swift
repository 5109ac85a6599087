import CLibFuzzer
import Logging
import NIOCore
import NIOEmbedded

@testable import Tether
@testable import TetherCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Drives the client's connection handler on an `EmbeddedChannel` with virtual time, by a
/// little program the fuzzer writes: arbitrary bytes from the "gateway" (after a WELCOME the
/// harness sends, or none), requests sent and cancelled, a drain, the clock advanced, the loop
/// run. It must never crash, and once the channel is closed every request must have its answer
/// or its error, and the connection its closure: a caller never waits for ever.
///
/// The input: its first byte chooses the setup (bit 0: a WELCOME without checksums arrives
/// first; bit 1: one frame per message, as over WebSocket); then operations, each an opcode
/// byte and its operand: 0 n: the next n bytes arrive (one read); 1 t: t × 100 ms pass;
/// 2: the loop runs; 3 i d: request i is sent with a deadline d × 100 ms away; 4 i: request i
/// is cancelled; 5: the client drains; 6: what the client wrote is taken; 7: the socket's
/// writability flips.
let loop = EmbeddedEventLoop()
let quiet = Logger(label: "fuzz") { _ in SwiftLogNoOpLogHandler() }
let hello = Frame.Hello(versions: 1...1, features: [], maxBodySize: 4096, clientID: "fuzz")
let welcome = Frame.Welcome(
    version: 1,
    features: [],
    connectionID: 1,
    heartbeatInterval: .seconds(10),
    idleTimeout: .seconds(30),
    maxBodySize: 4096,
    maxConcurrentRequests: 2
)

/// What completed, counted on the (embedded) event loop, which is this thread.
final class Settled: @unchecked Sendable {
    var requests = 0
    var closure = false
}

@_cdecl("LLVMFuzzerTestOneInput")
func fuzzClientConnection(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start, count > 0 else { return 0 }
    var input = UnsafeBufferPointer(start: start, count: count)[...]
    let setup = input.popFirst()!
    let framing: Framing = setup & 2 == 0 ? .byteStream : .messages
    let channel = EmbeddedChannel(loop: loop)
    let settled = Settled()
    let established = loop.makePromise(of: Handshake.Negotiated.self)
    let closed = loop.makePromise(of: ConnectionClosure.self)
    let handler = ClientConnectionHandler(
        configuration: .init(
            hello: hello,
            handshakeTimeout: .seconds(5),
            heartbeat: try! .init(timeout: .seconds(5), minimumTimeout: .seconds(5), jitter: 0, suspensionThreshold: nil),
            maxInboundBodySize: 4096,
            reliability: nil
        ),
        framing: framing,
        callbacks: .init(push: { _ in }, goAway: { _ in }, reliable: nil),
        established: established,
        closed: closed,
        logger: quiet
    )
    closed.futureResult.whenComplete { _ in settled.closure = true }
    try! channel.pipeline.syncOperations.addHandler(handler)
    try! channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
    if setup & 1 != 0 {
        _ = try? channel.writeInbound(try! FrameEncoder().encode(Frame(.welcome(welcome)), allocator: channel.allocator))
    }
    var requests = 0
    while channel.isActive, let opcode = input.popFirst() {
        switch opcode % 8 {
        case 0:
            let length = Int(input.popFirst() ?? 0)
            let bytes = input.prefix(length)
            input = input.dropFirst(length)
            _ = try? channel.writeInbound(ByteBuffer(bytes: bytes))
        case 1:
            loop.advanceTime(by: .milliseconds(100 * Int64(input.popFirst() ?? 0)))
        case 2:
            loop.run()
        case 3:
            let id = UInt64(input.popFirst() ?? 0)
            let deadline = loop.now + .milliseconds(100 * (1 + Int64(input.popFirst() ?? 0)))
            let promise = loop.makePromise(of: ByteBuffer.self)
            handler.sendRequest(.init(id: id, method: "m", body: ByteBuffer()), deadline: deadline, waiter: .promise(promise))
            promise.futureResult.whenComplete { _ in settled.requests += 1 }
            requests += 1
        case 4:
            handler.cancelRequest(id: UInt64(input.popFirst() ?? 0))
        case 5:
            handler.drain()
        case 6:
            while let _ = try? channel.readOutbound(as: ByteBuffer.self) {}
        default:
            channel.isWritable.toggle()
            channel.pipeline.fireChannelWritabilityChanged()
        }
    }
    _ = try? channel.finish(acceptAlreadyClosed: true)
    loop.run()
    loop.advanceTime(by: .seconds(600))
    loop.run()
    if settled.requests != requests {
        fatalError("\(requests - settled.requests) of \(requests) requests have neither an answer nor an error after the close")
    }
    if !settled.closure { fatalError("the closed channel's closure was never reported") }
    established.fail(CancellationError())  // harmless if it succeeded; a promise must complete
    return 0
}

// SwiftPM links this file's top-level code as the program's entry point; hand over to libFuzzer.
var argc = CommandLine.argc
var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
exit(LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzClientConnection(data, size) })
