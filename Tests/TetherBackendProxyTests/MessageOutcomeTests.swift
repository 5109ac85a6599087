import Testing
import TetherCore

@testable import TetherBackendProxy

@Suite("A message's outcome from the backend's HTTP status")
struct MessageOutcomeTests {
    func outcome(_ status: Int, ownStatus: Bool = false, explicit: UInt16? = nil) -> String {
        switch HTTPTransport.messageOutcome(status: status, ownStatus: ownStatus, explicit: explicit, message: "m") {
        case .processed: "processed"
        case .refused(let code, _): "refused \(code.rawValue)"
        case .retry: "retry"
        }
    }

    @Test("2xx processed; 4xx refused but 408 and 429; 5xx retried unless the backend set Tether-Status, numeric or not")
    func statuses() {
        #expect(self.outcome(200) == "processed" && self.outcome(204) == "processed")
        #expect(self.outcome(422) == "refused \(StatusCode.invalidRequest.rawValue)")
        #expect(self.outcome(408) == "retry" && self.outcome(429) == "retry" && self.outcome(503) == "retry")
        #expect(self.outcome(503, ownStatus: true, explicit: 1001) == "refused 1001")
        #expect(
            self.outcome(500, ownStatus: true) == "refused \(StatusCode.internalError.rawValue)",
            "a header that is not a number still refuses"
        )
    }
}
