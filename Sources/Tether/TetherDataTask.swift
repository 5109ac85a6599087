import Atomics
public import NIOCore
import TetherCore

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
    private enum Handle: Sendable {
        /// Handed to a ready connection, with no task.
        case direct(ClientConnection, id: UInt64)
        /// In a task: waiting for a connection, or sent again after a connection refused it.
        case task(Task<Void, Never>)
    }

    private final class HandleBox: AtomicReference, Sendable {
        let handle: Handle
        init(_ handle: Handle) { self.handle = handle }
    }

    // The task takes no lock: its state is atomics. The completion handler is taken out once,
    // by whoever ends the task (and let go of then, with what it captured).
    private static let suspended: UInt8 = 0
    private static let running: UInt8 = 1
    private static let canceled: UInt8 = 2
    private static let completed: UInt8 = 3

    /// The task's four atomics in one allocation (four `ManagedAtomic`s are four objects):
    /// the phase; whether the completion handler was taken; where the request is (to cancel
    /// it); and whether ``cancel()`` was called while running (a handle installed later is
    /// cancelled at once).
    private struct Atomics: @unchecked Sendable {
        // Unchecked: every access to the cells goes through an atomic operation.
        struct Cells {
            var phase: UnsafeAtomic<UInt8>.Storage
            var cancelRequested: UnsafeAtomic<Bool>.Storage
            var completionTaken: UnsafeAtomic<Bool>.Storage
            var handle: UnsafeAtomic<HandleBox?>.Storage
        }

        final class Buffer: ManagedBuffer<Cells, Void> {
            deinit {
                // The references the cells hold are released here, as a ManagedAtomic's deinit does.
                self.withUnsafeMutablePointerToHeader { cells in
                    _ = cells.pointee.handle.dispose()
                }
            }
        }

        private let buffer: Buffer

        init() {
            let buffer = Buffer.create(minimumCapacity: 0) { _ in
                Cells(
                    phase: .init(TetherDataTask.suspended),
                    cancelRequested: .init(false),
                    completionTaken: .init(false),
                    handle: .init(nil)
                )
            }
            self.buffer = unsafeDowncast(buffer, to: Buffer.self)
        }

        func phase<T>(_ body: (UnsafeAtomic<UInt8>) -> T) -> T {
            self.buffer.withUnsafeMutablePointerToHeader { cells in
                withUnsafeMutablePointer(to: &cells.pointee.phase) { body(UnsafeAtomic(at: $0)) }
            }
        }

        func cancelRequested<T>(_ body: (UnsafeAtomic<Bool>) -> T) -> T {
            self.buffer.withUnsafeMutablePointerToHeader { cells in
                withUnsafeMutablePointer(to: &cells.pointee.cancelRequested) { body(UnsafeAtomic(at: $0)) }
            }
        }

        func completionTaken<T>(_ body: (UnsafeAtomic<Bool>) -> T) -> T {
            self.buffer.withUnsafeMutablePointerToHeader { cells in
                withUnsafeMutablePointer(to: &cells.pointee.completionTaken) { body(UnsafeAtomic(at: $0)) }
            }
        }

        func handle<T>(_ body: (UnsafeAtomic<HandleBox?>) -> T) -> T {
            self.buffer.withUnsafeMutablePointerToHeader { cells in
                withUnsafeMutablePointer(to: &cells.pointee.handle) { body(UnsafeAtomic(at: $0)) }
            }
        }
    }

    private let atomics = Atomics()
    /// The completion handler until it is taken. Unsafe, not racy: only the caller that took
    /// it (`completionTaken`, one atomic exchange) reads or clears it; it was set in `init`.
    /// (As an atomic reference it cost an object and a double-word exchange per request.)
    private nonisolated(unsafe) var completion: (@Sendable (Result<ByteBuffer, TetherError>) -> Void)?
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
        self.completion = completion
    }

    /// The completion handler, to the one caller that ends the task; `nil` to any other.
    private func takeCompletion() -> (@Sendable (Result<ByteBuffer, TetherError>) -> Void)? {
        guard !self.atomics.completionTaken({ $0.exchange(true, ordering: .acquiringAndReleasing) }) else { return nil }
        let completion = self.completion
        self.completion = nil
        return completion
    }

    /// The task's current state.
    public var state: State {
        switch self.atomics.phase({ $0.load(ordering: .acquiring) }) {
        case Self.suspended: .suspended
        case Self.running: .running
        case Self.canceled: .canceled
        default: .completed
        }
    }

    /// Starts the request. Has no effect unless the task is suspended.
    public func resume() {
        guard
            self.atomics.phase({
                $0.compareExchange(expected: Self.suspended, desired: Self.running, ordering: .acquiringAndReleasing).exchanged
            })
        else { return }
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
                self.finish(with: result, call: call)
            }
        }
        // A `cancel()` that ran between `install` and `execute` may have found the request
        // nowhere yet: cancel it again, now that the connection has it (a second cancellation
        // of the same request does nothing).
        if self.atomics.cancelRequested({ $0.load(ordering: .sequentiallyConsistent) }) {
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
            self.finish(with: result, call: call)
        }
        if !self.install(.task(task)) { task.cancel() }
    }

    /// Records where the request is; `false` if ``cancel()`` was called meanwhile. With
    /// ``cancel()``'s store and load in the opposite order, one of the two sees the other.
    private func install(_ handle: Handle) -> Bool {
        self.atomics.handle { $0.store(HandleBox(handle), ordering: .sequentiallyConsistent) }
        return !self.atomics.cancelRequested { $0.load(ordering: .sequentiallyConsistent) }
    }

    /// Cancels the request. A suspended task completes at once with ``TetherError/Code/cancelled``;
    /// a running one is cancelled locally and on the gateway. No effect once completed.
    public func cancel() {
        if self.atomics.phase({
            $0.compareExchange(expected: Self.suspended, desired: Self.canceled, ordering: .acquiringAndReleasing).exchanged
        }) {
            self.takeCompletion()?(.failure(TetherError(code: .cancelled, message: "the data task was cancelled before it started")))
            return
        }
        guard self.atomics.phase({ $0.load(ordering: .acquiring) }) == Self.running else { return }
        self.atomics.cancelRequested { $0.store(true, ordering: .sequentiallyConsistent) }
        switch self.atomics.handle({ $0.load(ordering: .sequentiallyConsistent) })?.handle {
        case .direct(let connection, let id): connection.cancel(id)
        case .task(let task): task.cancel()
        case nil: break  // `resume` is installing it and will see the request
        }
    }

    private static func cancelled(_ method: String) -> TetherError {
        TetherError(code: .cancelled, message: "request '\(method)' was cancelled")
    }

    /// Completes the task once (a later call does nothing); a request that was sent (`call`) is
    /// counted in the client's statistics and metrics, as ``TetherClient/request(_:body:timeout:)`` counts its own.
    private func finish(with result: Result<ByteBuffer, TetherError>, call: TetherClient.PreparedRequest? = nil) {
        guard let completion = self.takeCompletion() else { return }
        if case .failure(let error) = result, error.code == .cancelled {
            self.atomics.phase { $0.store(Self.canceled, ordering: .releasing) }
        } else {
            self.atomics.phase { $0.store(Self.completed, ordering: .releasing) }
        }
        self.atomics.handle { $0.store(nil, ordering: .releasing) }
        if let call {
            let error: TetherError?
            if case .failure(let failure) = result { error = failure } else { error = nil }
            self.client.recorder.requestEnded(error, after: self.client.clock.now - call.preparedAt)
        }
        completion(result)
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
