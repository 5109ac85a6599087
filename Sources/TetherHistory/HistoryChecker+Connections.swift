/// The checker's connection rules (``HistoryChecker``): where clients are as they stop, and
/// connections closed for a protocol violation.
extension HistoryChecker {
    // MARK: Connections

    /// What a disconnect's reason says when the gateway broke the protocol
    /// (`DisconnectReason.protocolViolation`).
    static let protocolViolation = "protocol violation by the gateway"

    static func checkConnections(_ history: [HistoryRecord], bound: Int64?, _ result: inout Result) {
        var last: [String: HistoryRecord] = [:]
        for record in history where record.kind == .connect {
            guard let client = record.client else { continue }
            let device = "\(record.process)\u{0}\(client)"  // a client id may run in two processes
            if record.phase == .fail {  // a connection that ended, and why
                result.disconnects += 1
                if let why = record.detail, why.contains(Self.protocolViolation) {
                    result.anomalies.append(
                        Anomaly(kind: .protocolViolation, message: "\(client) (in \(record.process)) \(why)", records: [record])
                    )
                }
                continue
            }
            guard record.phase == .ok else {
                // Where it was as its process stopped: on its first endpoint, once the faults
                // stopped more than the bound before.
                guard let bound, let stopped = result.faultsStopped, record.time - stopped > bound, record.position != 0 else { continue }
                let place = record.position.map { "place \($0) in its list" } ?? "no connection"
                result.anomalies.append(
                    Anomaly(
                        kind: .notMovedUp,
                        message:
                            "\(client) (in \(record.process)) stopped \(record.time - stopped) ms after the faults stopped (the bound is \(bound) ms) \(record.detail ?? "") (\(place))",
                        records: (last[device].map { [$0] } ?? []) + [record]
                    )
                )
                continue
            }
            result.connections[record.peer ?? "?", default: 0] += 1
            if record.position != 0 {
                result.connectionsElsewhere += 1
            } else if let previous = last[device], previous.position != 0 {
                result.connectionsBackOnFirst += 1
            }
            last[device] = record
        }
    }
}
