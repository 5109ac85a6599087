import NIOCore
import TetherCore

extension GatewayConnectionHandler {
    /// Everything one gateway connection knows, with no I/O: the phase (through
    /// ``GatewaySessionStateMachine``, the protocol's rules), the requests in flight with their
    /// handlers' tasks and the handler slots, one timer queue (request deadlines, handler time
    /// limits, and the handshake, idle and grace deadlines), the pushes held until WELCOME, read
    /// backpressure, and the tasks the connection must outlive.
    ///
    /// Each event is a `mutating func` that returns what the handler must do; time is passed in.
    ///
    /// ```
    ///  awaitingHello ──HELLO──▶ negotiating ──WELCOME──▶ established ──drain──▶ draining
    ///        │                      │                       │                      │
    ///        └── ERROR / violation / handshake timeout / idle / grace / close ─────┴──▶ closed
    /// ```
    ///
    /// A request is in the table from the moment it is read until it is answered (by its
    /// handler, or with `deadline exceeded` when its deadline passes), cancelled, or the
    /// connection closes; it is answered at most once. At most `maxRunning` handlers run at
    /// once; beyond that requests wait here, and once `maxWaiting` wait the connection stops
    /// reading (TCP backpressure, not refusals), as it does while the client does not read.
    struct StateMachine {
        struct Configuration: Sendable {
            var handshakeTimeout: TimeAmount
            /// The longest a handler may take, whatever the client's timeout.
            var handlerTimeout: TimeAmount
            var idleTimeout: TimeAmount
            var shutdownGracePeriod: TimeAmount
            /// How long a last frame (GOAWAY, ERROR) may take to be written before the
            /// connection is closed anyway: a client that does not read cannot hold it open.
            var closeTimeout: TimeAmount = .seconds(2)
            /// Handlers that may run at once (the limit announced in WELCOME).
            var maxRunning: Int
            /// Requests that may wait for a slot before reading stops.
            var maxWaiting: Int
            /// Requests accepted per second (a burst up to as many); beyond, `resource exhausted`.
            var requestsPerSecond: Int = .max
            /// Reliable messages taken per second; beyond, they are not taken (the client
            /// sends them again).
            var messagesPerSecond: Int = .max
        }

        /// What a deadline in the timer queue is for.
        enum Timer: Hashable {
            case request(UInt64)
            /// The time limit of a task registered with ``startTimeLimit(_:now:)``.
            case timeLimit(UInt64)
        }

        private struct Request {
            var method: String
            /// The task running its handler, once started; cancelled when the request is settled.
            var task: Task<Void, Never>?
        }

        let configuration: Configuration
        private(set) var session = GatewaySessionStateMachine() {
            didSet {
                self.outboundFlags = self.session.outboundFlags
                self.peerMaxBodySize = self.session.negotiated?.peerMaxBodySize
            }
        }
        // What the handler reads on every frame is stored, not computed: a computed property of
        // a struct held by a class is read from a copy of the whole struct.
        /// The flags every outbound frame carries now.
        private(set) var outboundFlags = GatewaySessionStateMachine().outboundFlags
        /// The largest body the client accepts, once the WELCOME went out.
        private(set) var peerMaxBodySize: Int?
        /// Requests read and not yet answered, cancelled or closed.
        private(set) var requestsInFlight = 0
        private var hello: Frame.Hello?
        private var requests: [UInt64: Request] = [:] {
            didSet { self.requestsInFlight = self.requests.count }
        }
        /// Requests read while every slot was taken. Made on first use: an empty buffer already
        /// reserves room for 16, more than an idle connection needs in all.
        private var waiting: CircularBuffer<Frame.Request>?
        /// Request handlers running (their tasks have not ended).
        private(set) var running = 0
        /// Every task of the connection that has not ended: handlers, the handshake, reliable loops.
        private(set) var tasks = 0
        private var timers = DeadlineQueue<Timer, NIODeadline>()
        /// Cancels a task whose time limit is registered.
        private var timeLimited: [UInt64: @Sendable () -> Void] = [:]
        private var nextTimeLimit: UInt64 = 0
        private var handshakeDeadline: NIODeadline?
        private var graceDeadline: NIODeadline?
        /// When the client's credentials, and their grace period, run out.
        private var credentialsDeadline: NIODeadline?
        /// When a last frame that is still not written stops holding the connection open.
        private var closeDeadline: NIODeadline?
        /// The rate of requests and of reliable messages, if limited.
        private var requestRate: TokenBucket?
        private var messageRate: TokenBucket?
        private var lastInbound: NIODeadline
        /// Pushes made before the WELCOME went out; sent right after it.
        private var heldPushes: [Frame.Push] = []
        /// The channel's writability, as its events tell it.
        private(set) var writable = true
        /// A `read` was held back; it is passed on once reading may resume.
        private var readHeld = false
        /// The connection is being closed: nothing more is written.
        private(set) var closing = false
        /// The channel closed.
        private(set) var channelClosed = false

        init(configuration: Configuration, now: NIODeadline) {
            self.configuration = configuration
            self.lastInbound = now
            if configuration.requestsPerSecond < .max {
                self.requestRate = TokenBucket(perSecond: configuration.requestsPerSecond, now: now)
            }
            if configuration.messagesPerSecond < .max {
                self.messageRate = TokenBucket(perSecond: configuration.messagesPerSecond, now: now)
            }
            self.handshakeDeadline = now + configuration.handshakeTimeout
        }

        /// When the handler's one timer must fire next.
        var nextDeadline: NIODeadline? {
            mutating get {
                var next = self.timers.earliest
                if let handshake = self.handshakeDeadline { next = min(next ?? handshake, handshake) }
                if let grace = self.graceDeadline { next = min(next ?? grace, grace) }
                if let credentials = self.credentialsDeadline { next = min(next ?? credentials, credentials) }
                if let close = self.closeDeadline { next = min(next ?? close, close) }
                if let idle = self.idleDeadline { next = min(next ?? idle, idle) }
                return next
            }
        }

        private var idleDeadline: NIODeadline? {
            self.session.negotiated == nil || self.closing ? nil : self.lastInbound + self.configuration.idleTimeout
        }

        // MARK: Inbound frames

        enum OnFrame {
            case none
            /// Authenticate the client in a task, then send WELCOME (``welcome(_:)``) or refuse it.
            case startHandshake(Frame.Hello)
            /// A request to run: find its route (the request carries its effective timeout).
            case request(Frame.Request)
            /// Cancel the handler's task, if it runs.
            case cancel(Task<Void, Never>?)
            /// Pass the reliable message to the connection's reliable session.
            case message(Frame.Message)
            /// Pass the acknowledgement to the connection's reliable session.
            case deliveryAck(Frame.DeliveryAck)
            /// Write this RESPONSE (a refusal) or PONG.
            case send(Frame.Payload)
            /// The client reported an error: close.
            case close(Frame.ErrorReport)
            /// The frame broke the protocol: send ERROR, then close.
            case sendErrorAndClose(ProtocolError)
            /// Over the connection's rate: send this refusal (a request's), or nothing (a
            /// message is not taken; the client sends it again).
            case rateLimited(Frame.Payload?)
        }

        /// A frame arrived.
        mutating func received(_ frame: Frame, now: NIODeadline) -> OnFrame {
            self.lastInbound = now
            switch self.session.received(frame) {
            case .forwardHello(let hello):
                self.hello = hello
                return .startHandshake(hello)
            case .forwardRequest(var request):
                guard self.requests[request.id] == nil else {
                    return self.violation(ProtocolError(code: .protocolError, message: "request id \(request.id) is already in flight"))
                }
                if self.requestRate != nil, !self.requestRate!.take(now: now) {
                    let limit = self.configuration.requestsPerSecond
                    return .rateLimited(
                        .response(
                            .init(
                                id: request.id,
                                status: .resourceExhausted,
                                message: "more than \(limit) requests per second on this connection"
                            )
                        )
                    )
                }
                // The effective deadline: the client's, capped by the handler time limit.
                let timeout =
                    request.timeout.map { min(TimeAmount($0), self.configuration.handlerTimeout) } ?? self.configuration.handlerTimeout
                request.timeout = Duration(timeout)
                self.requests[request.id] = Request(method: request.method)
                self.timers.insert(.request(request.id), deadline: now + timeout)
                return .request(request)
            case .cancelRequest(let cancel):
                guard let request = self.requests.removeValue(forKey: cancel.requestID) else { return .none }
                self.timers.remove(.request(cancel.requestID))
                return .cancel(request.task)
            case .forwardMessage(let message):
                if self.messageRate != nil, !self.messageRate!.take(now: now) {
                    let answers = self.session.negotiated?.features.contains(.messageAnswers) == true
                    return .rateLimited(answers ? .messageAck(.init(entries: [.init(id: message.id, status: .unavailable)])) : nil)
                }
                return .message(message)
            case .forwardDeliveryAck(let ack):
                return .deliveryAck(ack)
            case .refuseRequest(let refusal):
                return .send(.response(refusal))
            case .replyPong(let ping):
                return .send(.pong(ping))
            case .peerError(let report):
                return .close(report)
            case .violation(let error):
                return .sendErrorAndClose(error)
            case .ignore:
                return .none
            }
        }

        /// The connection breaks the protocol (its bytes cannot be decoded, or a request is
        /// invalid): it ends with ERROR.
        mutating func violation(_ error: ProtocolError) -> OnFrame {
            self.session.closed()
            return .sendErrorAndClose(error)
        }

        // MARK: The handshake

        /// The handshake succeeded: the WELCOME goes out now.
        /// - Returns: The pushes held until now, to send right after it; `nil` if the connection
        ///   is no longer waiting for a WELCOME (it closed meanwhile).
        /// - Parameters:
        ///   - negotiated: What the handshake settled.
        ///   - credentialsDeadline: When the client's credentials have expired, grace included;
        ///     the connection then ends with GOAWAY `credentials expired`.
        mutating func welcome(_ negotiated: Handshake.Negotiated, credentialsDeadline: NIODeadline? = nil) -> [Frame.Push]? {
            guard case .negotiating = self.session.phase, !self.closing else { return nil }
            self.session.welcomeSent(negotiated)
            self.handshakeDeadline = nil
            self.credentialsDeadline = credentialsDeadline
            defer { self.heldPushes = [] }
            return self.heldPushes
        }

        /// The client refreshed its credentials on the connection: their new deadline replaces
        /// the old (unless the connection is already being drained for the old ones).
        mutating func credentialsReplaced(deadline: NIODeadline?) {
            guard case .established = self.session.phase else { return }
            self.credentialsDeadline = deadline
        }

        // MARK: Handlers

        enum OnHandlerNeeded: Equatable {
            /// Start its handler's task now.
            case start
            /// It waits for a slot.
            case queued
        }

        /// A request read needs a task for its handler.
        mutating func handlerNeeded(_ request: Frame.Request) -> OnHandlerNeeded {
            if self.running < self.configuration.maxRunning {
                self.running += 1
                self.tasks += 1
                return .start
            }
            if self.waiting == nil { self.waiting = CircularBuffer(initialCapacity: 4) }
            self.waiting!.append(request)
            return .queued
        }

        /// The task running request `id`'s handler was created; settling the request cancels it.
        /// - Returns: Whether the request was settled meanwhile (the task is to be cancelled).
        mutating func handlerStarted(_ id: UInt64, task: Task<Void, Never>) -> Bool {
            guard self.requests[id] != nil else { return true }
            self.requests[id]!.task = task
            return false
        }

        /// A RESPONSE for request `id` is about to be written (its handler's, or a refusal).
        /// - Returns: Whether to write it: `false` if the request was already answered (its
        ///   deadline passed), cancelled, or the connection is closing.
        mutating func responseReady(_ id: UInt64) -> Bool {
            guard self.requests.removeValue(forKey: id) != nil else { return false }
            self.timers.remove(.request(id))
            return !self.closing
        }

        /// What follows the end of a handler's task.
        struct OnTaskEnded {
            /// Waiting requests that may start now, in order (their slots are taken).
            var start: [Frame.Request] = []
            /// A held `read` may be passed on now.
            var resumeReading = false
            /// The connection closed and this was its last task: it is done.
            var done = false
        }

        /// A request handler's task ended.
        mutating func handlerEnded() -> OnTaskEnded {
            self.running -= 1
            self.tasks -= 1
            var result = OnTaskEnded()
            while self.running < self.configuration.maxRunning, let next = self.waiting?.popFirst() {
                // Answered by its deadline, or cancelled, while it waited: do not run it.
                guard self.requests[next.id] != nil else { continue }
                self.running += 1
                self.tasks += 1
                result.start.append(next)
            }
            if self.waiting?.isEmpty == true { self.waiting = nil }
            result.resumeReading = self.resumeReadingIfPossible()
            result.done = self.channelClosed && self.tasks == 0
            return result
        }

        /// Another task of the connection started (the handshake, a reliable loop).
        mutating func taskStarted() {
            self.tasks += 1
        }

        /// A task started with ``taskStarted()`` ended.
        /// - Returns: Whether the connection is done (closed, and this was its last task).
        mutating func taskEnded() -> Bool {
            self.tasks -= 1
            return self.channelClosed && self.tasks == 0
        }

        // MARK: Time limits of other tasks

        /// Holds a running task to the handler time limit: past it, `cancel` is called.
        ///
        /// Time limits outlive the connection: a batch of reliable messages whose handlers ran
        /// must still be committed after the connection closed (PROTOCOL.md, section 9.1), so
        /// its handlers keep running, under their limits, until they end.
        /// - Returns: A token for ``endTimeLimit(_:)``.
        mutating func startTimeLimit(_ cancel: @escaping @Sendable () -> Void, now: NIODeadline) -> UInt64 {
            let token = self.nextTimeLimit
            self.nextTimeLimit += 1
            self.timeLimited[token] = cancel
            self.timers.insert(.timeLimit(token), deadline: now + self.configuration.handlerTimeout)
            return token
        }

        /// The task finished in time, or not.
        /// - Returns: Whether it ran past its limit (and was cancelled).
        mutating func endTimeLimit(_ token: UInt64) -> Bool {
            guard self.timeLimited.removeValue(forKey: token) != nil else { return true }
            self.timers.remove(.timeLimit(token))
            return false
        }

        // MARK: Time

        /// What the handler does when its timer fires.
        struct OnTimer {
            /// `deadline exceeded` answers to write, for requests whose deadline passed.
            var responses: [Frame.Response] = []
            /// Tasks to cancel: handlers of expired requests, tasks past their time limit.
            var cancel: [@Sendable () -> Void] = []
            /// Write this (ERROR for a handshake that timed out, GOAWAY for an idle connection)
            /// and close.
            var sendAndClose: Frame.Payload?
            /// Close at once (the grace period after GOAWAY ended).
            var close = false
            /// Drain the connection with this GOAWAY (the client's credentials expired).
            var drain: Frame.GoAway?
            /// `close` because the last frame could not be written in time.
            var lastFrameStuck = false
        }

        /// The handler's timer fired (perhaps early: then nothing is due).
        mutating func timerFired(now: NIODeadline) -> OnTimer {
            var result = OnTimer()
            if let deadline = self.handshakeDeadline, now >= deadline {
                self.handshakeDeadline = nil
                let timeout = Duration(self.configuration.handshakeTimeout).shortDescription
                self.session.closed()
                result.sendAndClose = .error(.init(code: .handshakeTimeout, message: "no completed handshake within \(timeout)"))
                return result
            }
            if let deadline = self.closeDeadline, now >= deadline {
                self.closeDeadline = nil
                result.close = true
                result.lastFrameStuck = true
                return result
            }
            if let deadline = self.graceDeadline, now >= deadline {
                self.graceDeadline = nil
                result.close = true
                return result
            }
            if let deadline = self.credentialsDeadline, now >= deadline {
                // Drained like a shutdown: the requests in flight are answered, the client closes.
                self.credentialsDeadline = nil
                result.drain = Frame.GoAway(
                    reason: .credentialsExpired,
                    message: "the client's credentials expired; connect again with fresh ones"
                )
            }
            if let deadline = self.idleDeadline, now >= deadline {
                let silence = Duration(now - self.lastInbound).shortDescription
                result.sendAndClose = .goAway(.init(reason: .idleTimeout, message: "nothing received for \(silence)"))
                return result
            }
            for timer in self.timers.popExpired(at: now) {
                switch timer {
                case .request(let id):
                    guard let request = self.requests.removeValue(forKey: id) else { continue }
                    result.responses.append(
                        Frame.Response(id: id, status: .deadlineExceeded, message: "'\(request.method)' did not finish in time")
                    )
                    if let task = request.task { result.cancel.append { task.cancel() } }
                case .timeLimit(let token):
                    if let cancel = self.timeLimited.removeValue(forKey: token) { result.cancel.append(cancel) }
                }
            }
            return result
        }

        // MARK: Writing and reading

        /// What to do with a push about to be written to this connection.
        enum PushAdmission: Equatable {
            /// Write it.
            case write
            /// It was held until the WELCOME; nothing to write now.
            case held
            /// It is larger than the client accepts (at most `limit` bytes): drop it.
            case tooLarge(limit: Int)
            /// The connection is closing: drop it.
            case closing
        }

        /// Whether a push of `size` bytes may go out now.
        mutating func admitPush(_ push: Frame.Push) -> PushAdmission {
            guard !self.closing else { return .closing }
            guard let limit = self.peerMaxBodySize else {
                self.heldPushes.append(push)
                return .held
            }
            return push.bodySize <= limit ? .write : .tooLarge(limit: limit)
        }

        /// The channel's writability changed.
        /// - Returns: Whether a held `read` may be passed on now.
        mutating func writabilityChanged(_ writable: Bool) -> Bool {
            self.writable = writable
            return self.resumeReadingIfPossible()
        }

        /// The channel wants to read.
        /// - Returns: Whether to pass the read on; if not, it is held until reading may resume.
        mutating func readRequested() -> Bool {
            if self.mustHoldReads {
                self.readHeld = true
                return false
            }
            return true
        }

        private var mustHoldReads: Bool {
            (self.waiting?.count ?? 0) >= self.configuration.maxWaiting || !self.writable
        }

        private mutating func resumeReadingIfPossible() -> Bool {
            guard self.readHeld, !self.mustHoldReads else { return false }
            self.readHeld = false
            return true
        }

        // MARK: Closing

        enum OnDrain: Equatable {
            case none
            /// Send GOAWAY; the client closes once its requests are answered, the grace period
            /// bounds the wait.
            case sendGoAway
            /// Send GOAWAY and close at once (the handshake had not completed).
            case sendGoAwayAndClose
        }

        /// The gateway wants the connection gone (it is shutting down).
        mutating func drain(now: NIODeadline) -> OnDrain {
            switch self.session.drain() {
            case .sendGoAway:
                self.graceDeadline = now + self.configuration.shutdownGracePeriod
                return .sendGoAway
            case .sendGoAwayAndClose:
                return .sendGoAwayAndClose
            case .none:
                return .none
            }
        }

        /// The handler is closing the connection: nothing more is written.
        /// - Parameter now: When a last frame is being written, the time from which it has
        ///   ``Configuration-swift.struct/closeTimeout`` to be written; after that the timer
        ///   says to close at once.
        /// - Returns: `false` if it was closing already.
        mutating func startClosing(writingLastFrameAt now: NIODeadline? = nil) -> Bool {
            defer { self.closing = true }
            guard !self.closing else { return false }
            if let now {
                self.closeDeadline = now + self.configuration.closeTimeout
                self.graceDeadline = nil
            }
            return true
        }

        /// What to settle once the channel closed.
        struct OnClosed {
            /// The tasks of the request handlers still running, to cancel.
            var cancel: [Task<Void, Never>] = []
            /// No task is left: the connection is done.
            var done = false
        }

        /// The channel closed.
        /// - Returns: `nil` if it was reported already.
        mutating func closed() -> OnClosed? {
            guard !self.channelClosed else { return nil }
            self.channelClosed = true
            self.closing = true
            self.session.closed()
            var result = OnClosed()
            result.cancel = self.requests.values.compactMap(\.task)
            for id in self.requests.keys { self.timers.remove(.request(id)) }
            self.requests.removeAll()
            self.waiting = nil
            self.heldPushes = []
            // The time limits stay, with their deadlines (see ``startTimeLimit(_:now:)``).
            self.handshakeDeadline = nil
            self.graceDeadline = nil
            result.done = self.tasks == 0
            return result
        }
    }
}
