import Foundation
import NIOCore
import Testing
import TetherCore
import TetherGateway

@testable import TetherPostgres

@Suite("The cluster's parts without PostgreSQL")
struct ClusterPartsTests {
    @Test("a lane's key in a signal names its outbox, whatever the client id holds")
    func laneKeys() {
        for outbox in [OutboxID(client: "alice", epoch: 1), OutboxID(client: "a\tb", epoch: .max), OutboxID(client: "", epoch: 0)] {
            #expect(PostgresCluster.outbox(from: PostgresCluster.key(of: outbox)) == outbox)
        }
        #expect(PostgresCluster.outbox(from: "no tab") == nil)
        #expect(PostgresCluster.outbox(from: "alice\tnot a number") == nil)
    }

    @Test("a client command survives its row in tether_pushes; a row of an unknown order or a cut body is skipped")
    func clientCommandRows() {
        let commands: [ClientCommand] = [
            .disconnect(client: "bob", reconnect: true, retryAfter: .milliseconds(1_500), message: "maintenance é"),
            .disconnect(client: "mallory", reconnect: false, retryAfter: .zero, message: ""),
            .refreshCredentials(client: "alice", expiresAt: Date(timeIntervalSince1970: 1_764_400_000.25)),
            .expireCredentials(client: "carol", message: "log in again"),
        ]
        for command in commands {
            let row = StoredClientCommand.row(command)
            #expect(row.kind == StoredClientCommand.kind && row.target == command.clientID)
            #expect(StoredClientCommand.decode(client: row.target, topic: row.topic, body: row.body) == command, "\(command)")
        }
        #expect(StoredClientCommand.decode(client: "bob", topic: "explode", body: ByteBuffer()) == nil)
        #expect(StoredClientCommand.decode(client: "bob", topic: "refresh", body: ByteBuffer(bytes: [1, 2])) == nil)
        #expect(StoredPushTarget.decode(kind: StoredClientCommand.kind, name: "bob") == nil, "not a push")
    }

    @Test("a doorbell rung before the wait wakes it at once; unrung, the wait ends at its timeout; a ring ends a wait")
    func doorbell() async {
        let bell = Doorbell()
        let clock = ContinuousClock()
        bell.ring()
        bell.ring()
        // Generous bounds: the suite runs beside others on a loaded machine. A wait that ended
        // far before its 60 s timeout was woken by the ring.
        var start = clock.now
        await bell.wait(upTo: .seconds(60))
        #expect(clock.now - start < .seconds(30), "rung before: at once (two rings count as one)")
        start = clock.now
        await bell.wait(upTo: .milliseconds(200))
        #expect(clock.now - start >= .milliseconds(190), "the second ring was not kept")
        start = clock.now
        async let waited: Void = bell.wait(upTo: .seconds(60))
        try? await Task.sleep(for: .milliseconds(50))
        bell.ring()
        await waited
        #expect(clock.now - start < .seconds(30))
    }

    @Test("the cluster's configuration refuses timings that do not hold together")
    func configuration() throws {
        var configuration = try PostgresCluster.Configuration(url: "postgres://u@h/db")
        configuration.nodeTimeout = .seconds(1)
        configuration.heartbeatInterval = .seconds(1)
        #expect(throws: (any Error).self) { try configuration.validate() }
        configuration.nodeTimeout = .seconds(2)
        try configuration.validate()
        configuration.claimTimeout = .zero
        #expect(throws: (any Error).self) { try configuration.validate() }
    }
}
