/// Runs `body`, and fails with `failure()` if it has not finished after `timeout` (it is then
/// cancelled). Used where waiting for an answer must stay bounded: a readiness probe, a node
/// leaving its cluster, a server that does not answer at start.
/// - Throws: What `body` throws, or `failure()` after `timeout`.
package func withTimeout<T: Sendable>(
    _ timeout: Duration,
    failure: @escaping @Sendable () -> any Error,
    _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await withThrowingTaskGroup { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: timeout)
            throw failure()
        }
        defer { group.cancelAll() }
        return try await group.next()!
    }
}

extension Result where Failure == any Error {
    /// The result of `body`: what it returns, or what it throws.
    package init(catching body: () async throws -> Success) async {
        do {
            self = .success(try await body())
        } catch {
            self = .failure(error)
        }
    }
}
