import Foundation
import TetherProcess

/// Drops packets on the loopback interface of the lab's network namespace with iptables, by
/// port: real loss that the kernel's TCP must recover from (there is no `tc netem` here); and
/// hands packets to a queue that ``PacketDelay`` holds them in (delay and reordering).
///
/// The rules live in chains of their own, `TETHER_LAB` jumped to from `INPUT` for `lo` (drops
/// and resets) and `TETHER_LAB_DELAY` from `OUTPUT` for `lo` (queues: a packet goes out before
/// it comes in, so it is delayed first and then dropped or not), so clearing the lab's rules
/// never touches anything else.
public struct PacketFilter: Sendable {
    /// The chain holding the lab's drops and resets.
    static let chain = "TETHER_LAB"
    /// The chain holding the lab's queues.
    static let delayChain = "TETHER_LAB_DELAY"

    /// Why packet loss cannot be injected here, or `nil` if it can: the lab needs root and iptables.
    public static func unavailableReason() -> String? {
        guard geteuid() == 0 else {
            return "dropping packets needs root (iptables in a network namespace); run `sudo tether lab run`"
        }
        guard Shell.which("iptables") != nil, Shell.which("ip") != nil else {
            return "dropping packets needs iptables and iproute2 (Debian: apt-get install iptables iproute2)"
        }
        // Root in a container may still lack CAP_NET_ADMIN: try it.
        let probe = "tether-lab-probe-\(getpid())"
        do {
            try Shell.run("ip", "netns", "add", probe)
            defer { _ = try? Shell.run("ip", "netns", "delete", probe) }
            try Shell.run("ip", "netns", "exec", probe, "iptables", "-w", "-L", "INPUT", "-n")
        } catch {
            return "cannot create a network namespace with iptables rules here (\(error)); the lab needs CAP_NET_ADMIN"
        }
        return nil
    }

    /// Creates the lab's chains in the current network namespace (the lab's own).
    public init() throws {
        for (chain, jump) in [(Self.chain, ["INPUT", "-i", "lo"]), (Self.delayChain, ["OUTPUT", "-o", "lo"])] {
            _ = try? Shell.run("iptables", "-w", "-N", chain)
            try Shell.run("iptables", "-w", "-F", chain)
            if (try? Shell.run(["iptables", "-w", "-C"] + jump + ["-j", chain])) == nil {
                try Shell.run(["iptables", "-w", "-I"] + jump + ["-j", chain])
            }
        }
    }

    /// Drops each TCP packet to or from `ports` with probability `probability` (1 drops all).
    public func drop(probability: Double, ports: [Int]) throws {
        precondition((0...1).contains(probability), "a probability is between 0 and 1")
        try self.clear()
        guard probability > 0 else { return }
        for port in ports { _ = try self.block(port: port, probability: probability) }
    }

    /// Drops TCP packets to and from `port` (on `address` only, if given) with probability
    /// `probability`, beside the rules already there; or, with `reset`, answers each with a TCP
    /// reset (a connection is refused at once, an open one cut at its next packet).
    /// - Returns: The rules added (each its chain and its match), for ``remove(_:)``.
    func block(port: Int, address: String? = nil, probability: Double = 1, reset: Bool = false) throws -> [[String]] {
        precondition(probability > 0 && probability <= 1, "a probability is in (0, 1]")
        let statistic =
            probability >= 1 ? [] : ["-m", "statistic", "--mode", "random", "--probability", String(format: "%.4f", probability)]
        // The reset REJECT sends comes back through these rules (it bears the port): it is let
        // through, as is any reset.
        let target = reset ? ["!", "--tcp-flags", "RST", "RST", "-j", "REJECT", "--reject-with", "tcp-reset"] : ["-j", "DROP"]
        // Towards the port (to the address), and back from it (from the address).
        let rules = [
            [Self.chain] + (address.map { ["-d", $0] } ?? []) + ["-p", "tcp", "--dport", "\(port)"] + statistic + target,
            [Self.chain] + (address.map { ["-s", $0] } ?? []) + ["-p", "tcp", "--sport", "\(port)"] + statistic + target,
        ]
        for rule in rules { try Shell.run(["iptables", "-w", "-A"] + rule) }
        return rules
    }

    /// Hands every TCP packet to and from `port` to NFQUEUE queue `queue`, where a
    /// ``PacketDelay`` holds it; while no process has the queue bound, packets pass
    /// (`--queue-bypass`).
    /// - Returns: The rules added, for ``remove(_:)``.
    func queue(port: Int, queue: Int) throws -> [[String]] {
        let target = ["-j", "NFQUEUE", "--queue-num", "\(queue)", "--queue-bypass"]
        let rules = [
            [Self.delayChain, "-p", "tcp", "--dport", "\(port)"] + target,
            [Self.delayChain, "-p", "tcp", "--sport", "\(port)"] + target,
        ]
        for rule in rules { try Shell.run(["iptables", "-w", "-A"] + rule) }
        return rules
    }

    /// Removes rules ``block(port:address:probability:reset:)`` or ``queue(port:queue:)`` added.
    func remove(_ rules: [[String]]) throws {
        for rule in rules { try Shell.run(["iptables", "-w", "-D"] + rule) }
    }

    /// Removes every lab rule: packets flow again.
    public func clear() throws {
        try Shell.run("iptables", "-w", "-F", Self.chain)
        try Shell.run("iptables", "-w", "-F", Self.delayChain)
    }
}

/// A network namespace made by the lab, with its loopback up; removed by ``remove()``.
public struct LabNamespace: Sendable {
    /// The namespace's name (`ip netns` lists it while the lab runs).
    public let name: String

    /// Creates `tether-lab-PID`.
    public init() throws {
        self.name = "tether-lab-\(getpid())"
        try Shell.run("ip", "netns", "add", self.name)
        do {
            try Shell.run("ip", "-n", self.name, "link", "set", "lo", "up")
        } catch {
            self.remove()
            throw error
        }
    }

    /// Runs `arguments` inside the namespace, sharing this process's standard output and
    /// error, and returns its exit status. SIGINT and SIGTERM sent to this process meanwhile
    /// go to the command (`ip netns exec` runs it in its own place, the same process), so that
    /// it can stop what it started before this process deletes the namespace.
    public func run(_ arguments: [String]) throws -> Int32 {
        let program = try SpawnedProgram(try Shell.resolved(["ip", "netns", "exec", self.name] + arguments))
        let forwarded = [SIGINT, SIGTERM]
        let sources = forwarded.map { number in
            signal(number, SIG_IGN)  // a source sees the signal only if its default action does not run first
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { program.send(number) }
            source.resume()
            return source
        }
        defer {
            for source in sources { source.cancel() }
            for number in forwarded { signal(number, SIG_DFL) }
        }
        return program.waitUntilExit().status
    }

    /// Deletes the namespace (and with it the lab's iptables rules).
    public func remove() {
        _ = try? Shell.run("ip", "netns", "delete", self.name)
    }
}

/// Runs external commands for the lab.
enum Shell {
    struct Failure: Error, CustomStringConvertible {
        var command: [String]
        var status: Int32
        var output: String
        var description: String { "`\(self.command.joined(separator: " "))` exited with \(self.status): \(self.output)" }
    }

    /// The full path of `program` on `PATH` (plus the sbin directories), if any.
    static func which(_ program: String) -> String? {
        let path = (ProcessInfo.processInfo.environment["PATH"] ?? "") + ":/usr/sbin:/sbin:/usr/bin:/bin"
        for directory in path.split(separator: ":") {
            let candidate = "\(directory)/\(program)"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return nil
    }

    @discardableResult
    static func run(_ arguments: String...) throws -> String {
        try Self.run(arguments)
    }

    /// Runs the command to completion; throws with its output if it fails.
    @discardableResult
    static func run(_ arguments: [String]) throws -> String {
        let completed = try SpawnedProgram.run(try Self.resolved(arguments))
        guard completed.termination.succeeded else {
            throw Failure(command: arguments, status: completed.termination.status, output: completed.output)
        }
        return completed.output
    }

    /// `arguments` with the program's path found by ``which(_:)``.
    static func resolved(_ arguments: [String]) throws -> [String] {
        guard let executable = Self.which(arguments[0]) else {
            throw Failure(command: arguments, status: 127, output: "\(arguments[0]) not found")
        }
        return [executable] + arguments.dropFirst()
    }
}
