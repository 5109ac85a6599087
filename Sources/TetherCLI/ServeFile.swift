import ArgumentParser
import Foundation
import TetherCore
import TetherGateway
import Yams

/// `tether serve --config FILE`: the server API, the backend and channel rules in one YAML or
/// JSON file (JSON is YAML). Every key is checked: an unknown key or a bad value is an error
/// that names it, and nothing starts. The types decode as Swift synthesizes it; their coding
/// keys are also what ``knownKeys`` accepts.
///
/// ```yaml
/// api:
///   port: 8090
///   keys: [first-key-0123456789]     # and TETHER_API_KEYS
///   max_connections: 1024            # per listener (JSON, gRPC); more wait
///   idle_timeout_seconds: 60
/// backend:
///   url: http://127.0.0.1:5000
///   connect: true
///   requests: ["order.*"]
///   messages: ["chat.*"]
///   timeout_seconds: 5
///   max_calls: 256
///   message_batch: 1       # above 1: several messages per call (POST /tether/messages)
/// channels:
///   - pattern: "room.*"
///     history: 1000
///     history_age_seconds: 600
///     presence: true
///     storage: store
///     clients_publish: false
/// ```
///
/// What a command-line option also sets, the option decides.
struct ServeFile: Decodable, Equatable {
    struct API: Decodable, Equatable {
        var host: String?
        var port: Int?
        var grpcPort: Int?
        var keys: [String]?
        var maxBodyBytes: Int?
        var maxConnections: Int?
        var idleTimeoutSeconds: Double?

        enum CodingKeys: String, CodingKey, CaseIterable {
            case host, port, keys
            case grpcPort = "grpc_port"
            case maxBodyBytes = "max_body_bytes"
            case maxConnections = "max_connections"
            case idleTimeoutSeconds = "idle_timeout_seconds"
        }
    }

    struct Backend: Decodable, Equatable {
        var url: String
        var connect: Bool?
        var disconnect: Bool?
        var channels: [String]?
        var requests: [String]?
        var messages: [String]?
        var timeoutSeconds: Double?
        var maxCalls: Int?
        var messageBatch: Int?
        var caFile: String?
        var authorization: String?

        enum CodingKeys: String, CodingKey, CaseIterable {
            case url, connect, disconnect, channels, requests, messages, authorization
            case caFile = "ca_file"
            case timeoutSeconds = "timeout_seconds"
            case maxCalls = "max_calls"
            case messageBatch = "message_batch"
        }
    }

    struct ChannelRule: Decodable, Equatable {
        var pattern: String
        var history: Int?
        var historyAgeSeconds: Double?
        var presence: Bool?
        var storage: String?
        var clientsPublish: Bool?

        enum CodingKeys: String, CodingKey, CaseIterable {
            case pattern, history, presence, storage
            case historyAgeSeconds = "history_age_seconds"
            case clientsPublish = "clients_publish"
        }

        /// The rule, checked; `index` names it in errors.
        func rule(index: Int, storeKeepsChannels: Bool) throws -> GatewayConfiguration.Channels.Rule {
            let name = "channels[\(index)]"
            let pattern: ChannelPattern
            do {
                pattern = try ChannelPattern(self.pattern)
            } catch {
                throw ValidationError("\(name).pattern: \(error)")
            }
            let count = self.history ?? 1_000
            guard count >= 0 else { throw ValidationError("\(name).history must be 0 or more, got \(count)") }
            let age = self.historyAgeSeconds ?? 300
            guard age > 0, age <= 1e9 else {
                throw ValidationError("\(name).history_age_seconds must be positive and at most 1e9, got \(age)")
            }
            var retention: ChannelRetention?
            if count > 0 {
                do {
                    retention = try ChannelRetention(maxCount: count, maxAge: .nanoseconds(Int64(age * 1e9)))
                } catch {
                    throw ValidationError("\(name): \(error)")
                }
            }
            let storage: GatewayConfiguration.Channels.Storage
            switch self.storage ?? (storeKeepsChannels ? "store" : "memory") {
            case "store":
                guard storeKeepsChannels else {
                    throw ValidationError("\(name).storage store needs a --store file or --postgres: the in-memory store keeps no channels")
                }
                storage = .store
            case "memory":
                storage = .memory
            case let other:
                throw ValidationError("\(name).storage must be store or memory, got '\(other)'")
            }
            return .init(
                pattern: pattern,
                history: retention,
                storage: storage,
                presence: self.presence ?? true,
                clientsMayPublish: self.clientsPublish ?? false
            )
        }
    }

    var api: API?
    var backend: Backend?
    var channels: [ChannelRule]?

    enum CodingKeys: String, CodingKey, CaseIterable {
        case api, backend, channels
    }

    /// Reads and checks `path`.
    /// - Throws: `ValidationError` naming the file and the key of the first problem.
    static func load(_ path: String) throws -> ServeFile {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw ValidationError("--config: cannot read \(path)")
        }
        do {
            // A key no type declares would be ignored by decoding: refused first, by name.
            if let node = try Yams.compose(yaml: text), let unknown = Self.unknownKey(in: node) {
                throw ValidationError("--config \(path): \(unknown)")
            }
            return try YAMLDecoder().decode(ServeFile.self, from: text)
        } catch let error as ValidationError {
            throw error
        } catch let error as DecodingError {
            throw ValidationError("--config \(path): \(Self.describe(error))")
        } catch {
            throw ValidationError("--config \(path): \(error)")
        }
    }

    /// The keys each mapping of the file may have, by its place (`""` the top, `channels[]`
    /// each rule): the types' coding keys.
    private static let knownKeys: [String: [String]] = [
        "": CodingKeys.allCases.map(\.stringValue),
        "api": API.CodingKeys.allCases.map(\.stringValue),
        "backend": Backend.CodingKeys.allCases.map(\.stringValue),
        "channels[]": ChannelRule.CodingKeys.allCases.map(\.stringValue),
    ]

    /// The first key of `node` (at `place`, written `path` in errors) that its place does not
    /// know, as `key.path: unknown key (expected one of: …)`.
    private static func unknownKey(in node: Node, place: String = "", path: String = "") -> String? {
        if let mapping = node.mapping, let known = Self.knownKeys[place] {
            for (key, value) in mapping {
                let name = key.string ?? "\(key)"
                let keyPath = path.isEmpty ? name : "\(path).\(name)"
                guard known.contains(name) else {
                    return "\(keyPath): unknown key (expected one of: \(known.sorted().joined(separator: ", ")))"
                }
                if let unknown = Self.unknownKey(in: value, place: place.isEmpty ? name : "\(place).\(name)", path: keyPath) {
                    return unknown
                }
            }
        } else if let sequence = node.sequence {
            for (index, element) in sequence.enumerated() {
                if let unknown = Self.unknownKey(in: element, place: place + "[]", path: "\(path)[\(index)]") { return unknown }
            }
        }
        return nil
    }

    /// A decoding error as `key.path: what is wrong`.
    static func describe(_ error: DecodingError) -> String {
        func path(_ codingPath: [any CodingKey]) -> String {
            let text = codingPath.map { $0.intValue.map { "[\($0)]" } ?? ".\($0.stringValue)" }.joined()
            return text.hasPrefix(".") ? String(text.dropFirst()) : (text.isEmpty ? "(the top level)" : text)
        }
        switch error {
        case .keyNotFound(let key, let context):
            return "\(path(context.codingPath + [key])) is missing"
        case .typeMismatch(let type, let context):
            return "\(path(context.codingPath)) must be \(Self.name(of: type))"
        case .valueNotFound(let type, let context):
            return "\(path(context.codingPath)) must be \(Self.name(of: type)), not null"
        case .dataCorrupted(let context):
            return "\(path(context.codingPath)): \(context.debugDescription)"
        @unknown default:
            return "\(error)"
        }
    }

    private static func name(of type: Any.Type) -> String {
        switch type {
        case is String.Type: "a string"
        case is Int.Type: "an integer"
        case is Double.Type: "a number"
        case is Bool.Type: "true or false"
        case is [String].Type, is [Any].Type: "a list"
        default: "\(type)".contains("Dictionary") || "\(type)".contains("Keyed") ? "a mapping" : "\(type)"
        }
    }
}
