import Foundation
import TetherHistory
import TetherNIO

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Appends a process's history records to its file, one JSON line per record, each written
/// with one `write(2)` as it is made: a process killed with SIGKILL loses at most the record it
/// was writing, and one started again appends to the same file.
final class HistoryWriter: Sendable {
    let process: String
    private let descriptor: Int32
    private let lock = TetherLock(())

    /// - Throws: ``HistoryWorker/Failure`` if the file cannot be opened.
    init(path: String, process: String) throws {
        let descriptor = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            throw HistoryWorker.Failure(description: "cannot open \(path) for the history: \(String(cString: strerror(errno)))")
        }
        self.descriptor = descriptor
        self.process = process
    }

    deinit { close(self.descriptor) }

    /// The wall clock in milliseconds since 1970, as the records carry it.
    static func now() -> Int64 { Int64((Date().timeIntervalSince1970 * 1000).rounded(.down)) }

    /// Writes a record made now by this process.
    func record(
        _ kind: HistoryRecord.Kind,
        _ phase: HistoryRecord.Phase,
        id: String = "",
        client: String? = nil,
        peer: String? = nil,
        conversation: String? = nil,
        sequence: UInt64? = nil,
        channel: String? = nil,
        position: UInt64? = nil,
        end: UInt64? = nil,
        epoch: UInt64? = nil,
        detail: String? = nil
    ) {
        self.write(
            HistoryRecord(
                time: Self.now(),
                process: self.process,
                kind: kind,
                phase: phase,
                id: id,
                client: client,
                peer: peer,
                conversation: conversation,
                sequence: sequence,
                channel: channel,
                position: position,
                end: end,
                epoch: epoch,
                detail: detail
            )
        )
    }

    func write(_ record: HistoryRecord) {
        guard var line = try? JSONEncoder().encode(record) else { return }
        line.append(0x0A)
        self.lock.withLockedValue { _ in
            line.withUnsafeBytes { bytes in
                var offset = 0
                while offset < bytes.count {
                    let written = systemWrite(self.descriptor, bytes.baseAddress! + offset, bytes.count - offset)
                    if written < 0 {
                        if errno == EINTR { continue }
                        return
                    }
                    offset += written
                }
            }
        }
    }

    /// Every record of the history files in `directory` (`history-*.jsonl`), in file order; a
    /// line cut by a kill is skipped.
    static func read(directory: String) throws -> [HistoryRecord] {
        let names = try FileManager.default.contentsOfDirectory(atPath: directory)
            .filter { $0.hasPrefix("history-") && $0.hasSuffix(".jsonl") }.sorted()
        var records: [HistoryRecord] = []
        let decoder = JSONDecoder()
        for name in names {
            let data = try Data(contentsOf: URL(fileURLWithPath: "\(directory)/\(name)"))
            for line in data.split(separator: 0x0A) where !line.isEmpty {
                if let record = try? decoder.decode(HistoryRecord.self, from: Data(line)) { records.append(record) }
            }
        }
        return records
    }
}

/// `write(2)`, named apart from ``HistoryWriter/write(_:)``.
private func systemWrite(_ descriptor: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
    write(descriptor, bytes, count)
}
