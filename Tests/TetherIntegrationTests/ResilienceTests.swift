import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import TetherCore
import TetherGateway
import TetherGatewayTesting
import TetherTestSupport

@testable import Tether

extension IntegrationTests {
    /// The client healing itself: dead links, cut connections, restarts, failover, backoff.
    @Suite("Resilience", .timeLimit(.minutes(3)))
    struct ResilienceTests {
        /// A gateway with a fast heartbeat, so that dead links are found within a second.
        static func fastHeartbeat(_ configuration: inout GatewayConfiguration) {
            configuration.timeouts.heartbeatInterval = .milliseconds(200)
            configuration.timeouts.idle = .seconds(2)
        }

        static func fastClient(_ configuration: inout ClientConfiguration) {
            configuration.heartbeat.timeout = .milliseconds(300)
            configuration.connection.handshakeTimeout = .milliseconds(500)
        }

        @Test(
            "a silent gateway (TCP open, nothing answers) is detected by the heartbeat and the client reconnects",
            arguments: Endpoint.Transport.allCases
        )
        func silentGateway(over transport: Endpoint.Transport) async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    transport: transport,
                    configure: Self.fastHeartbeat,
                    routes: { gateway in
                        gateway.handle("echo") { request, _ in request.body }
                    }
                )
                let proxy = TCPFaultProxy(upstream: endpoint)
                let proxyAddress = try await proxy.start()
                harness.onExit { proxy.cutAll() }
                let client = try harness.client(
                    [Endpoint(host: "127.0.0.1", port: proxyAddress.port!, transport: transport)],
                    configure: Self.fastClient
                )
                let events = harness.events(of: client)
                #expect(try await client.request("echo", body: ByteBuffer(string: "a")).string == "a")

                let silenced = ContinuousClock.now
                proxy.mode = .blackhole
                try await eventually("the heartbeat declares the link dead", timeout: .seconds(10)) { !events.disconnectReasons.isEmpty }
                let detection = ContinuousClock.now - silenced
                guard case .heartbeatTimeout = events.disconnectReasons.first else {
                    Issue.record("expected a heartbeat timeout, got \(events.disconnectReasons)")
                    return
                }
                // Interval 200 ms + PONG timeout 300 ms, plus scheduling slack.
                #expect(detection < .seconds(3), "detected after \(detection)")
                #expect(proxy.openConnections >= 0)

                proxy.mode = .forward
                #expect(try await client.request("echo", body: ByteBuffer(string: "b"), timeout: .seconds(10)).string == "b")
                try await eventually("the reconnection is recorded") { events.connects >= 2 }
                await proxy.stop()
            }
        }

        @Test("a blackholed in-process link is detected and replaced the same way")
        func silentGatewayInProcess() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                _ = try harness.localGateway(
                    network: network,
                    at: endpoint,
                    configure: Self.fastHeartbeat,
                    routes: { gateway in
                        gateway.handle("echo") { request, _ in request.body }
                    }
                )
                let client = try harness.client([endpoint], transport: network.transport, configure: Self.fastClient)
                let events = harness.events(of: client)
                #expect(try await client.request("echo", body: ByteBuffer(string: "a")).string == "a")

                network.faults.blackhole()
                try await eventually("the heartbeat declares the link dead") { !events.disconnectReasons.isEmpty }
                guard case .heartbeatTimeout = events.disconnectReasons.first else {
                    Issue.record("expected a heartbeat timeout, got \(events.disconnectReasons)")
                    return
                }
                network.faults.heal()
                #expect(try await client.request("echo", body: ByteBuffer(string: "b"), timeout: .seconds(10)).string == "b")
            }
        }

        @Test("a cut connection fails the requests in flight with connectionLost; the client reconnects by itself")
        func cutConnection() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                let hang = WaitingHandler()
                _ = try harness.localGateway(
                    network: network,
                    at: endpoint,
                    routes: { gateway in
                        gateway.handle("echo") { request, _ in request.body }
                        gateway.handle("hang", hang.handler)
                    }
                )
                let client = try harness.client([endpoint], transport: network.transport)
                let events = harness.events(of: client)
                _ = try await client.request("echo")

                let inFlight = Task { try await client.request("hang", timeout: .seconds(60)) }
                try await eventually("the request is in flight") { hang.started }
                network.faults.dropConnections()
                let error = await #expect(throws: TetherError.self) { try await inFlight.value }
                #expect(error?.code == .connectionLost)

                #expect(try await client.request("echo", body: ByteBuffer(string: "again")).string == "again")
                // The recorder reads events from a stream of its own: it may lag the request.
                try await eventually("the reconnection is recorded") { events.connects >= 2 }
                #expect(events.connects == 2)
                guard case .closedByPeer = events.disconnectReasons.first else {
                    Issue.record("expected closedByPeer, got \(events.disconnectReasons)")
                    return
                }
            }
        }

        @Test("data tasks through connection cuts: each completion runs once, with its own echo or connectionLost")
        func dataTasksThroughCuts() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                _ = try harness.localGateway(
                    network: network,
                    at: endpoint,
                    routes: { gateway in
                        gateway.handleInline("echo") { request, _ in request.body }
                    }
                )
                let client = try harness.client([endpoint], transport: network.transport)
                _ = try await client.request("echo")

                let results = NIOLockedValueBox<[Int: [Result<ByteBuffer, TetherError>]]>([:])
                // 20 chains of 100 data tasks, each resumed by the completion of the one before.
                @Sendable func chain(_ index: Int, _ step: Int) {
                    guard step < 100 else { return }
                    let key = index * 100 + step
                    client.dataTask("echo", body: ByteBuffer(string: "\(key)"), timeout: .seconds(20)) { result in
                        results.withLockedValue { $0[key, default: []].append(result) }
                        chain(index, step + 1)
                    }.resume()
                }
                for index in 0..<20 { chain(index, 0) }
                for _ in 0..<3 {
                    try await Task.sleep(for: .milliseconds(15))
                    network.faults.dropConnections()
                }
                try await eventually("every data task completed", timeout: .seconds(30)) { results.withLockedValue { $0.count } == 2000 }
                try await Task.sleep(for: .milliseconds(100))  // a second completion would show by now
                var succeeded = 0
                for (key, outcomes) in results.withLockedValue({ $0 }) {
                    #expect(outcomes.count == 1, "data task \(key) completed \(outcomes.count) times")
                    switch outcomes.first {
                    case .success(let body):
                        #expect(body.string == "\(key)")
                        succeeded += 1
                    case .failure(let error):
                        #expect(error.code == .connectionLost, "data task \(key): \(error)")
                    case nil:
                        break
                    }
                }
                #expect(succeeded > 1000, "most were answered (\(succeeded))")
            }
        }

        @Test("a gateway restart: the client reconnects by itself and requests succeed again", arguments: Endpoint.Transport.allCases)
        func gatewayRestart(over transport: Endpoint.Transport) async throws {
            try await withHarness { harness in
                var configuration = GatewayConfiguration.defaults
                configuration.configureListener(transport)
                configuration.goAway.retryAfter = .milliseconds(50)
                let first = try Gateway(configuration: configuration, logger: testLogger("gateway-1"))
                first.handle("who") { _, _ in ByteBuffer(string: "first") }
                let firstRun = Task { try await first.run() }
                let port = try await (transport.isHTTP ? first.webSocketAddress : first.listeningAddress).port!
                let endpoint = Endpoint(host: "127.0.0.1", port: port, transport: transport)

                let client = try harness.client([endpoint])
                let events = harness.events(of: client)
                #expect(try await client.request("who").string == "first")

                first.shutdown()
                try await firstRun.value
                // While no gateway listens, a request waits for the next connection.
                let pending = Task { try await client.request("who", timeout: .seconds(20)) }
                try await Task.sleep(for: .milliseconds(300))

                configuration.configureListener(transport, port: port)
                let second = try Gateway(configuration: configuration, logger: testLogger("gateway-2"))
                second.handle("who") { _, _ in ByteBuffer(string: "second") }
                harness.spawn { try? await second.run() }
                harness.onExit { second.shutdown() }

                #expect(try await pending.value.string == "second")
                #expect(try await client.request("who").string == "second")
                // The recorder reads events from a stream of its own: it may lag the request.
                try await eventually("the reconnection is recorded") { events.connects >= 2 }
                #expect(events.connects == 2)
                guard case .goingAway(let goAway) = events.disconnectReasons.first else {
                    Issue.record("expected GOAWAY, got \(events.disconnectReasons)")
                    return
                }
                #expect(goAway.reason == .shutdown)
                #expect(events.all.contains { if case .connectFailed = $0 { true } else { false } }, "attempts failed while it was down")
            }
        }

        @Test("an abruptly killed gateway (no GOAWAY) is replaced the same way")
        func abruptRestart() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                })
                let proxy = TCPFaultProxy(upstream: endpoint)
                let address = try await proxy.start()
                harness.onExit { proxy.cutAll() }
                let client = try harness.client([Endpoint(host: "127.0.0.1", port: address.port!)])
                let events = harness.events(of: client)
                _ = try await client.request("echo")
                // The proxy plays the dead host: it refuses new connections and cuts the live ones.
                proxy.mode = .refuse
                proxy.cutAll()
                // (A request racing with the cut itself may have reached the gateway, so it would fail
                // with connectionLost; this one is made once the client knows it is disconnected.)
                try await eventually("the client notices") { !events.disconnectReasons.isEmpty }
                let pending = Task { try await client.request("echo", body: ByteBuffer(string: "later"), timeout: .seconds(20)) }
                try await Task.sleep(for: .milliseconds(200))
                proxy.mode = .forward
                #expect(try await pending.value.string == "later")
                await proxy.stop()
            }
        }

        @Test("endpoints are tried in turn: a dead first endpoint fails over to the second")
        func failover() async throws {
            try await withHarness { harness in
                let (_, live) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                })
                let dead = try await Self.unusedEndpoint()
                let client = try harness.client([dead, live]) { $0.connection.raceDelay = nil }
                let events = harness.events(of: client)
                #expect(try await client.request("echo", body: ByteBuffer(string: "via b")).string == "via b")
                @Sendable func attempts() -> [Endpoint] {
                    events.all.compactMap { event -> Endpoint? in
                        if case .connecting(let endpoint, _) = event { return endpoint }
                        return nil
                    }
                }
                // The recorder reads the event stream on its own task: wait for it to catch up.
                try await eventually("both attempts are recorded") { attempts().count >= 2 }
                #expect(attempts().prefix(2) == [dead, live])
                #expect(client.connectionState == .connected(live))
            }
        }

        @Test(
            "a connection that is up but failing (its requests time out, its heartbeat answers) is given up as linkFailing; the client moves to the next endpoint and penalises the first"
        )
        func failingLinkMovesOn() async throws {
            try await withHarness { harness in
                // The first gateway is alive (it answers PINGs) but its handler never answers.
                let (_, stuck) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { _, _ in
                        try await Task.sleep(for: .seconds(3600))
                        return ByteBuffer()
                    }
                })
                let (_, live) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                })
                let client = try harness.client([stuck, live]) {
                    $0.connection.raceDelay = nil
                    $0.connection.failingLink = try! .init(failureRate: 0.5, minimumRequests: 4, window: .seconds(30))
                }
                let events = harness.events(of: client)
                try await eventually("connected to the first endpoint") { client.connectionState == .connected(stuck) }
                @Sendable func givenUp() -> (timedOut: Int, of: Int)? {
                    for case .disconnected(.linkFailing(let timedOut, let total)) in events.all { return (timedOut, total) }
                    return nil
                }
                // Rounds of four requests until the client gives the link up. (On a loaded machine a
                // request's task can start after its deadline; it is then never sent, and a request
                // that was never sent is no evidence against the link: a round may count fewer.)
                for round in 0..<8 where client.connectionState == .connected(stuck) {
                    await withTaskGroup { group in
                        for index in 0..<4 {
                            group.addTask {
                                _ = try? await client.request(
                                    "echo",
                                    body: ByteBuffer(string: "\(round).\(index)"),
                                    timeout: .milliseconds(300)
                                )
                            }
                        }
                    }
                }
                try await eventually("the client gives the failing connection up") { givenUp() != nil }
                let verdict = try #require(givenUp())
                #expect(verdict.timedOut == verdict.of && verdict.of >= 4, "every request sent there timed out: \(verdict)")
                #expect(try await client.request("echo", body: ByteBuffer(string: "elsewhere")).string == "elsewhere")
                #expect(client.connectionState == .connected(live))
                #expect(
                    client.state.withLockedValue { $0.penalties.isPenalized(stuck, at: client.clock.now) },
                    "tried after the others for a while"
                )
            }
        }

        @Test(
            "an endpoint that fails where another connects is reported blocked, not offline; one that fails and then recovers is not",
            arguments: [true, false]
        )
        func blockedEndpoint(racing: Bool) async throws {
            try await withHarness { harness in
                let (_, live) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                })
                let refusing = try await Self.unusedEndpoint()
                let client = try harness.client([refusing, live], clientID: "blocked-\(racing)") {
                    if !racing { $0.connection.raceDelay = nil }
                }
                let events = harness.events(of: client)
                #expect(try await client.request("echo", body: ByteBuffer(string: "hi")).string == "hi")
                try await eventually("the refusing endpoint is reported blocked") {
                    events.all.contains { if case .endpointBlocked(refusing, _) = $0 { true } else { false } }
                }
                let blocked = events.all.compactMap { event -> TetherError? in
                    if case .endpointBlocked(_, let error) = event { return error }
                    return nil
                }
                #expect(blocked.count == 1, "once, for the refusing endpoint only: \(events.all)")
                #expect(blocked.first?.code == .notConnected)

                // A single endpoint that fails, then works (a restart), is not blocked.
                let (restarting, restartingEndpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                })
                let alone = try harness.client([restartingEndpoint], clientID: "alone-\(racing)")
                let aloneEvents = harness.events(of: alone)
                _ = try await alone.request("echo", body: ByteBuffer(string: "first"))
                restarting.shutdown()
                try await eventually("a failed attempt while it is down") {
                    aloneEvents.all.contains { if case .connectFailed = $0 { true } else { false } }
                }
                _ = try await harness.gateway(
                    port: restartingEndpoint.port,
                    routes: { gateway in
                        gateway.handle("echo") { request, _ in request.body }
                    }
                )
                #expect(try await alone.request("echo", body: ByteBuffer(string: "again")).string == "again")
                #expect(!aloneEvents.all.contains { if case .endpointBlocked = $0 { true } else { false } })
            }
        }

        @Test("racing: a refused endpoint hands over to the next within the same attempt")
        func racingFailover() async throws {
            try await withHarness { harness in
                let (_, live) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                })
                let dead = try await Self.unusedEndpoint()
                let client = try harness.client([dead, live])
                let events = harness.events(of: client)
                #expect(try await client.request("echo", body: ByteBuffer(string: "via b")).string == "via b")
                try await eventually("the connection is recorded") { events.connects == 1 }
                let attempts = events.all.filter { if case .connecting = $0 { true } else { false } }
                #expect(attempts.count == 1, "one attempt, two racers")
                #expect(client.connectionState == .connected(live))
            }
        }

        @Test("racing: a silent endpoint does not hold the attempt up; the first handshake wins, the others close")
        func racingSilentEndpoint() async throws {
            try await withHarness { harness in
                let (_, live) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                })
                // A proxy that accepts and then drops every byte: connects, never answers HELLO.
                let silent = TCPFaultProxy(upstream: live)
                let silentAddress = try await silent.start()
                silent.mode = .blackhole
                harness.onExit { silent.cutAll() }
                let client = try harness.client([Endpoint(host: "127.0.0.1", port: silentAddress.port!), live]) {
                    $0.connection.handshakeTimeout = .seconds(10)
                }
                let started = ContinuousClock.now
                #expect(try await client.request("echo", body: ByteBuffer(string: "raced")).string == "raced")
                #expect(ContinuousClock.now - started < .seconds(5), "the second racer starts after 250 ms, not after the 10 s timeout")
                #expect(client.connectionState == .connected(live))
                try await eventually("the losing racer is closed") { silent.openConnections == 0 }
            }
        }

        @Test("racing and endpoint bans follow the client's injected clock: a manual clock starts the next racer and lifts the ban")
        func racingOnInjectedClock() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let stalled = Endpoint(host: "stalled", port: 1)
                let refusing = Endpoint(host: "refusing", port: 1)
                let live = Endpoint(host: "live", port: 1)
                let gateway = try harness.localGateway(
                    network: network,
                    at: live,
                    routes: { gateway in
                        gateway.handle("echo") { request, _ in request.body }
                    }
                )
                network.attach(gateway, at: stalled)
                network.faults.stall(stalled)
                network.faults.refuse(refusing)
                let clock = ManualClock()
                let client = try harness.client([stalled, refusing, live], transport: network.transport, clock: clock) {
                    $0.connection.connectTimeout = .seconds(60)
                }
                // The first racer hangs on the stalled endpoint; the next one waits for the clock.
                await clock.waitForSleepers(1)
                try await Task.sleep(for: .milliseconds(400))
                #expect(client.connectionState == .connecting(stalled), "real time does not start the next racer")
                clock.advance(by: .milliseconds(250))  // the second racer: refused at once, which starts the third
                try await eventually("connected to the live endpoint") { client.connectionState == .connected(live) }
                #expect(try await client.request("echo", body: ByteBuffer(string: "raced")).string == "raced")

                // The refusal banned its endpoint, on the client's clock: until 30 s pass on it.
                func banned() -> Bool { client.state.withLockedValue { $0.penalties.isPenalized(refusing, at: client.clock.now) } }
                #expect(banned())
                clock.advance(by: .seconds(29))
                #expect(banned())
                clock.advance(by: .seconds(1))
                #expect(!banned(), "the ban ends when the injected clock says so")
                network.faults.heal()
            }
        }

        @Test("GOAWAY with an alternate endpoint moves the client there", arguments: Endpoint.Transport.allCases)
        func goAwayRedirect(over transport: Endpoint.Transport) async throws {
            try await withHarness { harness in
                let (_, secondEndpoint) = try await harness.gateway(
                    transport: transport,
                    routes: { second in
                        second.handle("who") { _, _ in ByteBuffer(string: "second") }
                    }
                )
                let (first, firstEndpoint) = try await harness.gateway(
                    transport: transport,
                    configure: { $0.goAway = .init(retryAfter: .milliseconds(10), alternateEndpoint: secondEndpoint) },
                    routes: { first in first.handle("who") { _, _ in ByteBuffer(string: "first") } }
                )

                let client = try harness.client([firstEndpoint])
                #expect(try await client.request("who").string == "first")
                first.shutdown()
                try await eventually("the client follows the redirect") { client.connectionState == .connected(secondEndpoint) }
                #expect(try await client.request("who").string == "second")
            }
        }

        @Test("a request made before run() waits, and times out saying the client is not running")
        func notRunning() async throws {
            let client = try TetherClient(configuration: .init(endpoints: [Endpoint(host: "127.0.0.1", port: 1)], clientID: "idle"))
            let error = await #expect(throws: TetherError.self) { try await client.request("echo", timeout: .milliseconds(100)) }
            #expect(error?.code == .timedOut)
            #expect(error?.message.contains("not running") == true)
            client.shutdown()
            let afterShutdown = await #expect(throws: TetherError.self) { try await client.request("echo", timeout: .seconds(5)) }
            #expect(afterShutdown?.code == .shutdown)
        }

        @Test("after maxAttempts failures the client gives up: run() throws, waiting requests fail, events say failed")
        func givesUp() async throws {
            let dead = try await Self.unusedEndpoint()
            var configuration = ClientConfiguration(endpoints: [dead], clientID: "doomed")
            configuration.reconnect.backoff = try Backoff(initial: .milliseconds(10), maximum: .milliseconds(20), maxAttempts: 3)
            let client = try TetherClient(configuration: configuration, logger: testLogger("client"))
            let events = client.events
            let waiting = Task { try await client.request("echo", timeout: .seconds(30)) }
            let runError = await #expect(throws: TetherError.self) { try await client.run() }
            #expect(runError?.code == .notConnected)
            #expect(runError?.message.contains("3") == true)
            let waitingError = await #expect(throws: TetherError.self) { try await waiting.value }
            #expect(waitingError?.code == .notConnected)
            var sawFailed = false
            var connectAttempts = 0
            for await event in events {
                if case .failed = event { sawFailed = true }
                if case .connecting = event { connectAttempts += 1 }
            }
            #expect(sawFailed)
            #expect(connectAttempts == 3)
            #expect(client.connectionState == .failed)
        }

        @Test("backoff delays come from the injected clock: no retry until the clock moves")
        func backoffOnManualClock() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                _ = try harness.localGateway(
                    network: network,
                    at: endpoint,
                    routes: { gateway in
                        gateway.handle("echo") { request, _ in request.body }
                    }
                )
                network.faults.refuse(endpoint)
                let clock = ManualClock()
                let client = try harness.client([endpoint], transport: network.transport, clock: clock) {
                    $0.reconnect.backoff = try! Backoff(initial: .seconds(1), maximum: .seconds(8), multiplier: 2, jitter: 0)
                }
                let events = harness.events(of: client)
                let pending = Task { try await client.request("echo", body: ByteBuffer(string: "finally"), timeout: .seconds(30)) }

                @Sendable func attempts() -> Int { events.all.filter { if case .connecting = $0 { true } else { false } }.count }
                @Sendable func lastDelay() -> Duration? {
                    events.all.compactMap { if case .backingOff(let delay, _) = $0 { delay } else { nil } }.last
                }

                await clock.waitForSleepers(1)
                try await eventually("the recorder sees the first backoff") { lastDelay() != nil }
                #expect(attempts() == 1)
                #expect(lastDelay() == .seconds(1))
                // Real time passes, the manual clock does not: no second attempt.
                try await Task.sleep(for: .milliseconds(200))
                #expect(attempts() == 1)

                clock.advance(by: .seconds(1))
                try await eventually("the second attempt fails and backs off longer") { lastDelay() == .seconds(2) }
                #expect(attempts() == 2)
                await clock.waitForSleepers(1)

                network.faults.heal()
                clock.advance(by: .milliseconds(1999))
                try await Task.sleep(for: .milliseconds(100))
                #expect(attempts() == 2, "1999 ms of a 2 s backoff is not enough")
                clock.advance(by: .milliseconds(1))
                #expect(try await pending.value.string == "finally")
                #expect(attempts() == 3)
            }
        }

        @Test("shutting the client down: requests in flight finish, new ones fail with shutdown")
        func clientShutdown() async throws {
            try await withHarness { harness in
                let slow = WaitingHandler(waitsFor: .milliseconds(300))
                let (_, endpoint) = try await harness.gateway(routes: { gateway in gateway.handle("slow", slow.handler) })
                var configuration = ClientConfiguration(endpoints: [endpoint], clientID: "leaving")
                configuration.requests.defaultTimeout = .seconds(10)
                let client = try TetherClient(configuration: configuration, logger: testLogger("client"))
                let run = Task { try await client.run() }
                let inFlight = Task { try await client.request("slow", body: ByteBuffer(string: "done")) }
                try await eventually("the request is in flight") { slow.started }
                client.shutdown()
                let refused = await #expect(throws: TetherError.self) { try await client.request("slow") }
                #expect(refused?.code == .shutdown)
                #expect(try await inFlight.value.string == "done")
                try await run.value
                #expect(client.connectionState == .shutDown)
            }
        }

        @Test("cancelling the tasks that run a client and a gateway stops both")
        func cancellation() async throws {
            var configuration = GatewayConfiguration.defaults
            configuration.listen = .init(host: "127.0.0.1", port: 0)
            let gateway = try Gateway(configuration: configuration, logger: testLogger("gateway"))
            gateway.handle("echo") { request, _ in request.body }
            let gatewayRun = Task { try await gateway.run() }
            let endpoint = Endpoint(host: "127.0.0.1", port: try await gateway.listeningAddress.port!)
            let client = try TetherClient(configuration: .init(endpoints: [endpoint], clientID: "c"), logger: testLogger("client"))
            let clientRun = Task { try await client.run() }
            #expect(try await client.request("echo", body: ByteBuffer(string: "x")).string == "x")

            clientRun.cancel()
            try await clientRun.value
            #expect(client.connectionState == .shutDown)
            gatewayRun.cancel()
            _ = try? await gatewayRun.value  // returns (a cancelled accept loop may throw CancellationError)
            try await eventually("the gateway has no connection left") { gateway.connections.isEmpty }
        }

        /// An endpoint on which nothing listens (a port that was just free).
        static func unusedEndpoint() async throws -> Endpoint {
            let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).get()
            let port = channel.localAddress!.port!
            try await channel.close()
            return Endpoint(host: "127.0.0.1", port: port)
        }
    }
}
