import NIOConcurrencyHelpers
public import NIOCore

/// A request in the style of `URLSessionDataTask`, for callback-based code.
///
/// Create it with ``TetherClient/dataTask(_:body:timeout:completion:)``; nothing is sent until
/// ``resume()``. The completion handler runs exactly once, on an arbitrary thread: with the
/// response body, or with a ``TetherError`` (``TetherError/Code/cancelled`` after ``cancel()``).
///
/// ```swift
/// let task = client.dataTask("time.now") { result in
///     DispatchQueue.main.async { label.text = (try? result.get()).map { String(buffer: $0) } }
/// }
/// task.resume()
/// ```
public final class TetherDataTask: Sendable {
    /// The task's lifecycle.
    public enum State: Hashable, Sendable {
        /// Created, not resumed.
        case suspended
        /// Resumed; the request is waiting for a connection or in flight.
        case running
        /// Cancelled; the completion handler got ``TetherError/Code/cancelled``.
        case canceled
        /// Finished with a response or an error.
        case completed
    }

    private struct Inner {
        var state = State.suspended
        var task: Task<Void, Never>?
        var completion: (@Sendable (Result<ByteBuffer, TetherError>) -> Void)?
    }

    private let inner: NIOLockedValueBox<Inner>
    private let operation: @Sendable () async throws(TetherError) -> ByteBuffer

    init(
        operation: @escaping @Sendable () async throws(TetherError) -> ByteBuffer,
        completion: @escaping @Sendable (Result<ByteBuffer, TetherError>) -> Void
    ) {
        self.operation = operation
        self.inner = NIOLockedValueBox(Inner(completion: completion))
    }

    /// The task's current state.
    public var state: State { self.inner.withLockedValue { $0.state } }

    /// Starts the request. Has no effect unless the task is suspended.
    public func resume() {
        self.inner.withLockedValue { inner in
            guard inner.state == .suspended else { return }
            inner.state = .running
            inner.task = Task {
                let result: Result<ByteBuffer, TetherError>
                do throws(TetherError) {
                    result = .success(try await self.operation())
                } catch {
                    result = .failure(error)
                }
                self.finish(with: result)
            }
        }
    }

    /// Cancels the request. A suspended task completes at once with ``TetherError/Code/cancelled``;
    /// a running one is cancelled locally and on the gateway. No effect once completed.
    public func cancel() {
        let task: Task<Void, Never>? = self.inner.withLockedValue { inner in
            guard inner.state == .suspended || inner.state == .running else { return nil }
            return inner.task
        }
        if let task {
            task.cancel()
        } else {
            self.finish(with: .failure(TetherError(code: .cancelled, message: "the data task was cancelled before it started")))
        }
    }

    private func finish(with result: Result<ByteBuffer, TetherError>) {
        let completion = self.inner.withLockedValue { inner -> (@Sendable (Result<ByteBuffer, TetherError>) -> Void)? in
            guard inner.state == .suspended || inner.state == .running else { return nil }
            if case .failure(let error) = result, error.code == .cancelled {
                inner.state = .canceled
            } else {
                inner.state = .completed
            }
            inner.task = nil
            defer { inner.completion = nil }
            return inner.completion
        }
        completion?(result)
    }
}

extension TetherClient {
    /// Creates a callback-style request; call ``TetherDataTask/resume()`` to send it.
    /// - Parameters:
    ///   - method: The route to call.
    ///   - body: The request's content.
    ///   - timeout: As in ``request(_:body:timeout:)``.
    ///   - completion: Called exactly once with the response body or the error.
    public func dataTask(
        _ method: String,
        body: ByteBuffer = ByteBuffer(),
        timeout: Duration? = nil,
        completion: @escaping @Sendable (Result<ByteBuffer, TetherError>) -> Void
    ) -> TetherDataTask {
        TetherDataTask(
            operation: { () async throws(TetherError) -> ByteBuffer in try await self.request(method, body: body, timeout: timeout) },
            completion: completion
        )
    }
}
