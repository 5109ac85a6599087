public import NIOCore
public import TetherCore
import TetherNIO

/// A clock that moves only when told to: inject it into a `TetherClient` or a `Gateway` and
/// every deadline they have — backoff, racing, requests, heartbeats, handshakes, idle
/// connections, retransmissions, expiry — waits for ``advance(by:)``.
///
/// ```swift
/// let clock = ManualClock()
/// let client = try TetherClient(configuration: config, transport: network.transport, clock: clock)
/// await clock.waitForSleepers(1)   // the client is backing off
/// clock.advance(by: .seconds(1))   // …and now it retries
/// ```
///
/// Its wall clock starts at ``wallClockOrigin`` and moves with it.
public final class ManualClock: TetherClock, Sendable {
    private struct Sleeper {
        var deadline: TetherInstant
        var continuation: CheckedContinuation<Void, any Error>
    }

    /// A callback armed on an event loop.
    private struct Armed {
        var deadline: TetherInstant
        var loop: any EventLoop
        var fire: @Sendable () -> Void
    }

    private struct State {
        var now = TetherInstant.zero
        var nextID = 0
        var sleepers: [Int: Sleeper] = [:]
        var cancelledEarly: Set<Int> = []
        var armed: [Int: Armed] = [:]
        var sleeperWaiters: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []
    }

    private let state = TetherLock(State())
    /// The wall-clock time (milliseconds since 1970) at the clock's zero.
    public let wallClockOrigin: Int64

    /// - Parameter wallClockOrigin: The wall-clock time at the clock's zero, in milliseconds
    ///   since 1970; by default the time the clock was made.
    public init(wallClockOrigin: Int64 = SystemClock().wallClockMilliseconds) {
        self.wallClockOrigin = wallClockOrigin
    }

    public var now: TetherInstant { self.state.withLockedValue { $0.now } }
    public var minimumResolution: Duration { .zero }
    public var wallClockMilliseconds: Int64 { self.wallClockOrigin + self.now.nanoseconds / 1_000_000 }

    /// The number of tasks sleeping on this clock.
    public var sleeperCount: Int { self.state.withLockedValue { $0.sleepers.count } }

    public func sleep(until deadline: TetherInstant, tolerance: Duration? = nil) async throws {
        let id = self.state.withLockedValue { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let (outcome, ready): (Result<Void, any Error>?, [CheckedContinuation<Void, Never>]) = self.state.withLockedValue { state in
                    if state.cancelledEarly.remove(id) != nil { return (.failure(CancellationError()), []) }
                    if deadline <= state.now { return (.success(()), []) }
                    state.sleepers[id] = Sleeper(deadline: deadline, continuation: continuation)
                    return (nil, Self.takeSatisfiedWaiters(&state))
                }
                if let outcome { continuation.resume(with: outcome) }
                for waiter in ready { waiter.resume() }
            }
        } onCancel: {
            let sleeper: Sleeper? = self.state.withLockedValue { state in
                guard let sleeper = state.sleepers.removeValue(forKey: id) else {
                    state.cancelledEarly.insert(id)
                    return nil
                }
                return sleeper
            }
            sleeper?.continuation.resume(throwing: CancellationError())
        }
        self.state.withLockedValue { _ = $0.cancelledEarly.remove(id) }
    }

    public func scheduleCallback(
        at deadline: TetherInstant,
        on eventLoop: any EventLoop,
        handler: some NIOScheduledCallbackHandler & AnyObject
    ) -> ClockCallback? {
        let bound = NIOLoopBound(handler as any NIOScheduledCallbackHandler, eventLoop: eventLoop)
        return self.schedule(at: deadline, on: eventLoop) { bound.value.handleScheduledCallback(eventLoop: eventLoop) }
    }

    public func schedule(at deadline: TetherInstant, on eventLoop: any EventLoop, _ task: @escaping @Sendable () -> Void) -> ClockCallback {
        let (id, due) = self.state.withLockedValue { state -> (Int, Bool) in
            defer { state.nextID += 1 }
            if deadline <= state.now { return (state.nextID, true) }
            state.armed[state.nextID] = Armed(deadline: deadline, loop: eventLoop, fire: task)
            return (state.nextID, false)
        }
        if due { eventLoop.execute(task) }
        return ClockCallback(cancel: { [weak self] in self?.state.withLockedValue { _ = $0.armed.removeValue(forKey: id) } })
    }

    /// Moves time forward, waking every sleeper and firing every callback whose deadline has
    /// come, in deadline order.
    public func advance(by duration: Duration) {
        let (sleepers, callbacks): ([Sleeper], [Armed]) = self.state.withLockedValue { state in
            state.now = state.now + duration
            let now = state.now
            let sleepers = state.sleepers.filter { $0.value.deadline <= now }
            for id in sleepers.keys { state.sleepers[id] = nil }
            let armed = state.armed.filter { $0.value.deadline <= now }
            for id in armed.keys { state.armed[id] = nil }
            return (sleepers.values.sorted { $0.deadline < $1.deadline }, armed.values.sorted { $0.deadline < $1.deadline })
        }
        for callback in callbacks { callback.loop.execute(callback.fire) }
        for sleeper in sleepers { sleeper.continuation.resume() }
    }

    /// Returns once at least `count` tasks are sleeping on this clock.
    public func waitForSleepers(_ count: Int = 1) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready: Bool = self.state.withLockedValue { state in
                if state.sleepers.count >= count { return true }
                state.sleeperWaiters.append((count, continuation))
                return false
            }
            if ready { continuation.resume() }
        }
    }

    private static func takeSatisfiedWaiters(_ state: inout State) -> [CheckedContinuation<Void, Never>] {
        let count = state.sleepers.count
        let ready = state.sleeperWaiters.filter { $0.count <= count }.map(\.continuation)
        state.sleeperWaiters.removeAll { $0.count <= count }
        return ready
    }
}
