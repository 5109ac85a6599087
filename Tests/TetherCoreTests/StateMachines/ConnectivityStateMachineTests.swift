import Testing

@testable import TetherCore

@Suite("Connectivity state machine")
struct ConnectivityStateMachineTests {
    let a = Endpoint(host: "a", port: 1)
    let b = Endpoint(host: "b", port: 2)
    let x = Endpoint(host: "x", port: 3)

    func machine(
        endpoints: [Endpoint]? = nil,
        initial: Duration = .seconds(1),
        maximum: Duration = .seconds(5),
        jitter: Double = 0,
        maxAttempts: Int? = nil
    ) throws -> ConnectivityStateMachine {
        let backoff = try Backoff(initial: initial, maximum: maximum, multiplier: 2, jitter: jitter, maxAttempts: maxAttempts)
        return ConnectivityStateMachine(
            configuration: .init(endpoints: endpoints ?? [self.a], backoff: backoff, stableAfter: .seconds(10)),
            generator: SplitMix64(seed: 1)
        )
    }

    @Test("start connects to the first endpoint")
    func start() throws {
        var machine = try self.machine()
        #expect(machine.start() == .connect(self.a, attempt: 1))
        #expect(machine.state == .connecting(self.a, attempt: 1))
    }

    @Test("a failed endpoint fails over to the next at once; a failed round backs off")
    func failover() throws {
        var machine = try self.machine(endpoints: [self.a, self.b])
        _ = machine.start()
        #expect(machine.connectFailed() == .connect(self.b, attempt: 2))
        #expect(machine.connectFailed() == .backOff(.seconds(1), next: self.a))
        #expect(machine.state == .backingOff(.seconds(1), next: self.a))
        #expect(machine.backoffElapsed() == .connect(self.a, attempt: 3))
        #expect(machine.connectFailed() == .connect(self.b, attempt: 4))
        #expect(machine.connectFailed() == .backOff(.seconds(2), next: self.a))
    }

    @Test("delays grow exponentially up to the maximum")
    func exponentialBackoff() throws {
        var machine = try self.machine()
        _ = machine.start()
        var delays: [Duration] = []
        for _ in 0..<6 {
            guard case .backOff(let delay, _) = machine.connectFailed() else {
                Issue.record("expected a backoff")
                return
            }
            delays.append(delay)
            _ = machine.backoffElapsed()
        }
        #expect(delays == [.seconds(1), .seconds(2), .seconds(4), .seconds(5), .seconds(5), .seconds(5)])
    }

    @Test("jitter stays within its bounds and is reproducible from the seed")
    func jitter() throws {
        func delays() throws -> [Duration] {
            var machine = try self.machine(initial: .seconds(1), maximum: .seconds(100), jitter: 0.5)
            _ = machine.start()
            return (0..<5).map { _ in
                guard case .backOff(let delay, _) = machine.connectFailed() else { return .zero }
                _ = machine.backoffElapsed()
                return delay
            }
        }
        let first = try delays()
        #expect(first == (try delays()))
        for (index, delay) in first.enumerated() {
            let base = Double(1 << index)
            let seconds = Backoff.seconds(delay)
            #expect(seconds >= base * 0.5 && seconds <= base * 1.5, "attempt \(index + 1): \(delay)")
        }
        #expect(Set(first.map { Backoff.seconds($0) / Double(1 << first.firstIndex(of: $0)!) }).count > 1, "jitter must vary")
    }

    @Test("the attempt limit ends in failed")
    func maxAttempts() throws {
        var machine = try self.machine(maxAttempts: 3)
        _ = machine.start()
        _ = machine.connectFailed()
        _ = machine.backoffElapsed()
        _ = machine.connectFailed()
        _ = machine.backoffElapsed()
        #expect(machine.connectFailed() == .fail(attempts: 3))
        #expect(machine.state == .failed(attempts: 3))
        #expect(machine.shutdown() == .stop)
    }

    @Test("a stable connection that drops reconnects to the same endpoint within the initial delay and resets failures")
    func stableDrop() throws {
        var machine = try self.machine(endpoints: [self.a, self.b])
        _ = machine.start()
        _ = machine.connectFailed()  // a fails, b is tried
        #expect(machine.connectSucceeded() == .serve)
        #expect(machine.state == .connected(self.b))
        guard case .backOff(let delay, let next) = machine.connectionClosed(uptime: .seconds(60)) else {
            Issue.record("expected a backoff")
            return
        }
        #expect(next == self.b)
        #expect(delay >= .zero && delay <= .seconds(1))
        #expect(machine.failures == 0)
        #expect(machine.backoffElapsed() == .connect(self.b, attempt: 1))
    }

    @Test("a connection that drops before it is stable counts as a failure")
    func unstableDrop() throws {
        var machine = try self.machine(maxAttempts: 3)
        _ = machine.start()
        _ = machine.connectSucceeded()
        #expect(machine.connectionClosed(uptime: .milliseconds(100)) == .backOff(.seconds(1), next: self.a))
        #expect(machine.backoffElapsed() == .connect(self.a, attempt: 2))
        _ = machine.connectSucceeded()
        #expect(machine.connectionClosed(uptime: .milliseconds(100)) == .backOff(.seconds(2), next: self.a))
        _ = machine.backoffElapsed()
        _ = machine.connectSucceeded()
        #expect(machine.connectionClosed(uptime: .milliseconds(100)) == .fail(attempts: 3))
    }

    @Test("GOAWAY stops dispatching; after the close the client waits retry-after and goes to the alternate")
    func goAwayWithAlternate() throws {
        var machine = try self.machine(endpoints: [self.a, self.b])
        _ = machine.start()
        _ = machine.connectSucceeded()
        #expect(machine.goAwayReceived(retryAfter: .seconds(2), alternate: self.x) == true)
        #expect(machine.state == .draining(self.a))
        #expect(machine.connectionClosed(uptime: .seconds(60)) == .backOff(.seconds(2), next: self.x))
        #expect(machine.backoffElapsed() == .connect(self.x, attempt: 1))
        // The alternate is used once; if it fails the list takes over at once.
        #expect(machine.connectFailed() == .connect(self.a, attempt: 2))
    }

    @Test("GOAWAY revoked: the client does not connect again once the connection closed, even when the network changes")
    func goAwayRevoked() throws {
        var machine = try self.machine(endpoints: [self.a, self.b])
        _ = machine.start()
        _ = machine.connectSucceeded()
        #expect(machine.goAwayReceived(retryAfter: .seconds(1), alternate: self.x, revoked: true) == true)
        #expect(machine.connectionClosed(uptime: .seconds(60)) == .revoked)
        #expect(machine.state == .failed(attempts: 0))
        #expect(machine.pathChanged(NetworkPath(isAvailable: true, identity: "home")) == .none)
        // A second GOAWAY on a draining connection keeps the revocation.
        var draining = try self.machine(endpoints: [self.a])
        _ = draining.start()
        _ = draining.connectSucceeded()
        _ = draining.goAwayReceived(retryAfter: .zero, alternate: nil, revoked: true)
        _ = draining.goAwayReceived(retryAfter: .zero, alternate: nil)
        #expect(draining.connectionClosed(uptime: .seconds(1)) == .revoked)
    }

    @Test("GOAWAY without an alternate moves to the next endpoint of the list")
    func goAwayWithoutAlternate() throws {
        var machine = try self.machine(endpoints: [self.a, self.b])
        _ = machine.start()
        _ = machine.connectSucceeded()
        _ = machine.goAwayReceived(retryAfter: .zero, alternate: nil)
        #expect(machine.connectionClosed(uptime: .seconds(1)) == .backOff(.zero, next: self.b))
    }

    @Test("shutdown from every state", arguments: ["idle", "connecting", "connected", "draining", "backingOff", "failed"])
    func shutdown(from state: String) throws {
        var machine = try self.machine(maxAttempts: 1)
        var expected = ConnectivityStateMachine.ShutdownAction.stop
        switch state {
        case "idle":
            break
        case "connecting":
            _ = machine.start()
        case "connected":
            _ = machine.start()
            _ = machine.connectSucceeded()
            expected = .closeConnection
        case "draining":
            _ = machine.start()
            _ = machine.connectSucceeded()
            _ = machine.goAwayReceived(retryAfter: .zero, alternate: nil)
            expected = .closeConnection
        case "backingOff":
            var unlimited = try self.machine()
            _ = unlimited.start()
            _ = unlimited.connectFailed()
            machine = unlimited
        case "failed":
            _ = machine.start()
            _ = machine.connectFailed()
        default:
            Issue.record("unknown state \(state)")
        }
        #expect(machine.shutdown() == expected)
        #expect(machine.state == .shutDown)
        #expect(machine.shutdown() == .none)
        #expect(machine.start() == .stop)
    }

    @Test("events that race with shutdown resolve to closing or stopping")
    func racesWithShutdown() throws {
        var connecting = try self.machine()
        _ = connecting.start()
        _ = connecting.shutdown()
        #expect(connecting.connectSucceeded() == .closeConnection)

        var failing = try self.machine()
        _ = failing.start()
        _ = failing.shutdown()
        #expect(failing.connectFailed() == .stop)

        var sleeping = try self.machine()
        _ = sleeping.start()
        _ = sleeping.connectFailed()
        _ = sleeping.shutdown()
        #expect(sleeping.backoffElapsed() == .stop)

        var connected = try self.machine()
        _ = connected.start()
        _ = connected.connectSucceeded()
        _ = connected.shutdown()
        #expect(connected.goAwayReceived(retryAfter: .zero, alternate: nil) == false)
        #expect(connected.connectionClosed(uptime: .seconds(1)) == .stop)
    }
}

@Suite("Backoff and endpoints")
struct BackoffTests {
    @Test("invalid backoff values are rejected with a clear message")
    func validation() {
        #expect(throws: ConfigurationError.self) { try Backoff(initial: .seconds(2), maximum: .seconds(1)) }
        #expect(throws: ConfigurationError.self) { try Backoff(multiplier: 0.5) }
        #expect(throws: ConfigurationError.self) { try Backoff(jitter: 1.5) }
        #expect(throws: ConfigurationError.self) { try Backoff(maxAttempts: 0) }
    }

    @Test("endpoints parse host:port and [IPv6]:port and reject the rest")
    func endpoints() throws {
        #expect(try Endpoint(parsing: "localhost:7700") == Endpoint(host: "localhost", port: 7700))
        #expect(try Endpoint(parsing: "[::1]:80") == Endpoint(host: "::1", port: 80))
        #expect(Endpoint(host: "::1", port: 80).description == "[::1]:80")
        for bad in ["localhost", ":80", "host:99999", "host:port", "::1:80", "[::1]80"] {
            #expect(throws: EndpointParseError.self, "\(bad)") { try Endpoint(parsing: bad) }
        }
    }

    @Test("endpoints parse as URLs of the six transports; each prints back as it parses")
    func endpointURLs() throws {
        #expect(try Endpoint(parsing: "tether://gw.example.com:7700") == Endpoint(host: "gw.example.com", port: 7700))
        #expect(try Endpoint(parsing: "TETHER://[::1]:80/") == Endpoint(host: "::1", port: 80))
        #expect(try Endpoint(parsing: "tethers://gw:7701") == Endpoint(host: "gw", port: 7701, transport: .tls))
        #expect(try Endpoint(parsing: "ws://gw:80/tether") == Endpoint(host: "gw", port: 80, transport: .webSocket))
        #expect(
            try Endpoint(parsing: "wss://gw/custom/path")
                == Endpoint(host: "gw", port: 443, transport: .secureWebSocket, path: "/custom/path")
        )
        #expect(try Endpoint(parsing: "ws://[::1]") == Endpoint(host: "::1", port: 80, transport: .webSocket, path: "/tether"))
        #expect(try Endpoint(parsing: "wss://[::1]:8443/") == Endpoint(host: "::1", port: 8443, transport: .secureWebSocket))
        #expect(try Endpoint(parsing: "http://gw") == Endpoint(host: "gw", port: 80, transport: .httpStream, path: "/tether/stream"))
        #expect(
            try Endpoint(parsing: "https://[::1]:8443/s") == Endpoint(host: "::1", port: 8443, transport: .secureHTTPStream, path: "/s")
        )
        #expect(try Endpoint(parsing: "https://gw/").path == Endpoint.defaultHTTPStreamPath)
        #expect(Endpoint(host: "gw", port: 1, transport: .tls, path: "/ignored").path == nil, "TCP and TLS have no path")
        for text in [
            "gw:7700", "tethers://gw:7701", "ws://gw:80/tether", "wss://[::1]:443/a/b", "http://gw:80/tether/stream", "https://gw:443/x",
        ] {
            #expect(try Endpoint(parsing: text).description == text)
            #expect(try Endpoint(parsing: Endpoint(parsing: text).description) == Endpoint(parsing: text))
        }
        let bad = [
            ("ftp://gw:80/tether", "scheme 'ftp'"), ("tether://gw:80/path", "no path"), ("tethers://gw:80/x", "no path"),
            ("tether://gw", "host:port"), ("wss://gw:99999/", "port"), ("ws://gw:80/tether?x=1", "no query"),
            ("https://gw/s#f", "no query"),
        ]
        for (text, reason) in bad {
            do {
                _ = try Endpoint(parsing: text)
                Issue.record("\(text) must not parse")
            } catch {
                #expect(error.reason.contains(reason), "\(text): \(error.reason)")
                #expect(error.text == text, "the error names the whole text")
            }
        }
    }
}

@Suite("Connectivity state machine, network path")
struct ConnectivityPathTests {
    let a = Endpoint(host: "a", port: 1)
    let b = Endpoint(host: "b", port: 2)
    let wifi = NetworkPath(isAvailable: true, identity: "wifi")
    let cellular = NetworkPath(isAvailable: true, identity: "cellular")

    func machine(endpoints: [Endpoint]? = nil, maxAttempts: Int? = nil) throws -> ConnectivityStateMachine {
        let backoff = try Backoff(initial: .seconds(1), maximum: .seconds(30), multiplier: 2, jitter: 0, maxAttempts: maxAttempts)
        return ConnectivityStateMachine(
            configuration: .init(endpoints: endpoints ?? [self.a], backoff: backoff, stableAfter: .seconds(10)),
            generator: SplitMix64(seed: 1)
        )
    }

    @Test("without a network, a failed attempt waits for one (no backoff, no other endpoint, not counted)")
    func waitsForPath() throws {
        var machine = try self.machine(endpoints: [self.a, self.b], maxAttempts: 2)
        #expect(machine.pathChanged(self.wifi) == .none)
        _ = machine.start()
        #expect(machine.pathChanged(.unavailable) == .none, "the attempt in flight ends by itself")
        #expect(machine.connectFailed() == .waitForPath(next: self.a))
        #expect(machine.state == .waitingForPath(next: self.a))
        #expect(machine.failures == 0, "no network is not the gateway's fault")
        #expect(machine.pathChanged(.unavailable) == .none)
        #expect(machine.pathChanged(self.wifi) == .connect(self.a, attempt: 1), "at once when it comes back")
    }

    @Test("a network that comes back cuts a backoff short and resets it")
    func restoredDuringBackoff() throws {
        var machine = try self.machine()
        _ = machine.start()
        #expect(machine.connectFailed() == .backOff(.seconds(1), next: self.a))
        #expect(machine.backoffElapsed() == .connect(self.a, attempt: 2))
        #expect(machine.connectFailed() == .backOff(.seconds(2), next: self.a))
        #expect(machine.pathChanged(self.wifi) == .none, "the first report is no change")
        #expect(machine.pathChanged(self.cellular) == .connect(self.a, attempt: 3))
        #expect(machine.connectFailed() == .backOff(.seconds(1), next: self.a), "the backoff starts over")
    }

    @Test("a path change under an established connection closes it and reconnects without delay")
    func changedWhileConnected() throws {
        var machine = try self.machine()
        #expect(machine.pathChanged(self.wifi) == .none)
        _ = machine.start()
        _ = machine.connectSucceeded()
        #expect(machine.pathChanged(self.wifi) == .none, "the same network: nothing to do")
        #expect(machine.pathChanged(self.cellular) == .closeConnection)
        #expect(machine.connectionClosed(uptime: .seconds(1)) == .connect(self.a, attempt: 1))
    }

    @Test("the endpoint that worked is remembered per network: back on a network, attempts start there; a new network starts at the top")
    func rememberedPerNetwork() throws {
        var machine = try self.machine(endpoints: [self.a, self.b])
        #expect(machine.pathChanged(self.wifi) == .none)
        _ = machine.start()
        #expect(machine.connectFailed() == .connect(self.b, attempt: 2), "a is blocked on this Wi-Fi")
        #expect(machine.connectSucceeded() == .serve)
        // On cellular (never seen), the list's first is tried again, and works.
        #expect(machine.pathChanged(self.cellular) == .closeConnection)
        #expect(machine.connectionClosed(uptime: .seconds(60)) == .connect(self.a, attempt: 1))
        #expect(machine.connectSucceeded() == .serve)
        // Back on the Wi-Fi: straight to b, no attempt wasted on a.
        #expect(machine.pathChanged(self.wifi) == .closeConnection)
        #expect(machine.connectionClosed(uptime: .seconds(60)) == .connect(self.b, attempt: 1))
        #expect(machine.connectSucceeded() == .serve)
        // Lost, then the same Wi-Fi again while waiting for a path: b.
        #expect(machine.pathChanged(.unavailable) == .none)
        #expect(machine.connectionClosed(uptime: .seconds(60)) == .waitForPath(next: self.b))
        #expect(machine.pathChanged(self.wifi) == .connect(self.b, attempt: 1))
    }

    @Test("a monitor's first report, after the client connected, remembers that connection's endpoint for that network")
    func firstReportRemembers() throws {
        var machine = try self.machine(endpoints: [self.a, self.b])
        _ = machine.start()
        #expect(machine.connectFailed() == .connect(self.b, attempt: 2))
        #expect(machine.connectSucceeded() == .serve)
        #expect(machine.pathChanged(self.wifi) == .none, "the first report is no change")
        #expect(machine.pathChanged(self.cellular) == .closeConnection)
        #expect(machine.connectionClosed(uptime: .seconds(60)) == .connect(self.a, attempt: 1))
        #expect(machine.connectSucceeded() == .serve)
        #expect(machine.pathChanged(self.wifi) == .closeConnection)
        #expect(machine.connectionClosed(uptime: .seconds(60)) == .connect(self.b, attempt: 1), "b is what worked on this Wi-Fi")
    }

    @Test("a connection lost while there is no network waits for one")
    func lostWithoutNetwork() throws {
        var machine = try self.machine()
        _ = machine.start()
        _ = machine.connectSucceeded()
        #expect(machine.pathChanged(.unavailable) == .none, "TCP may survive a short outage")
        #expect(machine.connectionClosed(uptime: .seconds(60)) == .waitForPath(next: self.a))
        #expect(machine.shutdown() == .stop)
        #expect(machine.pathChanged(self.wifi) == .none, "shut down: nothing more")
    }
}
