// swift-tools-version: 6.1
// Tether's benchmarks: a package of its own, so that neither Tether's users nor its CI build
// the benchmark harness (or, later, the peers it is compared with).
//
//     cd Benchmarks && swift package benchmark --target ReliableDelivery
import PackageDescription

let package = Package(
    name: "TetherBenchmarks",
    platforms: [.macOS(.v15), .iOS(.v18)],
    dependencies: [
        .package(name: "tether", path: ".."),
        .package(url: "https://github.com/ordo-one/benchmark", from: "1.38.1", traits: ["MallocInterposer"]),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
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
        )
    ]
)
