import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A small tmpfs the nemesis mounts for a gateway's SQLite store, so that it can fill it: a
/// full disk under the store, which must make the gateway refuse work (and say it is not
/// ready), never lose what it acknowledged.
///
/// Mounting needs root; the nemesis mounts it only inside its own namespace (`ip netns exec`
/// gives the process a mount namespace of its own as well), so nothing is left mounted on the
/// machine if it dies.
struct SmallDisk: Sendable {
    /// Where the tmpfs is mounted.
    let path: String
    private var filler: String { "\(self.path)/.filler" }

    /// Mounts a tmpfs of `megabytes` at `path` (created if needed).
    init(path: String, megabytes: Int) throws {
        self.path = path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        try Shell.run("mount", "-t", "tmpfs", "-o", "size=\(megabytes)m", "tether-nemesis", path)
    }

    /// Takes every free byte with a file of its own (`.filler`): the store's next write that
    /// needs space fails with "disk full".
    /// - Returns: The bytes taken.
    @discardableResult
    func fill() throws -> Int {
        let descriptor = open(self.filler, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        guard descriptor >= 0 else {
            throw Shell.Failure(command: ["open", self.filler], status: errno, output: String(cString: strerror(errno)))
        }
        defer { close(descriptor) }
        var taken = 0
        var information = statvfs()
        if statvfs(self.path, &information) == 0 {
            let free = Int(information.f_bavail) * Int(information.f_frsize)
            if free > 0, posix_fallocate(descriptor, 0, off_t(free)) == 0 { taken = free }
        }
        // What fallocate left (or all of it, where fallocate is not supported), a page at a time.
        let page = [UInt8](repeating: 0, count: 4096)
        while true {
            let written = page.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, off_t(taken)) }
            guard written > 0 else { break }
            taken += written
        }
        return taken
    }

    /// Frees what ``fill()`` took.
    func free() {
        unlink(self.filler)
    }

    /// Unmounts the tmpfs (its files go with it).
    func unmount() {
        _ = try? Shell.run("umount", "-l", self.path)
    }
}
