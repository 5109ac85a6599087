import Foundation
import Logging
import NIOCore
import Tether
public import TetherCore
import TetherHistory
import TetherNIO

/// One workload process of a nemesis run (`tether lab worker`): a few clients, each with its
/// outbox in SQLite on disk, sending reliable messages to the run's other clients, receiving
/// theirs and making requests, and recording every invocation and outcome to
/// `history-NAME.jsonl` (``HistoryWriter``). Killed and started again with the same
/// directory, it resumes: its clients' outboxes send what they had accepted, their checkpoints
/// say which deliveries were processed, and it appends to the same history.
///
/// With channels, each client subscribes to one of them (its place among everyone, modulo
/// their number), keeping its position in its outbox's file (``ClientConfiguration/Channels-swift.struct/positions``),
/// and one operation in ``Configuration-swift.struct/publishEvery`` publishes to a channel
/// drawn from them; receptions and gap events are recorded.
///
/// A message's body is its id in the history (`alice/bob/5f3a9c01/42`: sender, recipient, the
/// process start's nonce, a counter), so that its deliveries name it. The conversation is the
/// recipient's client id (the demo's `dm` handler delivers there). Which id the outbox gave a
/// message is kept in `CLIENT.map`, so that a process started again records the outcomes of
/// messages an earlier one sent; a message accepted just before a kill, whose line did not
/// reach the file, keeps no outcome (`info` for the checker).
public struct HistoryWorker: Sendable {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public struct Configuration: Sendable {
        /// The process's name in the history (`w1`); the same after a restart.
        public var name: String
        /// The client ids this process runs (each on one connection).
        public var clients: [String]
        /// Client ids another process runs that this one runs a second device of: with an outbox
        /// of its own (`CLIENT.twin-NAME.sqlite`), on another transport, sending messages,
        /// making requests and publishing, but neither processing deliveries (a client id's
        /// deliveries are one stream, PROTOCOL.md 9.2) nor subscribing.
        public var twins: [String] = []
        /// Every client id of the run: the recipients to choose from.
        public var everyone: [String]
        /// The gateways, in the order a client tries them (TCP).
        public var endpoints: [Endpoint]
        /// The gateways' WebSocket and HTTP-stream ports, in the same order: with them, the
        /// clients are spread over the transports by their place among everyone (TCP,
        /// WebSocket, the HTTP stream, TCP…); without, every client is on TCP.
        public var webPorts: [Int] = []
        /// Where the outboxes, the maps and the history are.
        public var directory: String
        /// When to stop sending (wall clock, milliseconds since 1970).
        public var sendUntil: Int64
        /// When to stop (wall clock): after `sendUntil`, the clients go on receiving.
        public var stopAt: Int64
        /// Between one client's operations.
        public var interval: Duration = .milliseconds(25)
        /// One operation in this many is an `echo` request, not a message.
        public var requestEvery: Int = 5
        /// The channels the clients subscribe to and publish to (none: no channel operations).
        public var channels: [String] = []
        /// With channels, one operation in this many (of those that are not requests) is a
        /// publication.
        public var publishEvery: Int = 4
        public var requestTimeout: Duration = .seconds(2)
        /// How long the gateway may stay silent before a client takes its connection for dead.
        public var heartbeat: Duration = .seconds(1)
        /// The longest a client waits between two attempts to connect, and before it sends an
        /// unacknowledged message again (the defaults, 30 s and 60 s, would make the
        /// convergence after the faults that long).
        public var longestBackoff: Duration = .seconds(2)
        /// While on an endpoint that is not a client's first (a fallback, another node), how
        /// often it probes the ones before (the default, 10 s, would leave it there through
        /// most of the faults that follow).
        public var moveUpInterval: Duration = .seconds(2)
        /// Draws the recipients and the operations.
        public var seed: UInt64

        public init(
            name: String,
            clients: [String],
            everyone: [String],
            endpoints: [Endpoint],
            directory: String,
            sendUntil: Int64,
            stopAt: Int64,
            seed: UInt64
        ) {
            self.name = name
            self.clients = clients
            self.everyone = everyone
            self.endpoints = endpoints
            self.directory = directory
            self.sendUntil = sendUntil
            self.stopAt = stopAt
            self.seed = seed
        }
    }

    public let configuration: Configuration

    public init(configuration: Configuration) {
        self.configuration = configuration
    }

    /// The gateways for the client at `place` among everyone, over its transport. A TCP client
    /// lists a fallback after its TCP endpoints (WebSocket for every other one, the HTTP stream
    /// for the rest): where TCP is blocked it connects there, and moves back up once TCP answers.
    static func endpoints(place: Int, _ configuration: Configuration) -> [Endpoint] {
        guard !configuration.webPorts.isEmpty, configuration.webPorts.count == configuration.endpoints.count else {
            return configuration.endpoints
        }
        func web(_ transport: Endpoint.Transport) -> [Endpoint] {
            zip(configuration.endpoints, configuration.webPorts).map { Endpoint(host: $0.host, port: $1, transport: transport) }
        }
        let transports: [Endpoint.Transport] = [.tcp, .webSocket, .httpStream]
        let transport = transports[place % transports.count]
        guard transport == .tcp else { return web(transport) }
        return configuration.endpoints + web((place / transports.count) % 2 == 0 ? .webSocket : .httpStream)
    }

    /// Runs the clients until ``Configuration-swift.struct/stopAt``.
    public func run() async throws {
        let history = try HistoryWriter(
            path: "\(self.configuration.directory)/history-\(self.configuration.name).jsonl",
            process: self.configuration.name
        )
        let nonce = String(UInt32.random(in: 0...UInt32.max), radix: 16)
        try await withThrowingTaskGroup(of: Void.self) { group in
            let clients = self.configuration.clients.map { ($0, false) } + self.configuration.twins.map { ($0, true) }
            for (index, (client, twin)) in clients.enumerated() {
                let worker = try ClientWorker(
                    client: client,
                    twin: twin,
                    configuration: self.configuration,
                    history: history,
                    nonce: nonce,
                    seed: self.configuration.seed &+ UInt64(index) &* 0x9E37_79B9_7F4A_7C15
                )
                group.addTask { try await worker.run() }
            }
            try await group.waitForAll()
        }
    }
}

/// One client of a worker process.
private final class ClientWorker: Sendable {
    let client: String
    /// Whether it is a second device of a client another process runs.
    let twin: Bool
    let configuration: HistoryWorker.Configuration
    let history: HistoryWriter
    let nonce: String
    let seed: UInt64
    let tether: TetherClient
    let mapFile: String
    /// The channel it subscribes to, if the run has channels.
    let channel: String?
    /// The history ids of the messages the outbox holds, by the outbox's id; and outcomes that
    /// came before `send` returned their id.
    let messages = TetherLock<(ids: [UInt64: String], early: [UInt64: MessageOutcome])>(([:], [:]))

    init(client: String, twin: Bool, configuration: HistoryWorker.Configuration, history: HistoryWriter, nonce: String, seed: UInt64) throws
    {
        self.client = client
        self.twin = twin
        self.configuration = configuration
        self.history = history
        self.nonce = nonce
        self.seed = seed
        let place = configuration.everyone.firstIndex(of: client) ?? 0
        // A twin on the next place's transport, with files of its own.
        let files = "\(configuration.directory)/\(client)" + (twin ? ".twin-\(configuration.name)" : "")
        var clientConfiguration = ClientConfiguration(
            endpoints: HistoryWorker.endpoints(place: twin ? place + 1 : place, configuration),
            clientID: client
        )
        let store = try SQLiteOutboxStore(path: "\(files).sqlite")
        clientConfiguration.reliability = try .init(
            outbox: store,
            retransmission: RTTEstimator(maximumTimeout: configuration.longestBackoff)
        )
        // A worker started again after a kill resumes its subscription from the position kept
        // here (what came in the last interval before the kill comes again).
        clientConfiguration.channels = try .init(positions: store, saveInterval: .milliseconds(200))
        clientConfiguration.heartbeat.interval = configuration.heartbeat
        clientConfiguration.reconnect.backoff = try Backoff(maximum: configuration.longestBackoff)
        clientConfiguration.connection.moveUpInterval = configuration.moveUpInterval
        var logger = Logger(label: "tether.lab.worker.\(client)")
        logger.logLevel = .critical
        self.tether = try TetherClient(configuration: clientConfiguration, logger: logger)
        self.mapFile = "\(files).map"
        self.channel = configuration.channels.isEmpty || twin ? nil : configuration.channels[place % configuration.channels.count]
        // Messages an earlier process of this worker sent: their outcomes may come now.
        if let text = try? String(contentsOfFile: self.mapFile, encoding: .utf8) {
            var ids: [UInt64: String] = [:]
            for line in text.split(separator: "\n") {
                let fields = line.split(separator: " ")
                if fields.count == 2, let id = UInt64(fields[0]) { ids[id] = String(fields[1]) }
            }
            self.messages.withLockedValue { $0.ids = ids }
        }
    }

    func run() async throws {
        // Of the messages an earlier process sent, those still in the outbox.
        let pending = Set(try await self.tether.pendingMessages().map(\.id))
        self.messages.withLockedValue { $0.ids = $0.ids.filter { pending.contains($0.key) } }
        let events = self.tether.messageEvents  // before run(): no outcome is missed
        let connections = self.tether.events
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await self.tether.run() }
            group.addTask { await self.recordOutcomes(events) }  // ends when the client stops
            group.addTask { await self.recordConnections(connections) }  // this one too
            if !self.twin { group.addTask { await self.recordDeliveries() } }
            if let channel = self.channel { group.addTask { await self.recordPublications(channel) } }
            group.addTask {
                await self.operate()
                let rest = self.configuration.stopAt - HistoryWriter.now()
                if rest > 0 { try? await Task.sleep(for: .milliseconds(rest)) }
                // What has no outcome yet did not converge (the checker says so, if the faults
                // stopped long enough before).
                self.recordWhereConnected()
                let pending = self.messages.withLockedValue { $0.ids }
                for (_, id) in pending.sorted(by: { $0.key < $1.key }) {
                    let peer = id.split(separator: "/").dropFirst().first.map(String.init)
                    self.history.record(
                        .send,
                        .info,
                        id: id,
                        client: self.client,
                        peer: peer,
                        conversation: peer,
                        detail: HistoryRecord.pendingAtTheEnd
                    )
                }
                self.tether.shutdown()
            }
            try await group.waitForAll()
        }
    }

    /// Messages and requests, one at a time, until `sendUntil`.
    private func operate() async {
        var generator = SplitMix64(seed: self.seed)
        let peers = self.configuration.everyone.filter { $0 != self.client }
        guard !peers.isEmpty else { return }
        var counter = 0
        var others = 0
        let channels = self.configuration.channels
        while HistoryWriter.now() < self.configuration.sendUntil {
            counter += 1
            if counter % self.configuration.requestEvery == 0 {
                await self.request("\(self.client)/req/\(self.nonce)/\(counter)")
                try? await Task.sleep(for: self.configuration.interval)
                continue
            }
            others += 1
            if !channels.isEmpty, others % self.configuration.publishEvery == 0 {
                let channel = channels[Int(generator.next() % UInt64(channels.count))]
                await self.publish("\(self.client)/pub/\(self.nonce)/\(counter)", to: channel)
            } else {
                let peer = peers[Int(generator.next() % UInt64(peers.count))]
                await self.send("\(self.client)/\(peer)/\(self.nonce)/\(counter)", to: peer)
            }
            try? await Task.sleep(for: self.configuration.interval)
        }
    }

    private func send(_ id: String, to peer: String) async {
        self.history.record(.send, .invoke, id: id, client: self.client, peer: peer, conversation: peer)
        let receipt: MessageReceipt
        do {
            receipt = try await self.tether.send("dm", body: ByteBuffer(string: id), conversation: peer)
        } catch {
            // Not accepted: it will never be sent.
            self.history.record(.send, .fail, id: id, client: self.client, peer: peer, conversation: peer, detail: "\(error)")
            return
        }
        self.appendToMap("\(receipt.id) \(id)\n")
        let early = self.messages.withLockedValue { state -> MessageOutcome? in
            if let outcome = state.early.removeValue(forKey: receipt.id) { return outcome }
            state.ids[receipt.id] = id
            return nil
        }
        if let early { self.recordOutcome(early, of: id) }
    }

    private func request(_ id: String) async {
        self.history.record(.request, .invoke, id: id, client: self.client)
        do {
            let answer = try await self.tether.request("echo", body: ByteBuffer(string: id), timeout: self.configuration.requestTimeout)
            let echoed = String(buffer: answer)
            self.history.record(.request, .ok, id: id, client: self.client, detail: echoed == id ? nil : "echoed \(echoed)")
        } catch {
            // A timeout or a lost connection: it may have run.
            self.history.record(.request, .info, id: id, client: self.client, detail: "\(error)")
        }
    }

    private func publish(_ id: String, to channel: String) async {
        self.history.record(.publish, .invoke, id: id, client: self.client, channel: channel)
        do {
            let position = try await self.tether.publish(
                ByteBuffer(string: id),
                toChannel: channel,
                timeout: self.configuration.requestTimeout
            )
            self.history.record(
                .publish,
                .ok,
                id: id,
                client: self.client,
                channel: channel,
                position: position.offset,
                epoch: position.epoch
            )
        } catch {
            // Refused before it was sent: it is not published. Else (a timeout, a lost
            // connection, the gateway's error) it may be.
            let phase: HistoryRecord.Phase = error.code == .invalidArgument ? .fail : .info
            self.history.record(.publish, phase, id: id, client: self.client, channel: channel, detail: "\(error)")
        }
    }

    /// Records what the subscription hears: each publication as the app handles it (its
    /// position is kept once the loop asks for the next event), and gap events.
    private func recordPublications(_ channel: String) async {
        do {
            for try await event in self.tether.subscribe(channel) {
                switch event {
                case .publication(let publication):
                    let position = publication.position
                    self.history.record(
                        .receive,
                        .ok,
                        id: String(buffer: publication.body),
                        client: self.client,
                        channel: channel,
                        position: position.offset,
                        epoch: position.epoch
                    )
                case .gap(let gap):
                    // The positions missed, in the epoch it resumes in.
                    let first = gap.after.epoch == gap.resumesAt.epoch ? gap.after.offset + 1 : 1
                    self.history.record(
                        .gap,
                        .ok,
                        client: self.client,
                        channel: channel,
                        position: first,
                        end: max(first, gap.resumesAt.offset) - 1,
                        epoch: gap.resumesAt.epoch,
                        detail: "\(gap)"
                    )
                case .subscribed, .joined, .left:
                    break
                }
            }
        } catch {
            self.history.record(.gap, .info, client: self.client, channel: channel, detail: "the subscription ended: \(error)")
        }
    }

    /// Records each connection that comes up: its endpoint's transport, and its place in the
    /// client's list (0: the first; more: a fallback or another node); and why each ended.
    private func recordConnections(_ events: AsyncStream<ConnectionEvent>) async {
        for await event in events {
            if case .disconnected(let reason) = event {
                self.history.record(.connect, .fail, client: self.client, detail: "disconnected: \(reason)")
                continue
            }
            guard case .connected(let endpoint, _, let connection) = event else { continue }
            self.recordConnection(to: endpoint, .ok, id: "\(connection)", detail: "\(endpoint)")
        }
    }

    /// Records where the client is connected as it stops (after the quiet period, it should be
    /// on its first endpoint).
    private func recordWhereConnected() {
        let state = self.tether.connectionState
        guard case .connected(let endpoint) = state else {
            self.history.record(.connect, .info, client: self.client, detail: "at the end: not connected (\(state))")
            return
        }
        self.recordConnection(to: endpoint, .info, detail: "at the end: connected to \(endpoint)")
    }

    /// A `connect` record of a connection to `endpoint`: its transport, and its place in the
    /// client's list.
    private func recordConnection(to endpoint: Endpoint, _ phase: HistoryRecord.Phase, id: String = "", detail: String) {
        self.history.record(
            .connect,
            phase,
            id: id,
            client: self.client,
            peer: endpoint.transport.rawValue,
            position: self.tether.configuration.endpoints.firstIndex(of: endpoint).map(UInt64.init),
            detail: detail
        )
    }

    private func recordOutcomes(_ events: AsyncStream<MessageEvent>) async {
        for await event in events {
            guard case .finished(let outcome) = event.state else { continue }
            let id = self.messages.withLockedValue { state -> String? in
                if let id = state.ids.removeValue(forKey: event.id) { return id }
                state.early[event.id] = outcome
                return nil
            }
            if let id { self.recordOutcome(outcome, of: id) }
        }
    }

    private func recordOutcome(_ outcome: MessageOutcome, of id: String) {
        let parts = id.split(separator: "/")
        let peer = parts.count > 1 ? String(parts[1]) : nil
        switch outcome {
        case .acknowledged:
            self.history.record(.send, .ok, id: id, client: self.client, peer: peer, conversation: peer)
        case .refused, .expired:
            self.history.record(.send, .fail, id: id, client: self.client, peer: peer, conversation: peer, detail: "\(outcome)")
        }
    }

    /// Records each delivery as the app processes it: the record is written before the loop
    /// asks for the next one, which is when the client stores its checkpoint.
    private func recordDeliveries() async {
        do {
            for try await delivery in self.tether.deliveries() where delivery.topic == "dm" {
                let id = String(buffer: delivery.body)
                let sender = id.split(separator: "/").first.map(String.init)
                self.history.record(
                    .delivery,
                    .ok,
                    id: id,
                    client: self.client,
                    peer: sender,
                    conversation: self.client,
                    sequence: delivery.sequence
                )
            }
        } catch {}
    }

    private func appendToMap(_ line: String) {
        guard let handle = FileHandle(forWritingAtPath: self.mapFile) ?? Self.create(self.mapFile) else { return }
        defer { try? handle.close() }
        _ = try? handle.seekToEnd()
        try? handle.write(contentsOf: Data(line.utf8))
    }

    private static func create(_ path: String) -> FileHandle? {
        _ = FileManager.default.createFile(atPath: path, contents: nil)
        return FileHandle(forWritingAtPath: path)
    }
}
