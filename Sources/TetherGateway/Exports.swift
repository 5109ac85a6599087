// The protocol's vocabulary (Endpoint, StatusCode, Frame, …) is part of the gateway's API:
// `import TetherGateway` is all a server needs.
@_exported import TetherCore
