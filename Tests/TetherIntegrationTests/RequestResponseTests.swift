import NIOConcurrencyHelpers
import NIOCore
import Testing
import TetherCore
import TetherGateway
import TetherTestSupport

@testable import Tether

extension IntegrationTests {
    @Suite("Requests", .timeLimit(.minutes(2)))
    struct RequestResponseTests {
        @Test(
            "a request gets its handler's reply; unknown methods and handler errors get clear statuses",
            arguments: Endpoint.Transport.allCases
        )
        func basics(over transport: Endpoint.Transport) async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    transport: transport,
                    routes: { gateway in
                        gateway.handle("echo") { request, _ in request.body }
                        gateway.handle("reject") { _, _ in throw RequestError(.permissionDenied, "not you") }
                        gateway.handle("crash") { _, _ in throw SomeInternalError() }
                        gateway.handle("whoami") { _, context in ByteBuffer(string: context.connection.clientID) }
                    }
                )
                let client = try harness.client([endpoint], clientID: "alice")

                #expect(try await client.request("echo", body: ByteBuffer(string: "hi")).string == "hi")
                #expect(try await client.request("whoami").string == "alice")

                let unknown = await #expect(throws: TetherError.self) { try await client.request("nope") }
                #expect(unknown?.code == .serverError && unknown?.status == .unknownMethod)
                #expect(unknown?.message.contains("nope") == true)

                let rejected = await #expect(throws: TetherError.self) { try await client.request("reject") }
                #expect(rejected?.status == .permissionDenied && rejected?.message == "not you")

                let crashed = await #expect(throws: TetherError.self) { try await client.request("crash") }
                #expect(crashed?.status == .internalError)
                #expect(crashed?.message == "internal error in 'crash'", "handler error details are not leaked by default")

                // The connection survived every failed request.
                #expect(try await client.request("echo", body: ByteBuffer(string: "still")).string == "still")
            }
        }

        @Test("inline handlers answer with the statuses of task handlers; a synchronous closure given to handle() still runs in a task")
        func inlineHandlers() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handleInline("echo") { request, _ in request.body }
                    gateway.handleInline("whoami") { _, context in ByteBuffer(string: context.connection.clientID) }
                    gateway.handleInline("reject") { _, _ in throw RequestError(.permissionDenied, "not you") }
                    gateway.handleInline("crash") { _, _ in throw SomeInternalError() }
                    // Not an inline handler: `withUnsafeCurrentTask` sees the task it runs in.
                    gateway.handle("in-task") { _, _ in ByteBuffer(string: withUnsafeCurrentTask { "\($0 != nil)" }) }
                })
                let client = try harness.client([endpoint], clientID: "bob")

                #expect(try await client.request("echo", body: ByteBuffer(string: "hi")).string == "hi")
                #expect(try await client.request("whoami").string == "bob")
                let rejected = await #expect(throws: TetherError.self) { try await client.request("reject") }
                #expect(rejected?.status == .permissionDenied && rejected?.message == "not you")
                let crashed = await #expect(throws: TetherError.self) { try await client.request("crash") }
                #expect(crashed?.status == .internalError && crashed?.message == "internal error in 'crash'")
                #expect(try await client.request("in-task").string == "true")

                // Many at once, interleaved with task handlers: each gets its own answer.
                let mismatches = try await withThrowingTaskGroup(of: Int.self) { group in
                    for value in 0..<2_000 {
                        group.addTask {
                            let method = value % 2 == 0 ? "echo" : "in-task"
                            let reply = try await client.request(method, body: ByteBuffer(string: "\(value)"))
                            return reply.string == (value % 2 == 0 ? "\(value)" : "true") ? 0 : 1
                        }
                    }
                    return try await group.reduce(0, +)
                }
                #expect(mismatches == 0)
            }
        }

        @Test(
            "10,000 concurrent requests over one connection each get their own response, out of order",
            arguments: Endpoint.Transport.allCases
        )
        func tenThousandConcurrent(over transport: Endpoint.Transport) async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    transport: transport,
                    routes: { gateway in
                        gateway.handle("square") { request, _ in
                            let value = Int(request.body.string)!
                            // Make some handlers slower so that responses overtake each other.
                            if value % 3 == 0 { try await Task.sleep(for: .milliseconds(value % 20)) }
                            return ByteBuffer(string: "\(value * value)")
                        }
                    }
                )
                let client = try harness.client([endpoint]) { $0.requests.defaultTimeout = .seconds(120) }
                let mismatches = try await withThrowingTaskGroup(of: Int.self) { group in
                    for value in 0..<10_000 {
                        group.addTask {
                            let reply = try await client.request("square", body: ByteBuffer(string: "\(value)"))
                            return reply.string == "\(value * value)" ? 0 : 1
                        }
                    }
                    return try await group.reduce(0, +)
                }
                #expect(mismatches == 0)
                #expect(gateway.connections.count == 1, "all requests share one connection")
            }
        }

        @Test("a request that outlives its timeout fails with timedOut, and its handler is stopped")
        func timeout() async throws {
            try await withHarness { harness in
                let slow = WaitingHandler(waitsFor: .seconds(30))
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("slow", slow.handler)
                    gateway.handle("echo") { request, _ in request.body }
                })
                let client = try harness.client([endpoint])
                _ = try await client.request("echo")  // connected

                let started = ContinuousClock.now
                let error = await #expect(throws: TetherError.self) { try await client.request("slow", timeout: .milliseconds(200)) }
                let elapsed = ContinuousClock.now - started
                #expect(error?.code == .timedOut, "\(String(describing: error)) after \(elapsed)")
                #expect(elapsed >= Duration.milliseconds(200) && elapsed < Duration.seconds(20), "took \(elapsed)")
                // Well under the gateway's 10 s grace period: only the deadline can stop the handler this soon.
                try await eventually("the gateway stops the handler", timeout: .seconds(3)) { slow.cancelled }
            }
        }

        @Test("the gateway answers deadline exceeded when a handler overruns the gateway's own limit")
        func gatewayHandlerLimit() async throws {
            try await withHarness { harness in
                let release = NIOLockedValueBox(false)
                let handlerFinished = NIOLockedValueBox(false)
                let (gateway, endpoint) = try await harness.gateway(
                    configure: { $0.timeouts.handler = .milliseconds(100) },
                    routes: { gateway in
                        gateway.handle("stubborn") { _, _ in
                            // Ignores cancellation on purpose, until the test lets it go.
                            while !release.withLockedValue({ $0 }) { try? await Task.sleep(for: .milliseconds(5)) }
                            handlerFinished.withLockedValue { $0 = true }
                            return ByteBuffer(string: "too late")
                        }
                    }
                )
                let client = try harness.client([endpoint])
                let events = harness.events(of: client)
                let error = await #expect(throws: TetherError.self) { try await client.request("stubborn", timeout: .seconds(30)) }
                #expect(error?.status == .deadlineExceeded)
                #expect(!handlerFinished.withLockedValue { $0 }, "the RESPONSE must not wait for the handler to give up")
                release.withLockedValue { $0 = true }
                try await eventually("the handler finishes") { handlerFinished.withLockedValue { $0 } }
                // Its late answer was dropped by the gateway; the connection carries on.
                try await Task.sleep(for: .milliseconds(100))
                #expect(events.disconnectReasons.isEmpty)
                #expect(gateway.connections.count == 1)
            }
        }

        @Test(
            "cancelling the calling task cancels the request at once and reaches the gateway handler",
            arguments: Endpoint.Transport.allCases
        )
        func cancellationReachesGateway(over transport: Endpoint.Transport) async throws {
            try await withHarness { harness in
                let wait = WaitingHandler()
                let (_, endpoint) = try await harness.gateway(
                    transport: transport,
                    routes: { gateway in gateway.handle("wait", wait.handler) }
                )
                let client = try harness.client([endpoint])
                let task = Task { try await client.request("wait", timeout: .seconds(60)) }
                try await eventually("the handler runs") { wait.started }
                let cancelledAt = ContinuousClock.now
                task.cancel()
                let error = await #expect(throws: TetherError.self) { try await task.value }
                #expect(error?.code == .cancelled)
                #expect(ContinuousClock.now - cancelledAt < .seconds(10), "cancellation is local: it does not wait for the 60 s handler")
                // The gateway's own deadline is 60 s; only the CANCEL frame can stop the handler now.
                try await eventually("the CANCEL frame stops the handler", timeout: .seconds(5)) { wait.cancelled }
            }
        }

        @Test("a request cancelled while it waits for the hop to the event loop ends at once, and is never sent")
        func cancelledBeforeSent() async throws {
            try await withHarness { harness in
                let calls = NIOLockedValueBox(0)
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("count") { _, _ in
                        calls.withLockedValue { $0 += 1 }
                        return ByteBuffer()
                    }
                    gateway.handle("echo") { request, _ in request.body }
                })
                let client = try harness.client([endpoint])
                _ = try await client.request("echo")  // connected

                // Hold the client's event loop: the request's hop cannot run.
                let loopHeld = ConditionLock(value: 0)
                client.eventLoop.execute {
                    loopHeld.lock(whenValue: 1)
                    loopHeld.unlock()
                }
                let outcome = NIOLockedValueBox<(any Error)?>(nil)
                let task = Task {
                    do {
                        _ = try await client.request("count", timeout: .seconds(60))
                    } catch {
                        outcome.withLockedValue { $0 = error }
                    }
                }
                try await Task.sleep(for: .milliseconds(100))
                task.cancel()
                do {
                    try await eventually("the request ends while the loop is still held", timeout: .seconds(5)) {
                        outcome.withLockedValue { $0 } != nil
                    }
                } catch {
                    loopHeld.lock()
                    loopHeld.unlock(withValue: 1)
                    throw error
                }
                loopHeld.lock()
                loopHeld.unlock(withValue: 1)
                #expect((outcome.withLockedValue { $0 } as? TetherError)?.code == .cancelled)
                // A REQUEST sent before this one would reach the gateway first.
                #expect(try await client.request("echo", body: ByteBuffer(string: "after")).string == "after")
                #expect(calls.withLockedValue { $0 } == 0)
            }
        }

        @Test("a handler's error message longer than a RESPONSE holds reaches the client cut to 65,535 bytes of UTF-8, at once")
        func longErrorMessage() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    // 3-byte characters: 65,535 is a multiple of 3, 65,536 would split one.
                    gateway.handle("refuse") { _, _ in throw RequestError(.permissionDenied, String(repeating: "é€", count: 20_000)) }
                    gateway.handleInline("refuse.inline") { _, _ in
                        throw RequestError(.invalidRequest, String(repeating: "x", count: 70_000))
                    }
                })
                let client = try harness.client([endpoint])
                let started = ContinuousClock.now
                for method in ["refuse", "refuse.inline"] {
                    do throws(TetherError) {
                        _ = try await client.request(method, timeout: .seconds(10))
                        Issue.record("\(method) must fail")
                    } catch {
                        #expect(error.code == .serverError)
                        #expect(error.status == (method == "refuse" ? .permissionDenied : .invalidRequest))
                        #expect(error.message.utf8.count <= 65_535 + 200, "\(error.message.utf8.count) bytes")
                        #expect(error.message.utf8.count >= 65_000, "the message is kept up to the limit")
                    }
                }
                #expect(ContinuousClock.now - started < .seconds(5), "answered, not left to time out")
            }
        }

        @Test("the data task API: suspended until resumed, completes once, cancellable, counted in the statistics")
        func dataTasks() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                    gateway.handle("wait") { _, _ in
                        try await Task.sleep(for: .seconds(60))
                        return ByteBuffer()
                    }
                })
                let client = try harness.client([endpoint])

                let results = NIOLockedValueBox<[Result<ByteBuffer, TetherError>]>([])
                let task = client.dataTask("echo", body: ByteBuffer(string: "cb")) { result in results.withLockedValue { $0.append(result) }
                }
                #expect(task.state == .suspended)
                try await Task.sleep(for: .milliseconds(50))
                #expect(results.withLockedValue { $0.isEmpty }, "nothing is sent before resume()")
                task.resume()
                try await eventually("the completion runs") { results.withLockedValue { $0.count == 1 } }
                #expect(try results.withLockedValue { $0[0] }.get().string == "cb")
                #expect(task.state == .completed)
                task.cancel()
                #expect(task.state == .completed, "cancel after completion changes nothing")

                let cancelledResults = NIOLockedValueBox<[Result<ByteBuffer, TetherError>]>([])
                let slow = client.dataTask("wait") { result in cancelledResults.withLockedValue { $0.append(result) } }
                slow.resume()
                #expect(slow.state == .running)
                try await Task.sleep(for: .milliseconds(50))
                slow.cancel()
                try await eventually("the cancelled task completes") { cancelledResults.withLockedValue { $0.count == 1 } }
                if case .failure(let error) = cancelledResults.withLockedValue({ $0[0] }) {
                    #expect(error.code == .cancelled)
                } else {
                    Issue.record("a cancelled data task must fail")
                }
                #expect(slow.state == .canceled)

                let never = NIOLockedValueBox(0)
                let suspended = client.dataTask("echo") { _ in never.withLockedValue { $0 += 1 } }
                suspended.cancel()
                #expect(suspended.state == .canceled)
                suspended.resume()
                try await Task.sleep(for: .milliseconds(50))
                #expect(never.withLockedValue { $0 } == 1, "the completion runs exactly once")

                // Counted as `request` counts its own: the two that were sent, one of them failed
                // (cancelled); the one cancelled before it started was never a request.
                let statistics = client.statistics
                #expect(statistics.requests == 2 && statistics.requestsFailed == 1, "\(statistics)")
            }
        }

        @Test("a data task on a connected client needs no Swift task: its completion runs on the event loop and may send the next")
        func dataTasksOnTheLoop() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handleInline("echo") { request, _ in request.body }
                })
                let client = try harness.client([endpoint])
                #expect(try await client.request("echo", body: ByteBuffer(string: "connected")).string == "connected")

                struct Observation: Sendable {
                    var onLoop: Bool
                    var inTask: Bool
                    var body: String?
                }
                let seen = NIOLockedValueBox<[Observation]>([])
                // Eight chains of 50 requests, each sent by the completion handler of the one before.
                @Sendable func chain(_ label: String, _ remaining: Int) {
                    guard remaining > 0 else { return }
                    client.dataTask("echo", body: ByteBuffer(string: "\(label)-\(remaining)")) { result in
                        let observation = Observation(
                            onLoop: client.eventLoop.inEventLoop,
                            inTask: withUnsafeCurrentTask { $0 != nil },
                            body: (try? result.get())?.string
                        )
                        seen.withLockedValue { $0.append(observation) }
                        chain(label, remaining - 1)
                    }.resume()
                }
                for index in 0..<8 { chain("c\(index)", 50) }
                try await eventually("every request is answered") { seen.withLockedValue { $0.count } == 400 }
                let observations = seen.withLockedValue { $0 }
                #expect(observations.allSatisfy { $0.onLoop && !$0.inTask })
                let expected = Set((0..<8).flatMap { index in (1...50).map { "c\(index)-\($0)" } })
                #expect(Set(observations.compactMap(\.body)) == expected, "each request got its own response")
            }
        }

        @Test("a data task cancelled while on the wire ends at once and its CANCEL stops the gateway's handler")
        func dataTaskCancellationReachesGateway() async throws {
            try await withHarness { harness in
                let wait = WaitingHandler()
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handleInline("echo") { request, _ in request.body }
                    gateway.handle("wait", wait.handler)
                })
                let client = try harness.client([endpoint])
                #expect(try await client.request("echo", body: ByteBuffer(string: "connected")).string == "connected")

                let outcome = NIOLockedValueBox<Result<ByteBuffer, TetherError>?>(nil)
                let task = client.dataTask("wait", timeout: .seconds(60)) { result in outcome.withLockedValue { $0 = result } }
                task.resume()
                try await eventually("the handler runs") { wait.started }
                task.cancel()
                try await eventually("the completion runs") { outcome.withLockedValue { $0 } != nil }
                guard case .failure(let error) = outcome.withLockedValue({ $0 }) else {
                    Issue.record("a cancelled data task must fail")
                    return
                }
                #expect(error.code == .cancelled)
                #expect(task.state == .canceled)
                try await eventually("the CANCEL frame stops the handler", timeout: .seconds(5)) { wait.cancelled }
            }
        }

        @Test("a data task handed to a connection that no longer takes requests is sent on the next connection")
        func dataTaskOnDrainedConnection() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handleInline("echo") { request, _ in request.body }
                })
                let client = try harness.client([endpoint])
                let events = harness.events(of: client)
                #expect(try await client.request("echo", body: ByteBuffer(string: "one")).string == "one")
                let connection = try #require(client.readyConnection)

                let outcome = NIOLockedValueBox<Result<ByteBuffer, TetherError>?>(nil)
                let task = client.dataTask("echo", body: ByteBuffer(string: "two")) { result in outcome.withLockedValue { $0 = result } }
                // In one event-loop turn: the connection stops taking requests and closes, while the
                // client still hands it out (it learns of the close later, off the loop).
                try await client.eventLoop.submit {
                    connection.drain()
                    task.resume()
                }.get()
                try await eventually("the completion runs", timeout: .seconds(10)) { outcome.withLockedValue { $0 } != nil }
                #expect(try outcome.withLockedValue { $0 }?.get().string == "two")
                try await eventually("the client reconnected") { events.connects >= 2 }
            }
        }

        @Test("invalid arguments are refused locally with clear errors")
        func invalidArguments() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    configure: { $0.limits.maxBodySize = 4096 },
                    routes: { gateway in gateway.handle("echo") { request, _ in request.body } }
                )
                let client = try harness.client([endpoint])
                #expect(await #expect(throws: TetherError.self) { try await client.request("") }?.code == .invalidArgument)
                #expect(
                    await #expect(throws: TetherError.self) { try await client.request("echo", timeout: .zero) }?.code == .invalidArgument
                )
                let tooLarge = await #expect(throws: TetherError.self) {
                    try await client.request("echo", body: ByteBuffer(repeating: 0, count: 5000))
                }
                #expect(tooLarge?.code == .requestTooLarge)
                #expect(try await client.request("echo", body: ByteBuffer(repeating: 1, count: 4000)).readableBytes == 4000)
            }
        }

        @Test("invalid configurations are refused with the name of the bad value")
        func invalidConfiguration() throws {
            var configuration = ClientConfiguration(endpoints: [], clientID: "x")
            #expect(throws: TetherError.self) { try TetherClient(configuration: configuration) }
            configuration.endpoints = [Endpoint(host: "h", port: 0)]
            #expect(throws: TetherError.self) { try TetherClient(configuration: configuration) }
            configuration.endpoints = [Endpoint(host: "h", port: 1)]
            configuration.heartbeat.timeout = .zero
            do {
                _ = try TetherClient(configuration: configuration)
                Issue.record("expected an error")
            } catch {
                #expect(error.code == .invalidConfiguration && error.message.contains("heartbeat.timeout"))
            }
            var gateway = GatewayConfiguration.defaults
            gateway.timeouts.idle = .seconds(1)
            gateway.timeouts.heartbeatInterval = .seconds(2)
            #expect(throws: GatewayError.self) { try Gateway(configuration: gateway) }
        }
    }

    struct SomeInternalError: Error {}
}
