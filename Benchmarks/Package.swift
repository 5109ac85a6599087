// swift-tools-version: 6.1
// Tether's benchmarks: a package of its own, so that neither Tether's users nor its CI build
// the benchmark harness or the peers it is compared with (Hummingbird, AsyncHTTPClient,
// grpc-swift-2, the WebSocket libraries).
//
//     cd Benchmarks && swift package benchmark --target ReliableDelivery
//     cd Benchmarks && swift run -c release tether-bench run
import PackageDescription

let package = Package(
    name: "TetherBenchmarks",
    platforms: [.macOS(.v15), .iOS(.v18)],
    dependencies: [
        .package(name: "tether", path: ".."),
        .package(url: "https://github.com/ordo-one/benchmark", from: "1.38.1", traits: ["MallocInterposer"]),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift.git", from: "0.2.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/hummingbird-project/hummingbird-websocket.git", from: "2.8.1"),
        .package(url: "https://github.com/hummingbird-project/swift-websocket.git", from: "1.6.2"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/grpc/grpc-swift-2.git", from: "2.4.3"),
        .package(url: "https://github.com/grpc/grpc-swift-nio-transport.git", from: "2.9.2"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
    ],
    targets: [
        .executableTarget(
            name: "ReliableDelivery",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Tether", package: "tether"),
                .product(name: "TetherGateway", package: "tether"),
            ],
            path: "Benchmarks/ReliableDelivery",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        // Allocation budgets per operation, checked against Thresholds/ by CI.
        .executableTarget(
            name: "Allocations",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Tether", package: "tether"),
                .product(name: "TetherGateway", package: "tether"),
            ],
            path: "Benchmarks/Allocations",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        .executableTarget(
            name: "Codec",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "TetherCore", package: "tether"),
            ],
            path: "Benchmarks/Codec",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        // Tether side by side with the protocols an app would otherwise use: each server and
        // each client in a process of its own, one run, the same payloads.
        .executableTarget(
            name: "tether-bench",
            dependencies: [
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Tether", package: "tether"),
                .product(name: "TetherCore", package: "tether"),
                .product(name: "TetherCompression", package: "tether"),
                .product(name: "TetherGateway", package: "tether"),
                .product(name: "TetherNIO", package: "tether"),
                .product(name: "TetherPostgres", package: "tether"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdWebSocket", package: "hummingbird-websocket"),
                .product(name: "WSClient", package: "swift-websocket"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCNIOTransportHTTP2", package: "grpc-swift-nio-transport"),
                .product(name: "TetherServerAPI", package: "tether"),
                .product(name: "TetherBackendProxy", package: "tether"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "SideBySide"
        ),
    ]
)
