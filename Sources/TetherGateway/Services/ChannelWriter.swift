import Foundation
import NIOCore
import TetherCore
import TetherNIO

/// Appends publications to the channels whose history is in the gateway's store, with
/// **group commit**, and sends each to its subscribers once the store has it, in the order the
/// store appended them.
///
/// No task of its own, as ``StoreWriter``: the first publisher to find no round under way
/// leads one — it appends its publication and every one waiting in one call to
/// ``ChannelHistoryStore/appendPublications(_:)``, sends them (``Pusher/sendStored(_:)``),
/// answers the others, and hands the lead to the first publisher that arrived meanwhile. One
/// round at a time: a channel's offsets are sent in order.
///
/// ```swift
/// let (position, recipients) = try await writer.publish(append, through: pusher)
/// ```
final class ChannelWriter: Sendable {
    let store: any ChannelHistoryStore

    private enum Role: Sendable {
        case done(Result<(ChannelPosition, Int), GatewayError>)
        /// Lead a round; `promoted`: handed the lead by the last round, with publications waiting.
        case lead(promoted: Bool)
    }

    private struct Waiting: Sendable {
        var append: ChannelAppend
        var continuation: CheckedContinuation<Role, Never>
    }

    private struct State {
        var leading = false
        var waiting: [Waiting] = []
    }

    private let state = TetherLock(State())
    /// Whether a round sends its publications itself; not when the cluster sends every
    /// publication the store appended (``GatewayCluster/sendsChannelPublications``).
    private let sends: Bool

    init(store: any ChannelHistoryStore, sends: Bool = true) {
        self.store = store
        self.sends = sends
    }

    /// Appends `append` to its channel's stream, with whatever other publications arrive
    /// meanwhile, then sends it to the channel's subscribers on this node.
    /// - Returns: Its position, and the number of connections it was sent to.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/storage`` when the store
    ///   failed: the publication was not appended, nor sent.
    func publish(_ append: ChannelAppend, through pusher: Pusher) async throws(GatewayError) -> (ChannelPosition, Int) {
        let role = await withCheckedContinuation { (continuation: CheckedContinuation<Role, Never>) in
            let lead = self.state.withLockedValue { state -> Bool in
                guard !state.leading else {
                    state.waiting.append(Waiting(append: append, continuation: continuation))
                    return false
                }
                state.leading = true
                return true
            }
            if lead { continuation.resume(returning: .lead(promoted: false)) }
        }
        switch role {
        case .done(let result):
            return try result.get()
        case .lead(let promoted):
            return try await self.lead(with: append, promoted: promoted, pusher: pusher)
        }
    }

    /// A page of a channel's history read from the store (see ``ChannelHub/history(of:after:limit:)``
    /// for the one in memory): the publications after `after`, or (`nil`) the latest `limit`,
    /// none published before `notBefore`, at most ``ChannelHub/pageBytes`` of bodies.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/storage`` when the store failed.
    func history(of channel: String, after: ChannelPosition?, limit: Int, notBefore: Date) async throws(GatewayError) -> ChannelHistoryPage
    {
        do {
            let head = try await self.store.head(of: channel, notBefore: notBefore)
            let top = head.top
            let from = after ?? ChannelPosition(epoch: head.epoch, offset: top - min(top, UInt64(limit)))
            let (first, gap) = ChannelGap.resuming(from, epoch: head.epoch, top: top, available: head.oldest ?? top + 1)
            var page = ChannelHistoryPage(
                channel: channel,
                epoch: head.epoch,
                top: top,
                gap: after == nil ? nil : gap,  // the latest ones: nothing was asked before them
                more: false,
                publications: []
            )
            guard first <= top else { return page }
            let read = try await self.store.publications(
                of: channel,
                epoch: head.epoch,
                after: first - 1,
                limit: limit,
                notBefore: notBefore
            )
            let kept = (read ?? []).filter { $0.offset <= top }
            page.publications = ChannelHub.capped(kept) { $0.body.readableBytes }.0.map {
                ChannelPublication(
                    channel: channel,
                    position: ChannelPosition(epoch: head.epoch, offset: $0.offset),
                    publisher: $0.publisher,
                    body: $0.body
                )
            }
            page.more = (page.publications.last?.position.offset ?? top) < top
            return page
        } catch {
            throw GatewayError(code: .storage, message: "the channel store failed: \(error)")
        }
    }

    /// One round: this publication and every one waiting, in one call to the store.
    private func lead(with own: ChannelAppend, promoted: Bool, pusher: Pusher) async throws(GatewayError) -> (ChannelPosition, Int) {
        let others: [Waiting] =
            promoted
            ? self.state.withLockedValue { state in
                defer { state.waiting.removeAll() }
                return state.waiting
            } : []
        let appends = [own] + others.map(\.append)
        var results: [Result<(ChannelPosition, Int), GatewayError>]
        do {
            let positions = try await self.store.appendPublications(appends)
            guard positions.count == appends.count else {
                throw MessageStoreError(
                    code: .storage,
                    message: "the store answered \(positions.count) positions for \(appends.count) publications"
                )
            }
            let publications = zip(appends, positions).map { append, position in
                Frame.Publication(channel: append.channel, position: position, publisher: append.publisher, body: append.body)
            }
            let counts = self.sends ? pusher.sendStored(publications) : publications.map { _ in 0 }
            results = zip(positions, counts).map { .success(($0, $1)) }
        } catch {
            // Not "nothing was published": a commit that fails as the disk does may have reached
            // it, and a restarted gateway then has the publication (the nemesis saw one, its
            // publisher told "internal error", received by every subscriber after a repair).
            let failure = GatewayError(
                code: .storage,
                message: "the channel store failed; the publication may not have been kept: \(error)"
            )
            results = Array(repeating: .failure(failure), count: appends.count)
        }
        let next = self.state.withLockedValue { state -> Waiting? in
            guard !state.waiting.isEmpty else {
                state.leading = false
                return nil
            }
            return state.waiting.removeFirst()
        }
        for (waiting, result) in zip(others, results.dropFirst()) {
            waiting.continuation.resume(returning: .done(result))
        }
        next?.continuation.resume(returning: .lead(promoted: true))
        return try results[0].get()
    }
}
