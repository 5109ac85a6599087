// swift-tools-version:6.1
import Foundation
import PackageDescription

// SwiftPM names a path dependency after its directory, which is whatever the clone is called.
let tether = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().lastPathComponent.lowercased()

// libFuzzer targets for Tether's decoders. Build and run (Linux, swift.org toolchain):
//
//   swift build -c debug -Xswiftc -sanitize=fuzzer,address --toolset lld-toolset.json
//   .build/debug/FuzzFrameDecoder Corpus/FrameDecoder -max_total_time=300
//   .build/debug/FuzzChannelBodies Corpus/ChannelBodies -max_total_time=300
//   .build/debug/FuzzGatewayConnection Corpus/GatewayConnection -max_total_time=600
//   .build/debug/FuzzClientConnection Corpus/ClientConnection -max_total_time=600
//   .build/debug/FuzzHTTPListener Corpus/HTTPListener -max_total_time=600
//
// No -parse-as-library: each target's main.swift calls LLVMFuzzerRunDriver itself, which
// sidesteps SwiftPM's renamed entry point for executables. The toolset selects lld because
// the system's gold linker crashes on these objects.
//
// Inputs that crashed once are kept in Corpus/FrameDecoder and replayed by the main package's
// tests (FuzzRegressionTests), so a fixed crash stays fixed.
//
// The connection handlers' targets run little programs (bytes in, time passing, requests,
// closes) through @testable imports; each program's source is a link to the file in the main
// package's tests that replays Corpus/GatewayConnection and Corpus/ClientConnection, so the
// fuzzer and `swift test` run the very same code. Their seeds are written by
// `TETHER_WRITE_FUZZ_SEEDS=1 swift test --filter FuzzRegression`; add an input that failed
// next to them.
let package = Package(
    name: "tether-fuzz",
    dependencies: [
        .package(path: ".."),
        // The same copies the main package resolves (its Package.swift names the versions).
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
    ],
    targets: [
        .target(name: "CLibFuzzer"),
        .executableTarget(
            name: "FuzzFrameDecoder",
            dependencies: [
                "CLibFuzzer",
                .product(name: "TetherCore", package: tether),
                .product(name: "TetherCompression", package: tether),
            ],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        // The reserved channel methods' bodies (package types: a @testable import).
        .executableTarget(
            name: "FuzzChannelBodies",
            dependencies: [
                "CLibFuzzer",
                .product(name: "TetherCore", package: tether),
            ],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        // The connection handlers, through @testable imports (debug builds enable testing).
        .executableTarget(
            name: "FuzzGatewayConnection",
            dependencies: [
                "CLibFuzzer",
                .product(name: "TetherCore", package: tether),
                .product(name: "TetherGateway", package: tether),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
            ],
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .executableTarget(
            name: "FuzzHTTPListener",
            dependencies: [
                "CLibFuzzer",
                .product(name: "TetherCore", package: tether),
                .product(name: "TetherNIO", package: tether),
                .product(name: "TetherNIOTransports", package: tether),
                .product(name: "TetherGateway", package: tether),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .executableTarget(
            name: "FuzzClientConnection",
            dependencies: [
                "CLibFuzzer",
                .product(name: "Tether", package: tether),
                .product(name: "TetherCore", package: tether),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
            ],
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
    ]
)
