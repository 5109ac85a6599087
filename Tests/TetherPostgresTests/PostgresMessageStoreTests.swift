import Foundation
import NIOCore
import PostgresNIO
import Testing
import TetherCore
import TetherGateway
import TetherGatewayTesting
import TetherPostgres
import TetherTestSupport

@Suite("PostgresMessageStore", .requires(.postgresql))
struct PostgresMessageStoreTests {
    /// PostgresNIO 1.33.2 crashes the process when a read brings a notice and no row while a
    /// query's rows stream, and PostgreSQL warns every session as it goes down ("terminating
    /// connection due to immediate shutdown command"): the nemesis saw a node crash as
    /// PostgreSQL was stopped (`-m immediate`) while the node read a channel's history. The
    /// store's connections ask for no warnings or notices.
    @Test("the store's connections ask PostgreSQL for no warnings or notices (client_min_messages = error)")
    func noNotices() async throws {
        try await TestPostgres.withDatabase { client, _ in
            let rows = try await client.query("SHOW client_min_messages")
            #expect(try await rows.collect().first?.decode(String.self) == "error")
        }
    }

    @Test("passes the store contract", arguments: MessageStoreContract.checks)
    func contract(_ check: MessageStoreContract.Check) async throws {
        try await TestPostgres.withDatabase { client, _ in
            try await check.run(on: try await PostgresMessageStore(client: client))
        }
    }

    @Test("passes the channel history contract", arguments: ChannelHistoryStoreContract.checks)
    func channelContract(_ check: ChannelHistoryStoreContract.Check) async throws {
        try await TestPostgres.withDatabase { client, _ in
            try await check.run(on: try await PostgresMessageStore(client: client))
        }
    }

    @Test("two stores on one database append to one channel concurrently: one epoch, offsets without gaps or doubles")
    func concurrentChannelAppends() async throws {
        try await TestPostgres.withDatabase { client, _ in
            let first = try await PostgresMessageStore(client: client)
            let second = try await PostgresMessageStore(client: client)
            let before = try await first.head(of: "room", notBefore: .distantPast)
            #expect(try await second.head(of: "room", notBefore: .distantPast) == before, "the same epoch before the first publication")
            let positions = try await withThrowingTaskGroup(of: [ChannelPosition].self) { group in
                for store in [first, second] {
                    group.addTask {
                        var positions: [ChannelPosition] = []
                        for index in 1...40 {
                            positions += try await store.appendPublications([
                                ChannelAppend(
                                    channel: "room",
                                    publisher: "",
                                    body: ByteBuffer(string: "\(index)"),
                                    time: Date(),
                                    maxCount: 1_000
                                )
                            ])
                        }
                        return positions
                    }
                }
                return try await group.reduce(into: []) { $0 += $1 }
            }
            #expect(Set(positions.map(\.epoch)) == [before.epoch])
            #expect(positions.map(\.offset).sorted() == Array(1...80))
        }
    }

    @Test("the epoch and everything committed survive reopening; a second store on the database shares them")
    func reopen() async throws {
        try await TestPostgres.withDatabase { client, _ in
            let first = try await PostgresMessageStore(client: client)
            let outbox = OutboxID(client: "a", epoch: 1)
            _ = try await first.commit(
                StoreWrite(
                    processed: [ProcessedMessage(outbox: outbox, conversation: "c", sequence: 1, messageID: 7)],
                    deliveries: [NewDelivery(recipient: "b", topic: "t", body: ByteBuffer(string: "x"))]
                )
            )
            let second = try await PostgresMessageStore(client: client)
            #expect(second.epoch == first.epoch)
            #expect(try await second.lastProcessed(outbox, conversation: "c") == 1)
            #expect(try await second.recordedOutcome(outbox, conversation: "c", sequence: 1) == RecordedOutcome(status: .ok, messageID: 7))
            #expect(try await second.deliveries(for: "b", after: 0, limit: 10).map(\.body) == [ByteBuffer(string: "x")])
        }
    }

    @Test("concurrent groups of two stores on one database number deliveries without gaps or doubles")
    func concurrentStores() async throws {
        try await TestPostgres.withDatabase { client, _ in
            let stores = [try await PostgresMessageStore(client: client), try await PostgresMessageStore(client: client)]
            try await withThrowingTaskGroup { group in
                for (index, store) in stores.enumerated() {
                    group.addTask {
                        for round in 0..<20 {
                            let writes = (0..<10).map { item in
                                StoreWrite(deliveries: [
                                    NewDelivery(recipient: "r", topic: "t", body: ByteBuffer(string: "\(index)-\(round)-\(item)"))
                                ])
                            }
                            for result in try await store.apply(writes) { _ = try result.get() }
                        }
                    }
                }
                try await group.waitForAll()
            }
            let all = try await stores[0].deliveries(for: "r", after: 0, limit: 1000)
            #expect(all.map(\.sequence) == Array(1...400))
            #expect(Set(all.map { String(buffer: $0.body) }).count == 400)
        }
    }

    @Test("a write whose fence is not its lane's current claim is refused as fenced, alone")
    func fenced() async throws {
        try await TestPostgres.withDatabase { client, _ in
            let store = try await PostgresMessageStore(client: client)
            let outbox = OutboxID(client: "a", epoch: 1)
            try await client.query("INSERT INTO tether_lanes (client, epoch, node, fence) VALUES ('a', 1, 1, 5)")
            let stale = StoreWrite(
                processed: [ProcessedMessage(outbox: outbox, conversation: "c", sequence: 1)],
                deliveries: [NewDelivery(recipient: "b", topic: "t", body: ByteBuffer(string: "stale"))],
                fence: LaneFence(outbox: outbox, token: 4)
            )
            let current = StoreWrite(
                processed: [ProcessedMessage(outbox: outbox, conversation: "c", sequence: 1)],
                deliveries: [NewDelivery(recipient: "b", topic: "t", body: ByteBuffer(string: "current"))],
                fence: LaneFence(outbox: outbox, token: 5)
            )
            let results = try await store.apply([stale, current])
            guard case .failure(let error) = results[0] else {
                Issue.record("the stale write was applied: \(results[0])")
                return
            }
            #expect(error.code == .fenced)
            #expect(try results[1].get() == [DeliveryReceipt(recipient: "b", sequence: 1)])
            #expect(try await store.deliveries(for: "b", after: 0, limit: 10).map { String(buffer: $0.body) } == ["current"])
        }
    }

    @Test("a write with a string PostgreSQL cannot hold (a NUL character) is refused alone; the rest of its group is applied")
    func unstorable() async throws {
        try await TestPostgres.withDatabase { client, _ in
            let store = try await PostgresMessageStore(client: client)
            let results = try await store.apply([
                StoreWrite(deliveries: [NewDelivery(recipient: "b", topic: "t", body: ByteBuffer(string: "1"))]),
                StoreWrite(processed: [ProcessedMessage(outbox: OutboxID(client: "a\u{0}", epoch: 1), conversation: "c", sequence: 1)]),
                StoreWrite(deliveries: [NewDelivery(recipient: "b", topic: "t\u{0}", body: ByteBuffer(string: "no"))]),
                StoreWrite(deliveries: [NewDelivery(recipient: "b", topic: "t", body: ByteBuffer(string: "2"))]),
            ])
            #expect(try results[0].get() == [DeliveryReceipt(recipient: "b", sequence: 1)])
            for index in [1, 2] {
                guard case .failure(let error) = results[index] else {
                    Issue.record("write \(index) was applied: \(results[index])")
                    continue
                }
                #expect(error.code == .invalidArgument)
                #expect(error.message.contains("NUL"))
            }
            #expect(try results[3].get() == [DeliveryReceipt(recipient: "b", sequence: 2)])
        }
    }

    @Test("a URL that is not PostgreSQL's is refused with a clear error")
    func badURL() {
        for url in ["http://localhost/db", "postgres://", "not a url", "postgres://h/db?sslmode=sometimes"] {
            #expect(throws: MessageStoreError.self) { try PostgresMessageStore.clientConfiguration(url: url) }
        }
    }

    @Test("a store whose database went away does not answer: checkReachable throws, and a gateway on it is not ready")
    func unreachable() async throws {
        try await TestPostgres.withDatabase { client, url in
            let store = try await PostgresMessageStore(client: client, operationTimeout: .seconds(2))
            try await store.checkReachable()
            var configuration = GatewayConfiguration.defaults
            configuration.listen = nil
            let gateway = try Gateway(configuration: configuration, messageStore: store)
            #expect(await gateway.readiness() == Gateway.Readiness(ready: false, reasons: ["starting"]), "not run yet; the store answers")

            let database = String(url.split(separator: "/").last!.split(separator: "?").first!)
            let admin = PostgresClient(
                configuration: try PostgresMessageStore.clientConfiguration(
                    url: url.replacingOccurrences(of: "/\(database)", with: "/tether")
                )
            )
            try await withThrowingTaskGroup { group in
                group.addTask { await admin.run() }
                defer { group.cancelAll() }
                try await admin.query(PostgresQuery(unsafeSQL: "DROP DATABASE \"\(database)\" WITH (FORCE)"))
            }
            await #expect(throws: MessageStoreError.self) { try await store.checkReachable() }
            let readiness = await gateway.readiness()
            #expect(!readiness.ready && readiness.reasons.contains { $0.hasPrefix("store unreachable") }, "\(readiness)")
        }
    }
}
