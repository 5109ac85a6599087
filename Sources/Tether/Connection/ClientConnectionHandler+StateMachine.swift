import NIOCore
import TetherCore

extension ClientConnectionHandler {
    /// Everything one client connection knows, with no I/O: the phase (through
    /// ``ClientSessionStateMachine``, the protocol's rules), the request slots and the in-flight
    /// table, one timer queue (request deadlines, retransmissions, the handshake's deadline and
    /// the heartbeat's), the heartbeat, and the window of reliable messages.
    ///
    /// Each event is a `mutating func` that returns what the handler must do; time is passed in.
    ///
    /// ```
    ///  idle ──start──▶ awaitingWelcome ──WELCOME──▶ established ──GOAWAY / drain──▶ draining
    ///                        │                           │                             │
    ///                        └─── ERROR / violation / timeout / close ─────────────────┴──▶ closed
    /// ```
    ///
    /// It keeps no more requests on the wire than the gateway's `max concurrent requests` and
    /// queues the rest, each under its own deadline: a queued request never reached the gateway,
    /// and fails with `notDispatched` (sent again on the next connection) if this one goes away.
    struct StateMachine {
        struct Configuration: Sendable {
            var hello: Frame.Hello
            var handshakeTimeout: TimeAmount
            /// The application's heartbeat settings.
            var heartbeat: ClientConfiguration.Heartbeat
            /// With reliable messaging: the window and retransmission bounds.
            var reliability: (window: Int, retransmission: RTTEstimator)?
        }

        /// What the application wants of the heartbeat now.
        struct HeartbeatPreference: Sendable {
            var mode: HeartbeatMode
            /// With NAT-timeout probing: the longest interval the network is known (or being
            /// tested) to keep an idle connection.
            var learnedInterval: Duration?
        }

        /// What a deadline in the timer queue is for.
        enum Timer: Hashable {
            case request(UInt64)
            case retransmission(UInt64)
        }

        private struct Request {
            var method: String
            var deadline: NIODeadline
            var waiter: ResponseWaiter
            /// The request while it waits for a slot; `nil` once sent.
            var unsent: Frame.Request?

            mutating func takeUnsent() -> Frame.Request? {
                defer { self.unsent = nil }
                return self.unsent
            }
        }

        let configuration: Configuration
        private(set) var session: ClientSessionStateMachine {
            didSet { self.outboundFlags = self.session.outboundFlags }
        }
        /// The flags every outbound frame carries now. Stored, so that the handler reads it
        /// without copying the machine (a computed property of a struct held by a class is
        /// read from a copy of the whole struct).
        private(set) var outboundFlags: FrameFlags
        private var started = false
        /// The channel closed and everything was settled.
        private var finished = false
        private var requests: [UInt64: Request] = [:]
        /// Ids of requests waiting for a slot, oldest first (some may have been settled meanwhile).
        private var waiting = CircularBuffer<UInt64>()
        /// Requests on the wire and not yet answered.
        private(set) var requestsOnWire = 0
        private var timers = DeadlineQueue<Timer, NIODeadline>()
        private var handshakeDeadline: NIODeadline?
        private(set) var heartbeat: HeartbeatStateMachine?
        /// The gateway's heartbeat interval and the longest interval it allows (half its idle timeout).
        private var heartbeatBounds: (gateway: TimeAmount, ceiling: TimeAmount)?
        private var heartbeatMode = HeartbeatMode.foreground
        /// The client closed the connection on purpose: an idle probe waiting then did not fail.
        private var closedByClient = false
        /// Why the connection ends, once decided.
        private(set) var closeReason: DisconnectReason?
        private(set) var establishedAt: NIODeadline?
        /// Reliable messages on this connection, once negotiated.
        private var outbox: OutboxWindow?
        private var retransmission: RTTEstimator?
        /// An idle probe's fate, for the client's NAT-timeout prober, until the handler takes it.
        private var idleProbeReport: (probe: HeartbeatStateMachine.IdleProbe, answered: Bool)?

        init(configuration: Configuration) {
            self.configuration = configuration
            self.session = ClientSessionStateMachine(hello: configuration.hello)
            self.outboundFlags = self.session.outboundFlags
        }

        /// The negotiated parameters, once established.
        var negotiated: Handshake.Negotiated? { self.session.negotiated }

        /// Whether new requests may be sent.
        var acceptsRequests: Bool { self.session.acceptsRequests }

        /// The number of requests in flight or queued.
        var requestCount: Int { self.requests.count }

        /// When the handler's one timer must fire next.
        var nextDeadline: NIODeadline? {
            mutating get {
                var next = self.timers.earliest
                if let handshake = self.handshakeDeadline { next = min(next ?? handshake, handshake) }
                if let heartbeat = self.heartbeat?.nextDeadline { next = min(next ?? heartbeat, heartbeat) }
                return next
            }
        }

        /// An idle probe that was answered, or that the link died waiting for.
        mutating func takeIdleProbeReport() -> (probe: HeartbeatStateMachine.IdleProbe, answered: Bool)? {
            defer { self.idleProbeReport = nil }
            return self.idleProbeReport
        }

        // MARK: The handshake

        /// The channel is active: send HELLO and start the handshake's deadline.
        /// - Returns: The HELLO to send, or `nil` if it was sent already.
        mutating func start(now: NIODeadline) -> Frame.Hello? {
            guard !self.started, case .awaitingWelcome = self.session.phase else { return nil }
            self.started = true
            self.handshakeDeadline = now + self.configuration.handshakeTimeout
            return self.configuration.hello
        }

        // MARK: Inbound frames

        /// What to do after a request ended before its response (or after a response freed
        /// its slot): a waiting request to send, and whether the connection is now done.
        struct AfterSettle {
            /// A request that was waiting for the freed slot, to write now.
            var send: Frame.Request?
            /// The connection drained: close it for this reason.
            var close: DisconnectReason?
        }

        enum OnFrame {
            case none
            /// WELCOME: the connection is established with these parameters.
            case established(Handshake.Negotiated)
            /// A RESPONSE: resume its waiter.
            case complete(ResponseWaiter, Result<ByteBuffer, TetherError>, AfterSettle)
            case push(Frame.Push)
            case sendPong(Frame.Ping)
            /// GOAWAY on the established connection: tell the client, fail the queued requests
            /// (`notDispatched`), and close if nothing is in flight.
            case goAway(Frame.GoAway, unsent: [ResponseWaiter], close: DisconnectReason?)
            /// The gateway refused the connection during the handshake (GOAWAY or ERROR): the
            /// attempt fails with this error; close.
            case refused(TetherError, close: DisconnectReason)
            /// The gateway reported a connection error: close.
            case close(DisconnectReason)
            /// The frame broke the protocol: send ERROR, then close.
            case sendErrorAndClose(ProtocolError)
            /// MESSAGE_ACK: tell the outbox, and send more messages.
            case messagesAcknowledged([Frame.MessageAck.Entry])
            /// DELIVERY, from the store whose epoch WELCOME announced.
            case delivery(Frame.Delivery, epoch: UInt64)
        }

        /// A frame arrived.
        /// - Parameters:
        ///   - frame: The frame.
        ///   - now: The event loop's time.
        ///   - preference: What the application wants of the heartbeat; read only for WELCOME.
        mutating func received(_ frame: Frame, now: NIODeadline, preference: @autoclosure () -> HeartbeatPreference) -> OnFrame {
            if let probe = self.heartbeat?.frameReceived(at: now) {
                self.idleProbeReport = (probe, true)
            }
            switch self.session.received(frame) {
            case .established(let negotiated):
                self.establish(negotiated, now: now, preference: preference())
                return .established(negotiated)

            case .response(let response):
                return self.complete(response, now: now)

            case .push(let push):
                return .push(push)

            case .replyPong(let ping):
                return .sendPong(ping)

            case .pong(let ping):
                self.heartbeat?.pongReceived(id: ping.id, at: now)
                return .none

            case .goAway(let goAway):
                self.closeReason = self.closeReason ?? .goingAway(goAway)
                guard self.establishedAt != nil else {
                    let error = TetherError(
                        code: .handshakeFailed,
                        message: "the gateway is going away (\(goAway.reason)): \(goAway.message)"
                    )
                    return .refused(error, close: .goingAway(goAway))
                }
                let unsent = self.takeUnsent()
                return .goAway(goAway, unsent: unsent, close: self.closeIfDrained())

            case .peerError(let report):
                let reason = DisconnectReason.gatewayError(code: report.code, message: report.message)
                self.closeReason = self.closeReason ?? reason
                guard self.establishedAt != nil else {
                    let error = TetherError(
                        code: .handshakeFailed,
                        message: "the gateway refused the connection: \(report.message)",
                        status: report.code
                    )
                    return .refused(error, close: reason)
                }
                return .close(reason)

            case .violation(let error):
                return self.violation(error)

            case .messageAck(let ack):
                // With the answers feature, `unavailable` means "not taken now": the message
                // stays in flight and its retransmission timer sends it again.
                let entries =
                    self.session.negotiated?.features.contains(.messageAnswers) == true
                    ? ack.entries.filter { $0.status != .unavailable } : ack.entries
                guard self.outbox != nil else { return .messagesAcknowledged(entries) }
                for entry in entries {
                    guard let (_, sample) = self.outbox!.acknowledged(entry.id, now: now) else { continue }
                    self.timers.remove(.retransmission(entry.id))
                    if let sample { self.retransmission?.record(sample: Duration(sample)) }
                }
                return .messagesAcknowledged(entries)

            case .delivery(let delivery):
                guard let epoch = self.session.negotiated?.deliveryEpoch else { return .none }
                return .delivery(delivery, epoch: epoch)

            case .ignore:
                return .none
            }
        }

        /// The connection breaks the protocol (the frame decoder failed, or a delivery skipped
        /// a sequence): it ends with ERROR.
        mutating func violation(_ error: ProtocolError) -> OnFrame {
            self.closeReason = self.closeReason ?? .protocolViolation(error)
            self.session.closed()
            return .sendErrorAndClose(error)
        }

        private mutating func establish(_ negotiated: Handshake.Negotiated, now: NIODeadline, preference: HeartbeatPreference) {
            self.handshakeDeadline = nil
            self.establishedAt = now
            let bounds = (
                gateway: TimeAmount(negotiated.heartbeatInterval),
                ceiling: TimeAmount.nanoseconds(TimeAmount(negotiated.idleTimeout).nanoseconds / 2)
            )
            self.heartbeatBounds = bounds
            if negotiated.features.contains(.reliableDelivery), let reliability = self.configuration.reliability {
                self.outbox = OutboxWindow(window: reliability.window)
                self.retransmission = reliability.retransmission
            }
            let settings = self.configuration.heartbeat
            self.heartbeatMode = preference.mode
            let pace = self.heartbeatPace(preference, bounds: bounds)
            self.heartbeat = HeartbeatStateMachine(
                configuration: .init(
                    interval: pace.interval,
                    jitter: pace.jitter,
                    timeout: RTTEstimator(
                        initialTimeout: settings.timeout,
                        minimumTimeout: min(settings.minimumTimeout, settings.timeout),
                        maximumTimeout: settings.timeout
                    ),
                    suspensionThreshold: settings.suspensionThreshold.map { TimeAmount($0) },
                    probeTimeout: TimeAmount(settings.probeTimeout),
                    stallInterval: settings.stallInterval.map { TimeAmount($0) }
                ),
                now: now
            )
        }

        private mutating func complete(_ response: Frame.Response, now: NIODeadline) -> OnFrame {
            guard let index = self.requests.index(forKey: response.id), self.requests.values[index].unsent == nil else {
                // Timed out or cancelled already (or never sent); PROTOCOL.md says to ignore it.
                return .none
            }
            let request = self.requests.remove(at: index).value
            self.requestsOnWire -= 1
            self.timers.remove(.request(response.id))
            let result: Result<ByteBuffer, TetherError>
            switch response.status {
            case .ok:
                result = .success(response.body)
            case .unavailable:
                // The gateway is draining and did not run the handler: safe to send again elsewhere.
                result = .failure(TetherError(code: .notDispatched, message: response.message, status: response.status))
            case .deadlineExceeded where now >= request.deadline:
                // The gateway enforced the caller's own deadline: to the caller, it timed out.
                result = .failure(
                    TetherError(code: .timedOut, message: "no response to '\(request.method)' before its deadline", status: response.status)
                )
            default:
                let message = response.message.isEmpty ? "'\(request.method)' failed" : response.message
                result = .failure(TetherError(code: .serverError, message: message, status: response.status))
            }
            return .complete(request.waiter, result, self.afterSettle())
        }

        // MARK: Requests

        enum OnSubmit {
            /// Write the request now.
            case write(Frame.Request)
            /// It waits for a slot.
            case queued
            /// It cannot be sent on this connection.
            case fail(ResponseWaiter, TetherError)
        }

        /// The client sends a request, answered to `waiter` at the latest when `deadline` passes.
        mutating func submit(_ request: Frame.Request, deadline: NIODeadline, waiter: ResponseWaiter) -> OnSubmit {
            guard self.session.acceptsRequests, let negotiated = self.session.negotiated else {
                return .fail(waiter, TetherError(code: .notDispatched, message: "the connection no longer accepts requests"))
            }
            let bodySize = request.bodySize
            guard bodySize <= negotiated.peerMaxBodySize else {
                return .fail(
                    waiter,
                    TetherError(
                        code: .requestTooLarge,
                        message: "the request body is \(bodySize) bytes; the gateway accepts at most \(negotiated.peerMaxBodySize)"
                    )
                )
            }
            // A free slot and nobody waiting ahead: straight to the wire, without queueing.
            let direct = self.waiting.isEmpty && self.requestsOnWire < Self.requestLimit(negotiated)
            let entry = Request(method: request.method, deadline: deadline, waiter: waiter, unsent: direct ? nil : request)
            if let previous = self.requests.updateValue(entry, forKey: request.id) {
                self.requests[request.id] = previous
                return .fail(waiter, TetherError(code: .invalidArgument, message: "request id \(request.id) is already in flight"))
            }
            self.timers.insert(.request(request.id), deadline: deadline)
            guard direct else {
                self.waiting.append(request.id)
                return .queued
            }
            self.requestsOnWire += 1
            return .write(request)
        }

        /// The most requests the gateway takes on the wire at once.
        private static func requestLimit(_ negotiated: Handshake.Negotiated) -> Int {
            negotiated.maxConcurrentRequests == 0 ? Int.max : Int(negotiated.maxConcurrentRequests)
        }

        enum OnCancel {
            case none
            /// Fail the waiter with `cancelled`; if the request was on the wire, send CANCEL.
            case cancelled(ResponseWaiter, TetherError, sendCancel: Bool, AfterSettle)
        }

        /// The caller abandons request `id`.
        mutating func cancel(_ id: UInt64) -> OnCancel {
            guard let (request, wasSent) = self.settle(id) else { return .none }
            let error = TetherError(code: .cancelled, message: "request '\(request.method)' was cancelled")
            return .cancelled(request.waiter, error, sendCancel: wasSent, self.afterSettle())
        }

        /// Removes a request that ends before its response, freeing its slot if it was sent.
        private mutating func settle(_ id: UInt64) -> (Request, wasSent: Bool)? {
            guard let request = self.requests.removeValue(forKey: id) else { return nil }
            self.timers.remove(.request(id))
            let wasSent = request.unsent == nil
            if wasSent { self.requestsOnWire -= 1 }
            return (request, wasSent)
        }

        /// After a slot was freed: the next waiting request, and whether a draining connection is done.
        private mutating func afterSettle() -> AfterSettle {
            AfterSettle(send: self.nextWaiting(), close: self.closeIfDrained())
        }

        /// The oldest waiting request, if a slot is free; it is on the wire from now on.
        mutating func nextWaiting() -> Frame.Request? {
            guard let negotiated = self.session.negotiated, self.session.acceptsRequests else { return nil }
            while self.requestsOnWire < Self.requestLimit(negotiated), let id = self.waiting.popFirst() {
                // In place: one lookup, and no copy of the request.
                guard let frame = self.requests[id]?.takeUnsent() else { continue }  // settled meanwhile
                self.requestsOnWire += 1
                return frame
            }
            return nil
        }

        /// Fails every queued request: it never reached the gateway, so the client sends it
        /// again on its next connection.
        private mutating func takeUnsent() -> [ResponseWaiter] {
            var unsent: [ResponseWaiter] = []
            for id in self.waiting {
                guard let request = self.requests[id], request.unsent != nil else { continue }
                self.requests[id] = nil
                self.timers.remove(.request(id))
                unsent.append(request.waiter)
            }
            self.waiting.removeAll()
            return unsent
        }

        private func closeIfDrained() -> DisconnectReason? {
            guard case .draining = self.session.phase, self.requests.isEmpty else { return nil }
            return self.closeReason ?? .shutdown
        }

        // MARK: Time

        /// What the handler does when its timer fires.
        struct OnTimer {
            /// The handshake did not complete: the attempt fails with this error, and the
            /// connection closes.
            var handshakeTimedOut: TetherError?
            /// Requests whose deadline passed, to fail with `timedOut`.
            var expired: [(ResponseWaiter, TetherError)] = []
            /// CANCELs to send for expired requests that were on the wire.
            var cancels: [UInt64] = []
            /// Waiting requests to send in the slots the expired ones freed.
            var send: [Frame.Request] = []
            /// Reliable messages are due for retransmission: send what the window allows.
            var pumpMessages = false
            /// The heartbeat's decision.
            var heartbeat: HeartbeatStateMachine.TimerAction = .none
            /// The connection is done: close it for this reason.
            var close: DisconnectReason?
        }

        /// The handler's timer fired (perhaps early: then nothing is due).
        mutating func timerFired(now: NIODeadline) -> OnTimer {
            var result = OnTimer()
            if let handshake = self.handshakeDeadline, now >= handshake, self.establishedAt == nil {
                self.handshakeDeadline = nil
                let timeout = Duration(self.configuration.handshakeTimeout)
                result.handshakeTimedOut = TetherError(code: .handshakeFailed, message: "no WELCOME within \(timeout.shortDescription)")
                result.close = .transportError("handshake timed out after \(timeout.shortDescription)")
                self.closeReason = self.closeReason ?? result.close
                return result
            }
            for timer in self.timers.popExpired(at: now) {
                switch timer {
                case .request(let id):
                    guard let (request, wasSent) = self.settle(id) else { continue }
                    let message =
                        wasSent
                        ? "no response to '\(request.method)' before its deadline"
                        : "'\(request.method)' was still queued at its deadline (the gateway's \(self.requestsOnWire) request slots were busy)"
                    result.expired.append((request.waiter, TetherError(code: .timedOut, message: message)))
                    if wasSent { result.cancels.append(id) }
                case .retransmission(let id):
                    if self.outbox?.timedOut(id) != nil { result.pumpMessages = true }
                }
            }
            if !result.expired.isEmpty {
                while let next = self.nextWaiting() { result.send.append(next) }
                result.close = self.closeIfDrained()
            }
            if self.heartbeat != nil {
                result.heartbeat = self.heartbeat!.timerFired(at: now)
                if case .linkDead(let silence) = result.heartbeat {
                    self.reportFailedIdleProbe()
                    result.close = .heartbeatTimeout(silentFor: Duration(silence))
                    self.closeReason = self.closeReason ?? result.close
                }
            }
            return result
        }

        /// Frames were flushed: the heartbeat counts the link as used.
        mutating func flushed(now: NIODeadline) {
            self.heartbeat?.frameSent(at: now)
        }

        // MARK: The heartbeat

        /// The interval for the mode (configured, or the default for the mode; never longer than
        /// the gateway's idle timeout allows) and its jitter.
        ///
        /// With NAT-timeout probing, the interval is never longer than the network is known (or
        /// being tested) to keep an idle connection. When that is what decides it, the interval
        /// is used exactly, without jitter: every idle probe then tests the interval it reports.
        private func heartbeatPace(
            _ preference: HeartbeatPreference,
            bounds: (gateway: TimeAmount, ceiling: TimeAmount)
        ) -> (interval: TimeAmount, jitter: Double) {
            let mode = preference.mode
            let configured = self.configuration.heartbeat.interval(for: mode).map { TimeAmount($0) }
            let wanted = max(.milliseconds(1), min(configured ?? (mode == .foreground ? bounds.gateway : bounds.ceiling), bounds.ceiling))
            if let learned = preference.learnedInterval.map({ TimeAmount($0) }), learned <= wanted {
                return (learned, 0)
            }
            return (wanted, self.configuration.heartbeat.jitter)
        }

        /// The application's heartbeat mode, or what NAT-timeout probing learned, changed.
        ///
        /// Back in the foreground, the link is probed at once: the app is about to use it, and a
        /// connection that died in the background is found in one round trip, not one interval.
        /// - Returns: The id of a PING to send now, if any.
        mutating func heartbeatPreferenceChanged(_ preference: HeartbeatPreference, now: NIODeadline) -> UInt64? {
            guard self.heartbeat != nil, let bounds = self.heartbeatBounds else { return nil }
            let previous = self.heartbeatMode
            self.heartbeatMode = preference.mode
            let pace = self.heartbeatPace(preference, bounds: bounds)
            if pace.interval != self.heartbeat!.interval || pace.jitter != self.heartbeat!.configuration.jitter {
                self.heartbeat!.setInterval(pace.interval, jitter: pace.jitter)
            }
            guard preference.mode == .foreground, previous != .foreground else { return nil }
            if case .sendPing(let id) = self.heartbeat!.probeNow(at: now) { return id }
            return nil
        }

        private mutating func reportFailedIdleProbe() {
            guard !self.closedByClient, let probe = self.heartbeat?.outstandingIdleProbe else { return }
            self.idleProbeReport = (probe, false)
        }

        // MARK: Reliable messages

        /// Messages to send on this connection (in addition to those queued).
        mutating func enqueueMessages(_ records: [OutboxRecord]) -> Bool {
            guard self.outbox != nil else { return false }
            self.outbox!.enqueue(records)
            return true
        }

        /// A message expired: its tombstone replaces it.
        mutating func replaceMessage(with tombstone: OutboxRecord) {
            self.outbox?.replace(with: tombstone)
        }

        /// The next reliable message to send, if the window allows; its retransmission deadline
        /// is set.
        /// - Parameters:
        ///   - now: The event loop's time.
        ///   - wallClock: Milliseconds since 1970, to turn expiry times into time to live.
        /// - Returns: The MESSAGE, and whether this is its first transmission on this connection.
        mutating func nextMessage(now: NIODeadline, wallClock: Int64) -> (Frame.Message, first: Bool)? {
            guard self.outbox != nil, self.session.acceptsRequests, let record = self.outbox!.next(now: now) else { return nil }
            let transmissions = self.outbox!.inFlight[record.id]?.transmissions ?? 1
            let message = Frame.Message(
                id: record.id,
                topic: record.topic,
                conversation: record.conversation,
                sequence: record.sequence,
                ttl: record.expired ? nil : record.expiresAt.map { .milliseconds(max(1, $0 - wallClock)) },
                expired: record.expired,
                body: record.expired ? ByteBuffer() : record.body
            )
            let timeout = self.retransmission?.retransmissionTimeout(afterRetransmissions: transmissions - 1) ?? .seconds(1)
            self.timers.insert(.retransmission(record.id), deadline: now + TimeAmount(timeout))
            return (message, transmissions == 1)
        }

        /// The DELIVERY_ACK telling the gateway that every delivery up to `sequence` was
        /// processed, if the connection is established.
        mutating func deliveryAck(upTo sequence: UInt64) -> Frame.DeliveryAck? {
            self.session.negotiated == nil ? nil : Frame.DeliveryAck(sequence: sequence)
        }

        // MARK: Closing

        /// The client stops sending requests (it is shutting down).
        /// - Returns: The reason to close now for, if nothing is in flight or the handshake is
        ///   not complete.
        mutating func drain() -> DisconnectReason? {
            self.session.drain()
            self.closeReason = self.closeReason ?? .shutdown
            guard self.establishedAt != nil else { return .shutdown }
            return self.closeIfDrained()
        }

        /// The client closes the connection on purpose (a network change, a shutdown).
        mutating func closeRequested() {
            self.closedByClient = true
        }

        /// The channel reported an error other than a protocol violation: the connection closes.
        mutating func transportFailed(_ description: String) {
            self.closeReason = self.closeReason ?? .transportError(description)
        }

        /// What is left to settle once the channel has closed.
        struct OnClosed {
            /// The handshake never completed: the attempt fails with this error.
            var handshakeFailed: TetherError?
            /// Every waiter still waiting, with its error.
            var failed: [(ResponseWaiter, TetherError)]
            var closure: ConnectionClosure
        }

        /// The channel closed.
        mutating func closed(now: NIODeadline) -> OnClosed? {
            guard !self.finished else { return nil }
            self.finished = true
            switch self.closeReason {
            case nil, .closedByPeer, .transportError: self.reportFailedIdleProbe()
            default: break  // decided here (a heartbeat timeout reports itself), or by the gateway
            }
            self.session.closed()
            self.heartbeat = nil
            self.handshakeDeadline = nil
            self.outbox = nil
            let reason = self.closeReason ?? .closedByPeer
            self.closeReason = reason
            var failed: [(ResponseWaiter, TetherError)] = self.takeUnsent().map {
                ($0, TetherError(code: .notDispatched, message: "the connection closed before the request was sent: \(reason)"))
            }
            for (_, request) in self.requests {
                failed.append(
                    (
                        request.waiter,
                        TetherError(
                            code: .connectionLost,
                            message: "the connection closed while '\(request.method)' was in flight: \(reason)"
                        )
                    )
                )
            }
            self.requests.removeAll()
            self.requestsOnWire = 0
            _ = self.timers.removeAll()
            let handshakeFailed =
                self.establishedAt == nil
                ? TetherError(code: .handshakeFailed, message: "the connection closed during the handshake: \(reason)") : nil
            let uptime = self.establishedAt.map { Duration(now - $0) } ?? .zero
            return OnClosed(handshakeFailed: handshakeFailed, failed: failed, closure: ConnectionClosure(reason: reason, uptime: uptime))
        }
    }
}
