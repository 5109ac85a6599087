// What a server needs of the lower layers comes with `import TetherGateway`, and nothing
// more: the protocol's machinery stays in TetherCore.
@_exported import struct TetherCore.ConfigurationError
@_exported import struct TetherCore.Endpoint
@_exported import struct TetherCore.EndpointParseError
@_exported import enum TetherCore.Framing
@_exported import struct TetherCore.StatusCode
@_exported import enum TetherNIO.PEMSource
@_exported import enum TetherNIO.WebSocketBinding
