/// The gateway's routes: request methods and message topics to their handlers.
///
/// Routes are registered on the ``Gateway`` before it runs (``Gateway/handle(_:_:)``,
/// ``Gateway/handleInline(_:_:)``, ``Gateway/onMessage(_:_:)``) and frozen when it starts:
/// every connection then reads the same immutable tables, with no lock per request.
struct Router: Sendable {
    /// How a method is served.
    enum Route: Sendable {
        /// In a task of its own (``Gateway/handle(_:_:)``).
        case task(Gateway.Handler)
        /// On the event loop, at once (``Gateway/handleInline(_:_:)``).
        case inline(Gateway.InlineHandler)
    }

    private(set) var routes: [String: Route] = [:]
    private(set) var messageHandlers: [String: Gateway.MessageHandler] = [:]
    /// Routes of every method that starts with a prefix (``Gateway/handle(prefix:_:)``):
    /// looked at only when no method matches exactly.
    private(set) var prefixRoutes = PrefixTable<Route>()
    /// The same for message topics (``Gateway/onMessage(prefix:_:)``).
    private(set) var prefixMessageHandlers = PrefixTable<Gateway.MessageHandler>()
    /// The application's authorization hook, if it set one.
    var authorizer: Gateway.Authorizer?
    /// The application's hook for channels gaining their first subscriber or losing their last.
    var occupancy: Gateway.ChannelOccupancyHook?
    /// The application's asynchronous check of channel access (``Gateway/authorizeChannels(_:)``).
    var channelAuthorizer: Gateway.ChannelAuthorizer?
    /// The application's hook for established connections that closed.
    var disconnected: Gateway.DisconnectHook?
    /// What the application adds to `/ready` (``Gateway/addReadinessCheck(_:)``).
    var readinessChecks: [Gateway.ReadinessCheck] = []

    /// Whether `connection` may do `access`: its credentials allow it, and so does the hook.
    func permits(_ access: Access, _ connection: ConnectionInfo) -> Bool {
        (connection.identity?.allows(access) ?? true) && (self.authorizer?(access, connection) ?? true)
    }

    /// Why the application's asynchronous channel check refuses `access`, if it is set and does.
    func channelRefusal(_ access: Access, _ connection: ConnectionInfo) async -> RequestError? {
        guard let check = self.channelAuthorizer else { return nil }
        do {
            try await check(access, connection)
            return nil
        } catch let error as RequestError {
            return error
        } catch {
            return RequestError(.unavailable, "the channel's access could not be checked: \(error)")
        }
    }

    /// Whether any access of `connection` must be checked (most connections need no check).
    func checksAccess(of connection: ConnectionInfo) -> Bool {
        self.authorizer != nil || connection.identity?.restricts == true
    }

    /// The route of a request method, if any.
    @inline(__always)
    func route(_ method: String) -> Route? {
        if let route = self.routes[method] { return route }
        return self.prefixRoutes.isEmpty ? nil : self.prefixRoute(method)?.value
    }

    /// The prefix route of a method no route names exactly; reserved methods (`$…`) are
    /// never routed by prefix.
    func prefixRoute(_ method: String) -> (prefix: String, value: Route)? {
        guard !method.hasPrefix("$") else { return nil }
        return self.prefixRoutes.match(method)
    }

    /// The handler of a message topic, if any.
    func messageHandler(_ topic: String) -> Gateway.MessageHandler? {
        if let handler = self.messageHandlers[topic] { return handler }
        return self.prefixMessageHandlers.match(topic)?.value
    }

    /// What a prefix route's metrics are labelled with: the prefix and `*`.
    static func label(ofPrefix prefix: String) -> String { prefix + "*" }

    mutating func add(_ method: String, _ route: Route) {
        self.routes[method] = route
    }

    mutating func add(topic: String, _ handler: @escaping Gateway.MessageHandler) {
        self.messageHandlers[topic] = handler
    }

    mutating func add(prefix: String, _ route: Route) {
        self.prefixRoutes.add(prefix, route)
    }

    mutating func add(topicPrefix prefix: String, _ handler: @escaping Gateway.MessageHandler) {
        self.prefixMessageHandlers.add(prefix, handler)
    }
}

/// Values by name prefix; the longest prefix a name starts with wins.
struct PrefixTable<Value: Sendable>: Sendable {
    /// Longest prefix first, so that the first match is the longest.
    private(set) var entries: [(prefix: String, value: Value)] = []

    var isEmpty: Bool { self.entries.isEmpty }

    /// Adds `value` under `prefix`, replacing what the prefix had.
    mutating func add(_ prefix: String, _ value: Value) {
        self.entries.removeAll { $0.prefix == prefix }
        self.entries.append((prefix, value))
        self.entries.sort { $0.prefix.utf8.count > $1.prefix.utf8.count }
    }

    /// The entry of the longest prefix `name` starts with.
    func match(_ name: String) -> (prefix: String, value: Value)? {
        self.entries.first { name.hasPrefix($0.prefix) }
    }
}
