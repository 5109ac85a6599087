// swift-tools-version:6.1
import PackageDescription

// Tether: a persistent connection between an app and its server that is as simple to use
// as an HTTP request. The targets follow the layers of the design:
//
//   TetherCore     sans-IO protocol: frames, codec, handshake, state machines (no sockets)
//   TetherCompression  payload compression for the codec: raw DEFLATE with zlib (CompressNIO)
//   TetherNIO      the frame core both sides share (FrameConnection, the connection timer),
//                  the memory budget, the client transport abstraction (SwiftNIO, no transport)
//   TetherNIOTransports  the transports: TCP and TLS (swift-nio-ssl), WebSocket, the HTTP
//                  stream (HTTP/1.1 and HTTP/2), HTTP CONNECT proxies, Transport Services
//   Tether         the client library (requests, pushes, heartbeat, reconnect)
//   TetherGateway  the gateway (server) library
//   TetherJWT      the gateway's JSON Web Token authenticator (jwt-kit)
//   TetherPostgres the gateway's PostgreSQL store and cluster: several nodes (postgres-nio)
//   TetherStreamForwarding  sends HTTP-stream POSTs to the node of a cluster that holds their
//                  session (async-http-client)
//   TetherProtobuf typed swift-protobuf conveniences for client and gateway
//   TetherServerAPI the server API a backend in any language drives the gateway with: JSON
//                  over HTTP, its server code generated from openapi.yaml (swift-openapi-
//                  generator, served by Hummingbird) on a listener of its own
//   TetherBackendProxy the event proxy: clients' connects, requests and reliable messages
//                  handed to the backend over HTTP (async-http-client) or gRPC
//   TetherGRPCProtos the gRPC forms of both: code generated from Protos/tether/v1/*.proto
//                  (scripts/generate-grpc; committed), for grpc-swift 2
//   TetherHistory  a run's history and the checker of the guarantees (issue 44; pure)
//   TetherProcess  programs started with posix_spawn, waited for with waitpid (the lab,
//                  the PostgreSQL helper, the tests)
//   TetherFaultProxy a TCP proxy that injects faults (tether proxy, the lab, tests)
//   TetherTesting  for an app's tests: a manual clock, the fault proxy (not linked into
//                  `tether`)
//   TetherGatewayTesting  for tests against a gateway: an in-process network with faults,
//                  the message-store contract
//   TetherLab      the weak-network lab: scenarios, packet loss (iptables), measurements
//   tether         the command-line tool (serve, call, chat, demo)
//
// Integrations/ is a package of its own: Tether with OpenTelemetry (swift-otel), whose long
// first build only CI pays.

let strictSwift6: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "tether",
    platforms: [.macOS(.v13), .iOS(.v16), .tvOS(.v16), .watchOS(.v9)],
    products: [
        .library(name: "TetherCore", targets: ["TetherCore"]),
        .library(name: "TetherCompression", targets: ["TetherCompression"]),
        .library(name: "TetherNIO", targets: ["TetherNIO"]),
        .library(name: "TetherNIOTransports", targets: ["TetherNIOTransports"]),
        .library(name: "Tether", targets: ["Tether"]),
        .library(name: "TetherGateway", targets: ["TetherGateway"]),
        .library(name: "TetherJWT", targets: ["TetherJWT"]),
        .library(name: "TetherPostgres", targets: ["TetherPostgres"]),
        .library(name: "TetherStreamForwarding", targets: ["TetherStreamForwarding"]),
        .library(name: "TetherProtobuf", targets: ["TetherProtobuf"]),
        .library(name: "TetherServerAPI", targets: ["TetherServerAPI"]),
        .library(name: "TetherBackendProxy", targets: ["TetherBackendProxy"]),
        .library(name: "TetherGRPCProtos", targets: ["TetherGRPCProtos"]),
        .library(name: "TetherTesting", targets: ["TetherTesting"]),
        .library(name: "TetherGatewayTesting", targets: ["TetherGatewayTesting"]),
        .executable(name: "tether", targets: ["TetherCLI"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-atomics.git", from: "1.3.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-protobuf.git", from: "1.39.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.7.1"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-nio-transport-services.git", from: "1.28.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        .package(url: "https://github.com/apple/swift-nio-http2.git", from: "1.46.0"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/adam-fowler/compress-nio.git", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.3"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-openapi-generator.git", from: "1.14.3"),
        .package(url: "https://github.com/apple/swift-openapi-runtime.git", from: "1.13.4"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/hummingbird-project/swift-openapi-hummingbird.git", from: "2.1.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        .package(url: "https://github.com/jpsim/Yams.git", from: "6.2.2"),
        .package(url: "https://github.com/grpc/grpc-swift-2.git", from: "2.4.3"),
        .package(url: "https://github.com/grpc/grpc-swift-nio-transport.git", from: "2.9.2"),
        .package(url: "https://github.com/grpc/grpc-swift-protobuf.git", from: "2.4.1"),
    ],
    targets: [
        // CRC-32C with the processor's instruction; the only C in Tether (see its header).
        .target(name: "CTetherCRC32C"),
        .target(
            name: "TetherCore",
            dependencies: [
                "CTetherCRC32C",
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strictSwift6
        ),
        // The codec's payload compression (PayloadDeflating, PayloadInflating) with zlib.
        .target(
            name: "TetherCompression",
            dependencies: [
                "TetherCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "CompressNIO", package: "compress-nio"),
            ],
            swiftSettings: strictSwift6
        ),
        .target(
            name: "TetherNIO",
            dependencies: [
                "TetherCore",
                "TetherCompression",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Atomics", package: "swift-atomics"),
            ],
            swiftSettings: strictSwift6
        ),
        // The transports, on top of the frame core: each wraps a channel's bytes into Tether's
        // frames (TCP, TLS), WebSocket messages or the HTTP stream's GET and POSTs.
        .target(
            name: "TetherNIOTransports",
            dependencies: [
                "TetherCore",
                "TetherNIO",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOExtras", package: "swift-nio-extras"),
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOTransportServices", package: "swift-nio-transport-services"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strictSwift6
        ),
        .target(
            name: "Tether",
            dependencies: [
                "TetherCore",
                "TetherCompression",
                "TetherNIO",
                "TetherNIOTransports",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOFoundationCompat", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ],
            swiftSettings: strictSwift6
        ),
        .target(
            name: "TetherGateway",
            dependencies: [
                "TetherCore",
                "TetherCompression",
                "TetherNIO",
                "TetherNIOTransports",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "NIOFoundationCompat", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSwift6
        ),
        .target(
            name: "TetherJWT",
            dependencies: [
                "TetherCore",
                "TetherGateway",
                .product(name: "JWTKit", package: "jwt-kit"),
            ],
            swiftSettings: strictSwift6
        ),
        // A run's history (operations, deliveries, faults) and the checker that searches it for
        // what Tether promises never happens (issue 44): no I/O, no dependency.
        .target(
            name: "TetherHistory",
            swiftSettings: strictSwift6
        ),
        // Programs started with posix_spawn and waited for with waitpid (the lab's iptables and
        // gateways, the PostgreSQL helper's pg_ctl, the tests' peers): not Foundation's Process.
        .target(
            name: "TetherProcess",
            dependencies: [
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio")
            ],
            swiftSettings: strictSwift6
        ),
        .target(
            name: "TetherPostgres",
            dependencies: [
                "TetherCore",
                "TetherProcess",
                "TetherNIO",
                "TetherGateway",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSwift6
        ),
        // HTTP-stream POSTs sent between the nodes of a cluster (any GatewayCluster's
        // ClusterStreamForwarder), apart from the store so that it needs no HTTP client.
        .target(
            name: "TetherStreamForwarding",
            dependencies: [
                "TetherGateway",
                "TetherNIO",
                "TetherNIOTransports",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSwift6
        ),
        .target(
            name: "TetherProtobuf",
            dependencies: [
                "Tether",
                "TetherGateway",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "SwiftProtobuf", package: "swift-protobuf"),
            ],
            swiftSettings: strictSwift6
        ),
        // The server API: openapi.yaml is the contract; the build plugin generates the server's
        // types and routes from it, so the document cannot drift from the code.
        .target(
            name: "TetherServerAPI",
            dependencies: [
                "TetherCore",
                "TetherGateway",
                .product(name: "OpenAPIRuntime", package: "swift-openapi-runtime"),
                .product(name: "OpenAPIHummingbird", package: "swift-openapi-hummingbird"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCNIOTransportHTTP2Posix", package: "grpc-swift-nio-transport"),
                .product(name: "SwiftProtobuf", package: "swift-protobuf"),
                "TetherGRPCProtos",
            ],
            swiftSettings: strictSwift6,
            plugins: [.plugin(name: "OpenAPIGenerator", package: "swift-openapi-generator")]
        ),
        // Generated by scripts/generate-grpc from Protos/tether/v1 (do not edit).
        .target(
            name: "TetherGRPCProtos",
            dependencies: [
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCProtobuf", package: "grpc-swift-protobuf"),
                .product(name: "SwiftProtobuf", package: "swift-protobuf"),
            ],
            swiftSettings: strictSwift6
        ),
        // The event proxy to the backend: connects, requests and reliable messages over HTTP.
        .target(
            name: "TetherBackendProxy",
            dependencies: [
                "TetherCore",
                "TetherGateway",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOFoundationCompat", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCNIOTransportHTTP2Posix", package: "grpc-swift-nio-transport"),
                "TetherGRPCProtos",
            ],
            swiftSettings: strictSwift6
        ),
        // A TCP proxy that injects faults (cut, blackhole, delay, loss): `tether proxy`, the lab
        // and the tests use it.
        .target(
            name: "TetherFaultProxy",
            dependencies: [
                "TetherCore",
                "TetherNIO",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strictSwift6
        ),
        // The testing kit, split per side: the app's (a manual clock, the fault proxy) and the
        // gateway's (an in-process network to a gateway, the message-store contract).
        .target(
            name: "TetherTesting",
            dependencies: [
                "TetherCore",
                "TetherNIO",
                "TetherFaultProxy",
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strictSwift6
        ),
        .target(
            name: "TetherGatewayTesting",
            dependencies: [
                "TetherCore",
                "TetherNIO",
                "TetherGateway",
                "TetherTesting",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strictSwift6
        ),
        .target(
            name: "TetherLab",
            dependencies: [
                "TetherCore",
                "TetherHistory",
                "TetherProcess",
                "TetherNIO",
                "Tether",
                "TetherPostgres",
                "TetherFaultProxy",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSwift6
        ),
        .executableTarget(
            name: "TetherCLI",
            dependencies: [
                "Tether",
                "TetherNIO",
                "TetherGateway",
                "TetherJWT",
                "TetherPostgres",
                "TetherStreamForwarding",
                "TetherFaultProxy",
                "TetherLab",
                "TetherServerAPI",
                "TetherBackendProxy",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Yams", package: "Yams"),
            ],
            swiftSettings: strictSwift6
        ),
        // Tests mirror the sources: one folder per module, then the loopback integration tests.
        // Counts the locks a request, a push and a reliable message take, in a process of its
        // own; LockBudgetTests runs it and holds the counts to their budgets (debug builds).
        .executableTarget(
            name: "tether-lock-probe",
            dependencies: [
                "Tether",
                "TetherGateway",
                "TetherNIO",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/TetherLockProbe",
            swiftSettings: strictSwift6
        ),
        .target(
            name: "TetherTestSupport",
            dependencies: [
                "TetherGateway",
                "TetherProcess",
                "TetherPostgres",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/TetherTestSupport",
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "TetherCoreTests",
            dependencies: [
                "TetherCore",
                "TetherCompression",
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "TetherCompressionTests",
            dependencies: [
                "TetherCore",
                "TetherCompression",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "CompressNIO", package: "compress-nio"),
            ],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "TetherNIOTests",
            dependencies: [
                "TetherCore",
                "TetherNIO",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOTestUtils", package: "swift-nio"),
            ],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "TetherNIOTransportsTests",
            dependencies: [
                "TetherCore",
                "TetherNIO",
                "TetherNIOTransports",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "TetherTests",
            dependencies: [
                "TetherCore",
                "TetherNIO",
                "Tether",
                "TetherTestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "TetherGatewayTests",
            dependencies: [
                "TetherCore",
                "TetherNIO",
                "TetherNIOTransports",
                "TetherGateway",
                "TetherCompression",
                "TetherGatewayTesting",
                "TetherTestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "GRDB", package: "GRDB.swift"),
            ],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "TetherPostgresTests",
            dependencies: [
                "TetherCore",
                "TetherGateway",
                "TetherPostgres",
                "TetherGatewayTesting",
                "TetherTestSupport",
                "Tether",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "TetherBackendProxyTests",
            dependencies: ["TetherCore", "TetherBackendProxy"],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "TetherHistoryTests",
            dependencies: ["TetherHistory"],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "TetherJWTTests",
            dependencies: [
                "TetherCore",
                "TetherGateway",
                "TetherJWT",
                "TetherProcess",
                "TetherTestSupport",
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "TetherIntegrationTests",
            dependencies: [
                "TetherCore",
                "TetherNIO",
                "TetherNIOTransports",
                "Tether",
                "TetherGateway",
                "TetherJWT",
                "TetherProtobuf",
                "TetherTesting",
                "TetherGatewayTesting",
                "TetherLab",
                "TetherPostgres",
                "TetherStreamForwarding",
                "TetherCompression",
                "TetherTestSupport",
                "TetherProcess",
                "TetherServerAPI",
                "TetherBackendProxy",
                "TetherGRPCProtos",
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCNIOTransportHTTP2Posix", package: "grpc-swift-nio-transport"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SwiftProtobuf", package: "swift-protobuf"),
                .product(name: "CompressNIO", package: "compress-nio"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ],
            // Python peers the tests run as processes of their own, found by path.
            exclude: ["Peers/websocket_peer.py", "Peers/websocket_slow.py", "Peers/flood.py", "Peers/grpc_peer.py"],
            swiftSettings: strictSwift6
        ),
    ]
)
