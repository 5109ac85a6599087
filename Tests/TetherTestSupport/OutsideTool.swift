import Foundation
import Synchronization
package import Testing
import TetherProcess

/// A program or package from outside the Swift build that some tests need: a peer or a proxy
/// not written here. (The lab's packet filter, which also needs root, says why it is unavailable itself.)
///
/// On a developer's machine a test whose tool is missing is skipped, with the command that
/// installs it; with `CI` set it runs and fails, so a CI machine that lacks a tool cannot pass
/// by skipping. `scripts/install-test-tools` installs them all (`.ci/run` calls it).
///
/// ```swift
/// @Test("…", .requires(.openssl))
/// func opensslInterop() async throws {
///     try OutsideTool.openssl.require()
///     …
/// }
/// ```
package enum OutsideTool: String, CaseIterable, Sendable {
    case openssl
    case python3
    /// Python's `websockets` package (pip).
    case pythonWebsockets = "python3 websockets"
    /// Squid, the HTTP proxy (its `basic_ncsa_auth` helper too).
    case squid
    /// nginx, as a reverse proxy with its default buffering.
    case nginx
    /// curl, a peer that reads the HTTP stream.
    case curl
    /// PostgreSQL's server (initdb, pg_ctl): the cluster tests start a private one.
    case postgresql
    /// Prometheus' server: it scrapes a gateway's `/metrics` and checks the dashboard's queries.
    case prometheus
    /// schemathesis (pip): fuzzes the server API against its OpenAPI document.
    case schemathesis
    /// Python's grpcio and grpcio-tools (pip): a gRPC peer not written here, its stubs
    /// generated from the repository's protos.
    case pythonGRPC = "python3 grpcio"

    /// The command that installs it on Debian or Ubuntu.
    package var installCommand: String {
        switch self {
        case .openssl: "apt-get install openssl"
        case .python3: "apt-get install python3"
        case .pythonWebsockets: "apt-get install python3 python3-pip; python3 -m pip install websockets"
        case .squid: "apt-get install squid"
        case .nginx: "apt-get install nginx"
        case .curl: "apt-get install curl"
        case .postgresql: "apt-get install postgresql"
        case .prometheus: "apt-get install prometheus"
        case .schemathesis: "apt-get install python3 python3-pip; python3 -m pip install schemathesis"
        case .pythonGRPC: "apt-get install python3 python3-pip; python3 -m pip install grpcio grpcio-tools"
        }
    }

    /// Why it cannot be used here, or `nil` if it can.
    package var unavailableReason: String? {
        if let known = Self.reasons.withLock({ $0[self] }) { return known }
        let reason = self.probe()  // outside the lock: a probe may ask for another tool
        Self.reasons.withLock { $0[self] = .some(reason) }
        return reason
    }

    /// Whether `CI` is set: then a missing tool fails the tests that need it instead of
    /// skipping them.
    package static var isCI: Bool {
        guard let value = ProcessInfo.processInfo.environment["CI"] else { return false }
        return !value.isEmpty && value != "0" && value.lowercased() != "false"
    }

    /// The message of a skip or a failure for this tool.
    package var missingMessage: String {
        "\(self.unavailableReason ?? "\(self.rawValue) is missing"); install it with `\(self.installCommand)`, "
            + "or every test tool with `scripts/install-test-tools`"
    }

    /// Throws, saying what is missing and how to install it, if the tool cannot be used; a test
    /// calls it first, so that under `CI` (where it is not skipped) it fails with that message.
    package func require() throws {
        guard self.unavailableReason != nil else { return }
        throw MissingTool(tool: self)
    }

    package struct MissingTool: Error, CustomStringConvertible {
        package var tool: OutsideTool
        package var description: String { "CI is set, and a tool this test needs is missing: " + self.tool.missingMessage }
    }

    /// Where squid is (Debian puts it in /usr/sbin, often not on a user's `PATH`).
    package static var squidExecutable: String? {
        ["/usr/sbin/squid", "/usr/local/sbin/squid", "/usr/bin/squid"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// Where nginx is (Debian puts it in /usr/sbin).
    package static var nginxExecutable: String? {
        ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// Where PostgreSQL's server programs are: Debian's `/usr/lib/postgresql/<version>/bin`, or
    /// `pg_ctl` on `PATH`.
    package static var postgresBinaries: String? {
        let debian = "/usr/lib/postgresql"
        let versions = (try? FileManager.default.contentsOfDirectory(atPath: debian)) ?? []
        for version in versions.sorted(by: { (Int($0) ?? 0) > (Int($1) ?? 0) }) {
            let bin = "\(debian)/\(version)/bin"
            if FileManager.default.isExecutableFile(atPath: "\(bin)/pg_ctl") { return bin }
        }
        for directory in (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":") {
            if FileManager.default.isExecutableFile(atPath: "\(directory)/pg_ctl") { return String(directory) }
        }
        return nil
    }

    /// Where Prometheus' server is (Debian: /usr/bin/prometheus).
    package static var prometheusExecutable: String? {
        ["/usr/bin/prometheus", "/usr/local/bin/prometheus"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// Squid's helper that checks Basic credentials against an htpasswd file.
    package static let squidBasicAuth = "/usr/lib/squid/basic_ncsa_auth"

    private static let reasons = Mutex<[OutsideTool: String?]>([:])

    private func probe() -> String? {
        switch self {
        case .openssl:
            return Self.run(["openssl", "version"]) ? nil : "openssl is not installed"
        case .python3:
            return Self.run(["python3", "-c", "pass"]) ? nil : "python3 is not installed"
        case .pythonWebsockets:
            if let reason = OutsideTool.python3.unavailableReason { return reason }
            return Self.run(["python3", "-c", "import websockets"]) ? nil : "the Python package websockets is not installed"
        case .squid:
            guard Self.squidExecutable != nil, FileManager.default.isExecutableFile(atPath: Self.squidBasicAuth) else {
                return "squid is not installed"
            }
            return nil
        case .nginx:
            return Self.nginxExecutable == nil ? "nginx is not installed" : nil
        case .curl:
            return Self.run(["curl", "--version"]) ? nil : "curl is not installed"
        case .postgresql:
            return Self.postgresBinaries == nil ? "PostgreSQL's server (initdb, pg_ctl) is not installed" : nil
        case .prometheus:
            return Self.prometheusExecutable == nil ? "Prometheus' server is not installed" : nil
        case .schemathesis:
            if let reason = OutsideTool.python3.unavailableReason { return reason }
            return Self.run(["python3", "-m", "schemathesis.cli", "--version"]) ? nil : "the Python package schemathesis is not installed"
        case .pythonGRPC:
            if let reason = OutsideTool.python3.unavailableReason { return reason }
            return Self.run(["python3", "-c", "import grpc, grpc_tools.protoc"])
                ? nil : "the Python packages grpcio and grpcio-tools are not installed"
        }
    }

    /// Whether `arguments` (looked up on `PATH`) runs and exits 0.
    private static func run(_ arguments: [String]) -> Bool {
        (try? SpawnedProgram(arguments, output: .discard).waitUntilExit().succeeded) ?? false
    }
}

extension Trait where Self == ConditionTrait {
    /// Skips the test, with the install command, when one of `tools` is missing, unless `CI`
    /// is set: in CI the test runs, and ``OutsideTool/require()`` fails it.
    package static func requires(_ tools: OutsideTool...) -> Self {
        let missing = tools.filter { $0.unavailableReason != nil }
        return .enabled(
            if: missing.isEmpty || OutsideTool.isCI,
            Comment(rawValue: "skipped: " + missing.map(\.missingMessage).joined(separator: "; "))
        )
    }
}
