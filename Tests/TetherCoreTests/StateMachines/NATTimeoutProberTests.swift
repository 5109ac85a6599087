import Testing
import TetherCore

@Suite("NAT timeout prober")
struct NATTimeoutProberTests {
    func prober(
        initial: Int64 = 60,
        step: Int64 = 30,
        minimum: Int64 = 15,
        maximum: Int64 = 600,
        failures: Int = 2,
        reprobeAfter: Int? = nil,
        networks: Int = 32
    ) throws -> NATTimeoutProber {
        NATTimeoutProber(
            configuration: try .init(
                initialInterval: .seconds(initial),
                step: .seconds(step),
                minimumInterval: .seconds(minimum),
                maximumInterval: .seconds(maximum),
                failuresToBackOff: failures,
                reprobeAfter: reprobeAfter,
                maximumNetworks: networks
            )
        )
    }

    /// Runs idle probes on `network` against a NAT that forgets connections idle longer than
    /// `natTimeout`, and returns the intervals used.
    func search(_ prober: inout NATTimeoutProber, network: String, natTimeout: Duration, probes: Int) -> [Duration] {
        var used: [Duration] = []
        for _ in 0..<probes {
            let interval = prober.interval(for: network)
            used.append(interval)
            if interval < natTimeout {
                prober.probeSucceeded(network: network, interval: interval)
            } else {
                prober.probeFailed(network: network, interval: interval)
            }
        }
        return used
    }

    @Test("grows while probes are answered, backs off below the longest safe interval after two failures, then stays")
    func findsTheTimeout() throws {
        var prober = try self.prober()
        let used = self.search(&prober, network: "wifi", natTimeout: .seconds(200), probes: 12)
        // 180 s survived, 210 s did not: settle 10 % below 180 s, away from the NAT's edge.
        #expect(used.map { $0 / .seconds(1) } == [60, 90, 120, 150, 180, 210, 210, 162, 162, 162, 162, 162])
        #expect(prober.isSettled("wifi"))
        #expect(prober.networks["wifi"]?.longestSafe == .seconds(180))
        #expect(prober.networks["wifi"]?.failedAt == .seconds(210))
    }

    @Test("one failure is not enough: a link can die for other reasons")
    func oneFailureIsForgiven() throws {
        var prober = try self.prober()
        prober.probeSucceeded(network: "wifi", interval: .seconds(60))
        #expect(prober.probeFailed(network: "wifi", interval: .seconds(90)) == .unchanged)
        #expect(prober.probeSucceeded(network: "wifi", interval: .seconds(90)) == .grew(to: .seconds(120)))
        #expect(prober.probeFailed(network: "wifi", interval: .seconds(120)) == .unchanged)
        #expect(prober.probeSucceeded(network: "wifi", interval: .seconds(120)) == .grew(to: .seconds(150)))
        #expect(!prober.isSettled("wifi"))
    }

    @Test("a network whose timeout is below the initial interval steps down to the minimum, never below")
    func shortTimeout() throws {
        var prober = try self.prober()
        let used = self.search(&prober, network: "cell", natTimeout: .seconds(20), probes: 9)
        #expect(used.map { $0 / .seconds(1) } == [60, 60, 30, 30, 15, 15, 15, 15, 15])
        #expect(prober.isSettled("cell"))
    }

    @Test("each network keeps its own interval, and the least recently used is forgotten")
    func perNetwork() throws {
        var prober = try self.prober(networks: 2)
        _ = self.search(&prober, network: "home", natTimeout: .seconds(100), probes: 6)
        _ = self.search(&prober, network: "cell", natTimeout: .seconds(40), probes: 6)
        #expect(prober.interval(for: "home") == .seconds(81))
        #expect(prober.interval(for: "cell") == .seconds(30))
        #expect(prober.interval(for: "office") == .seconds(60), "an unknown network starts at the initial interval")
        prober.probeSucceeded(network: "home", interval: .seconds(90))  // home is used again
        prober.probeSucceeded(network: "office", interval: .seconds(60))
        #expect(prober.networks.keys.sorted() == ["home", "office"])
        #expect(prober.interval(for: "cell") == .seconds(60), "cell was forgotten")
    }

    @Test("reports for another interval do not move the search")
    func staleReports() throws {
        var prober = try self.prober()
        // A foreground heartbeat (10 s) was answered: safe, but no reason to grow.
        #expect(prober.probeSucceeded(network: "wifi", interval: .seconds(10)) == .unchanged)
        #expect(prober.interval(for: "wifi") == .seconds(60))
        // A connection still at an older, shorter interval died: not this interval's failure.
        prober.probeFailed(network: "wifi", interval: .seconds(30))
        prober.probeFailed(network: "wifi", interval: .seconds(30))
        #expect(prober.interval(for: "wifi") == .seconds(60))
        // A longer silence than the current interval survived: the current one is safe too.
        #expect(prober.probeSucceeded(network: "wifi", interval: .seconds(75)) == .grew(to: .seconds(90)))
    }

    @Test("an interval once safe that now fails twice steps down; a success above a failure clears it")
    func networkChangesItsMind() throws {
        var prober = try self.prober()
        _ = self.search(&prober, network: "wifi", natTimeout: .seconds(100), probes: 6)
        #expect(prober.interval(for: "wifi") == .seconds(81))
        // The router now forgets after 70 s.
        prober.probeFailed(network: "wifi", interval: .seconds(81))
        #expect(prober.probeFailed(network: "wifi", interval: .seconds(81)) == .backedOff(to: .seconds(51)))
        #expect(prober.networks["wifi"]?.longestSafe == nil)
        #expect(prober.isSettled("wifi"))
        // Evidence that 90 s is fine after all (a long silence survived): the search resumes.
        prober.probeSucceeded(network: "wifi", interval: .seconds(95))
        #expect(prober.networks["wifi"]?.failedAt == nil)
        #expect(!prober.isSettled("wifi"))
    }

    @Test("a settled network is probed again after enough successes, when asked to")
    func reprobe() throws {
        var prober = try self.prober(reprobeAfter: 3)
        // 60 and 90 answered, 120 failed twice: settled at 81.
        _ = self.search(&prober, network: "wifi", natTimeout: .seconds(100), probes: 4)
        #expect(prober.interval(for: "wifi") == .seconds(81))
        #expect(prober.isSettled("wifi"))
        #expect(prober.probeSucceeded(network: "wifi", interval: .seconds(81)) == .unchanged)
        #expect(prober.probeSucceeded(network: "wifi", interval: .seconds(81)) == .unchanged)
        #expect(prober.probeSucceeded(network: "wifi", interval: .seconds(81)) == .grew(to: .seconds(111)))
    }

    @Test("the maximum caps growth")
    func maximum() throws {
        var prober = try self.prober(maximum: 100)
        let used = self.search(&prober, network: "wifi", natTimeout: .seconds(1000), probes: 5)
        #expect(used.map { $0 / .seconds(1) } == [60, 90, 100, 100, 100])
        #expect(prober.isSettled("wifi"))
    }

    @Test("configuration out of range is rejected with a clear error")
    func validation() {
        #expect(throws: ConfigurationError.self) { try NATTimeoutProber.Configuration(step: .zero) }
        #expect(throws: ConfigurationError.self) {
            try NATTimeoutProber.Configuration(initialInterval: .seconds(10), minimumInterval: .seconds(15))
        }
        #expect(throws: ConfigurationError.self) { try NATTimeoutProber.Configuration(failuresToBackOff: 0) }
        #expect(throws: ConfigurationError.self) { try NATTimeoutProber.Configuration(reprobeAfter: 0) }
        #expect(throws: ConfigurationError.self) { try NATTimeoutProber.Configuration(maximumNetworks: 0) }
        #expect(throws: ConfigurationError.self) { try NATTimeoutProber.Configuration(settleMargin: 0.6) }
    }
}
