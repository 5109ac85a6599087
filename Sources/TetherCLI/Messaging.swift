import ArgumentParser
import Foundation
import Logging
import NIOCore
import Tether

/// Options shared by the reliable messaging commands.
struct ReliableClientOptions: ParsableArguments {
    @Option(name: .customLong("as"), help: "Your client id. Run one process per client id at a time.")
    var clientID: String

    @Option(help: "This client's SQLite file (outbox and delivery checkpoint); default: CLIENT-ID.tether.sqlite. :memory: keeps nothing.")
    var store: String?

    @OptionGroup var gateway: GatewayOptions

    func makeClient() throws -> TetherClient {
        let path = self.store ?? "\(self.clientID).tether.sqlite"
        let outbox: any OutboxStore
        if path == ":memory:" {
            outbox = InMemoryOutboxStore()
        } else {
            do {
                outbox = try SQLiteOutboxStore(path: path)
            } catch {
                throw ValidationError("cannot open the store '\(path)': \(error)")
            }
        }
        var configuration = try self.gateway.configuration(clientID: self.clientID)
        configuration.reliability = try .init(outbox: outbox)
        return try TetherClient(configuration: configuration, transport: self.gateway.transport())
    }
}

struct Send: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Send messages reliably and wait until the gateway has processed them.",
        discussion: """
            Each message is stored in the client's SQLite file before it is sent. If this command is
            killed, run it again with the same --as and --store: it sends what was left, before any
            new message. Prints a line per message accepted (accepted ID SEQUENCE TEXT), then one
            per outcome (acknowledged ID, refused ID STATUS, expired ID).

            Example: tether send --as alice --to bob "hello" "how are you?"
            """
    )

    @Argument(help: "The messages (UTF-8 text).")
    var texts: [String] = []

    @Option(help: "The recipient's client id (the conversation).")
    var to: String

    @Option(help: "Send N numbered messages TEXT-1 … TEXT-N, TEXT being the first argument (or 'message').")
    var count: Int?

    @Option(help: "The message topic.")
    var topic = "dm"

    @Option(name: .customLong("ttl"), help: "Seconds after which an unacknowledged message expires.")
    var ttlSeconds: Double?

    @Option(name: .customLong("timeout"), help: "Seconds to wait for the outcomes; what is left stays in the outbox.")
    var timeoutSeconds: Double?

    @OptionGroup var client: ReliableClientOptions

    @OptionGroup var logging: LoggingOptions

    func validate() throws {
        if let count = self.count, count < 1 { throw ValidationError("--count must be at least 1") }
        if self.count != nil, self.texts.count > 1 { throw ValidationError("--count takes at most one TEXT") }
        guard !self.to.isEmpty else { throw ValidationError("--to must not be empty") }
    }

    func run() async throws {
        try self.logging.bootstrap(default: .critical)
        let ttl = try self.ttlSeconds.map { try duration(seconds: $0, option: "ttl") }
        let timeout = try self.timeoutSeconds.map { try duration(seconds: $0, option: "timeout") }
        let texts: [String]
        if let count = self.count {
            let prefix = self.texts.first ?? "message"
            texts = (1...count).map { "\(prefix)-\($0)" }
        } else {
            texts = self.texts
        }
        let client = try self.client.makeClient()

        let failures = try await withThrowingTaskGroup(of: Int?.self) { group in
            group.addTask {
                try await client.run()
                return nil
            }
            group.addTask {
                defer { client.shutdown() }
                // Left over from an earlier run that was stopped: they go first.
                var receipts = try await client.pendingMessages()
                if !receipts.isEmpty { output("resuming \(receipts.count) messages left in the outbox") }
                for text in texts {
                    let receipt = try await client.send(self.topic, body: ByteBuffer(string: text), conversation: self.to, ttl: ttl)
                    output("accepted \(receipt.id) \(receipt.sequence) \(text)")
                    receipts.append(receipt)
                }
                return try await self.report(receipts, of: client, timeout: timeout)
            }
            var failures = 0
            for try await result in group {
                if let result { failures = result }
            }
            return failures
        }
        if failures > 0 { throw ExitCode.failure }
    }

    /// Prints each message's outcome; returns how many did not succeed.
    private func report(_ receipts: [MessageReceipt], of client: TetherClient, timeout: Duration?) async throws -> Int {
        try await withThrowingTaskGroup(of: Int.self) { group in
            group.addTask {
                var failures = 0
                for receipt in receipts {
                    switch await client.outcome(of: receipt) {
                    case .acknowledged:
                        output("acknowledged \(receipt.id)")
                    case .refused(let status):
                        output("refused \(receipt.id) \(status)")
                        failures += 1
                    case .expired:
                        output("expired \(receipt.id)")
                        failures += 1
                    case nil:
                        output("unknown \(receipt.id)")
                    }
                }
                return failures
            }
            if let timeout {
                group.addTask {
                    try await Task.sleep(for: timeout)
                    let left = try await client.pendingMessages().count
                    printError("timed out: \(left) messages are still in the outbox; run the command again to send them")
                    return max(1, left)
                }
            }
            let failures = try await group.next()!
            group.cancelAll()
            return failures
        }
    }
}

struct Receive: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the reliable deliveries of a client id: each once, in order, across restarts.",
        discussion: """
            Prints SEQUENCE TOPIC TEXT per delivery. A delivery is acknowledged (and never printed
            again) once the next one is asked for, with the checkpoint kept in the client's SQLite file.

            Example: tether receive --as bob --count 2
            """
    )

    @Option(help: "Stop after this many deliveries.")
    var count: Int?

    @OptionGroup var client: ReliableClientOptions

    @OptionGroup var logging: LoggingOptions

    func validate() throws {
        if let count = self.count, count < 1 { throw ValidationError("--count must be at least 1") }
    }

    func run() async throws {
        try self.logging.bootstrap(default: .critical)
        let client = try self.client.makeClient()
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { try await client.run() }
            group.addTask {
                defer { client.shutdown() }
                var received = 0
                for try await delivery in client.deliveries() {
                    output("\(delivery.sequence) \(delivery.topic) \(String(buffer: delivery.body))")
                    received += 1
                    if let count = self.count, received >= count { break }
                }
            }
        }
    }
}

/// Writes a line to standard output at once (unbuffered, so that a pipe sees it immediately).
func output(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}
