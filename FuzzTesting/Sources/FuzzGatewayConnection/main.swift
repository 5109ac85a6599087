import CLibFuzzer
import Logging
import NIOCore
import NIOEmbedded

@testable import TetherCore
@testable import TetherGateway

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Drives the gateway's connection handler on an `EmbeddedChannel` with virtual time, by a
/// little program the fuzzer writes: arbitrary bytes in (after a HELLO the harness sends, or
/// none), the clock advanced, the loop run, the client's reads stopped and resumed, in any
/// order. It must never crash, and once the channel is closed the gateway must count nothing
/// of it (a request, task or slot left behind would keep a gateway from ever shutting down).
///
/// The input: its first byte chooses the setup (bit 0: send a HELLO without checksums first,
/// so that the program starts on an established connection; bit 1: one frame per message, as
/// over WebSocket, instead of a byte stream); then operations, each an opcode byte and its
/// operand: 0 n: the next n bytes arrive (one read); 1 t: t × 100 ms pass; 2: the loop runs;
/// 3: what the gateway wrote is taken; 4: the client stops or resumes reading.
let loop = EmbeddedEventLoop()
let quiet = Logger(label: "fuzz") { _ in SwiftLogNoOpLogHandler() }
let gateway: Gateway = {
    var configuration = GatewayConfiguration.defaults
    configuration.listen = nil
    // Two slots, so that requests also wait for one; every admission limit out of the way,
    // so that each input starts alike.
    configuration.limits.maxConcurrentRequestsPerConnection = 2
    configuration.limits.maxBodySize = 4096
    configuration.limits.maxBufferedInboundBytes = 8192
    configuration.limits.maxConnections = 1 << 30
    configuration.limits.maxConnectionsPerAddress = 1 << 30
    configuration.limits.handshakesPerSecond = 1 << 30
    configuration.limits.handshakesPerSecondPerAddress = 1 << 30
    configuration.limits.requestsPerSecondPerConnection = 50
    let gateway = try! Gateway(configuration: configuration, eventLoopGroup: loop, logger: quiet)
    gateway.handle("task") { request, _ in request.body }
    gateway.handleInline("inline") { request, _ in request.body }
    gateway.handle("join") { request, context in ByteBuffer(string: "\(context.join(String(buffer: request.body)))") }
    return gateway
}()
let services = gateway.services
var nextID: UInt64 = 0

@_cdecl("LLVMFuzzerTestOneInput")
func fuzzGatewayConnection(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start, count > 0 else { return 0 }
    var input = UnsafeBufferPointer(start: start, count: count)[...]
    let setup = input.popFirst()!
    let framing: Framing = setup & 2 == 0 ? .byteStream : .messages
    nextID += 1
    let channel = EmbeddedChannel(loop: loop)
    let handler = GatewayConnectionHandler(services: services, id: nextID, framing: framing, eventLoop: loop, logger: quiet)
    try! channel.pipeline.syncOperations.addHandler(handler)
    try! channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
    if setup & 1 != 0 {
        let hello = Frame.Hello(versions: 1...1, features: [], maxBodySize: 4096, clientID: "fuzz-\(nextID)")
        _ = try? channel.writeInbound(try! FrameEncoder().encode(Frame(.hello(hello)), allocator: channel.allocator))
        loop.run()
    }
    while channel.isActive, let opcode = input.popFirst() {
        switch opcode % 5 {
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
    let counted = gateway.activity.active
    if counted != 0 {
        fatalError("a closed connection is still counted by the gateway (\(counted)): something it started never ended")
    }
    return 0
}

// SwiftPM links this file's top-level code as the program's entry point; hand over to libFuzzer.
var argc = CommandLine.argc
var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
exit(LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzGatewayConnection(data, size) })
