import NIOCore
import NIOPosix
import TetherCore
import TetherNIO

#if canImport(Darwin)
    import Darwin
#elseif canImport(Glibc)
    import Glibc
#endif

/// Short descriptions of the errors transports throw, for messages people read.
enum TransportErrors {
    /// A failed connection attempt to `endpoint` as the ``TetherError`` the client reports:
    /// TLS and WebSocket failures keep codes of their own.
    static func connectFailure(_ error: any Error, endpoint: Endpoint) -> TetherError {
        switch error {
        case let error as TetherError:
            return error
        case let error as TransportError:
            let code: TetherError.Code
            switch error.code {
            case .tlsHandshakeFailed: code = .tlsFailed
            case .certificatePinMismatch: code = .certificatePinMismatch
            case .webSocketUpgradeFailed: code = .webSocketUpgradeFailed
            case .proxyFailed: code = .proxyFailed
            case .httpStreamFailed: code = .httpStreamFailed
            default: code = .notConnected
            }
            return TetherError(code: code, message: error.message, cause: error)
        case let error as ConfigurationError:
            return TetherError(code: .invalidConfiguration, message: error.message, cause: error)
        default:
            return TetherError(code: .notConnected, message: "could not connect to \(endpoint): \(Self.describe(error))", cause: error)
        }
    }

    /// `connection refused`, `timed out after 5 s`, `cannot resolve gw.example.com`, …
    static func describe(_ error: any Error) -> String {
        switch error {
        case let error as TetherError:
            return error.message
        case let error as TransportError:
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
