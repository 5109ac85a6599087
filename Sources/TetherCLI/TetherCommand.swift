import ArgumentParser

@main
struct TetherCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tether",
        abstract: "A persistent connection between apps and their server, as simple as HTTP.",
        subcommands: [
            Serve.self, Call.self, Chat.self, History.self, Presence.self, Send.self, Receive.self, Demo.self, Lab.self, Proxy.self,
            Postgres.self,
        ]
    )
}
