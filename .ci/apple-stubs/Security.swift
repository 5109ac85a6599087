// A stand-in for the Security framework on Linux: only what
// Sources/TetherNIOTransports/Transport/NIOTSClientTransport.swift uses, declared as Apple's SDK
// declares it to Swift (SecTrust.h, SecCertificate.h, SecProtocolOptions.h). Core
// Foundation's toll-free bridged types stand as their Foundation classes. Type-checking
// against it catches Swift mistakes; it proves nothing about the real framework.
import Dispatch
import Foundation

public typealias CFData = NSData
public typealias CFArray = NSArray
public typealias CFError = NSError
public typealias CFAllocator = AnyObject
public typealias CFIndex = Int
public typealias OSStatus = Int32

public final class SecTrust {}
public final class SecCertificate {}
public final class sec_protocol_options_t { public init() {} }
public final class sec_protocol_metadata_t {}
public final class sec_trust_t {}

public enum tls_protocol_version_t {
    case TLSv12
    case TLSv13
}

public typealias sec_protocol_verify_complete_t = (Bool) -> Void
public typealias sec_protocol_verify_t = (sec_protocol_metadata_t, sec_trust_t, @escaping sec_protocol_verify_complete_t) -> Void

public func sec_protocol_options_add_tls_application_protocol(_ options: sec_protocol_options_t, _ applicationProtocol: UnsafePointer<CChar>) {}
public func sec_protocol_options_set_min_tls_protocol_version(_ options: sec_protocol_options_t, _ version: tls_protocol_version_t) {}
public func sec_protocol_options_set_tls_server_name(_ options: sec_protocol_options_t, _ serverName: UnsafePointer<CChar>) {}
public func sec_protocol_options_set_verify_block(
    _ options: sec_protocol_options_t,
    _ verifyBlock: @escaping sec_protocol_verify_t,
    _ verifyBlockQueue: DispatchQueue
) {}
public func sec_trust_copy_ref(_ trust: sec_trust_t) -> Unmanaged<SecTrust> { .passRetained(SecTrust()) }

public func SecTrustSetAnchorCertificates(_ trust: SecTrust, _ anchorCertificates: CFArray) -> OSStatus { 0 }
public func SecTrustSetAnchorCertificatesOnly(_ trust: SecTrust, _ anchorCertificatesOnly: Bool) -> OSStatus { 0 }
public func SecTrustEvaluateWithError(_ trust: SecTrust, _ error: UnsafeMutablePointer<CFError?>?) -> Bool { false }
public func SecTrustGetCertificateAtIndex(_ trust: SecTrust, _ index: CFIndex) -> SecCertificate? { nil }
public func SecCertificateCreateWithData(_ allocator: CFAllocator?, _ data: CFData) -> SecCertificate? { nil }
public func SecCertificateCopyData(_ certificate: SecCertificate) -> CFData { NSData() }
