import Histogram
import NIOConcurrencyHelpers
import NIOCore
import Tether

/// Drives a Tether gateway through the completion-handler API (``TetherDataTask``), the way the
/// raw floor's NIO handler drives its echo: `inFlight` requests on the wire, and each answer's
/// completion handler, which runs on the client's event loop, sends the next request. No Swift
/// task per request.
final class CallbackDriver: Sendable {
    private struct State {
        var sent = 0
        var outstanding = 0
        var outcome = RawEcho.Outcome(completed: 0, latency: Histogram(highestTrackableValue: 60_000_000_000))
        var failure: TetherError?
        var done: CheckedContinuation<RawEcho.Outcome, any Error>?
    }

    private let client: TetherClient
    private let method: String
    private let body: ByteBuffer
    private let requests: Int?
    private let deadline: NIODeadline
    private let state = NIOLockedValueBox(State())

    private init(client: TetherClient, method: String, body: ByteBuffer, requests: Int?, deadline: NIODeadline) {
        self.client = client
        self.method = method
        self.body = body
        self.requests = requests
        self.deadline = deadline
    }

    /// Keeps `inFlight` requests on the wire until `requests` are answered (all of them, if
    /// `nil`) or `seconds` pass; fails with the first error a request gets.
    static func drive(
        _ client: TetherClient,
        method: String,
        body: ByteBuffer,
        inFlight: Int,
        requests: Int?,
        seconds: Double
    ) async throws -> RawEcho.Outcome {
        let driver = CallbackDriver(
            client: client,
            method: method,
            body: body,
            requests: requests,
            deadline: .now() + .nanoseconds(Int64(seconds * 1e9))
        )
        return try await withCheckedThrowingContinuation { continuation in
            let first = driver.state.withLockedValue { state in
                state.done = continuation
                let first = min(inFlight, requests ?? inFlight)
                state.sent = first
                state.outstanding = first
                return first
            }
            for _ in 0..<first { driver.send() }
        }
    }

    private func send() {
        let started = NIODeadline.now()
        self.client.dataTask(self.method, body: self.body) { result in
            self.answered(result, startedAt: started)
        }.resume()
    }

    private func answered(_ result: Result<ByteBuffer, TetherError>, startedAt started: NIODeadline) {
        let now = NIODeadline.now()
        let (next, finished): (Bool, CheckedContinuation<RawEcho.Outcome, any Error>?) = self.state.withLockedValue { state in
            state.outstanding -= 1
            switch result {
            case .success:
                state.outcome.completed += 1
                _ = state.outcome.latency.record(UInt64((now - started).nanoseconds))
            case .failure(let error):
                state.failure = state.failure ?? error
            }
            let more = state.failure == nil && now < self.deadline && (self.requests.map { state.sent < $0 } ?? true)
            if more {
                state.sent += 1
                state.outstanding += 1
                return (true, nil)
            }
            guard state.outstanding == 0 else { return (false, nil) }
            defer { state.done = nil }
            return (false, state.done)
        }
        if next { self.send() }
        if let finished {
            let (outcome, failure) = self.state.withLockedValue { ($0.outcome, $0.failure) }
            if let failure { finished.resume(throwing: failure) } else { finished.resume(returning: outcome) }
        }
    }
}
