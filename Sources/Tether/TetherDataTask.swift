public import NIOCore
import TetherCore
import TetherNIO

/// A request in the style of `URLSessionDataTask`, for callback-based code.
///
/// Create it with ``TetherClient/dataTask(_:body:timeout:completion:)``; nothing is sent until
/// ``resume()``. The completion handler runs exactly once: with the response body, or with a
/// ``TetherError`` (``TetherError/Code/cancelled`` after ``cancel()``).
///
/// When the client is connected, the request goes straight to the connection, with no Swift
/// task, and the completion handler runs on the connection's event loop: keep it short, and
/// hop elsewhere for slow work. A request resumed from the completion handler leaves in the
/// same write as the others sent from that event-loop turn, without a thread hop. When the
/// client is still connecting, the request waits for the connection in a task, as
/// ``TetherClient/request(_:body:timeout:)`` does, and the handler runs on that task's thread.
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

    /// Where a running request is, to cancel it.
    private enum Handle {
        /// Handed to a ready connection, with no task.
        case direct(ClientConnection, id: UInt64)
        /// In a task: waiting for a connection, or sent again after a connection refused it.
        case task(Task<Void, Never>)
    }

    private struct Inner {
        var state = State.suspended
        var handle: Handle?
        /// ``cancel()`` was called while running: a handle installed later is cancelled at once.
        var cancelRequested = false
        var completion: (@Sendable (Result<ByteBuffer, TetherError>) -> Void)?
    }

    private let inner: TetherLock<Inner>
    private let client: TetherClient
    private let method: String
    private let body: ByteBuffer
    private let timeout: Duration?

    init(
        client: TetherClient,
        method: String,
        body: ByteBuffer,
        timeout: Duration?,
        completion: @escaping @Sendable (Result<ByteBuffer, TetherError>) -> Void
    ) {
        self.client = client
        self.method = method
        self.body = body
        self.timeout = timeout
        self.inner = TetherLock(Inner(completion: completion))
    }

    /// The task's current state.
    public var state: State { self.inner.withLockedValue { $0.state } }

    /// Starts the request. Has no effect unless the task is suspended.
    public func resume() {
        let resumed = self.inner.withLockedValue { inner in
            guard inner.state == .suspended else { return false }
            inner.state = .running
            return true
        }
        guard resumed else { return }
        let call: TetherClient.PreparedRequest
        do {
            call = try self.client.prepareRequest(self.method, timeout: self.timeout)
        } catch {
            self.finish(with: .failure(error))
            return
        }
        if let connection = self.client.readyConnection {
            self.send(call, on: connection)
        } else {
            self.startTask(call)
        }
    }

    /// Hands the request to a ready connection; if it refuses it (it is going away), the
    /// request waits for the next one in a task.
    private func send(_ call: TetherClient.PreparedRequest, on connection: ClientConnection) {
        // Sent right after it was prepared: its whole timeout is left (positive: checked when prepared).
        let request = Frame.Request(id: call.id, method: call.method, timeout: call.deadline - call.preparedAt, body: self.body)
        guard self.install(.direct(connection, id: call.id)) else {
            self.finish(with: .failure(Self.cancelled(call.method)))
            return
        }
        connection.execute(request, deadline: call.deadline) { result in
            if case .failure(let error) = result, error.code == .notDispatched {
                self.client.retire(connection)
                self.startTask(call)
            } else {
                self.finish(with: result)
            }
        }
        // A `cancel()` that ran between `install` and `execute` may have found the request
        // nowhere yet: cancel it again, now that the connection has it (a second cancellation
        // of the same request does nothing).
        if self.inner.withLockedValue({ $0.cancelRequested }) {
            connection.cancel(call.id)
        }
    }

    /// Sends the request from a task, which waits for a connection as `request` does.
    private func startTask(_ call: TetherClient.PreparedRequest) {
        let task = Task {
            let result: Result<ByteBuffer, TetherError>
            do throws(TetherError) {
                result = .success(try await self.client.perform(call, body: self.body))
            } catch {
                result = .failure(error)
            }
            self.finish(with: result)
        }
        if !self.install(.task(task)) { task.cancel() }
    }

    /// Records where the request is; `false` if ``cancel()`` was called meanwhile.
    private func install(_ handle: Handle) -> Bool {
        self.inner.withLockedValue { inner in
            inner.handle = handle
            return !inner.cancelRequested
        }
    }

    /// Cancels the request. A suspended task completes at once with ``TetherError/Code/cancelled``;
    /// a running one is cancelled locally and on the gateway. No effect once completed.
    public func cancel() {
        enum Action {
            case complete((@Sendable (Result<ByteBuffer, TetherError>) -> Void)?)
            case cancelRequest(ClientConnection, id: UInt64)
            case cancelTask(Task<Void, Never>)
            case none
        }
        let action: Action = self.inner.withLockedValue { inner in
            switch inner.state {
            case .suspended:
                inner.state = .canceled
                defer { inner.completion = nil }
                return .complete(inner.completion)
            case .running:
                inner.cancelRequested = true
                switch inner.handle {
                case .direct(let connection, let id): return .cancelRequest(connection, id: id)
                case .task(let task): return .cancelTask(task)
                case nil: return .none  // `resume` is installing it and will see the request
                }
            case .canceled, .completed:
                return .none
            }
        }
        switch action {
        case .complete(let completion):
            completion?(.failure(TetherError(code: .cancelled, message: "the data task was cancelled before it started")))
        case .cancelRequest(let connection, let id):
            connection.cancel(id)
        case .cancelTask(let task):
            task.cancel()
        case .none:
            break
        }
    }

    private static func cancelled(_ method: String) -> TetherError {
        TetherError(code: .cancelled, message: "request '\(method)' was cancelled")
    }

    private func finish(with result: Result<ByteBuffer, TetherError>) {
        let completion = self.inner.withLockedValue { inner -> (@Sendable (Result<ByteBuffer, TetherError>) -> Void)? in
            guard inner.state == .running else { return nil }
            if case .failure(let error) = result, error.code == .cancelled {
                inner.state = .canceled
            } else {
                inner.state = .completed
            }
            inner.handle = nil
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
    ///   - completion: Called exactly once with the response body or the error; on the client's
    ///     event loop when the client was connected at ``TetherDataTask/resume()``, so keep it
    ///     short and hop elsewhere for slow work.
    public func dataTask(
        _ method: String,
        body: ByteBuffer = ByteBuffer(),
        timeout: Duration? = nil,
        completion: @escaping @Sendable (Result<ByteBuffer, TetherError>) -> Void
    ) -> TetherDataTask {
        TetherDataTask(client: self, method: method, body: body, timeout: timeout, completion: completion)
    }
}
