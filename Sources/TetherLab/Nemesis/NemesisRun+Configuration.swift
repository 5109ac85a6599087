import TetherCore

/// What a nemesis run is told (``NemesisRun/Configuration``), which faults it can inject
/// (``NemesisRun/Fault``), and what it reports (``NemesisRun/Report``).
extension NemesisRun {
    /// A kind of fault.
    public enum Fault: String, CaseIterable, Codable, Sendable {
        case killWorker = "kill-worker"
        case pauseWorker = "pause-worker"
        case killNode = "kill-node"
        case pauseNode = "pause-node"
        /// PostgreSQL crashed and started again (a cluster only).
        case restartPostgres = "restart-postgres"
        /// Every connection to PostgreSQL ended (a cluster only).
        case terminateConnections = "terminate-connections"
        /// A gateway cut off from every client: the packets to and from its port dropped
        /// (iptables; in a namespace). Twice as long as the other faults, so that some outlast
        /// the heartbeat's idle timeout.
        case partitionNode = "partition-node"
        /// Every transaction on PostgreSQL read-only, in open sessions and new ones
        /// (``LocalPostgres/setReadOnly(_:)``), undone at the heal (a cluster only).
        case readOnlyPostgres = "read-only-postgres"
        /// A node cut off from PostgreSQL: the packets between them dropped, the connections
        /// left open (a cluster in a namespace). Nodes talk to each other only through
        /// PostgreSQL, so this is also the partition between nodes.
        case partitionPostgres = "partition-postgres"
        /// 30 % of the packets to and from a gateway's port dropped (in a namespace).
        case losePackets = "lose-packets"
        /// Every packet to and from a gateway's ports held for a delay drawn around a mean (20
        /// to 250 ms, drawn per fault) with a jitter up to the mean, so that packets overtake
        /// each other: delay and reordering, as netem would (``PacketDelay``; in a namespace,
        /// with NetfilterQueue).
        case delayPackets = "delay-packets"
        /// The disk under the gateway's SQLite store full (one gateway, in a namespace).
        case fillDisk = "fill-disk"
        /// The disk under the gateway's SQLite store turned read-only by the kernel, as after
        /// an I/O error (ext4's emergency read-only; one gateway, in a namespace, where loop
        /// devices and `mkfs.ext4` are); then the repair: the gateway stopped (SIGKILL), the
        /// disk checked and mounted again, the gateway started.
        case readOnlyDisk = "read-only-disk"
        /// TCP blocked, as by a middlebox that lets only HTTP through: every packet to or from
        /// any gateway's TCP port answered with a reset (iptables; in a namespace), open
        /// connections cut and new ones refused. Clients that list a WebSocket or HTTP-stream
        /// endpoint after their TCP ones fall back to it, and move back up to TCP once the
        /// block lifts; their reliable messages and subscriptions resume on each switch. Twice
        /// as long as the other faults; a run over every transport only.
        case blockTCP = "block-tcp"

        /// Whether the fault is PostgreSQL's (a cluster only).
        public var needsPostgres: Bool {
            self == .restartPostgres || self == .terminateConnections || self == .partitionPostgres || self == .readOnlyPostgres
        }

        /// Whether the fault needs the run's own namespace (root): iptables rules or a mount.
        public var needsNamespace: Bool {
            self == .partitionNode || self == .partitionPostgres || self == .losePackets || self == .fillDisk || self == .readOnlyDisk
                || self == .blockTCP || self == .delayPackets
        }

        /// Whether the fault can be injected in a run with `nodes` gateways, in a namespace of
        /// its own or not, with clients over every transport or over TCP only.
        public func isAvailable(nodes: Int, namespace: Bool, everyTransport: Bool = true) -> Bool {
            if self.needsNamespace && !namespace { return false }
            if self == .blockTCP { return everyTransport }
            if self == .delayPackets { return PacketDelay.unavailableReason == nil }
            if self == .fillDisk { return nodes == 1 }
            if self == .readOnlyDisk { return nodes == 1 && SmallDisk.canBeExt4 }
            return nodes > 1 || !self.needsPostgres
        }
    }

    public struct Configuration: Sendable {
        /// The `tether` executable (for `serve` and `lab worker`).
        public var executable: String
        /// Where the store, the outboxes, the histories, the logs and the report go.
        public var directory: String
        /// Draws the faults, their targets, moments and lengths, and the workers' operations.
        public var seed: UInt64
        /// How long the workers send while faults are injected.
        public var faultySeconds: Double = 40
        /// After the faults: the workers stop sending and go on receiving for this long.
        public var quietSeconds: Double = 20
        public var workers = 2
        public var clientsPerWorker = 3
        /// Between one client's operations.
        public var interval: Duration = .milliseconds(25)
        /// Gateways: 1 with an SQLite store, or 2 and more on a private PostgreSQL server.
        public var nodes = 1
        /// Channels (`nemesis.room1`…): each client subscribes to one and publishes to any;
        /// their history is in the store (10,000 publications, an hour). 0: no channels.
        public var channels = 2
        /// Whether the clients are spread over TCP, WebSocket and the HTTP stream (each gateway
        /// listens for both on a second port); else all are on TCP.
        public var everyTransport = true
        /// The kinds of fault drawn from (PostgreSQL's only with a cluster).
        public var faults: [Fault] = Fault.allCases
        /// The mean time between the starts of two faults.
        public var meanGap: Duration = .seconds(2)
        /// The longest a fault lasts (each lasts 0.2 s to this).
        public var longestFault: Duration = .seconds(3)
        /// An acknowledged message must be delivered within this long after the last fault healed.
        public var convergenceBound: Duration = .seconds(15)
        /// The gateway's heartbeat (its idle timeout is three).
        public var heartbeat: Duration = .seconds(1)
        /// Whether this process runs in a network (and mount) namespace of its own, as root:
        /// then its iptables rules and mounts touch nothing else, and the network and disk
        /// faults can be injected. `tether lab nemesis` makes one when it can.
        public var namespace = false

        public init(executable: String, directory: String, seed: UInt64) {
            self.executable = executable
            self.directory = directory
            self.seed = seed
        }
    }

    /// What a run did and found (`report.json`).
    public struct Report: Codable, Sendable {
        public var seed: UInt64
        public var seconds: Double
        /// Operations invoked (messages sent, requests made, publications).
        public var operations: Int
        /// Messages by outcome (`ok`, `fail`, `info`).
        public var sends: [String: Int]
        public var delivered: Int
        public var repeatsAfterKills: Int
        public var requestsAnswered: Int
        /// Publications by outcome (`ok`, `fail`, `info`).
        public var publishes: [String: Int]
        /// Publications received by subscribers (each subscriber's first time), received again
        /// after a kill of the subscriber's process (from its kept position), and positions
        /// subscribers were told they missed (gap events).
        public var received: Int
        public var receivedAgainAfterKills: Int
        public var gapPositions: UInt64
        /// The longest an acknowledged publication took to reach a subscriber after the faults
        /// stopped, in milliseconds.
        public var slowestChannelConvergenceMs: Int64?
        /// Client connections that came up, by transport (`tether`, `ws`, `http`); those to an
        /// endpoint other than the client's first (a fallback, another node); and those back on
        /// its first after one elsewhere (moves back up).
        public var connections: [String: Int]
        public var connectionsElsewhere: Int
        public var connectionsBackOnFirst: Int
        /// Client connections that ended, for any reason.
        public var disconnects: Int
        /// Faults injected, by kind.
        public var faults: [String: Int]
        /// Packets held by the `delay-packets` faults, and those of them let go before one that
        /// arrived earlier (reordered).
        public var packetsDelayed: Int
        public var packetsReordered: Int
        /// Faults of the disk during which the gateway's `/ready` said 503, the store failing:
        /// full, and read-only.
        public var readyRefusedWhileDiskFull: Int
        public var readyRefusedWhileReadOnly: Int
        /// The longest an acknowledged message waited after the faults stopped, in milliseconds.
        public var slowestConvergenceMs: Int64?
        /// Each gateway's (`gateway`, `node-1`…) resident memory at its peak and its descriptors
        /// first and last, sampled every half second (a node started again counts as the same).
        public var gateways: [String: ProcessFigures]
        /// Each anomaly with the records that show it (also in `anomalies.txt`).
        public var anomalies: [String]
    }

    /// A process's resident memory and descriptors in a run.
    public struct ProcessFigures: Codable, Sendable {
        public var peakResidentBytes: Int
        /// Descriptors in the first sample, and in the last (after the workers stopped: the
        /// clients' connections are closed, so a leak shows as more than in the first).
        public var firstDescriptors: Int?
        public var lastDescriptors: Int?
    }
}
