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
    /// The application's authorization hook, if it set one.
    var authorizer: Gateway.Authorizer?
    /// The application's hook for channels gaining their first subscriber or losing their last.
    var occupancy: Gateway.ChannelOccupancyHook?

    /// Whether `connection` may do `access`: its credentials allow it, and so does the hook.
    func permits(_ access: Access, _ connection: ConnectionInfo) -> Bool {
        (connection.identity?.allows(access) ?? true) && (self.authorizer?(access, connection) ?? true)
    }

    /// Whether any access of `connection` must be checked (most connections need no check).
    func checksAccess(of connection: ConnectionInfo) -> Bool {
        self.authorizer != nil || connection.identity?.restricts == true
    }

    /// The route of a request method, if any.
    @inline(__always)
    func route(_ method: String) -> Route? {
        self.routes[method]
    }

    /// The handler of a message topic, if any.
    func messageHandler(_ topic: String) -> Gateway.MessageHandler? {
        self.messageHandlers[topic]
    }

    mutating func add(_ method: String, _ route: Route) {
        self.routes[method] = route
    }

    mutating func add(topic: String, _ handler: @escaping Gateway.MessageHandler) {
        self.messageHandlers[topic] = handler
    }
}
