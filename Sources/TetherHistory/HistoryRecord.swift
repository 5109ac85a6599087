/// One line of a run's history: an operation's invocation or its outcome, a delivery or a
/// channel publication a client received, or an act of the nemesis.
///
/// Each process of a run (a workload process, the nemesis) writes its records as JSON lines;
/// ``HistoryChecker`` reads them all. As in Jepsen's histories, an operation has an `invoke`
/// record and then one outcome: `ok`, `fail` (it certainly did not happen: refused, expired),
/// or `info` (not known: a timeout, the process died). An operation with no outcome at all is
/// taken as `info`.
///
/// ```json
/// {"time":1764330000123,"process":"w3","kind":"send","phase":"invoke","id":"w3/alice/c7/42","client":"alice","peer":"bob","conversation":"c7"}
/// ```
public struct HistoryRecord: Codable, Sendable, Hashable {
    /// What the record is about.
    public enum Kind: String, Codable, Sendable, Hashable {
        /// A reliable message sent: `id` (unique in the run), `client` (the sender), `peer` (the
        /// recipient's client id), `conversation`.
        case send
        /// A reliable message the recipient's app processed: `id`, `client` (the recipient),
        /// `peer` (the sender), `conversation`, `sequence` (its number in the recipient's
        /// stream of deliveries, which every sender's messages share).
        case delivery
        /// A request: `id`, `client`.
        case request
        /// A channel publication: `id` (its body), `client` (the publisher), `channel`;
        /// `position` and `epoch` in its `ok`.
        case publish
        /// A channel publication a subscriber received: `id`, `client` (the subscriber),
        /// `channel`, `position`, `epoch`.
        case receive
        /// A gap a subscriber was told of: `client`, `channel`, `position` (the first missed) to
        /// `end` (the last missed), `epoch` (the one it resumes in).
        case gap
        /// A client's connection came up: `id` (the connection's), `client`, `peer` (the
        /// endpoint's transport: `tether`, `ws`, `http`…), `position` (the endpoint's place in the
        /// client's list: 0, its first; more, a fallback or another node), `detail` (the
        /// endpoint). Its `fail`: a connection ended, `detail` says why. Its `info`: where the
        /// client was connected as its process stopped, the same fields as `ok` (no `position`
        /// if it was not connected).
        case connect
        /// The nemesis killed (SIGKILL) a process of the run: `peer` names it.
        case kill
        /// Any other fault of the nemesis, for the report: `detail` says which; `invoke` when
        /// it starts, `ok` when it is healed.
        case fault
    }

    /// The `detail` of a send's `info` outcome recorded when its process stopped while the
    /// message was accepted and still had no outcome: the checker counts it as not converged
    /// (if the faults stopped long enough before).
    public static let pendingAtTheEnd = "pending at the end"

    /// Where the record stands in its operation's life.
    public enum Phase: String, Codable, Sendable, Hashable {
        case invoke, ok, fail, info
    }

    /// The wall clock, in milliseconds since 1970, when the record was made.
    public var time: Int64
    /// The process that made it (a workload process's name, or `nemesis`); a process started
    /// again after a kill keeps its name.
    public var process: String
    public var kind: Kind
    public var phase: Phase
    /// The operation's id, unique in the run for its kind (a message's id is in its body, so
    /// that its deliveries name it too).
    public var id: String
    public var client: String?
    public var peer: String?
    public var conversation: String?
    public var sequence: UInt64?
    public var channel: String?
    public var position: UInt64?
    public var end: UInt64?
    /// The epoch of a channel position (a channel's history started again has another).
    public var epoch: UInt64?
    /// Why an operation failed, what a fault was.
    public var detail: String?

    public init(
        time: Int64,
        process: String,
        kind: Kind,
        phase: Phase,
        id: String = "",
        client: String? = nil,
        peer: String? = nil,
        conversation: String? = nil,
        sequence: UInt64? = nil,
        channel: String? = nil,
        position: UInt64? = nil,
        end: UInt64? = nil,
        epoch: UInt64? = nil,
        detail: String? = nil
    ) {
        self.time = time
        self.process = process
        self.kind = kind
        self.phase = phase
        self.id = id
        self.client = client
        self.peer = peer
        self.conversation = conversation
        self.sequence = sequence
        self.channel = channel
        self.position = position
        self.end = end
        self.epoch = epoch
        self.detail = detail
    }
}
