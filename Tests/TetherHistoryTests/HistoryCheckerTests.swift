import Foundation
import Testing
import TetherHistory

/// Hand-made histories, one per thing the checker must find, and clean ones it must pass.
@Suite("History checker")
struct HistoryCheckerTests {
    /// A little language for histories: each call adds a record one millisecond after the last.
    struct Builder {
        var records: [HistoryRecord] = []
        var time: Int64 = 1_000

        mutating func add(
            _ process: String,
            _ kind: HistoryRecord.Kind,
            _ phase: HistoryRecord.Phase,
            _ id: String = "",
            _ build: (inout HistoryRecord) -> Void = { _ in }
        ) {
            self.time += 1
            var record = HistoryRecord(time: self.time, process: process, kind: kind, phase: phase, id: id)
            build(&record)
            self.records.append(record)
        }

        /// alice sends `id` to bob in `conversation`, with this outcome (`nil`: none recorded).
        mutating func send(_ id: String, conversation: String = "c1", outcome: HistoryRecord.Phase? = .ok) {
            self.add("w1", .send, .invoke, id) {
                $0.client = "alice"
                $0.peer = "bob"
                $0.conversation = conversation
            }
            if let outcome { self.add("w1", .send, outcome, id) { $0.detail = outcome == .fail ? "refused: invalid request" : nil } }
        }

        /// bob's process `process` records the delivery of `id` with `sequence`.
        mutating func deliver(
            _ id: String,
            sequence: UInt64,
            conversation: String = "c1",
            to client: String = "bob",
            process: String = "w2"
        ) {
            self.add(process, .delivery, .ok, id) {
                $0.client = client
                $0.peer = "alice"
                $0.conversation = conversation
                $0.sequence = sequence
            }
        }

        mutating func kill(_ process: String) {
            self.add("nemesis", .kill, .ok) { $0.peer = process }
        }

        mutating func receive(_ id: String, at position: UInt64, process: String = "w3") {
            self.add(process, .receive, .ok, id) {
                $0.client = "carol"
                $0.channel = "news"
                $0.position = position
            }
        }

        mutating func gap(from: UInt64, to: UInt64, process: String = "w3") {
            self.add(process, .gap, .ok) {
                $0.client = "carol"
                $0.channel = "news"
                $0.position = from
                $0.end = to
            }
        }

        mutating func publish(_ ids: String...) {
            for id in ids { self.add("w4", .publish, .invoke, id) { $0.channel = "news" } }
        }

        /// dave publishes `id` to news, acknowledged at `position` (`nil`: with `outcome`).
        mutating func published(_ id: String, at position: UInt64?, outcome: HistoryRecord.Phase = .ok) {
            self.add("w4", .publish, .invoke, id) { $0.channel = "news" }
            self.add("w4", .publish, position == nil ? outcome : .ok, id) {
                $0.channel = "news"
                $0.position = position
                $0.epoch = position == nil ? nil : 0
            }
        }
    }

    func kinds(_ builder: Builder) -> [HistoryChecker.Anomaly.Kind] {
        HistoryChecker.check(builder.records).anomalies.map(\.kind)
    }

    @Test("a clean history: every acknowledged message once and in order, requests once, channel positions received or gaps")
    func clean() {
        var history = Builder()
        history.send("m1")
        history.send("m2")
        history.send("m3", outcome: .fail)
        history.send("m4", outcome: nil)  // its sender died: not known
        history.send("x1", conversation: "c2")
        history.deliver("m1", sequence: 1)
        history.deliver("x1", sequence: 2, conversation: "c2")  // bob's stream numbers every delivery
        history.deliver("m2", sequence: 3)
        history.add("w1", .request, .invoke, "r1")
        history.add("w1", .request, .ok, "r1")
        history.add("w1", .request, .invoke, "r2")
        history.add("w1", .request, .info, "r2") { $0.detail = "timed out" }
        history.publish("p1", "p2", "p3", "p4", "p5")
        history.receive("p1", at: 1)
        history.gap(from: 2, to: 3)
        history.receive("p4", at: 4)
        history.receive("p5", at: 5)

        let result = HistoryChecker.check(history.records.shuffled())
        #expect(result.isValid, "\(result.anomalies)")
        #expect(result.sends == [.ok: 3, .fail: 1, .info: 1])
        #expect(result.delivered == 3 && result.requestsAnswered == 1)
        #expect(result.received == 3 && result.gapPositions == 2)
    }

    @Test("acknowledged and never delivered")
    func lost() {
        var history = Builder()
        history.send("m1")
        history.send("m2")
        history.deliver("m1", sequence: 1)
        let anomalies = HistoryChecker.check(history.records).anomalies
        #expect(anomalies.map(\.kind) == [.acknowledgedNotDelivered])
        #expect(anomalies.first?.records.map(\.id) == ["m2", "m2"], "the send's invocation and outcome")
    }

    @Test("delivered twice: an anomaly, unless the recording process was killed in between (then counted)")
    func doubled() {
        var history = Builder()
        history.send("m1")
        history.deliver("m1", sequence: 1)
        history.deliver("m1", sequence: 1)
        #expect(self.kinds(history) == [.deliveredTwice])

        var afterKill = Builder()
        afterKill.send("m1")
        afterKill.deliver("m1", sequence: 1)
        afterKill.kill("w2")
        afterKill.deliver("m1", sequence: 1)
        let result = HistoryChecker.check(afterKill.records)
        #expect(result.isValid && result.repeatsAfterKills == 1, "\(result.anomalies)")

        var otherKilled = Builder()
        otherKilled.send("m1")
        otherKilled.deliver("m1", sequence: 1)
        otherKilled.kill("w1")  // the sender's process, not the one that recorded it
        otherKilled.deliver("m1", sequence: 1)
        #expect(self.kinds(otherKilled) == [.deliveredTwice])
    }

    @Test("never sent: an unknown id, or a message delivered to another client than its recipient")
    func neverSent() {
        var history = Builder()
        history.send("m1")
        history.deliver("m1", sequence: 1)
        history.deliver("ghost", sequence: 2)
        history.deliver("m1", sequence: 1, to: "mallory", process: "w9")
        #expect(self.kinds(history) == [.neverSent, .neverSent])
    }

    @Test("a refused message delivered")
    func refusedDelivered() {
        var history = Builder()
        history.send("m1", outcome: .fail)
        history.deliver("m1", sequence: 1)
        #expect(self.kinds(history) == [.refusedDelivered])
    }

    @Test("out of order: a later send delivered first, or a recipient's delivery sequence that skips")
    func outOfOrder() {
        var history = Builder()
        history.send("m1")
        history.send("m2")
        history.deliver("m2", sequence: 1)
        history.deliver("m1", sequence: 2)
        #expect(self.kinds(history) == [.outOfOrder])

        var skipped = Builder()
        skipped.send("m1")
        skipped.send("m2")
        skipped.deliver("m1", sequence: 1)
        skipped.deliver("m2", sequence: 3)
        #expect(self.kinds(skipped) == [.outOfOrder])

        var otherConversations = Builder()  // each conversation has its own order
        otherConversations.send("m1", conversation: "c1")
        otherConversations.send("n1", conversation: "c2")
        otherConversations.deliver("n1", sequence: 1, conversation: "c2")
        otherConversations.deliver("m1", sequence: 2, conversation: "c1")
        #expect(self.kinds(otherConversations).isEmpty)

        var sharedStream = Builder()  // the recipient's stream skips a number between conversations
        sharedStream.send("m1", conversation: "c1")
        sharedStream.send("n1", conversation: "c2")
        sharedStream.deliver("m1", sequence: 1, conversation: "c1")
        sharedStream.deliver("n1", sequence: 3, conversation: "c2")
        #expect(self.kinds(sharedStream) == [.outOfOrder])
    }

    @Test("two processes of one client id are two outboxes: each one's sends in order, the two interleaved in any way")
    func twoOutboxes() {
        var history = Builder()
        history.send("a1")  // alice's outbox in w1
        history.add("w4", .send, .invoke, "b1") {  // alice's second device, in w4
            $0.client = "alice"
            $0.peer = "bob"
            $0.conversation = "c1"
        }
        history.add("w4", .send, .ok, "b1")
        history.send("a2")
        history.deliver("b1", sequence: 1)
        history.deliver("a1", sequence: 2)
        history.deliver("a2", sequence: 3)
        #expect(HistoryChecker.check(history.records).isValid, "b1 before a1: another outbox")
        var reordered = Builder()
        reordered.records = Array(history.records.prefix(5))
        reordered.time = history.time
        reordered.deliver("a2", sequence: 1)
        reordered.deliver("a1", sequence: 2)
        reordered.deliver("b1", sequence: 3)
        #expect(kinds(reordered) == [.outOfOrder], "a2 before a1: the same outbox")
    }

    @Test("a request answered twice, or answered after it was reported failed")
    func requests() {
        var history = Builder()
        history.add("w1", .request, .invoke, "r1")
        history.add("w1", .request, .ok, "r1")
        history.add("w1", .request, .ok, "r1")
        history.add("w1", .request, .invoke, "r2")
        history.add("w1", .request, .fail, "r2") { $0.detail = "deadline exceeded" }
        history.add("w1", .request, .ok, "r2")
        #expect(self.kinds(history) == [.answeredTwice, .answeredTwice])
    }

    @Test("channels: a position twice or back (but after a kill), one neither received nor a gap, a publication never published")
    func channels() {
        var twice = Builder()
        twice.publish("p1", "p2")
        twice.receive("p1", at: 1)
        twice.receive("p1", at: 1)
        twice.receive("p2", at: 2)
        #expect(self.kinds(twice) == [.receivedTwice])

        var afterKill = Builder()
        afterKill.publish("p1", "p2")
        afterKill.receive("p1", at: 1)
        afterKill.kill("w3")
        afterKill.receive("p1", at: 1)
        afterKill.receive("p2", at: 2)
        #expect(self.kinds(afterKill).isEmpty)

        var hole = Builder()
        hole.publish("p1", "p2", "p3", "p4")
        hole.receive("p1", at: 1)
        hole.gap(from: 2, to: 2)
        hole.receive("p4", at: 4)
        let anomalies = HistoryChecker.check(hole.records).anomalies
        #expect(anomalies.map(\.kind) == [.unaccounted])
        #expect(anomalies.first?.message.contains("positions 3…3") == true, "\(anomalies)")

        var invented = Builder()
        invented.receive("p9", at: 1)
        #expect(self.kinds(invented) == [.neverPublished])
    }

    @Test("channels: a kept position replayed after a kill, in order; acknowledged publications every subscriber must account for")
    func channelPublications() {
        // Killed after 3, started again from its kept position 1: 2 and 3 again, then on.
        var replay = Builder()
        for position in 1...5 { replay.published("p\(position)", at: UInt64(position)) }
        replay.receive("p1", at: 1)
        replay.receive("p2", at: 2)
        replay.receive("p3", at: 3)
        replay.kill("w3")
        replay.receive("p2", at: 2)
        replay.receive("p3", at: 3)
        replay.receive("p4", at: 4)
        replay.gap(from: 5, to: 5)
        let clean = HistoryChecker.check(replay.records)
        #expect(clean.isValid, "\(clean.anomalies)")
        #expect(clean.received == 4 && clean.receivedAgainAfterKills == 2 && clean.gapPositions == 1)
        #expect(clean.publishes == [.ok: 5])

        // The same replay going back within the process started again: out of order.
        var back = Builder()
        for position in 1...3 { back.published("p\(position)", at: UInt64(position)) }
        back.receive("p1", at: 1)
        back.receive("p2", at: 2)
        back.kill("w3")
        back.receive("p2", at: 2)
        back.receive("p1", at: 1)
        back.receive("p3", at: 3)
        #expect(self.kinds(back) == [.outOfOrder])

        // Acknowledged at 3 and 4; the subscriber stopped at 2.
        var short = Builder()
        for position in 1...4 { short.published("p\(position)", at: UInt64(position)) }
        short.receive("p1", at: 1)
        short.receive("p2", at: 2)
        let missing = HistoryChecker.check(short.records).anomalies
        #expect(missing.map(\.kind) == [.acknowledgedNotReceived])
        #expect(missing.first?.message.contains("2 acknowledged publications (3…4)") == true, "\(missing)")

        // A subscriber that came after 1 was published owes nothing before its first position.
        var late = Builder()
        for position in 1...3 { late.published("p\(position)", at: UInt64(position)) }
        late.receive("p2", at: 2)
        late.receive("p3", at: 3)
        #expect(self.kinds(late).isEmpty)

        // Two ids at one position (the acknowledgement says p1, a subscriber got p2 there),
        // and one id at two positions.
        var clash = Builder()
        clash.published("p1", at: 1)
        clash.publish("p2")
        clash.receive("p2", at: 1)
        #expect(self.kinds(clash) == [.twoAtOnePosition])
        var twice = Builder()
        twice.published("p1", at: 1)
        twice.receive("p1", at: 1)
        twice.receive("p1", at: 2)
        #expect(self.kinds(twice) == [.publishedTwice])

        // Refused, yet received.
        var refused = Builder()
        refused.published("p1", at: nil, outcome: .fail)
        refused.receive("p1", at: 1)
        #expect(self.kinds(refused) == [.refusedDelivered])

        // Received long after the faults stopped.
        var slow = Builder()
        slow.published("p1", at: 1)
        slow.kill("w9")
        slow.time += 5_000
        slow.receive("p1", at: 1)
        let measured = HistoryChecker.check(slow.records)
        #expect(measured.isValid && measured.slowestChannelConvergence == 5_001)
        #expect(HistoryChecker.check(slow.records, convergenceBound: .seconds(2)).anomalies.map(\.kind) == [.notConverged])
    }

    @Test("an anomaly names the faults in force from its first record to its last; a fault is paired with its heal by its detail")
    func faultsInForce() {
        var history = Builder()
        history.add("nemesis", .fault, .invoke) { $0.detail = "partition-node network of gateway for 900 ms" }  // 1001
        history.send("m1")  // 1002, acknowledged at 1003, never delivered
        history.add("nemesis", .fault, .ok) { $0.detail = "partition-node network of gateway for 900 ms" }  // 1004
        history.add("nemesis", .fault, .invoke) { $0.detail = "pause-node gateway for 300 ms" }  // 1005, never healed
        history.kill("w9")  // 1006
        let result = HistoryChecker.check(history.records)
        #expect(result.anomalies.map(\.kind) == [.acknowledgedNotDelivered])
        #expect(result.anomalies.first?.faultsInForce == ["partition-node network of gateway for 900 ms"])

        let timeline = FaultTimeline(history.records.shuffled())
        #expect(timeline.faults.map(\.kind) == ["partition-node", "pause-node", "SIGKILL"])
        #expect(timeline.faults.map(\.end) == [1_004, nil, 1_006])
        #expect(timeline.inForce(from: 1_005, to: 2_000).map(\.detail) == ["pause-node gateway for 300 ms", "SIGKILL of w9"])
        #expect(timeline.inForce(from: 900, to: 1_000).isEmpty)
    }

    @Test("convergence: measured from the nemesis's last act; later than the bound is an anomaly")
    func convergence() {
        var history = Builder()
        history.send("m1")
        history.kill("w2")
        history.add("nemesis", .fault, .ok) { $0.detail = "partition healed" }
        history.send("m2")
        history.time += 500
        history.deliver("m1", sequence: 1)
        history.time += 2_000
        history.deliver("m2", sequence: 2)
        let measured = HistoryChecker.check(history.records)
        #expect(measured.isValid && measured.faultsStopped == 1_004)
        #expect(measured.slowestConvergence == 2_502, "m2: acknowledged at 1006, delivered at 3508")
        #expect(HistoryChecker.check(history.records, convergenceBound: .seconds(3)).isValid)
        let late = HistoryChecker.check(history.records, convergenceBound: .seconds(1))
        #expect(late.anomalies.map(\.kind) == [.notConverged] && late.anomalies.first?.records.last?.id == "m2")

        var calm = Builder()  // no fault at all: nothing to measure
        calm.send("m1")
        calm.deliver("m1", sequence: 1)
        #expect(HistoryChecker.check(calm.records, convergenceBound: .zero).slowestConvergence == nil)

        // A message still without an outcome when its process stopped: not converged, if the
        // faults stopped more than the bound before.
        var stuck = Builder()
        stuck.send("m1", outcome: nil)
        stuck.add("nemesis", .fault, .ok) { $0.detail = "postgres restarted" }
        stuck.time += 5_000
        stuck.add("w1", .send, .info, "m1") { $0.detail = HistoryRecord.pendingAtTheEnd }
        let stuckLong = HistoryChecker.check(stuck.records, convergenceBound: .seconds(2))
        #expect(stuckLong.anomalies.map(\.kind) == [.notConverged] && stuckLong.anomalies.first?.message.contains("no outcome") == true)
        #expect(HistoryChecker.check(stuck.records, convergenceBound: .seconds(10)).isValid, "within the bound: still converging")
        #expect(HistoryChecker.check(stuck.records).isValid, "without a bound: only measured")
    }

    @Test(
        "connections: counted by transport, those elsewhere than a client's first endpoint and those back on it; a client that stops elsewhere or unconnected, long after the faults, did not move back up"
    )
    func connections() {
        func connect(_ history: inout Builder, _ client: String, _ transport: String, place: UInt64?, end: Bool = false) {
            history.add("w1", .connect, end ? .info : .ok, end ? "" : "\(history.time)") {
                $0.client = client
                $0.peer = place == nil ? nil : transport
                $0.position = place
                $0.detail = end ? "at the end" : transport
            }
        }
        var history = Builder()
        connect(&history, "alice", "tether", place: 0)
        connect(&history, "bob", "tether", place: 0)
        history.add("nemesis", .fault, .invoke) { $0.detail = "block-tcp tcp for 900 ms" }
        connect(&history, "alice", "ws", place: 1)  // fell back
        connect(&history, "bob", "http", place: 1)
        history.add("nemesis", .fault, .ok) { $0.detail = "block-tcp tcp for 900 ms" }  // 1006
        connect(&history, "alice", "tether", place: 0)  // moved back up
        history.time += 5_000
        connect(&history, "alice", "tether", place: 0, end: true)
        connect(&history, "bob", "http", place: 1, end: true)  // 6009: still on its fallback
        connect(&history, "carol", "", place: nil, end: true)  // 6010: not connected
        let result = HistoryChecker.check(history.records, convergenceBound: .seconds(2))
        #expect(result.connections == ["tether": 3, "ws": 1, "http": 1])
        #expect(result.connectionsElsewhere == 2 && result.connectionsBackOnFirst == 1)
        #expect(result.anomalies.map(\.kind) == [.notMovedUp, .notMovedUp])
        #expect(result.anomalies.first?.records.map(\.peer) == ["http", "http"], "bob's last connection, and where it was at the end")
        #expect(
            result.anomalies.last?.message.hasPrefix("carol") == true
                && result.anomalies.last?.message.contains("no connection") == true
        )
        #expect(HistoryChecker.check(history.records, convergenceBound: .seconds(10)).isValid, "within the bound: still moving")
        #expect(result.disconnects == 0)

        // A connection a client closed because the gateway broke the protocol: an anomaly,
        // whatever the faults; any other reason is only counted.
        var broken = Builder()
        for reason in [
            "disconnected: heartbeat timeout", "disconnected: protocol violation by the gateway: protocol error: delivery 2 skips 1",
        ] {
            broken.add("w2", .connect, .fail) {
                $0.client = "bob"
                $0.detail = reason
            }
        }
        let violated = HistoryChecker.check(broken.records)
        #expect(violated.disconnects == 2 && violated.anomalies.map(\.kind) == [.protocolViolation])
        #expect(HistoryChecker.check(history.records).isValid, "without a bound: only counted")
    }

    @Test("a record is one JSON line, as the workload writes it")
    func json() throws {
        let line =
            #"{"time":1764330000123,"process":"w3","kind":"send","phase":"invoke","id":"w3/alice/c7/42","client":"alice","peer":"bob","conversation":"c7"}"#
        let record = try JSONDecoder().decode(HistoryRecord.self, from: Data(line.utf8))
        #expect(record.kind == .send && record.phase == .invoke && record.peer == "bob" && record.sequence == nil)
        let again = try JSONDecoder().decode(HistoryRecord.self, from: try JSONEncoder().encode(record))
        #expect(again == record)
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode(
                HistoryRecord.self,
                from: Data(#"{"time":1,"process":"w","kind":"teleport","phase":"ok","id":""}"#.utf8)
            )
        }
    }
}
