import NIOCore
import TetherCore

extension TetherClient {
    /// Everything the client's tasks share, behind one lock.
    struct State {
        enum RunPhase { case notStarted, running, finished }

        /// A request waiting for a connection.
        enum Waiter {
            case waiting(CheckedContinuation<ClientConnection, any Error>, timer: ClockCallback)
            /// Cancelled before it was registered: the registration must fail at once.
            case cancelledEarly
        }

        /// Waiters taken out of the state, to be resumed outside the lock.
        struct Waiters {
            var entries: [(CheckedContinuation<ClientConnection, any Error>, ClockCallback)] = []

            func resume(returning connection: ClientConnection) {
                for (continuation, timer) in self.entries {
                    timer.cancel()
                    continuation.resume(returning: connection)
                }
            }

            func resume(throwing error: TetherError) {
                for (continuation, timer) in self.entries {
                    timer.cancel()
                    continuation.resume(throwing: error)
                }
            }
        }

        var machine: ConnectivityStateMachine
        /// Endpoints that refused or failed a handshake recently: tried last for a while.
        var penalties: EndpointPenalties<TetherInstant>
        var run: RunPhase = .notStarted
        /// The connection new requests go to; `nil` while connecting, draining or stopped.
        var ready: ClientConnection?
        /// The established connection, draining or not.
        var current: ClientConnection?
        var waiters: [UInt64: Waiter] = [:]
        /// The last connection failure, for error messages.
        var lastError: TetherError?
        /// Endpoints whose connection failed on this network since the last connection was
        /// established: if another endpoint then works, they are blocked here, not offline.
        var failedSinceConnected: [Endpoint: TetherError] = [:]
        /// Set once the client gave up or shut down; requests fail with it.
        var terminalError: TetherError?
        /// The message of a GOAWAY `revoked`: the client stops once its connection closes.
        var revocation: String?
        /// What a path change decided while the run loop waited; the loop performs it on waking.
        var pendingAction: ConnectivityStateMachine.Action?
        /// The heartbeat mode the app set; new connections start in it.
        var heartbeatMode = HeartbeatMode.foreground
        /// What NAT-timeout probing learned, if it is on.
        var natProber: NATTimeoutProber?

        /// The network the device is on, as the path monitor last reported it ("" without a
        /// monitor, or before its first report). Read when the heartbeat needs it, not when a
        /// connection is made: a monitor's first report may come after the first connection,
        /// and a later change of network replaces the connection anyway.
        var network: String { self.machine.path?.identity ?? "" }

        init(machine: ConnectivityStateMachine, endpointPenalty: Duration) {
            self.machine = machine
            self.penalties = EndpointPenalties(duration: endpointPenalty)
        }

        /// Removes and returns what a path change decided, if anything.
        mutating func takePendingAction() -> ConnectivityStateMachine.Action? {
            defer { self.pendingAction = nil }
            return self.pendingAction
        }

        /// Removes and returns every registered waiter (not the early-cancelled markers).
        mutating func takeWaiters() -> Waiters {
            var taken = Waiters()
            for (id, waiter) in self.waiters {
                if case .waiting(let continuation, let timer) = waiter {
                    taken.entries.append((continuation, timer))
                    self.waiters[id] = nil
                }
            }
            return taken
        }
    }
}
