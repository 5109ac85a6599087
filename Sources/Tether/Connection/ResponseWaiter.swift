import NIOCore

/// Who waits for a request's response, resumed by the connection handler on its event loop.
///
/// A caller's continuation and a data task's completion handler are resumed directly, with no
/// promise in between: a promise would cost a future, a callback list and a closure per request.
enum ResponseWaiter: Sendable {
    /// An `async` caller (``TetherClient/request(_:body:timeout:)``), suspended on this continuation.
    case continuation(UnsafeContinuation<ByteBuffer, any Error>)
    /// A callback (``TetherDataTask``); it runs on the event loop, inside the handler.
    case callback(@Sendable (Result<ByteBuffer, TetherError>) -> Void)
    /// A promise (tests, and callers that want a future).
    case promise(EventLoopPromise<ByteBuffer>)

    /// Delivers the response body.
    func succeed(_ body: ByteBuffer) {
        switch self {
        case .continuation(let continuation): continuation.resume(returning: body)
        case .callback(let callback): callback(.success(body))
        case .promise(let promise): promise.succeed(body)
        }
    }

    /// Delivers the outcome.
    func resume(with result: Result<ByteBuffer, TetherError>) {
        switch result {
        case .success(let body): self.succeed(body)
        case .failure(let error): self.fail(error)
        }
    }

    /// Delivers `error`.
    func fail(_ error: TetherError) {
        switch self {
        case .continuation(let continuation): continuation.resume(throwing: error)
        case .callback(let callback): callback(.failure(error))
        case .promise(let promise): promise.fail(error)
        }
    }
}
