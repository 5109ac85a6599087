import Foundation
import TetherProcess

/// Delays packets and reorders them, as `tc netem delay … ` with jitter would (this kernel has
/// no netem): iptables hands the packets to an NFQUEUE queue (``PacketFilter/queue(port:queue:)``)
/// and a small Python program holds each for a delay drawn around a mean, then lets it go.
/// Packets whose delays cross overtake each other: TCP sees them out of order and must put its
/// stream back together. The program uses the NetfilterQueue package (over the kernel's
/// `nfnetlink_queue`); it is written into the run's directory from ``script``.
///
/// ```swift
/// let rules = try filter.queue(port: gateway.port, queue: 1)
/// let delay = try await PacketDelay.start(queue: 1, mean: .milliseconds(80), jitter: .milliseconds(60), seed: 7, directory: run)
/// try await Task.sleep(for: .seconds(2))
/// try filter.remove(rules)
/// print(try await delay.stop())  // "delayed 412, reordered 97"
/// ```
public struct PacketDelay: Sendable {
    /// What the program printed as it stopped (`delayed N, reordered M`): the packets it held,
    /// and those let go after a later packet of their own connection (addresses and ports).
    struct Summary: Sendable, CustomStringConvertible {
        var delayed: Int
        var reordered: Int
        var description: String { "delayed \(self.delayed), reordered \(self.reordered)" }
    }

    private let program: SpawnedProgram
    private let log: String

    /// Why packets cannot be delayed here, or `nil` if they can: python3 and its NetfilterQueue
    /// package (which builds against libnetfilter-queue). Root and a namespace are the packet
    /// filter's to check.
    public static let unavailableReason: String? = {
        let probe = try? SpawnedProgram(["python3", "-c", "import netfilterqueue"], output: .discard).waitUntilExit()
        guard probe?.succeeded == true else {
            return "delaying packets needs python3 and NetfilterQueue "
                + "(apt-get install libnetfilter-queue-dev python3-dev gcc; python3 -m pip install NetfilterQueue; "
                + "or scripts/install-test-tools)"
        }
        return nil
    }()

    /// Starts holding the packets of queue `queue`, and returns once the program has bound the
    /// queue (Python takes about a tenth of a second to start; packets pass meanwhile).
    ///
    /// - Parameters:
    ///   - queue: the NFQUEUE queue's number, as in the rules.
    ///   - mean: a packet's delay is drawn from `mean - jitter` to `mean + jitter` (at least 0).
    ///   - seed: draws the delays.
    ///   - directory: where the program and its log are written (`packet-delay-QUEUE.log`).
    /// - Throws: If the program could not bind the queue within 10 s (its log's last lines say why).
    static func start(queue: Int, mean: Duration, jitter: Duration, seed: UInt64, directory: String) async throws -> PacketDelay {
        let script = "\(directory)/packet-delay.py"
        if !FileManager.default.fileExists(atPath: script) {
            try Self.script.write(toFile: script, atomically: true, encoding: .utf8)
        }
        let log = "\(directory)/packet-delay-\(queue).log"
        let before = FileManager.default.contents(atPath: log)?.count ?? 0  // earlier faults' lines
        let program = try SpawnedProgram(
            [
                "python3", script, "\(queue)", "\(Self.milliseconds(mean))", "\(Self.milliseconds(jitter))", "\(seed % (1 << 62))",
            ],
            output: .file(log, append: true)
        )
        let holder = PacketDelay(program: program, log: log)
        let deadline = ContinuousClock.now + .seconds(10)
        while true {
            let written = FileManager.default.contents(atPath: log)?.dropFirst(before) ?? Data()
            if String(decoding: written, as: UTF8.self).contains("bound \(queue)") { return holder }
            guard program.isRunning, ContinuousClock.now < deadline else {
                program.send(SIGKILL)
                _ = try? await program.exit()
                let lines = String(decoding: written, as: UTF8.self).split(separator: "\n").suffix(5)
                throw Shell.Failure(
                    command: program.arguments,
                    status: -1,
                    output: "did not bind its queue: " + lines.joined(separator: "\n")
                )
            }
            do {
                try await Task.sleep(for: .milliseconds(10))
            } catch {
                program.send(SIGKILL)  // cancelled: no program left holding a queue
                throw error
            }
        }
    }

    /// Lets every packet held go (at once), stops the program, and returns what it did; remove
    /// the queue's rules first, or the packets that arrive next wait for no one and pass.
    /// - Throws: If the program failed (its log's last lines say why).
    func stop() async throws -> Summary {
        self.program.send(SIGTERM)
        let termination = try await self.program.exit()
        let lines = ((try? String(contentsOfFile: self.log, encoding: .utf8)) ?? "").split(separator: "\n")
        guard termination.succeeded, let last = lines.last, last.hasPrefix("delayed ") else {
            throw Shell.Failure(command: self.program.arguments, status: -1, output: lines.suffix(5).joined(separator: "\n"))
        }
        let numbers = last.split(whereSeparator: { !$0.isNumber }).compactMap { Int($0) }
        guard numbers.count == 2 else {
            throw Shell.Failure(command: self.program.arguments, status: -1, output: String(last))
        }
        return Summary(delayed: numbers[0], reordered: numbers[1])
    }

    private static func milliseconds(_ duration: Duration) -> Int {
        Int(duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000)
    }

    /// The program: holds each packet of its queue for its drawn delay, in a heap by release
    /// time, and accepts it then; on SIGTERM accepts every packet it holds and prints its summary.
    static let script = #"""
        # Written by tether's nemesis (the delay-packets fault; Sources/TetherLab/PacketDelay.swift).
        # Holds each packet iptables hands to NFQUEUE queue QUEUE for a delay drawn from
        # MEAN-JITTER to MEAN+JITTER milliseconds, then lets it go: packets whose delays cross
        # overtake each other. Needs root and NetfilterQueue (pip install NetfilterQueue).
        # "reordered" counts packets let go after a later one of their own connection.
        # Usage: python3 packet-delay.py QUEUE MEAN_MS JITTER_MS SEED
        # SIGTERM lets every packet held go and prints "delayed N, reordered M".
        import heapq, random, select, signal, sys, time
        from netfilterqueue import NetfilterQueue, COPY_PACKET

        queue, mean, jitter = int(sys.argv[1]), float(sys.argv[2]) / 1000, float(sys.argv[3]) / 1000
        draw = random.Random(int(sys.argv[4]))
        held = []  # (release time, arrival number, flow, packet)
        latest = {}  # by flow (addresses and ports): the highest arrival number let go
        arrivals = released = reordered = 0
        stopping = False

        def flow(header):
            if header[0] >> 4 == 6:
                return header[8:40] + header[40:44]
            length = (header[0] & 0x0F) * 4
            return header[12:20] + header[length:length + 4]

        def arrived(packet):
            global arrivals
            delay = max(0.0, draw.uniform(mean - jitter, mean + jitter))
            heapq.heappush(held, (time.monotonic() + delay, arrivals, flow(packet.get_payload()), packet))
            arrivals += 1

        def release(until):
            global released, reordered
            while held and held[0][0] <= until:
                _, number, key, packet = heapq.heappop(held)
                packet.accept()
                released += 1
                # Overtaken by a later packet of its own connection: reordered, as TCP sees it.
                if number < latest.get(key, -1):
                    reordered += 1
                else:
                    latest[key] = number

        def stop(*_):
            global stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        nfqueue = NetfilterQueue()
        nfqueue.bind(queue, arrived, max_len=65536, mode=COPY_PACKET, range=64)  # the headers only
        print("bound", queue, flush=True)
        try:
            while not stopping:
                # Short enough that SIGTERM (select is retried after a handler) is seen soon.
                timeout = min(0.1, max(0.0, held[0][0] - time.monotonic())) if held else 0.1
                try:
                    readable, _, _ = select.select([nfqueue.get_fd()], [], [], timeout)
                except InterruptedError:
                    continue
                if readable:
                    nfqueue.run(block=False)
                release(time.monotonic())
        finally:
            release(float("inf"))
            nfqueue.unbind()
            print(f"delayed {released}, reordered {reordered}", flush=True)
        """#
}
