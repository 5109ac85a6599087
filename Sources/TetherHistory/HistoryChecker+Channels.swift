/// The checker's channel rules (``HistoryChecker``): publications, receptions and gaps, per
/// subscriber and channel.
extension HistoryChecker {
    // MARK: Channels

    /// A place in a channel's stream.
    private struct Place: Hashable {
        var channel: String
        var epoch: UInt64
        var offset: UInt64
    }

    /// How far one subscriber (a client, on a channel) is accounted for.
    private struct Subscriber {
        /// The first position it accounted for (received or a gap): the publications before
        /// were published before it subscribed.
        var first: UInt64
        /// The highest position it accounted for.
        var last: UInt64
        /// The position of its last record: a process started again after a kill may receive
        /// from an older one than `last` (its kept position), in order again.
        var cursor: UInt64
        var epoch: UInt64?
        var lastRecord: HistoryRecord
    }

    static func checkChannels(_ history: [HistoryRecord], _ kills: Kills, bound: Int64?, _ result: inout Result) {
        var publishes: [String: (invoke: HistoryRecord, outcome: HistoryRecord?)] = [:]
        for record in history where record.kind == .publish {
            if record.phase == .invoke {
                publishes[record.id] = (record, nil)
            } else if publishes[record.id] != nil, publishes[record.id]?.outcome == nil {
                publishes[record.id]?.outcome = record
            }
        }
        for publish in publishes.values { result.publishes[publish.outcome?.phase ?? .info, default: 0] += 1 }

        // What each position holds, and where each publication is: from the publishers'
        // acknowledgements and from what the subscribers received.
        var holder: [Place: HistoryRecord] = [:]
        var placeOf: [String: (place: Place, record: HistoryRecord)] = [:]
        func place(_ record: HistoryRecord, at place: Place) {
            if let other = holder[place], other.id != record.id {
                result.anomalies.append(
                    Anomaly(
                        kind: .twoAtOnePosition,
                        message: "\(place.channel) \(place.epoch):\(place.offset) holds \(other.id) and \(record.id)",
                        records: [other, record]
                    )
                )
                return
            }
            holder[place] = record
            if let other = placeOf[record.id], other.place != place {
                result.anomalies.append(
                    Anomaly(
                        kind: .publishedTwice,
                        message:
                            "\(record.id) is at \(other.place.epoch):\(other.place.offset) and at \(place.epoch):\(place.offset) of \(place.channel)",
                        records: [other.record, record]
                    )
                )
                return
            }
            placeOf[record.id] = (place, record)
        }
        // The acknowledged publications, by channel: placed now, owed to subscribers at the end.
        var acknowledged: [String: [(offset: UInt64, epoch: UInt64, record: HistoryRecord)]] = [:]
        for publish in publishes.values {
            guard let outcome = publish.outcome, outcome.phase == .ok, let offset = outcome.position else { continue }
            let channel = publish.invoke.channel ?? ""
            place(outcome, at: Place(channel: channel, epoch: outcome.epoch ?? 0, offset: offset))
            acknowledged[channel, default: []].append((offset, outcome.epoch ?? 0, outcome))
        }

        var subscribers: [String: Subscriber] = [:]
        var slowest: (wait: Int64, records: [HistoryRecord])?
        for record in history where (record.kind == .receive || record.kind == .gap) && record.phase == .ok {
            guard let position = record.position else { continue }
            let end = record.kind == .gap ? max(record.end ?? position, position) : position
            let channel = record.channel ?? ""
            let key = "\(record.client ?? record.process)\u{0}\(channel)"
            if record.kind == .receive {
                if let publish = publishes[record.id] {
                    if publish.outcome?.phase == .fail {
                        result.anomalies.append(
                            Anomaly(
                                kind: .refusedDelivered,
                                message: "publication \(record.id) failed (\(publish.outcome?.detail ?? "-")) and was received",
                                records: [publish.invoke, publish.outcome!, record]
                            )
                        )
                    }
                    if let stopped = result.faultsStopped, let outcome = publish.outcome, outcome.phase == .ok {
                        let wait = record.time - max(stopped, outcome.time)
                        if wait > 0, wait > slowest?.wait ?? 0 { slowest = (wait, [publish.invoke, outcome, record]) }
                    }
                } else {
                    result.anomalies.append(
                        Anomaly(kind: .neverPublished, message: "\(record.id) at \(position) on \(channel)", records: [record])
                    )
                }
                place(record, at: Place(channel: channel, epoch: record.epoch ?? 0, offset: position))
            }
            // The first record, or the first of another epoch (after a gap that says so).
            guard var subscriber = subscribers[key], record.epoch == subscriber.epoch || record.epoch == nil || subscriber.epoch == nil
            else {
                if let earlier = subscribers[key], record.kind != .gap {
                    result.anomalies.append(
                        Anomaly(
                            kind: .unaccounted,
                            message:
                                "\(record.client ?? record.process) on \(channel): epoch \(record.epoch ?? 0) after \(earlier.epoch ?? 0) with no gap",
                            records: [earlier.lastRecord, record]
                        )
                    )
                }
                subscribers[key] = Subscriber(first: position, last: end, cursor: end, epoch: record.epoch, lastRecord: record)
                if record.kind == .receive { result.received += 1 } else { result.gapPositions += end - position + 1 }
                continue
            }
            let who = record.client ?? record.process
            if kills.killed(record.process, after: subscriber.lastRecord.time, upTo: record.time) {
                // A process started again: from its kept position, at most where it was.
                if position > subscriber.last + 1 {
                    result.anomalies.append(
                        Anomaly(
                            kind: .unaccounted,
                            message: "\(who) on \(channel): positions \(subscriber.last + 1)…\(position - 1) neither received nor a gap",
                            records: [subscriber.lastRecord, record]
                        )
                    )
                }
            } else if position <= subscriber.cursor {
                result.anomalies.append(
                    Anomaly(
                        kind: position == subscriber.cursor ? .receivedTwice : .outOfOrder,
                        message: "\(who) on \(channel): position \(position) after \(subscriber.cursor), with no kill between",
                        records: [subscriber.lastRecord, record]
                    )
                )
            } else if position > max(subscriber.cursor, subscriber.last) + 1 {
                let from = max(subscriber.cursor, subscriber.last) + 1
                result.anomalies.append(
                    Anomaly(
                        kind: .unaccounted,
                        message: "\(who) on \(channel): positions \(from)…\(position - 1) neither received nor a gap",
                        records: [subscriber.lastRecord, record]
                    )
                )
            }
            if end > subscriber.last {
                let new = end - max(position, subscriber.last + 1) + 1
                if record.kind == .receive { result.received += 1 } else { result.gapPositions += new }
            } else if record.kind == .receive {
                result.receivedAgainAfterKills += 1
            }
            subscriber.last = max(subscriber.last, end)
            subscriber.cursor = end
            subscriber.epoch = record.epoch ?? subscriber.epoch
            subscriber.lastRecord = record
            subscribers[key] = subscriber
        }

        // Every acknowledged publication reached each subscriber of its channel that was
        // there when it was published: received, or inside a gap.
        for (key, subscriber) in subscribers.sorted(by: { $0.key < $1.key }) {
            let parts = key.split(separator: "\u{0}", omittingEmptySubsequences: false)
            let channel = String(parts.last ?? "")
            let missing = (acknowledged[channel] ?? []).filter {
                $0.epoch == (subscriber.epoch ?? $0.epoch) && $0.offset >= subscriber.first && $0.offset > subscriber.last
            }.sorted { $0.offset < $1.offset }
            guard let firstMissing = missing.first, let lastMissing = missing.last else { continue }
            result.anomalies.append(
                Anomaly(
                    kind: .acknowledgedNotReceived,
                    message:
                        "\(parts.first ?? "") on \(channel) got to \(subscriber.last): \(missing.count) acknowledged publications (\(firstMissing.offset)…\(lastMissing.offset)) never received",
                    records: [subscriber.lastRecord, firstMissing.record]
                )
            )
        }
        result.slowestChannelConvergence = slowest?.wait
        if let bound, let slowest, slowest.wait > bound {
            result.anomalies.append(
                Anomaly(
                    kind: .notConverged,
                    message:
                        "publication \(slowest.records[0].id) was received \(slowest.wait) ms after the faults stopped (the bound is \(bound) ms)",
                    records: slowest.records
                )
            )
        }
    }
}
