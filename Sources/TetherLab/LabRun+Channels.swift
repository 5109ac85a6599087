import Foundation
import Logging
import NIOCore
import Tether
import TetherCore
import TetherFaultProxy
import TetherNIO

extension ScenarioRun {
    /// The channels experiment: a gateway whose channels keep `history` publications (in its
    /// SQLite store), subscribers spread over the channels, each behind a proxy of its own, and
    /// a publisher at `rate`. Each subscriber's link is cut once (its connections dropped, new
    /// ones refused) at a seeded random time for a seeded random length; packets to and from
    /// the gateway are dropped at the scenario's loss. Once the publisher stops and every link
    /// is back, every subscriber must reach its channel's top with each publication once and
    /// in order, or a gap event exactly where the history ran out.
    func run(_ setup: Scenario.ChannelsSetup) async throws -> ScenarioResult {
        let scenario = self.scenario
        let gateway = GatewayProcess(
            executable: self.lab.executable,
            port: try await GatewayProcess.freePort(),
            store: "\(self.directory)/gateway.sqlite",
            heartbeat: scenario.heartbeatInterval,
            logFile: "\(self.directory)/gateway.log",
            extraArguments: [
                "--channel-history", "\(setup.history)", "--channel-history-age", "3600", "--channel-clients-publish",
            ]
        )
        try await gateway.start()
        defer { gateway.kill() }
        let upstream = Endpoint(host: "127.0.0.1", port: gateway.port)
        if scenario.loss > 0 { try self.lab.packetFilter?.drop(probability: scenario.loss, ports: [gateway.port]) }

        let channels = (0..<setup.channels).map { "lab.room\($0)" }
        var subscribers: [(name: String, channel: String, proxy: TCPFaultProxy, client: TetherClient)] = []
        for index in 0..<setup.clients {
            let proxy = TCPFaultProxy(upstream: upstream)
            let endpoint = Endpoint(host: "127.0.0.1", port: try await proxy.start().port!)
            subscribers.append(("s\(index)", channels[index % channels.count], proxy, try self.channelClient("s\(index)", endpoint)))
        }
        defer { for subscriber in subscribers { Task { await subscriber.proxy.stop() } } }
        let publisher = try self.channelClient("publisher", upstream)
        self.say(
            "gateway on \(gateway.port) keeping \(setup.history) per channel, \(subscribers.count) subscribers in \(channels.count) channels"
                + String(format: ", dropping %.0f %% of packets", scenario.loss * 100)
        )

        // The cuts: one per subscriber, seeded.
        var random = SplitMix64(seed: setup.seed)
        let publishing = setup.publishing.totalSeconds
        let (shortest, longest) = (setup.shortestCut.totalSeconds, setup.longestCut.totalSeconds)
        let cuts: [(start: Double, length: Double)] = subscribers.map { _ in
            let length = shortest + random.nextUnit() * (longest - shortest)
            let start = 2 + random.nextUnit() * max(0, publishing - 2 - length)
            return (start, length)
        }

        let heard = TetherLock<[String: [ChannelCheck.Heard]]>([:])
        /// Publications asked for, per channel (started, answered or not).
        let asked = TetherLock<[String: UInt64]>([:])
        let subscribed = TetherLock<[String: Int]>([:])
        let published = TetherLock<(count: Int, failed: [String: Int], top: [String: ChannelPosition])>((0, [:], [:]))
        let caughtUp = TetherLock<[Double]>([])
        let everyone = [("publisher", publisher)] + subscribers.map { ($0.name, $0.client) }
        var result = ScenarioResult(name: scenario.name, summary: scenario.summary)
        try await withThrowingTaskGroup(of: Void.self) { group in
            self.run(everyone, in: &group)
            for subscriber in subscribers {
                group.addTask {
                    do {
                        for try await event in subscriber.client.subscribe(subscriber.channel) {
                            switch event {
                            case .publication(let publication):
                                heard.withLockedValue { $0[subscriber.name, default: []].append(.publication(publication.position)) }
                            case .gap(let gap):
                                let publishedBy = asked.withLockedValue { $0[subscriber.channel] ?? 0 }
                                heard.withLockedValue { $0[subscriber.name, default: []].append(.gap(gap, publishedBy: publishedBy)) }
                            case .subscribed:
                                subscribed.withLockedValue { $0[subscriber.name, default: 0] += 1 }
                            case .joined, .left:
                                break
                            }
                        }
                    } catch {
                        self.say("\(subscriber.name)'s subscription ended: \(error)")
                    }
                }
            }
            for (subscriber, cut) in zip(subscribers, cuts) {
                group.addTask {
                    try await self.sleep(until: .milliseconds(Int(cut.start * 1000)))
                    subscriber.proxy.mode = .refuse
                    subscriber.proxy.cutAll()
                    try await Task.sleep(for: .milliseconds(Int(cut.length * 1000)))
                    subscriber.proxy.mode = .forward
                    // How long until it has what was published before its link came back.
                    let back = self.recorder.now()
                    let target = published.withLockedValue { $0.top[subscriber.channel]?.offset } ?? 0
                    await self.waitUntil(seconds: 300) {
                        heard.withLockedValue { state in
                            state[subscriber.name]?.last.map {
                                if case .publication(let position) = $0 { position.offset >= target } else { false }
                            } ?? (target == 0)
                        }
                    }
                    caughtUp.withLockedValue { $0.append(self.recorder.now() - back) }
                }
            }
            // Everyone subscribed before the first publication (or waits for its link).
            await self.waitUntil(seconds: 60) { subscribed.withLockedValue { $0.count } == subscribers.count }
            let start = self.recorder.now()
            let total = Int(publishing * Double(setup.rate))
            try await withThrowingTaskGroup(of: Void.self) { publishes in
                for index in 0..<total {
                    let due = start + Double(index) / Double(setup.rate)
                    let wait = due - self.recorder.now()
                    if wait > 0 { try await Task.sleep(for: .milliseconds(Int(wait * 1000))) }
                    let channel = channels[index % channels.count]
                    asked.withLockedValue { $0[channel, default: 0] += 1 }
                    publishes.addTask {
                        do {
                            let position = try await publisher.publish(
                                ByteBuffer(string: "\(index)"),
                                toChannel: channel,
                                timeout: .seconds(30)
                            )
                            published.withLockedValue { state in
                                state.count += 1
                                if position.offset > state.top[channel]?.offset ?? 0 { state.top[channel] = position }
                            }
                        } catch {
                            // Timed out under loss, or its connection lost: it may have been published all the same.
                            let code = (error as? TetherError).map { "\($0.code)" } ?? "\(type(of: error))"
                            published.withLockedValue { $0.failed[code, default: 0] += 1 }
                        }
                    }
                }
                try await publishes.waitForAll()
            }
            let counts = published.withLockedValue { ($0.count, $0.failed) }
            self.say("publishing over: \(counts.0) publications acknowledged, not: \(counts.1)")

            // The channels' tops, as the gateway has them.
            // The channels' tops, as the gateway has them (asked again while the publisher's
            // lossy link is down).
            var tops: [String: ChannelPosition] = [:]
            let asking = self.recorder.now()
            while tops.count < channels.count, self.recorder.now() - asking < 120 {
                for channel in channels where tops[channel] == nil {
                    if let page = try? await publisher.history(of: channel, limit: 1, timeout: .seconds(10)) {
                        tops[channel] = ChannelPosition(epoch: page.epoch, offset: page.top)
                    }
                }
                if tops.count < channels.count { try await Task.sleep(for: .milliseconds(500)) }
            }
            if tops.count < channels.count { self.say("could not read the tops of \(channels.count - tops.count) channels") }
            await self.waitUntil(seconds: 300) {
                heard.withLockedValue { state in
                    subscribers.allSatisfy { subscriber in
                        guard case .publication(let position)? = state[subscriber.name]?.last else { return false }
                        return position.offset == tops[subscriber.channel]?.offset
                    }
                }
            }
            let final = heard.withLockedValue { $0 }
            var checks: [ChannelCheck] = []
            for subscriber in subscribers {
                checks.append(
                    ChannelCheck.check(final[subscriber.name] ?? [], epoch: tops[subscriber.channel]?.epoch ?? 0, history: setup.history)
                )
            }
            for (subscriber, check) in zip(subscribers, checks) {
                if let anomaly = check.firstAnomaly { self.say("\(subscriber.name) in \(subscriber.channel): anomaly around \(anomaly)") }
            }
            let notCaughtUp = zip(subscribers, checks).filter { !$1.caughtUp(to: tops[$0.channel]?.offset ?? 0) }.count
            result.channels = ScenarioResult.Channels(
                clients: subscribers.count,
                channels: channels.count,
                history: setup.history,
                published: tops.values.reduce(0) { $0 + Int($1.offset) },
                publishAcknowledged: counts.0,
                publishFailed: counts.1,
                cuts: Percentiles(cuts.map(\.length)),
                expected: subscribers.reduce(0) { $0 + Int(tops[$1.channel]?.offset ?? 0) } - checks.reduce(0) { $0 + Int($1.before) },
                startedLate: checks.reduce(0) { $0 + Int($1.before) },
                received: checks.reduce(0) { $0 + $1.received },
                subscriptions: subscribed.withLockedValue { $0.values.reduce(0, +) },
                gaps: checks.reduce(0) { $0 + $1.gaps },
                missedInGaps: checks.reduce(0) { $0 + $1.missedInGaps },
                duplicates: checks.reduce(0) { $0 + $1.duplicates },
                silentlyLost: checks.reduce(0) { $0 + $1.silentlyLost },
                inexactGaps: checks.reduce(0) { $0 + $1.inexactGaps },
                unjustifiedGaps: checks.reduce(0) { $0 + $1.unjustifiedGaps },
                epochChanges: checks.reduce(0) { $0 + $1.epochChanges },
                notCaughtUp: notCaughtUp,
                caughtUpAfterCut: Percentiles(caughtUp.withLockedValue { $0 })
            )
            let tally = result.channels!
            self.say(
                "\(tally.received) publications received by \(tally.clients) subscribers, \(tally.gaps) gaps (\(tally.missedInGaps) missed), "
                    + "\(tally.duplicates) duplicates, \(tally.silentlyLost) lost silently, \(tally.inexactGaps) inexact gaps, "
                    + "\(tally.unjustifiedGaps) gaps the history could have covered, "
                    + "\(tally.notCaughtUp) not at the top"
            )
            for (_, client) in everyone { client.shutdown() }
            try await group.waitForAll()
        }
        result.seconds = self.recorder.now()
        return result
    }

    /// A subscriber (or the publisher) with the defaults a user gets.
    private func channelClient(_ name: String, _ endpoint: Endpoint) throws -> TetherClient {
        let configuration = ClientConfiguration(endpoints: [endpoint], clientID: name)
        var logger = Logger(label: "tether.lab.\(name)")
        logger.logLevel = .critical
        return try TetherClient(configuration: configuration, logger: logger)
    }
}
