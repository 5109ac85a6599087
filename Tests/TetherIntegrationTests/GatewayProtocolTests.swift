import NIOConcurrencyHelpers
import NIOCore
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherTestSupport

extension IntegrationTests {
    /// The gateway against clients that misbehave, over real TCP.
    @Suite("Gateway protocol handling", .timeLimit(.minutes(2)))
    struct GatewayProtocolTests {
        /// Expects an ERROR with `code`, then the connection closed by the gateway.
        func expectErrorAndClose(
            _ connection: RawConnection,
            _ code: StatusCode,
            sourceLocation: SourceLocation = #_sourceLocation
        ) async throws {
            let frame = await connection.next()
            guard case .error(let report)? = frame?.payload else {
                Issue.record("expected ERROR \(code), got \(String(describing: frame))", sourceLocation: sourceLocation)
                return
            }
            #expect(report.code == code, "message: \(report.message)", sourceLocation: sourceLocation)
            #expect(frame?.flags.contains(.checksum) == true, "ERROR carries a checksum", sourceLocation: sourceLocation)
            #expect(await connection.next() == nil, "nothing follows an ERROR", sourceLocation: sourceLocation)
            try await connection.waitForClose()
        }

        @Test("garbage gets ERROR bad magic and a close, and every other client is still served")
        func garbage() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                })
                let client = try harness.client([endpoint])
                #expect(try await client.request("echo", body: ByteBuffer(string: "before")).string == "before")

                // Many bad clients at once, while the good one keeps calling.
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for index in 0..<20 {
                        group.addTask {
                            let bad = try await RawConnection.connect(to: endpoint)
                            try await bad.send(bytes: ByteBuffer(string: "GET /\(index) HTTP/1.1\r\nHost: x\r\n\r\n"))
                            try await self.expectErrorAndClose(bad, .badMagic)
                        }
                    }
                    group.addTask {
                        for index in 0..<200 {
                            let reply = try await client.request("echo", body: ByteBuffer(string: "\(index)"))
                            #expect(reply.string == "\(index)")
                        }
                    }
                    try await group.waitForAll()
                }
                #expect(gateway.connections.count == 1)
            }
        }

        @Test("an oversized length gets ERROR frame too large before any body byte is sent")
        func oversizedLength() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway()
                // Before the handshake the limit is 64 KiB.
                let early = try await RawConnection.connect(to: endpoint)
                try await early.send(bytes: Self.header(type: .hello, length: 100_000))
                try await self.expectErrorAndClose(early, .frameTooLarge)

                // After it, the gateway's configured limit (1 MiB by default).
                let late = try await RawConnection.connect(to: endpoint)
                #expect(try await late.handshake() != nil)
                try await late.send(bytes: Self.header(type: .request, length: UInt32.max))
                try await self.expectErrorAndClose(late, .frameTooLarge)
            }
        }

        @Test("a corrupted frame gets ERROR checksum mismatch")
        func badChecksum() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway()
                let connection = try await RawConnection.connect(to: endpoint)
                #expect(try await connection.handshake() != nil)
                var bytes = ByteBuffer()
                try FrameEncoder().encode(
                    Frame(.request(.init(id: 1, method: "echo", body: ByteBuffer(string: "data"))), flags: .checksum),
                    into: &bytes
                )
                bytes.setInteger(UInt8(ascii: "X"), at: bytes.writerIndex - 1)
                try await connection.send(bytes: bytes)
                try await self.expectErrorAndClose(connection, .checksumMismatch)
            }
        }

        @Test("after negotiating checksums, a frame without one is refused")
        func missingChecksum() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway()
                let connection = try await RawConnection.connect(to: endpoint)
                let welcome = try await connection.handshake(features: .checksum)
                #expect(welcome?.features == .checksum)
                try await connection.send(.ping(.init(id: 1)), flags: [])
                try await self.expectErrorAndClose(connection, .checksumMismatch)
            }
        }

        @Test("without negotiated checksums, frames without one are served")
        func checksumsOff() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                })
                let connection = try await RawConnection.connect(to: endpoint)
                let welcome = try await connection.handshake(features: [])
                #expect(welcome?.features == [])
                try await connection.send(.request(.init(id: 5, method: "echo", body: ByteBuffer(string: "plain"))), flags: [])
                let frame = await connection.next()
                #expect(frame == Frame(.response(.init(id: 5, body: ByteBuffer(string: "plain")))))
                connection.close()
            }
        }

        @Test("a gateway that requires checksums refuses clients that do not offer them")
        func checksumsRequired() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway { $0.checksums = .required }
                let connection = try await RawConnection.connect(to: endpoint)
                try await connection.send(.hello(.init(versions: 1...1, features: [], maxBodySize: 1 << 20, clientID: "x")))
                try await self.expectErrorAndClose(connection, .protocolError)
            }
        }

        @Test("a client id over the gateway's limit gets ERROR invalid request naming the limit")
        func clientIDTooLong() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway()
                let connection = try await RawConnection.connect(to: endpoint)
                let id = String(repeating: "x", count: 60_000)
                try await connection.send(.hello(.init(versions: 1...1, features: [], maxBodySize: 1 << 20, clientID: id)))
                guard case .error(let report)? = await connection.next()?.payload else {
                    Issue.record("expected ERROR")
                    return
                }
                #expect(report.code == .invalidRequest)
                #expect(report.message.contains("at most 256"))
                try await connection.waitForClose()
            }
        }

        /// The ERROR the gateway answers a new connection with at once, if it refuses it.
        func refusal(at endpoint: Endpoint) async throws -> Frame.ErrorReport? {
            let connection = try await RawConnection.connect(to: endpoint)
            defer { connection.close() }
            // A refused connection may be closed before the HELLO is written.
            try? await connection.send(.hello(.init(versions: 1...1, features: .checksum, maxBodySize: 1 << 20, clientID: "x")))
            guard case .error(let report)? = await connection.next()?.payload else { return nil }
            return report
        }

        @Test("connections over the per-address limit get ERROR resource exhausted saying so; a closed one makes room")
        func connectionLimit() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway { $0.limits.maxConnectionsPerAddress = 3 }
                var held: [RawConnection] = []
                for _ in 0..<3 {
                    let connection = try await RawConnection.connect(to: endpoint)
                    #expect(try await connection.handshake() != nil)
                    held.append(connection)
                }
                let fourth = try await RawConnection.connect(to: endpoint)
                guard case .error(let full)? = await fourth.next()?.payload else {
                    Issue.record("expected ERROR")
                    return
                }
                #expect(full.code == .resourceExhausted && full.message.contains("maximum of 3 connections"))
                try await fourth.waitForClose()

                held.removeFirst().close()
                try await Task.sleep(for: .milliseconds(300))
                let fifth = try await RawConnection.connect(to: endpoint)
                #expect(try await fifth.handshake() != nil, "room again")
                for connection in held + [fifth] { connection.close() }
            }
        }

        @Test("new connections over the per-address rate get ERROR resource exhausted; the rate refills")
        func connectionRate() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway { $0.limits.handshakesPerSecondPerAddress = 2 }
                #expect(try await self.refusal(at: endpoint) == nil)
                #expect(try await self.refusal(at: endpoint) == nil)
                let tooFast = try await self.refusal(at: endpoint)
                #expect(tooFast?.code == .resourceExhausted && tooFast?.message.contains("2 new connections per second") == true)
                try await Task.sleep(for: .milliseconds(600))
                #expect(try await self.refusal(at: endpoint) == nil, "a token back after half a second")
            }
        }

        @Test("a client with no common version gets ERROR unsupported version")
        func versionMismatch() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway()
                let connection = try await RawConnection.connect(to: endpoint)
                try await connection.send(.hello(.init(versions: 2...3, features: [], maxBodySize: 1 << 20, clientID: "future")))
                try await self.expectErrorAndClose(connection, .unsupportedVersion)
            }
        }

        @Test("frames out of order, unknown types and duplicate request ids are protocol errors")
        func outOfOrder() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("wait") { _, _ in
                        try await Task.sleep(for: .seconds(30))
                        return ByteBuffer()
                    }
                })
                let early = try await RawConnection.connect(to: endpoint)
                try await early.send(.request(.init(id: 1, method: "echo")))
                try await self.expectErrorAndClose(early, .unexpectedFrame)

                let pusher = try await RawConnection.connect(to: endpoint)
                #expect(try await pusher.handshake() != nil)
                try await pusher.send(.push(.init(topic: "t")))
                try await self.expectErrorAndClose(pusher, .unexpectedFrame)

                let unknown = try await RawConnection.connect(to: endpoint)
                #expect(try await unknown.handshake() != nil)
                try await unknown.send(bytes: Self.header(type: FrameType(rawValue: 0x42), length: 0))
                try await self.expectErrorAndClose(unknown, .unknownFrameType)

                let duplicate = try await RawConnection.connect(to: endpoint)
                #expect(try await duplicate.handshake() != nil)
                try await duplicate.send(.request(.init(id: 9, method: "wait")))
                try await duplicate.send(.request(.init(id: 9, method: "wait")))
                try await self.expectErrorAndClose(duplicate, .protocolError)
            }
        }

        @Test("an unknown extension frame is ignored")
        func extensionIgnored() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                })
                let connection = try await RawConnection.connect(to: endpoint)
                #expect(try await connection.handshake() != nil)
                try await connection.send(.extension(.init(type: FrameType(rawValue: 0xC0), id: 1, body: ByteBuffer(string: "?"))))
                try await connection.send(.request(.init(id: 2, method: "echo", body: ByteBuffer(string: "ok"))))
                guard case .response(let response)? = await connection.next()?.payload else {
                    Issue.record("expected the echo")
                    return
                }
                #expect(response.id == 2 && response.body.string == "ok")
                connection.close()
            }
        }

        @Test("PING is answered with a PONG echoing its id and data")
        func pingPong() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway()
                let connection = try await RawConnection.connect(to: endpoint)
                #expect(try await connection.handshake() != nil)
                let ping = Frame.Ping(id: 77, data: ByteBuffer(string: "stamp"))
                try await connection.send(.ping(ping))
                #expect(await connection.next()?.payload == .pong(ping))
                connection.close()
            }
        }

        @Test("a client that never says HELLO is dropped after the handshake timeout")
        func handshakeTimeout() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway { $0.timeouts.handshake = .milliseconds(200) }
                let connection = try await RawConnection.connect(to: endpoint)
                try await self.expectErrorAndClose(connection, .handshakeTimeout)
            }
        }

        @Test("a connection silent for the idle timeout gets GOAWAY idle timeout and is closed")
        func idleReaping() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway {
                    $0.timeouts.heartbeatInterval = .milliseconds(100)
                    $0.timeouts.idle = .milliseconds(300)
                }
                let connection = try await RawConnection.connect(to: endpoint)
                let started = ContinuousClock.now
                #expect(try await connection.handshake() != nil)
                guard case .goAway(let goAway)? = await connection.next()?.payload else {
                    Issue.record("expected GOAWAY")
                    return
                }
                #expect(goAway.reason == .idleTimeout)
                #expect(ContinuousClock.now - started >= .milliseconds(300))
                #expect(await connection.next() == nil)
            }
        }

        @Test("the authenticator sees the token and can refuse the client")
        func authentication() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    authenticate: { info in
                        guard info.authToken.map({ String(buffer: $0) }) == "let-me-in" else {
                            throw RequestError(.unauthenticated, "bad token for \(info.clientID)")
                        }
                    },
                    routes: { gateway in gateway.handle("echo") { request, _ in request.body } }
                )

                let good = try harness.client([endpoint]) { $0.authentication = .token(ByteBuffer(string: "let-me-in")) }
                #expect(try await good.request("echo", body: ByteBuffer(string: "in")).string == "in")

                let bad = try harness.client([endpoint], clientID: "mallory") {
                    $0.authentication = .provider { ByteBuffer(string: "guess") }
                    $0.reconnect.backoff.maxAttempts = 1
                }
                let events = harness.events(of: bad)
                let error = await #expect(throws: TetherError.self) { try await bad.request("echo", timeout: .seconds(10)) }
                #expect(error?.code == .notConnected)
                try await eventually("the refusal is reported") {
                    events.all.contains { event in
                        if case .connectFailed(_, let failure) = event {
                            return failure.code == .handshakeFailed && failure.status == .unauthenticated
                                && failure.message.contains("bad token for mallory")
                        }
                        return false
                    }
                }
            }
        }

        @Test("graceful shutdown: GOAWAY, requests in flight are answered, later ones are refused as unavailable")
        func gracefulShutdown() async throws {
            try await withHarness { harness in
                let release = NIOLockedValueBox(false)
                let (gateway, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("work") { request, _ in
                        while !release.withLockedValue({ $0 }) { try await Task.sleep(for: .milliseconds(5)) }
                        return request.body
                    }
                })
                let connection = try await RawConnection.connect(to: endpoint)
                #expect(try await connection.handshake() != nil)
                try await connection.send(.request(.init(id: 1, method: "work", body: ByteBuffer(string: "in flight"))))
                try await eventually("the request is in flight") { gateway.connections.count == 1 }
                try await Task.sleep(for: .milliseconds(50))

                gateway.shutdown()
                guard case .goAway(let goAway)? = await connection.next()?.payload else {
                    Issue.record("expected GOAWAY")
                    return
                }
                #expect(goAway.reason == .shutdown)

                try await connection.send(.request(.init(id: 2, method: "work", body: ByteBuffer(string: "too late"))))
                guard case .response(let refused)? = await connection.next()?.payload else {
                    Issue.record("expected the refusal")
                    return
                }
                #expect(refused.id == 2 && refused.status == .unavailable)

                release.withLockedValue { $0 = true }
                guard case .response(let answered)? = await connection.next()?.payload else {
                    Issue.record("expected the answer to the request in flight")
                    return
                }
                #expect(answered.id == 1 && answered.status == .ok && answered.body.string == "in flight")
                // The client closes once its requests are answered; then the gateway is done.
                connection.close()
                try await eventually("the gateway forgets the connection") { gateway.connections.isEmpty }
            }
        }

        @Test("after GOAWAY, a client that never closes is closed when the grace period ends")
        func gracePeriod() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway { $0.timeouts.shutdownGracePeriod = .milliseconds(300) }
                let connection = try await RawConnection.connect(to: endpoint)
                #expect(try await connection.handshake() != nil)
                let started = ContinuousClock.now
                gateway.shutdown()
                guard case .goAway? = await connection.next()?.payload else {
                    Issue.record("expected GOAWAY")
                    return
                }
                #expect(await connection.next() == nil)
                #expect(ContinuousClock.now - started >= .milliseconds(300))
            }
        }

        @Test("a connection limited to 2 concurrent handlers runs 40 requests, never more than 2 at once, refusing none")
        func concurrencyLimit() async throws {
            try await withHarness { harness in
                let running = NIOLockedValueBox((now: 0, peak: 0))
                let (_, endpoint) = try await harness.gateway(
                    configure: { $0.limits.maxConcurrentRequestsPerConnection = 2 },
                    routes: { gateway in
                        gateway.handle("work") { request, _ in
                            running.withLockedValue {
                                $0.now += 1; $0.peak = max($0.peak, $0.now)
                            }
                            try await Task.sleep(for: .milliseconds(5))
                            running.withLockedValue { $0.now -= 1 }
                            return request.body
                        }
                    }
                )
                let client = try harness.client([endpoint])
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for index in 0..<40 {
                        group.addTask {
                            let reply = try await client.request("work", body: ByteBuffer(string: "\(index)"), timeout: .seconds(30))
                            #expect(reply.string == "\(index)")
                        }
                    }
                    try await group.waitForAll()
                }
                #expect(running.withLockedValue { $0.peak } == 2)
            }
        }

        @Test("a client that ignores the concurrency limit: deadlines and cancels still stop handlers and free the slots")
        func cancelWhileSaturated() async throws {
            try await withHarness { harness in
                let block = WaitingHandler(waitsFor: .seconds(60))
                let (_, endpoint) = try await harness.gateway(
                    configure: { $0.limits.maxConcurrentRequestsPerConnection = 2 },
                    routes: { gateway in
                        gateway.handle("block", block.handler)
                        gateway.handle("echo") { request, _ in request.body }
                    }
                )
                // The reference client never exceeds the limit WELCOME announces; this one does.
                let connection = try await RawConnection.connect(to: endpoint)
                #expect(try await connection.handshake()?.maxConcurrentRequests == 2)
                // 1 and 2 take the slots; 3 and 4 wait (few enough that the gateway reads on); 4 is
                // cancelled by the client.
                for id in UInt64(1)...4 {
                    try await connection.send(.request(.init(id: id, method: "block", timeout: .milliseconds(300))))
                }
                try await connection.send(.cancel(.init(requestID: 4)))
                var answered: [UInt64: StatusCode] = [:]
                while answered.count < 3, case .response(let response)? = await connection.next()?.payload {
                    answered[response.id] = response.status
                }
                #expect(answered == [1: .deadlineExceeded, 2: .deadlineExceeded, 3: .deadlineExceeded])
                // The deadlines stopped the handlers, so a new request gets a slot at once.
                try await connection.send(.request(.init(id: 5, method: "echo", body: ByteBuffer(string: "served"))))
                guard case .response(let response)? = await connection.next()?.payload else {
                    Issue.record("expected the echo")
                    return
                }
                #expect(response.id == 5 && response.body.string == "served")
                try await eventually("no handler is left running") { block.cancelled }
                connection.close()
            }
        }

        @Test("an inline handler takes no slot: it answers while every slot is busy, and an unknown method is answered too")
        func inlineHandlerTakesNoSlot() async throws {
            try await withHarness { harness in
                let block = WaitingHandler(waitsFor: .seconds(60))
                let (_, endpoint) = try await harness.gateway(
                    configure: { $0.limits.maxConcurrentRequestsPerConnection = 1 },
                    routes: { gateway in
                        gateway.handle("block", block.handler)
                        gateway.handleInline("echo") { request, _ in request.body }
                    }
                )
                // The reference client never exceeds the limit WELCOME announces; this one does.
                let connection = try await RawConnection.connect(to: endpoint)
                #expect(try await connection.handshake()?.maxConcurrentRequests == 1)
                try await connection.send(.request(.init(id: 1, method: "block")))
                try await eventually("the only slot is taken") { block.started }
                try await connection.send(.request(.init(id: 2, method: "echo", body: ByteBuffer(string: "inline"))))
                try await connection.send(.request(.init(id: 3, method: "nope")))
                var answers: [UInt64: Frame.Response] = [:]
                while answers.count < 2, case .response(let response)? = await connection.next()?.payload {
                    answers[response.id] = response
                }
                #expect(answers[2]?.status == .ok && answers[2]?.body.string == "inline")
                #expect(answers[3]?.status == .unknownMethod)
                #expect(answers[1] == nil, "the blocked handler still runs")
                connection.close()
                try await eventually("the blocked handler was stopped by the close") { block.cancelled }
            }
        }

        @Test("a client far over the concurrency limit: once 16 requests wait, the gateway stops reading until a slot frees")
        func readsStopWhenManyWait() async throws {
            try await withHarness { harness in
                let block = WaitingHandler(waitsFor: .seconds(60))
                let (_, endpoint) = try await harness.gateway(
                    configure: { $0.limits.maxConcurrentRequestsPerConnection = 1 },
                    routes: { gateway in gateway.handle("block", block.handler) }
                )
                let connection = try await RawConnection.connect(to: endpoint)
                #expect(try await connection.handshake()?.maxConcurrentRequests == 1)
                // 1 takes the slot until its deadline; 2...17 wait, and then the gateway stops reading.
                try await connection.send(.request(.init(id: 1, method: "block", timeout: .seconds(1))))
                for id in UInt64(2)...17 {
                    try await connection.send(.request(.init(id: id, method: "block", timeout: .seconds(30))))
                }
                try await eventually("the first handler runs") { block.started }
                try await Task.sleep(for: .milliseconds(100))  // the waiting requests are read by now
                let pinged = ContinuousClock.now
                try await connection.send(.ping(.init(id: 7)))
                // The PING is read only once 1's deadline frees its slot and 2 starts.
                guard case .response(let first)? = await connection.next()?.payload else {
                    Issue.record("expected the deadline of request 1")
                    return
                }
                #expect(first.id == 1 && first.status == .deadlineExceeded)
                guard case .pong(let pong)? = await connection.next()?.payload else {
                    Issue.record("expected the PONG")
                    return
                }
                #expect(pong.id == 7)
                #expect(ContinuousClock.now - pinged >= .milliseconds(500), "the PING waited in the socket")
                connection.close()
            }
        }

        static func header(type: FrameType, length: UInt32) -> ByteBuffer {
            var buffer = ByteBuffer()
            FrameHeader.write(type: type, id: 1, length: length, into: &buffer)
            return buffer
        }
    }
}
