public import Foundation

/// Turns lab results into the Markdown report: the tables, the targets met or missed, the
/// machine, and the command that made it.
public enum LabReport {
    /// The machine the lab ran on: cores, memory, kernel.
    public static func machine() -> String {
        let cores = ProcessInfo.processInfo.activeProcessorCount
        let memory = Double(ProcessInfo.processInfo.physicalMemory) / 1_073_741_824
        var system = utsname()
        uname(&system)
        let release = withUnsafeBytes(of: &system.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        let sysname = withUnsafeBytes(of: &system.sysname) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        return String(format: "%d cores, %.0f GiB memory, %@ %@", cores, memory, sysname, release)
    }

    /// The report for `results`.
    public static func markdown(_ results: [ScenarioResult], machine: String, command: String, date: Date = Date()) -> String {
        var lines: [String] = []
        lines.append("# Tether weak-network lab report")
        lines.append("")
        lines.append("- Made by: `\(command)`")
        lines.append("- Machine: \(machine)")
        lines.append("- Date: \(date.formatted(.iso8601))")
        lines.append(
            "- Setup: a `tether serve` gateway process (SQLite store) and the clients in the lab's process, all with the default "
                + "client configuration; every client's link is a proxy of the lab on loopback inside a network namespace the lab "
                + "created; packet loss and blackholes are iptables DROP rules on those links (real kernel TCP retransmits), "
                + "latency and jitter come from the proxy. Alice sends reliable messages to Bob (20/s, then a backlog) and makes "
                + "one echo request at a time; Carol is idle; observers are idle clients that give the reconnection samples."
        )
        lines.append("")
        lines.append("## Targets")
        lines.append("")
        for check in Self.targets(results) { lines.append("- \(check)") }
        lines.append("")
        lines.append("## Delivery (reliable messages, Alice → gateway → Bob's app)")
        lines.append("")
        lines.append(
            "| Scenario | Conditions | Accepted | ≤ 5 s | ≤ 30 s | Eventually | Dup / order | Latency p50 / p90 / p99 (ms) | Backlog: drained in / p99 | Requests ok | Request p50 / p99 (ms) |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for result in results where result.natTimeout == nil && result.channels == nil {
            guard result.skipped == nil, let delivery = result.delivery else {
                lines.append("| \(result.name) | \(result.summary) | skipped: \(result.skipped ?? "no data") | | | | | | | | |")
                continue
            }
            let backlog = result.backlog.map { backlog in
                "\(backlog.messages): " + (backlog.drainSeconds.map { Self.number($0, 1) + " s" } ?? "not drained")
                    + " / " + (backlog.latency.map { Self.number($0.p99, 0) + " ms" } ?? "–")
            }
            lines.append(
                "| \(result.name) | \(result.summary) | \(delivery.accepted) | \(Self.percent(delivery.within5s, of: delivery.accepted)) | "
                    + "\(Self.percent(delivery.within30s, of: delivery.accepted)) | \(Self.percent(delivery.eventually, of: delivery.accepted)) | "
                    + "\(delivery.duplicates) / \(delivery.orderViolations) | \(Self.triple(delivery.latency)) | \(backlog ?? "–") | "
                    + "\(result.requests.map { Self.percent($0.succeeded, of: $0.sent) } ?? "–") | "
                    + "\(result.requests?.latency.map { Self.number($0.p50, 1) + " / " + Self.number($0.p99, 0) } ?? "–") |"
            )
        }
        lines.append("")
        lines.append("## Connection")
        lines.append("")
        lines.append(
            "| Scenario | First connect p50 / p90 (ms) | Restored → connected p50 / p90 / p95 (s) | Signal | Samples | Never reconnected | Blackhole detected after p50 / max (s) | Disconnects |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        for result in results where result.skipped == nil && result.natTimeout == nil && result.channels == nil {
            let reconnection = result.reconnection
            let restored = reconnection?.restoredToConnected.map {
                "\(Self.number($0.p50, 2)) / \(Self.number($0.p90, 2)) / \(Self.number($0.p95, 2))"
            }
            let detection = reconnection?.detection.map { "\(Self.number($0.p50, 1)) / \(Self.number($0.max, 1))" }
            let disconnects = result.disconnects.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")
            lines.append(
                "| \(result.name) | \(result.firstConnect.map { "\(Self.number($0.p50, 1)) / \(Self.number($0.p90, 1))" } ?? "–") | "
                    + "\(restored ?? "–") | \(reconnection.map { $0.signalled ? "yes" : "no" } ?? "–") | "
                    + "\(reconnection?.restoredToConnected?.count ?? 0) | \(reconnection.map { "\($0.neverReconnected)" } ?? "–") | "
                    + "\(detection ?? "–") | \(disconnects.isEmpty ? "none" : disconnects) |"
            )
        }
        let herds = results.filter { $0.herd != nil }
        if !herds.isEmpty {
            lines.append("")
            lines.append("## Gateway restart with many clients (thundering herd)")
            lines.append("")
            lines.append("| Scenario | Clients | Peak handshakes/s | Peak attempts/s | All reconnected after (s) |")
            lines.append("|---|---|---|---|---|")
            for result in herds {
                let herd = result.herd!
                lines.append(
                    "| \(result.name) | \(herd.clients) | \(Self.number(herd.peakConnectsPerSecond, 0)) | \(Self.number(herd.peakAttemptsPerSecond, 0)) | "
                        + "\(herd.secondsToAllReconnected.map { Self.number($0, 2) } ?? "not all") |"
                )
            }
        }
        let restricted = results.filter { $0.restricted != nil }
        if !restricted.isEmpty {
            lines.append("")
            lines.append("## Restrictive networks (fallback to the HTTP stream, and back)")
            lines.append("")
            lines.append(
                "Every client lists `tether://` (the raw port), `ws://` and `http://…/tether/stream`, in that order, with the default "
                    + "racing. The raw port is rejected (nothing listens: RST) or blackholed (the lab's proxy accepts and swallows); "
                    + "WebSocket upgrades are refused (`404`, as a proxy that refuses upgrades answers); the HTTP stream is open. "
                    + "Then the raw port opens, and clients probe the better endpoints every `connection.moveUpInterval`."
            )
            lines.append("")
            lines.append(
                "| Scenario | Clients | First request p50 / p90 / max (s) | No request | Connected over | Raw port opened at (s) | Back on the raw port p50 / p90 / max (s) | Still on a fallback | Heartbeat / move-up interval (s) |"
            )
            lines.append("|---|---|---|---|---|---|---|---|---|")
            for result in restricted {
                let restricted = result.restricted!
                let transports = restricted.firstTransports.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(
                    separator: ", "
                )
                func three(_ percentiles: Percentiles?) -> String {
                    percentiles.map { "\(Self.number($0.p50, 2)) / \(Self.number($0.p90, 2)) / \(Self.number($0.max, 2))" } ?? "–"
                }
                lines.append(
                    "| \(result.name) | \(restricted.clients) | \(three(restricted.firstRequest)) | \(restricted.noFirstRequest) | \(transports) | "
                        + "\(restricted.liftedAtSeconds.map { Self.number($0, 1) } ?? "–") | \(three(restricted.movedUp)) | \(restricted.neverMovedUp) | "
                        + "\(Self.number(restricted.heartbeatIntervalSeconds, 0)) / \(Self.number(restricted.moveUpIntervalSeconds, 0)) |"
                )
            }
        }
        let killed = results.filter { $0.nodeKill != nil }
        if !killed.isEmpty {
            lines.append("")
            lines.append("## A cluster node killed")
            lines.append("")
            lines.append(
                "Gateway nodes (`tether serve --postgres`) on a private PostgreSQL; every client lists every node, its own first. "
                    + "The first node is killed with SIGKILL; its clients move to the next node in their list."
            )
            lines.append("")
            lines.append("| Scenario | Nodes | Clients | On the killed node | Back on another node p50 / p95 / max (s) | Not back |")
            lines.append("|---|---|---|---|---|---|")
            for result in killed {
                let kill = result.nodeKill!
                let back = kill.back.map { "\(Self.number($0.p50, 2)) / \(Self.number($0.p95, 2)) / \(Self.number($0.max, 2))" } ?? "–"
                lines.append("| \(result.name) | \(kill.nodes) | \(kill.clients) | \(kill.affected) | \(back) | \(kill.neverBack) |")
            }
        }
        let channelRuns = results.filter { $0.channels != nil }
        if !channelRuns.isEmpty {
            lines.append("")
            lines.append("## Channels: subscribers cut off while publications go on")
            lines.append("")
            lines.append(
                "A gateway whose channels keep a history of N publications (in its SQLite store); each subscriber behind a proxy "
                    + "of its own, its link cut once (connections dropped, new ones refused) at a seeded time for a seeded length; "
                    + "packets to and from the gateway dropped at the scenario's loss. Each subscriber must end at its channel's "
                    + "top with every publication once and in order, or inside a gap event that starts at the last one it had "
                    + "and ends at the next one it gets. Duplicates, silent losses, inexact gaps and subscribers not at the top "
                    + "must all be 0."
            )
            lines.append("")
            lines.append(
                "| Scenario | Subscribers / channels | History | Published (acknowledged; failed, by error) | Cuts p50 / max (s) | Received | "
                    + "Gaps (missed) | Duplicates | Lost silently | Inexact or unjustified gaps | Not at the top | Caught up after a cut p50 / p95 / max (s) |"
            )
            lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for result in channelRuns {
                let run = result.channels!
                let cuts = run.cuts.map { "\(Self.number($0.p50, 1)) / \(Self.number($0.max, 1))" } ?? "–"
                let back =
                    run.caughtUpAfterCut.map { "\(Self.number($0.p50, 2)) / \(Self.number($0.p95, 2)) / \(Self.number($0.max, 2))" } ?? "–"
                lines.append(
                    "| \(result.name) | \(run.clients) / \(run.channels) | \(run.history) | \(run.published) (\(run.publishAcknowledged); "
                        + "\(run.publishFailed.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))) | \(cuts) | \(run.received) of \(run.expected)\(run.startedLate > 0 ? " (\(run.startedLate) before a late first subscription)" : "") | \(run.gaps) (\(run.missedInGaps)) | \(run.duplicates) | "
                        + "\(run.silentlyLost) | \(run.inexactGaps) / \(run.unjustifiedGaps) | \(run.notCaughtUp) | \(back) |"
                )
            }
        }
        for result in results {
            guard let nat = result.natTimeout else { continue }
            lines.append("")
            lines.append("## NAT timeout (smart heartbeat)")
            lines.append("")
            lines.append(
                "Idle clients in the background mode, for \(Self.number(result.seconds, 0)) s, behind a NAT (the lab's proxy) that "
                    + "silently forgets a connection that carried nothing for \(Self.number(nat.natTimeoutSeconds, 0)) s. Fixed: the "
                    + "default background interval, half the gateway's idle timeout (\(Self.number(nat.fixedIntervalSeconds, 0)) s). "
                    + "Probing: `heartbeat.natProbing` starting at \(Self.number(nat.probingInitialSeconds, 0)) s, "
                    + "\(Self.number(nat.probingStepSeconds, 0)) s steps (scaled down; the defaults are 60 s and 30 s). Time unreachable: client-time on a connection the NAT had forgotten, when pushes go nowhere. Bytes "
                    + "include the reconnections."
            )
            lines.append("")
            let learned = Set(nat.learnedSeconds).sorted().map { Self.number($0, 0) + " s" }.joined(separator: ", ")
            lines.append("| Group | Clients | Interval | Connections lost | Time unreachable | Bytes per client-hour |")
            lines.append("|---|---|---|---|---|---|")
            let probing = nat.probing
            lines.append(
                "| probing | \(probing.clients) | learned: \(learned); all settled after \(nat.settledAfterSeconds.map { Self.number($0, 0) + " s" } ?? "—") | "
                    + "\(probing.linksLost) (\(probing.linksLostAfterSettled.map { "\($0)" } ?? "–") after settling) | "
                    + "\(Self.number(probing.unreachableFraction * 100, 1)) % | "
                    + "\(probing.bytesPerHourPerClient.map { Self.number($0 / 1024, 1) + " KiB (settled)" } ?? "–") |"
            )
            let fixed = nat.fixed
            lines.append(
                "| fixed | \(fixed.clients) | \(Self.number(nat.fixedIntervalSeconds, 0)) s | \(fixed.linksLost) | "
                    + "\(Self.number(fixed.unreachableFraction * 100, 1)) % | "
                    + "\(fixed.bytesPerHourPerClient.map { Self.number($0 / 1024, 1) + " KiB" } ?? "–") |"
            )
        }
        lines.append("")
        lines.append("## Cost of staying connected")
        lines.append("")
        for result in results where result.heartbeatBytesPerHour != nil || result.overheadBytesPerMessage != nil {
            var parts: [String] = []
            if let bytes = result.heartbeatBytesPerHour {
                parts.append(
                    "an idle connection exchanges \(Self.number(bytes / 1024, 1)) KiB per hour (heartbeats, both ways, TCP/IP headers not counted)"
                )
            }
            if let overhead = result.overheadBytesPerMessage {
                parts.append(
                    "a reliable message costs \(Self.number(overhead, 0)) bytes on the wire beyond its body (MESSAGE, MESSAGE_ACK, DELIVERY, DELIVERY_ACK)"
                )
            }
            lines.append("- \(result.name): " + parts.joined(separator: "; "))
        }
        if let probe = results.compactMap(\.ttlProbe).first {
            lines.append("- A message sent into the blackhole with a 5 s TTL ended as: \(probe)")
        }
        lines.append("")
        let views = results.filter { $0.gateway != nil }
        if !views.isEmpty {
            lines.append("## The gateway's own view (its /metrics), beside the lab's")
            lines.append("")
            lines.append("Read once every client was connected again at the end. A restarted gateway's counters cover its last process.")
            lines.append("")
            lines.append(
                "| Scenario | connections (gateway / lab) | handshakes | echo answered (gateway / lab) | messages processed (gateway / lab) "
                    + "| duplicates dropped | deliveries sent / acknowledged | agree |"
            )
            lines.append("|---|---|---|---|---|---|---|---|")
            for result in views {
                let view = result.gateway!
                let lab = (result.requests?.succeeded).map(String.init) ?? "–"
                let messages = (result.delivery?.accepted).map(String.init) ?? "–"
                lines.append(
                    "| \(result.name)\(view.restarted ? " (restarted)" : "") | \(view.connectionsOpen) / \(view.clients) | \(view.handshakes) "
                        + "| \(view.echoAnswered) / \(lab) | \(view.messagesProcessed) / \(messages) | \(view.duplicatesDropped) "
                        + "| \(view.deliveriesSent) / \(view.deliveriesAcknowledged) "
                        + "| \(view.disagreements.isEmpty ? "✅" : "❌ " + view.disagreements.joined(separator: "; ")) |"
                )
            }
            lines.append("")
        }
        return lines.joined(separator: "\n")
    }

    /// The issue's done-when targets that these results can judge, met (✅) or missed (❌).
    public static func targets(_ results: [ScenarioResult]) -> [String] {
        var checks: [String] = []
        func check(_ met: Bool, _ text: String) { checks.append((met ? "✅ " : "❌ ") + text) }
        func result(_ name: String) -> ScenarioResult? { results.first { $0.name == name && $0.skipped == nil } }
        for name in ["loss-30", "loss-50", "loss-30-wss", "loss-30-http"] {
            guard let result = result(name), let delivery = result.delivery else { continue }
            check(
                delivery.eventually == delivery.accepted && delivery.duplicates == 0 && delivery.orderViolations == 0,
                "\(name): \(delivery.eventually) of \(delivery.accepted) delivered eventually, \(delivery.duplicates) duplicates, \(delivery.orderViolations) order violations"
            )
        }
        for name in ["loss-30", "loss-30-wss"] {
            guard let backlog = result(name)?.backlog else { continue }
            let drain = backlog.drainSeconds
            check(
                (drain ?? .infinity) <= 10,
                "\(name): \(backlog.messages)-message backlog drained in \(drain.map { Self.number($0, 1) + " s" } ?? "—") (target ≤ 10 s)"
            )
            if let p99 = backlog.latency?.p99 {
                check(p99 <= 5000, "\(name): backlog p99 latency \(Self.number(p99, 0)) ms (target ≤ 5,000 ms)")
            }
        }
        if let backlog = result("loss-50")?.backlog {
            let drain = backlog.drainSeconds
            check(
                (drain ?? .infinity) <= 120,
                "loss-50: \(backlog.messages)-message backlog drained in \(drain.map { Self.number($0, 1) + " s" } ?? "—") (target ≤ 120 s)"
            )
        }
        for name in ["switch", "flap"] {
            if let restored = result(name)?.reconnection?.restoredToConnected {
                check(
                    restored.p50 <= 0.5 && restored.p90 <= 1,
                    "\(name) (path signal): restored → connected p50 \(Self.number(restored.p50, 2)) s, p90 \(Self.number(restored.p90, 2)) s (targets ≤ 0.5 s, ≤ 1 s)"
                )
            }
        }
        for name in ["blackhole", "blackhole-wss"] {
            guard let blackhole = result(name), let reconnection = blackhole.reconnection else { continue }
            if let restored = reconnection.restoredToConnected {
                check(
                    restored.p95 <= 2,
                    "\(name) lifted (no signal): restored → connected p95 \(Self.number(restored.p95, 2)) s (target ≤ 2 s)"
                )
            }
            if let detection = reconnection.detection {
                check(
                    detection.max <= 16,
                    "\(name) detected after at most \(Self.number(detection.max, 1)) s (target: heartbeat interval 10 s + timeout 5 s + 1 s = 16 s)"
                )
            }
            if let probe = blackhole.ttlProbe {
                check(probe == "expired", "\(name): a message that missed its TTL in the blackhole ended as \(probe)")
            }
        }
        if let nat = result("nat")?.natTimeout {
            let longest = nat.learnedSeconds.max() ?? 0
            check(
                nat.settledAfterSeconds != nil && longest < nat.natTimeoutSeconds && nat.probing.linksLostAfterSettled == 0,
                "nat: every probing client settled (after \(nat.settledAfterSeconds.map { Self.number($0, 0) + " s" } ?? "—")) below the "
                    + "\(Self.number(nat.natTimeoutSeconds, 0)) s NAT timeout (longest \(Self.number(longest, 0)) s) and lost no connection after; "
                    + "unreachable \(Self.number(nat.probing.unreachableFraction * 100, 1)) % of the time vs \(Self.number(nat.fixed.unreachableFraction * 100, 1)) % at the fixed interval"
            )
        }
        if let run = result("node-kill"), let kill = run.nodeKill {
            check(
                kill.neverBack == 0 && (kill.back?.p95 ?? .infinity) <= 5,
                "node-kill: \(kill.affected) clients of the killed node back on another node within "
                    + "\(kill.back.map { Self.number($0.p95, 2) + " s" } ?? "—") p95 (target ≤ 5 s), \(kill.neverBack) not back"
            )
            if let delivery = run.delivery {
                check(
                    delivery.eventually == delivery.accepted && delivery.duplicates == 0 && delivery.orderViolations == 0,
                    "node-kill: \(delivery.eventually) of \(delivery.accepted) messages delivered across the kill, "
                        + "\(delivery.duplicates) duplicates, \(delivery.orderViolations) order violations"
                )
            }
        }
        for (name, limit) in [("restricted-rejected", 2.0), ("restricted-blackholed", 3.0)] {
            guard let run = result(name), let restricted = run.restricted else { continue }
            let first = restricted.firstRequest
            check(
                restricted.noFirstRequest == 0 && (first?.p90 ?? .infinity) <= limit,
                "\(name): first request p90 \(first.map { Self.number($0.p90, 2) + " s" } ?? "—") over the HTTP stream (target ≤ \(Self.number(limit, 0)) s), "
                    + "\(restricted.noFirstRequest) clients without one"
            )
            let back = restricted.movedUp
            check(
                restricted.neverMovedUp == 0 && (back?.max ?? .infinity) <= restricted.heartbeatIntervalSeconds,
                "\(name): back on the raw port after at most \(back.map { Self.number($0.max, 2) + " s" } ?? "—") (target: within one heartbeat interval, "
                    + "\(Self.number(restricted.heartbeatIntervalSeconds, 0)) s), \(restricted.neverMovedUp) clients left behind"
            )
            if let delivery = run.delivery {
                check(
                    delivery.eventually == delivery.accepted && delivery.duplicates == 0 && delivery.orderViolations == 0,
                    "\(name): \(delivery.eventually) of \(delivery.accepted) messages delivered across the fallback and the move up, "
                        + "\(delivery.duplicates) duplicates, \(delivery.orderViolations) order violations"
                )
            }
        }
        if let herd = result("herd")?.herd {
            check(
                herd.secondsToAllReconnected != nil,
                "herd: \(herd.clients) clients, all reconnected: \(herd.secondsToAllReconnected.map { "yes, within \(Self.number($0, 2)) s" } ?? "no"); peak \(Self.number(herd.peakConnectsPerSecond, 0)) handshakes/s"
            )
        }
        return checks
    }

    static func number(_ value: Double, _ digits: Int) -> String {
        String(format: "%.\(digits)f", value)
    }

    static func percent(_ part: Int, of whole: Int) -> String {
        guard whole > 0 else { return "–" }
        return part == whole ? "100 %" : String(format: "%.1f %%", Double(part) / Double(whole) * 100)
    }

    static func triple(_ percentiles: Percentiles?) -> String {
        guard let percentiles else { return "–" }
        return "\(Self.number(percentiles.p50, 0)) / \(Self.number(percentiles.p90, 0)) / \(Self.number(percentiles.p99, 0))"
    }
}
