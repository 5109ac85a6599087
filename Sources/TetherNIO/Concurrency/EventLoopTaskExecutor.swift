public import NIOCore

/// Runs Swift concurrency jobs on one SwiftNIO event loop.
///
/// A task that prefers this executor (`group.addTask(executorPreference:)`) runs on the same
/// thread as its channel's handlers. Resuming it after a channel read, or writing from it, then
/// costs no thread hop and no wake-up: the job is queued on the loop that is already running.
/// The price is the usual one for code on an event loop: it must not block.
///
/// ```swift
/// let executor = EventLoopTaskExecutor(channel.eventLoop)
/// group.addTask(executorPreference: executor) { await serve(channel) }
/// ```
public final class EventLoopTaskExecutor: TaskExecutor, Sendable {
    /// The loop the jobs run on.
    public let eventLoop: any EventLoop

    /// - Parameter eventLoop: The loop to run jobs on.
    public init(_ eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        self.eventLoop.execute {
            job.runSynchronously(on: self.asUnownedTaskExecutor())
        }
    }

    /// One executor per loop of `group`, to look up by a channel's loop.
    /// - Parameter group: The loops; their set must not change (true of NIO's groups).
    public static func perLoop(of group: any EventLoopGroup) -> EventLoopTaskExecutors {
        EventLoopTaskExecutors(group)
    }
}

/// The ``EventLoopTaskExecutor`` of each loop of a group.
public struct EventLoopTaskExecutors: Sendable {
    private let executors: [ObjectIdentifier: EventLoopTaskExecutor]

    init(_ group: any EventLoopGroup) {
        var executors: [ObjectIdentifier: EventLoopTaskExecutor] = [:]
        for loop in group.makeIterator() {
            executors[ObjectIdentifier(loop)] = EventLoopTaskExecutor(loop)
        }
        self.executors = executors
    }

    /// The executor of `eventLoop`: the group's own, or a new one for a loop of another group
    /// (an `EmbeddedEventLoop` in tests, say).
    public func executor(for eventLoop: any EventLoop) -> EventLoopTaskExecutor {
        self.executors[ObjectIdentifier(eventLoop)] ?? EventLoopTaskExecutor(eventLoop)
    }
}
