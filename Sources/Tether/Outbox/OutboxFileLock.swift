#if canImport(Darwin)
    import Darwin
#elseif canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// An exclusive advisory lock on `PATH.lock`, held while an outbox file is open, so that two
/// clients (in one process or in two) never send from the same outbox. The operating system
/// releases it when the process ends, however it ends.
final class OutboxFileLock: Sendable {
    private let descriptor: Int32

    /// Takes the lock, or fails at once if another client holds it.
    init(path: String) throws {
        let lockPath = path + ".lock"
        let descriptor = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            throw OutboxStoreError(message: "cannot create the lock file \(lockPath): \(String(cString: strerror(errno)))")
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let reason = errno
            close(descriptor)
            if reason == EWOULDBLOCK {
                throw OutboxStoreError(
                    message: "the outbox \(path) is in use by another client; one client (and one process) per outbox file"
                )
            }
            throw OutboxStoreError(message: "cannot lock \(lockPath): \(String(cString: strerror(reason)))")
        }
        self.descriptor = descriptor
    }

    deinit {
        close(self.descriptor)  // releases the lock
    }
}
