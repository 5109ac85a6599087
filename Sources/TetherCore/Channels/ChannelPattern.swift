/// A set of channel names: one name, or every name that starts with a prefix (`room.*`), or
/// every channel (`*`). What a gateway's channel options and a client's credentials name.
///
/// ```swift
/// let rooms = try ChannelPattern("room.*")
/// rooms.matches("room.lobby")   // true
/// rooms.matches("news")         // false
/// ```
public struct ChannelPattern: Sendable, Hashable, CustomStringConvertible {
    /// The name, or the prefix before the final `*`.
    private let stem: Substring
    private let isPrefix: Bool

    /// - Parameter pattern: A channel name, or a prefix followed by one `*` at the end; `*`
    ///   alone matches every channel.
    /// - Throws: ``ConfigurationError`` for an empty pattern, one longer than
    ///   ``Frame/maxChannelLength``, or a `*` anywhere but at the end.
    public init(_ pattern: String) throws(ConfigurationError) {
        guard Frame.isValidChannelName(pattern) else {
            throw ConfigurationError("a channel pattern must be 1 to \(Frame.maxChannelLength) bytes long, got \"\(pattern)\"")
        }
        let isPrefix = pattern.hasSuffix("*")
        let stem = isPrefix ? pattern.dropLast() : Substring(pattern)
        guard !stem.contains("*") else {
            throw ConfigurationError("a channel pattern may have one '*', at its end: \"\(pattern)\"")
        }
        self.stem = stem
        self.isPrefix = isPrefix
    }

    /// Every channel.
    public static let all = try! ChannelPattern("*")

    /// Whether `channel` is in the set.
    public func matches(_ channel: String) -> Bool {
        self.isPrefix ? channel.utf8.starts(with: self.stem.utf8) : channel.utf8.elementsEqual(self.stem.utf8)
    }

    public var description: String { self.isPrefix ? "\(self.stem)*" : String(self.stem) }
}
