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
