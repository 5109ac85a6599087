import NIOCore
import Testing

@testable import Tether

@Suite("Submission ticket")
struct SubmissionTicketTests {
    struct Cancelled: Error {}

    @Test("cancelled before the continuation is published: publishing fails, the caller ends at once")
    func cancelledFirst() async {
        let ticket = SubmissionTicket.make()
        guard case .beforePublished = ticket.cancel() else {
            Issue.record("nothing was published yet")
            return
        }
        let published = await withUnsafeContinuation { (outer: UnsafeContinuation<Bool, Never>) in
            Task {
                _ = try? await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<ByteBuffer, any Error>) in
                    let published = ticket.publish(continuation)
                    if !published { continuation.resume(throwing: Cancelled()) }
                    outer.resume(returning: published)
                }
            }
        }
        #expect(!published)
        #expect(!ticket.take() && !ticket.takeDirectly(), "the loop never sends it")
    }

    @Test("cancelled while waiting for the hop: the canceller owns the continuation, and the loop skips the request")
    func cancelledWaiting() async {
        let ticket = SubmissionTicket.make()
        let result: Result<ByteBuffer, any Error> = await withUnsafeContinuation { outer in
            Task {
                do {
                    let body = try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<ByteBuffer, any Error>) in
                        #expect(ticket.publish(continuation))
                        guard case .waitingForHop(let owned) = ticket.cancel() else {
                            Issue.record("the request was waiting for its hop")
                            continuation.resume(throwing: Cancelled())
                            return
                        }
                        owned.resume(throwing: Cancelled())
                    }
                    outer.resume(returning: .success(body))
                } catch {
                    outer.resume(returning: .failure(error))
                }
            }
        }
        #expect(throws: Cancelled.self) { try result.get() }
        #expect(!ticket.take(), "the loop skips it: its caller was answered")
    }

    @Test("taken by the loop first: a cancellation goes to the loop; a caller already on the loop takes it directly")
    func takenFirst() async {
        let ticket = SubmissionTicket.make()
        let body = await withUnsafeContinuation { (outer: UnsafeContinuation<String, Never>) in
            Task {
                let body = try? await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<ByteBuffer, any Error>) in
                    #expect(ticket.publish(continuation))
                    #expect(ticket.take())
                    guard case .onTheLoop = ticket.cancel() else {
                        Issue.record("the loop has it")
                        continuation.resume(throwing: Cancelled())
                        return
                    }
                    continuation.resume(returning: ByteBuffer(string: "answered by the loop"))
                }
                outer.resume(returning: body.map { String(buffer: $0) } ?? "")
            }
        }
        #expect(body == "answered by the loop")
        let direct = SubmissionTicket.make()
        #expect(direct.takeDirectly())
        guard case .onTheLoop = direct.cancel() else {
            Issue.record("a request taken directly is cancelled on the loop")
            return
        }
    }
}
