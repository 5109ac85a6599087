/// Searches a run's history for what Tether promises never happens.
///
/// Reliable messages (``HistoryRecord/Kind/send``, ``HistoryRecord/Kind/delivery``):
/// - **acknowledged, never delivered**: a `send` whose outcome is `ok` has no delivery;
/// - **delivered twice**: a message delivered more than once to its recipient, unless the
///   process that recorded the earlier copy was killed in between (its app recorded the
///   delivery, and the kill came before the client stored its checkpoint: the restarted
///   process gets it again). Such repeats are allowed and counted;
/// - **never sent**: a delivery of an id no `send` invoked, or to another client than its
///   recipient;
/// - **refused, yet delivered**: a delivery of a message whose `send` failed;
/// - **out of order**: in a (sender's outbox, conversation, recipient), a message delivered for
///   the first time after one its outbox sent later (an outbox is a process's client: a client id
///   run by two processes has two, each numbering its conversations, PROTOCOL.md 9.1); or a first delivery whose sequence (the recipient's
///   stream of deliveries) is not one more than the recipient's last.
///
/// - **not converged**: an acknowledged message first delivered later than the bound after the
///   nemesis's last act (or after its acknowledgement, if that came later); or a message still
///   without an outcome when its process stopped (``HistoryRecord/pendingAtTheEnd``) later
///   than the bound after the nemesis's last act.
///
/// Requests: **answered twice**, or answered after it was reported failed.
///
/// Channels (``HistoryRecord/Kind/publish``, ``HistoryRecord/Kind/receive``,
/// ``HistoryRecord/Kind/gap``), per subscriber (a client) and channel:
/// - **received twice** or **out of order**: a position at or before the one it received
///   last, unless its process was killed in between (started again, it resumes from the
///   position it kept, which may be older: those come again, in order, and are counted);
/// - **neither received nor a gap**: a position after the first it accounted for that it
///   neither received nor was told it missed (a gap event);
/// - **published, never received**: an acknowledged publication at or after a subscriber's
///   first position that it neither received nor was told it missed by the end;
/// - **never published**: a publication no `publish` invoked; **refused, yet delivered**: one
///   whose `publish` failed;
/// - **two publications at one position** (from the acknowledgements and from what every
///   subscriber received), and **published twice**: one publication at two positions;
/// - **not converged**: an acknowledged publication received later than the bound after the
///   faults stopped.
///
/// Connections (``HistoryRecord/Kind/connect``): **not back on its first endpoint**, a client
/// whose process stopped, more than the bound after the faults stopped, connected to a
/// fallback or another node (it should have moved back up), or not connected at all; and a
/// **protocol violation**, a connection a client closed because the gateway broke the protocol
/// (PROTOCOL.md: never, whatever the faults).
///
/// ```swift
/// let result = HistoryChecker.check(records)
/// for anomaly in result.anomalies { print(anomaly) }
/// ```
public enum HistoryChecker {
    /// What the checker found.
    public struct Result: Sendable {
        public var anomalies: [Anomaly]
        /// Sends by their outcome (`ok`, `fail`, `info`).
        public var sends: [HistoryRecord.Phase: Int]
        /// First deliveries of messages.
        public var delivered: Int
        /// Deliveries repeated after a kill of the recording process (allowed).
        public var repeatsAfterKills: Int
        /// Requests answered.
        public var requestsAnswered: Int
        /// Publications by their outcome (`ok`, `fail`, `info`).
        public var publishes: [HistoryRecord.Phase: Int] = [:]
        /// Channel publications received (first time) and positions covered by gaps.
        public var received: Int
        public var gapPositions: UInt64
        /// Publications received again by a process started again after a kill, from the
        /// position it kept (allowed).
        public var receivedAgainAfterKills = 0
        /// The longest wait, after the faults stopped (or its acknowledgement, if later), for
        /// an acknowledged publication to reach a subscriber, in milliseconds.
        public var slowestChannelConvergence: Int64?
        /// When the nemesis's last act was (milliseconds since 1970), if it acted.
        public var faultsStopped: Int64?
        /// The longest wait, after the faults stopped (or after its acknowledgement, if later),
        /// for the first delivery of an acknowledged message, in milliseconds.
        public var slowestConvergence: Int64?
        /// Connections that came up, by their endpoint's transport (`tether`, `ws`, `http`).
        public var connections: [String: Int] = [:]
        /// Connections to an endpoint that is not the client's first (a fallback, another node),
        /// and connections to its first that followed one of those (moves back up).
        public var connectionsElsewhere = 0
        public var connectionsBackOnFirst = 0
        /// Connections that ended (for any reason: faults, moves, the end).
        public var disconnects = 0

        /// Whether the history holds no anomaly.
        public var isValid: Bool { self.anomalies.isEmpty }
    }

    /// One thing that must not happen, and the records that show it.
    public struct Anomaly: Sendable, Hashable, CustomStringConvertible {
        public enum Kind: String, Sendable, Hashable {
            case acknowledgedNotDelivered = "acknowledged, never delivered"
            case deliveredTwice = "delivered twice"
            case neverSent = "never sent"
            case refusedDelivered = "refused, yet delivered"
            case outOfOrder = "out of order"
            case answeredTwice = "answered twice"
            case receivedTwice = "received twice"
            case unaccounted = "neither received nor a gap"
            case neverPublished = "never published"
            case twoAtOnePosition = "two publications at one position"
            case publishedTwice = "published twice"
            case acknowledgedNotReceived = "published, never received"
            case notConverged = "not converged"
            case notMovedUp = "not back on its first endpoint"
            case protocolViolation = "protocol violation"
        }

        public var kind: Kind
        public var message: String
        /// The records that show it, in the history's order.
        public var records: [HistoryRecord]
        /// The nemesis's faults in force from its first record to its last (``FaultTimeline``).
        public var faultsInForce: [String] = []

        public var description: String { "\(self.kind.rawValue): \(self.message)" }
    }

    /// Checks `records` (from every process of the run, in any order: they are put in the order
    /// of their times, each process's records in its own order).
    ///
    /// - Parameter convergenceBound: How long after the nemesis's last act (a kill, or a fault
    ///   record) an acknowledged message may take to be delivered; later is an anomaly
    ///   (**not converged**). `nil`: only measured (``Result/slowestConvergence``).
    public static func check(_ records: [HistoryRecord], convergenceBound: Duration? = nil) -> Result {
        let history = records.enumerated().sorted { ($0.element.time, $0.offset) < ($1.element.time, $1.offset) }.map(\.element)
        var result = Result(
            anomalies: [],
            sends: [:],
            delivered: 0,
            repeatsAfterKills: 0,
            requestsAnswered: 0,
            received: 0,
            gapPositions: 0
        )
        let kills = Kills(history)
        result.faultsStopped = history.last { $0.kind == .kill || $0.kind == .fault }?.time
        let bound = convergenceBound.map { $0.components.seconds * 1_000 + $0.components.attoseconds / 1_000_000_000_000_000 }
        Self.checkMessages(history, kills, bound: bound, &result)
        Self.checkRequests(history, &result)
        Self.checkChannels(history, kills, bound: bound, &result)
        Self.checkConnections(history, bound: bound, &result)
        let timeline = FaultTimeline(history)
        for index in result.anomalies.indices {
            let times = result.anomalies[index].records.map(\.time)
            guard let first = times.min(), let last = times.max() else { continue }
            result.anomalies[index].faultsInForce = timeline.inForce(from: first, to: last).map(\.detail)
        }
        return result
    }

    // MARK: Messages

    private struct Send {
        var invoke: HistoryRecord
        var outcome: HistoryRecord?
        /// Its place among its sender's sends in the conversation.
        var index: Int
    }

    private static func checkMessages(_ history: [HistoryRecord], _ kills: Kills, bound: Int64?, _ result: inout Result) {
        var sends: [String: Send] = [:]
        var sendsPerConversation: [String: Int] = [:]
        for record in history where record.kind == .send {
            if record.phase == .invoke {
                let key = "\(record.process)\u{0}\(record.client ?? "")\u{0}\(record.conversation ?? "")"
                let index = sendsPerConversation[key, default: 0]
                sendsPerConversation[key] = index + 1
                sends[record.id] = Send(invoke: record, index: index)
            } else if sends[record.id]?.outcome == nil {
                sends[record.id]?.outcome = record
            }
        }
        for send in sends.values {
            result.sends[send.outcome?.phase ?? .info, default: 0] += 1
        }

        // Deliveries, per message and per (sender's outbox, conversation, recipient) in delivery order.
        var copies: [String: [HistoryRecord]] = [:]
        var lastInStream: [String: (index: Int, record: HistoryRecord)] = [:]
        var lastSequence: [String: (sequence: UInt64, record: HistoryRecord)] = [:]
        for delivery in history where delivery.kind == .delivery && delivery.phase == .ok {
            guard let send = sends[delivery.id] else {
                result.anomalies.append(
                    Anomaly(kind: .neverSent, message: "\(delivery.id) was delivered to \(delivery.client ?? "?")", records: [delivery])
                )
                continue
            }
            if delivery.client != send.invoke.peer {
                result.anomalies.append(
                    Anomaly(
                        kind: .neverSent,
                        message: "\(delivery.id) was sent to \(send.invoke.peer ?? "?") and delivered to \(delivery.client ?? "?")",
                        records: [send.invoke, delivery]
                    )
                )
                continue
            }
            if send.outcome?.phase == .fail {
                result.anomalies.append(
                    Anomaly(
                        kind: .refusedDelivered,
                        message: "\(delivery.id) failed (\(send.outcome?.detail ?? "-")) and was delivered",
                        records: [send.invoke, send.outcome!, delivery]
                    )
                )
            }
            if let earlier = copies[delivery.id]?.last {
                copies[delivery.id]!.append(delivery)
                if kills.killed(earlier.process, after: earlier.time, upTo: delivery.time) {
                    result.repeatsAfterKills += 1
                } else {
                    result.anomalies.append(
                        Anomaly(
                            kind: .deliveredTwice,
                            message:
                                "\(delivery.id) was delivered again to \(delivery.client ?? "?") with no kill of \(earlier.process) between",
                            records: [earlier, delivery]
                        )
                    )
                }
                continue
            }
            copies[delivery.id] = [delivery]
            result.delivered += 1
            let stream =
                "\(send.invoke.process)\u{0}\(send.invoke.client ?? "")\u{0}\(send.invoke.conversation ?? "")\u{0}\(delivery.client ?? "")"
            if let last = lastInStream[stream], send.index < last.index {
                result.anomalies.append(
                    Anomaly(
                        kind: .outOfOrder,
                        message: "\(delivery.id) (sent #\(send.index + 1)) came after \(last.record.id) (sent #\(last.index + 1))",
                        records: [last.record, delivery]
                    )
                )
            }
            lastInStream[stream] = (send.index, delivery)
            if let sequence = delivery.sequence, let recipient = delivery.client {
                if let last = lastSequence[recipient], sequence != last.sequence + 1 {
                    result.anomalies.append(
                        Anomaly(
                            kind: .outOfOrder,
                            message:
                                "\(recipient)'s delivery \(sequence) (\(delivery.id)) came after its delivery \(last.sequence) (\(last.record.id))",
                            records: [last.record, delivery]
                        )
                    )
                }
                lastSequence[recipient] = (sequence, delivery)
            }
        }
        if let bound, let stopped = result.faultsStopped {
            for send in sends.values {
                guard let outcome = send.outcome, outcome.phase == .info, outcome.detail == HistoryRecord.pendingAtTheEnd,
                    outcome.time - stopped > bound
                else { continue }
                result.anomalies.append(
                    Anomaly(
                        kind: .notConverged,
                        message:
                            "\(send.invoke.id) still had no outcome \(outcome.time - stopped) ms after the faults stopped (the bound is \(bound) ms)",
                        records: [send.invoke, outcome]
                    )
                )
            }
        }
        for send in sends.values where send.outcome?.phase == .ok {
            guard let delivery = copies[send.invoke.id]?.first else {
                result.anomalies.append(
                    Anomaly(
                        kind: .acknowledgedNotDelivered,
                        message: "\(send.invoke.id) to \(send.invoke.peer ?? "?") was acknowledged and never delivered",
                        records: [send.invoke, send.outcome!]
                    )
                )
                continue
            }
            // Convergence: how long after the faults stopped (or its acknowledgement) it came.
            guard let stopped = result.faultsStopped else { continue }
            let wait = delivery.time - max(stopped, send.outcome!.time)
            guard wait > 0 else { continue }
            result.slowestConvergence = max(result.slowestConvergence ?? 0, wait)
            if let bound, wait > bound {
                result.anomalies.append(
                    Anomaly(
                        kind: .notConverged,
                        message: "\(send.invoke.id) was delivered \(wait) ms after the faults stopped (the bound is \(bound) ms)",
                        records: [send.invoke, send.outcome!, delivery]
                    )
                )
            }
        }
    }

    // MARK: Requests

    private static func checkRequests(_ history: [HistoryRecord], _ result: inout Result) {
        var outcomes: [String: HistoryRecord] = [:]
        for record in history where record.kind == .request && record.phase != .invoke {
            if let first = outcomes[record.id] {
                if record.phase == .ok {
                    result.anomalies.append(
                        Anomaly(
                            kind: .answeredTwice,
                            message: "request \(record.id) was answered after its \(first.phase.rawValue) outcome",
                            records: [first, record]
                        )
                    )
                }
                continue
            }
            outcomes[record.id] = record
            if record.phase == .ok { result.requestsAnswered += 1 }
        }
    }
}

/// The kills of the nemesis, by the process killed.
struct Kills {
    private var times: [String: [Int64]] = [:]

    init(_ history: [HistoryRecord]) {
        for record in history where record.kind == .kill && record.phase != .fail {
            if let process = record.peer { self.times[process, default: []].append(record.time) }
        }
    }

    /// Whether `process` was killed after `start` and no later than `end`.
    func killed(_ process: String, after start: Int64, upTo end: Int64) -> Bool {
        self.times[process]?.contains { $0 >= start && $0 <= end } ?? false
    }
}
