import Foundation
public import Logging
public import NIOCore
public import Testing

// What every test target of Tether shares: quiet loggers and polling for a condition.

/// A logger for tests: quiet unless `TETHER_TEST_LOG` names a level (e.g. `TETHER_TEST_LOG=warning`).
public func testLogger(_ label: String) -> Logger {
    var logger = Logger(label: "test.\(label)")
    logger.logLevel = ProcessInfo.processInfo.environment["TETHER_TEST_LOG"].flatMap { Logger.Level(rawValue: $0) } ?? .critical
    return logger
}

/// Waits until `condition` holds, polling; fails the test after `timeout`.
public func eventually(
    _ what: String,
    timeout: Duration = .seconds(10),
    sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: @Sendable () async -> Bool
) async throws {
    let deadline = ContinuousClock.now + timeout
    while !(await condition()) {
        guard ContinuousClock.now < deadline else {
            Issue.record("timed out waiting until \(what)", sourceLocation: sourceLocation)
            throw TimedOut(what: what)
        }
        try await Task.sleep(for: .milliseconds(5))
    }
}

public struct TimedOut: Error {
    public var what: String
}

extension ByteBuffer {
    /// The bytes as UTF-8 text.
    public var string: String { String(buffer: self) }
}

/// Replays the committed corpus of a fuzz target (`FuzzTesting/Corpus/<target>`): its seeds,
/// and the inputs that once failed. Checks that the committed seeds are `seeds` (with
/// `TETHER_WRITE_FUZZ_SEEDS` set, it writes them first), then runs every file with `run`,
/// which returns what went wrong, if anything; each failure is an issue naming the file.
public func replayFuzzCorpus(
    of target: String,
    seeds: [String: [UInt8]],
    sourceLocation: SourceLocation = #_sourceLocation,
    _ run: ([UInt8]) -> String?
) throws {
    let directory = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("FuzzTesting/Corpus/\(target)")
    if ProcessInfo.processInfo.environment["TETHER_WRITE_FUZZ_SEEDS"] != nil {
        // After a change to the seeds: TETHER_WRITE_FUZZ_SEEDS=1 swift test --filter FuzzRegression
        for (name, bytes) in seeds { try Data(bytes).write(to: directory.appendingPathComponent("seed-\(name)")) }
    }
    let files = try FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)
    for (name, bytes) in seeds {
        let committed = try files.first { $0.lastPathComponent == "seed-\(name)" }.map { try Data(contentsOf: $0) }
        #expect(committed == Data(bytes), "seed-\(name) is committed as the program's seeds() make it", sourceLocation: sourceLocation)
    }
    for file in files.sorted(by: { $0.lastPathComponent < $1.lastPathComponent }) {
        if let failure = run(Array(try Data(contentsOf: file))) {
            Issue.record("\(file.lastPathComponent): \(failure)", sourceLocation: sourceLocation)
        }
    }
}
