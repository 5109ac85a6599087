import Crypto

/// The API keys a call may carry, checked in constant time.
///
/// Each key is kept as its SHA-256, and a candidate is hashed and compared with every key's
/// digest, all 32 bytes of each, whatever matched: neither the time nor the length of a key
/// tells an attacker how close a guess was.
struct APIKeys: Sendable {
    private let digests: [[UInt8]]

    init(_ keys: [String]) {
        self.digests = keys.map { Array(SHA256.hash(data: Array($0.utf8))) }
    }

    /// Whether `candidate` is one of the keys.
    func contains(_ candidate: Substring) -> Bool {
        let digest = Array(SHA256.hash(data: Array(candidate.utf8)))
        var found: UInt8 = 0
        for key in self.digests {
            var difference: UInt8 = 0
            for index in 0..<32 { difference |= key[index] ^ digest[index] }
            found |= difference == 0 ? 1 : 0
        }
        return found == 1
    }

    /// The key an `Authorization` header carries (`Bearer KEY`), if it is one of the keys.
    func authorizes(_ header: String?) -> Bool {
        guard let header, header.count > 7, header.prefix(7).lowercased() == "bearer " else { return false }
        return self.contains(header.dropFirst(7))
    }
}
