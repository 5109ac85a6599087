// swift-tools-version:6.1
import Foundation
import PackageDescription

// SwiftPM names a path dependency after its directory, which is whatever the clone is called.
let tether = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().lastPathComponent.lowercased()

// Tether with OpenTelemetry (swift-otel): a package of its own, because swift-otel takes about
// seven minutes of a first build on two cores, which `swift build` and every test run of the
// main package should not pay. CI builds and tests it once (.ci/run).
//
//   cd Integrations && swift test
let package = Package(
    name: "tether-integrations",
    platforms: [.macOS(.v15), .iOS(.v18)],
    products: [
        .library(name: "TetherOTel", targets: ["TetherOTel"])
    ],
    dependencies: [
        .package(path: ".."),
        // OTLP over HTTP only (protobuf or JSON): the gRPC exporter would add grpc-swift.
        .package(url: "https://github.com/swift-otel/swift-otel.git", from: "1.6.0", traits: ["OTLPHTTP"]),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.3"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
    ],
    targets: [
        .target(
            name: "TetherOTel",
            dependencies: [
                .product(name: "Tether", package: tether),
                .product(name: "TetherGateway", package: tether),
                .product(name: "OTel", package: "swift-otel"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .testTarget(
            name: "TetherOTelTests",
            dependencies: [
                "TetherOTel",
                .product(name: "Tether", package: tether),
                .product(name: "TetherGateway", package: tether),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
    ]
)
