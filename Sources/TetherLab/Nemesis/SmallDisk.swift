import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A small disk the nemesis mounts for a gateway's SQLite store, so that it can fill it or
/// turn it read-only: a full disk, or one the kernel stopped writing to, under the store must
/// make the gateway refuse work (and say it is not ready), never lose what it acknowledged.
///
/// An ext4 filesystem without a journal in an image file on a loop device (`mount -o
/// loop,errors=remount-ro`), where `mkfs.ext4` and loop devices are there; else a tmpfs, which
/// can be filled but not turned read-only (a tmpfs cannot be remounted read-only while the
/// store holds its files open for writing).
///
/// Mounting needs root; the nemesis mounts it only inside its own namespace (`ip netns exec`
/// gives the process a mount namespace of its own as well), so nothing is left mounted on the
/// machine if it dies (and the loop device, set to clear itself, goes with the mount).
struct SmallDisk: Sendable {
    /// Where the disk is mounted.
    let path: String
    /// The ext4 image, if the disk is one (else a tmpfs).
    let image: String?
    private var filler: String { "\(self.path)/.filler" }

    /// Mounts a disk of `megabytes` at `path` (created if needed).
    init(path: String, megabytes: Int) throws {
        self.path = path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        let image = "\(path).ext4"
        if Self.canBeExt4, (try? Shell.run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", image, "\(megabytes)M")) != nil,
            (try? Shell.run("mount", "-t", "ext4", "-o", "loop,errors=remount-ro", image, path)) != nil
        {
            self.image = image
        } else {
            try? FileManager.default.removeItem(atPath: image)
            self.image = nil
            try Shell.run("mount", "-t", "tmpfs", "-o", "size=\(megabytes)m", "tether-nemesis", path)
        }
    }

    /// Whether the disk can be ext4 on a loop device here: `mkfs.ext4` and `e2fsck`
    /// (e2fsprogs), loop devices, and ext4 in the kernel.
    static var canBeExt4: Bool {
        Shell.which("mkfs.ext4") != nil && Shell.which("e2fsck") != nil && FileManager.default.fileExists(atPath: "/dev/loop-control")
            && FileManager.default.fileExists(atPath: "/sys/fs/ext4")
    }

    /// Whether ``turnReadOnly()`` can be used: an ext4 disk whose kernel can be told of an
    /// error (`/sys/fs/ext4/DEVICE/trigger_fs_error`).
    var canTurnReadOnly: Bool {
        guard let trigger = self.errorTrigger else { return false }
        return access(trigger, W_OK) == 0
    }

    /// The sysfs file that makes the kernel take the filesystem for damaged.
    private var errorTrigger: String? {
        guard self.image != nil, let device = self.device else { return nil }
        return "/sys/fs/ext4/\((device as NSString).lastPathComponent)/trigger_fs_error"
    }

    /// The loop device the disk is mounted from (`/dev/loop3`), from this process's mounts.
    private var device: String? {
        guard let mounts = try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8) else { return nil }
        let resolved = (self.path as NSString).standardizingPath
        for line in mounts.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count > 2, fields[2] == "ext4" else { continue }
            let mountPoint = String(fields[1]).replacingOccurrences(of: "\\040", with: " ")
            if mountPoint == resolved || mountPoint == self.path { return String(fields[0]) }
        }
        return nil
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

    /// Writes out everything the filesystems hold in memory (`sync`), the disk's too: what an
    /// installed gateway's disk has long done by the time it fails. A store file created
    /// seconds before the disk turns read-only may lose its directory entry (SQLite flushes the
    /// file's data, not the directory that names it), and with it the whole store.
    func flush() {
        sync()
    }

    /// Frees what ``fill()`` took.
    func free() {
        unlink(self.filler)
    }

    /// Makes the kernel take the filesystem for damaged: with `errors=remount-ro` it stops
    /// writing to it at once (ext4's emergency read-only), files open or not, as after an I/O
    /// error. Only ``repair()`` (unmounted, checked, mounted again) makes it writable again.
    func turnReadOnly() throws {
        guard let trigger = self.errorTrigger else {
            throw Shell.Failure(command: ["trigger_fs_error"], status: 1, output: "the disk is not an ext4 filesystem on a loop device")
        }
        guard let handle = FileHandle(forWritingAtPath: trigger) else {
            throw Shell.Failure(command: ["open", trigger], status: errno, output: String(cString: strerror(errno)))
        }
        defer { try? handle.close() }
        try handle.write(contentsOf: Data("tether lab nemesis: read-only disk\n".utf8))
    }

    /// What an operator does after ``turnReadOnly()``, once nothing holds a file on the disk
    /// (the gateway stopped): unmounts it, checks it (`e2fsck -fy`), mounts it again.
    /// - Returns: What `e2fsck` fixed, if anything (its output).
    @discardableResult
    func repair() throws -> String? {
        guard let image = self.image else { return nil }
        try Shell.run("umount", self.path)
        var fixed: String?
        do {
            try Shell.run("e2fsck", "-f", "-y", image)
        } catch let failure as Shell.Failure where failure.status == 1 {
            fixed = failure.output  // 1: errors found and corrected
        }
        try Shell.run("mount", "-t", "ext4", "-o", "loop,errors=remount-ro", image, self.path)
        return fixed
    }

    /// Unmounts the disk (a tmpfs's files go with it; an image stays, with the store in it).
    func unmount() {
        _ = try? Shell.run("umount", "-l", self.path)
    }
}
