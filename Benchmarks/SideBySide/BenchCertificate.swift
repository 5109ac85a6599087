import Foundation

/// The self-signed certificate of the TLS peers, made with `openssl req` once per run and
/// shared with the server and driver processes through the environment.
enum BenchCertificate {
    static let certificateVariable = "TETHER_BENCH_TLS_CERT"
    static let keyVariable = "TETHER_BENCH_TLS_KEY"

    /// The certificate and key files, made now unless the environment names them.
    static func files() throws -> (certificate: String, key: String) {
        let environment = ProcessInfo.processInfo.environment
        if let certificate = environment[Self.certificateVariable], let key = environment[Self.keyVariable] {
            return (certificate, key)
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-bench-tls-\(getpid())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let (certificate, key) = ("\(directory)/cert.pem", "\(directory)/key.pem")
        let openssl = Process()
        openssl.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        openssl.arguments = [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-keyout", key, "-out", certificate, "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ]
        openssl.standardError = FileHandle.nullDevice
        try openssl.run()
        openssl.waitUntilExit()
        guard openssl.terminationStatus == 0 else { throw BenchError("openssl req failed: cannot make the TLS peers' certificate") }
        setenv(Self.certificateVariable, certificate, 1)
        setenv(Self.keyVariable, key, 1)
        return (certificate, key)
    }
}
