import AsyncHTTPClient
import Foundation
import NIOCore
import Testing
import Tether
import TetherGateway
import TetherProcess
import TetherTestSupport

extension IntegrationTests {
    @Suite("A real Prometheus scrapes the gateway", .timeLimit(.minutes(2)))
    struct PrometheusTests {
        /// The dashboard operators import into Grafana.
        static let dashboard = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("dashboards/tether-gateway.json")

        struct QueryAnswer: Decodable {
            struct Data: Decodable {
                struct Sample: Decodable {
                    var metric: [String: String]
                    var value: [ValueOrTime]
                }
                var resultType: String
                var result: [Sample]
            }
            var status: String
            var data: Data?
            var error: String?
        }

        enum ValueOrTime: Decodable {
            case time(Double)
            case value(String)
            init(from decoder: any Decoder) throws {
                let container = try decoder.singleValueContainer()
                if let time = try? container.decode(Double.self) {
                    self = .time(time)
                } else {
                    self = .value(try container.decode(String.self))
                }
            }
        }

        /// Runs a PromQL instant query.
        static func query(_ prometheus: String, _ expression: String) async throws -> QueryAnswer {
            var components = URLComponents(string: prometheus + "/api/v1/query")!
            components.queryItems = [URLQueryItem(name: "query", value: expression)]
            let response = try await HTTPClient.shared.execute(
                HTTPClientRequest(url: components.url!.absoluteString),
                timeout: .seconds(10)
            )
            let body = try await response.body.collect(upTo: 1 << 20)
            return try JSONDecoder().decode(QueryAnswer.self, from: Data(buffer: body))
        }

        /// The single value of a query's answer, if it has one.
        static func value(_ answer: QueryAnswer) -> Double? {
            guard let sample = answer.data?.result.first, case .value(let text)? = sample.value.last else { return nil }
            return Double(text)
        }

        @Test(
            "Prometheus (Debian's) scrapes a gateway's /metrics: its request count is the client's; every query of the Grafana dashboard runs on it",
            .requires(.prometheus)
        )
        func scrape() async throws {
            try OutsideTool.prometheus.require()
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    configure: { $0.admin = .init(port: 0) },
                    metrics: .prometheus(),
                    routes: { gateway in gateway.handleInline("echo") { request, _ in request.body } }
                )
                let adminPort = try await gateway.adminAddress.port!
                let client = try harness.client([endpoint])
                for index in 0..<20 { _ = try await client.request("echo", body: ByteBuffer(string: "\(index)")) }

                let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-prometheus-\(UUID().uuidString)")
                try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
                let configuration = directory.appendingPathComponent("prometheus.yml")
                try """
                global:
                  scrape_interval: 1s
                scrape_configs:
                  - job_name: tether
                    static_configs:
                      - targets: ['127.0.0.1:\(adminPort)']
                """.write(to: configuration, atomically: true, encoding: .utf8)
                let port = try await freePort()
                let log = directory.appendingPathComponent("prometheus.log")
                let process = try SpawnedProgram(
                    [
                        OutsideTool.prometheusExecutable!, "--config.file=\(configuration.path)",
                        "--storage.tsdb.path=\(directory.appendingPathComponent("data").path)", "--web.listen-address=127.0.0.1:\(port)",
                    ],
                    output: .file(log.path)
                )
                harness.onExit {
                    process.send(SIGTERM)
                    process.waitUntilExit()
                    try? FileManager.default.removeItem(at: directory)
                }
                harness.describe { "prometheus log: " + ((try? String(contentsOf: log, encoding: .utf8))?.suffix(2000).description ?? "-") }
                let prometheus = "http://127.0.0.1:\(port)"

                // The scrape sees the 20 requests the client made.
                let requests = #"sum(tether_requests_total{method="echo",status="ok"})"#
                var seen: Double?
                let deadline = ContinuousClock.now + .seconds(60)
                while ContinuousClock.now < deadline {
                    if let answer = try? await Self.query(prometheus, requests), let value = Self.value(answer) {
                        seen = value
                        if value == 20 { break }
                    }
                    try await Task.sleep(for: .milliseconds(250))
                }
                #expect(seen == 20, "Prometheus saw \(String(describing: seen)) echo requests")
                #expect(Self.value(try await Self.query(prometheus, #"up{job="tether"}"#)) == 1)
                #expect(Self.value(try await Self.query(prometheus, #"sum(tether_connections_open)"#)) == 1)

                // Every query of the dashboard parses and runs (Grafana's $__rate_interval as 1m).
                let dashboard = try JSONSerialization.jsonObject(with: Data(contentsOf: Self.dashboard)) as! [String: Any]
                let panels = dashboard["panels"] as! [[String: Any]]
                var expressions: [String] = []
                for panel in panels {
                    for target in panel["targets"] as! [[String: Any]] { expressions.append(target["expr"] as! String) }
                }
                #expect(expressions.count >= 20)
                for expression in expressions {
                    let answer = try await Self.query(prometheus, expression.replacingOccurrences(of: "$__rate_interval", with: "1m"))
                    #expect(answer.status == "success", "\(expression): \(answer.error ?? "-")")
                }
                // And the metrics they name exist: no panel queries a name the gateway does not export.
                // (Closes and refusals are labelled by what happened: their series appear with the first.)
                let exported = try await AdminTests.get("http://127.0.0.1:\(adminPort)/metrics").body
                let appearWithTheFirst: Set = ["tether_connections_closed_total", "tether_limit_refusals_total"]
                for expression in expressions {
                    for name in Self.metricNames(in: expression) where !appearWithTheFirst.contains(name) {
                        #expect(
                            exported.contains("# TYPE \(name.replacingOccurrences(of: "_bucket", with: ""))"),
                            "\(name) is not exported"
                        )
                    }
                }
            }
        }

        /// The `tether_…` metric names an expression uses.
        static func metricNames(in expression: String) -> Set<String> {
            var names: Set<String> = []
            var rest = Substring(expression)
            while let range = rest.range(of: "tether_") {
                let name = rest[range.lowerBound...].prefix { $0.isLetter || $0.isNumber || $0 == "_" }
                names.insert(String(name))
                rest = rest[name.endIndex...]
            }
            return names
        }
    }
}
