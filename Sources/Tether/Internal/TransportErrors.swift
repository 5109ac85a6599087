import NIOCore
import NIOPosix

#if canImport(Darwin)
    import Darwin
#elseif canImport(Glibc)
    import Glibc
#endif

/// Short descriptions of the errors transports throw, for messages people read.
enum TransportErrors {
    /// `connection refused`, `timed out after 5 s`, `cannot resolve gw.example.com`, …
    static func describe(_ error: any Error) -> String {
        switch error {
        case let error as TetherError:
            return error.message
        case let error as NIOConnectionError:
            if let failure = error.connectionErrors.last {
                return Self.describe(failure.error)
            }
            if error.dnsAError != nil || error.dnsAAAAError != nil {
                return "cannot resolve \(error.host)"
            }
            return "\(error)"
        case let error as IOError:
            return Self.describe(errno: error.errnoCode)
        case ChannelError.connectTimeout(let timeout):
            return "timed out after \(Duration(timeout).shortDescription)"
        default:
            return "\(error)"
        }
    }

    private static func describe(errno: CInt) -> String {
        #if canImport(Darwin) || canImport(Glibc)
            if let text = strerror(errno) {
                return String(cString: text).lowercased()
            }
        #endif
        return "error \(errno)"
    }
}
