import Foundation
import TetherNIO

/// Samples a few processes' resident memory and open descriptors from `/proc` (Linux), for
/// what a fault must not do: grow a gateway's memory without bound, or leak descriptors.
final class ProcessSampler: Sendable {
    /// One process's figures.
    struct Figures: Codable, Sendable {
        /// The largest resident memory seen, in bytes.
        var peakResidentBytes: Int = 0
        /// Open descriptors in the first sample after the process started, and in the last.
        var firstDescriptors: Int?
        var lastDescriptors: Int?
    }

    private let figures = TetherLock<[String: Figures]>([:])

    /// Takes one sample of each process (`name` → its id now; `nil`: not running).
    func sample(_ processes: [(name: String, id: Int32?)]) {
        for (name, id) in processes {
            guard let id, let resident = Self.residentBytes(of: id) else { continue }
            let descriptors = Self.descriptors(of: id)
            self.figures.withLockedValue { figures in
                var current = figures[name, default: Figures()]
                current.peakResidentBytes = max(current.peakResidentBytes, resident)
                if current.firstDescriptors == nil { current.firstDescriptors = descriptors }
                current.lastDescriptors = descriptors ?? current.lastDescriptors
                figures[name] = current
            }
        }
    }

    var snapshot: [String: Figures] { self.figures.withLockedValue { $0 } }

    /// `VmRSS` of `/proc/PID/status`, in bytes.
    static func residentBytes(of id: Int32) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(id)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
            let kilobytes = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
        else { return nil }
        return kilobytes * 1024
    }

    /// The entries of `/proc/PID/fd`.
    static func descriptors(of id: Int32) -> Int? {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(id)/fd"))?.count
    }
}
