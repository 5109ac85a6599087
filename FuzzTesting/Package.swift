// swift-tools-version:6.1
import Foundation
import PackageDescription

// SwiftPM names a path dependency after its directory, which is whatever the clone is called.
let tether = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().lastPathComponent.lowercased()

// libFuzzer targets for Tether's decoders. Build and run (Linux, swift.org toolchain):
//
//   swift build -c debug -Xswiftc -sanitize=fuzzer,address --toolset lld-toolset.json
//   .build/debug/FuzzFrameDecoder Corpus/FrameDecoder -max_total_time=300
//
// No -parse-as-library: each target's main.swift calls LLVMFuzzerRunDriver itself, which
// sidesteps SwiftPM's renamed entry point for executables. The toolset selects lld because
// the system's gold linker crashes on these objects.
//
// Inputs that crashed once are kept in Corpus/FrameDecoder and replayed by the main package's
// tests (FuzzRegressionTests), so a fixed crash stays fixed.
let package = Package(
    name: "tether-fuzz",
    dependencies: [
        .package(path: "..")
    ],
    targets: [
        .target(name: "CLibFuzzer"),
        .executableTarget(
            name: "FuzzFrameDecoder",
            dependencies: [
                "CLibFuzzer",
                .product(name: "TetherCore", package: tether),
            ],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
    ]
)
