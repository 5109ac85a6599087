// What an app needs of the lower layers comes with `import Tether`, and nothing more: the
// protocol's machinery stays in TetherCore (import it to implement the protocol yourself).
@_exported import struct TetherCore.Backoff
@_exported import struct TetherCore.ConfigurationError
@_exported import struct TetherCore.DeliveryCheckpoint
@_exported import enum TetherCore.DisconnectReason
@_exported import struct TetherCore.Endpoint
@_exported import struct TetherCore.EndpointParseError
@_exported import struct TetherCore.EventLoopClock
@_exported import enum TetherCore.HeartbeatMode
@_exported import enum TetherCore.MessageOutcome
@_exported import enum TetherCore.MessagePriority
@_exported import struct TetherCore.NATTimeoutProber
@_exported import struct TetherCore.NetworkPath
@_exported import struct TetherCore.OutboxRecord
@_exported import struct TetherCore.OutboxSnapshot
@_exported import struct TetherCore.ProtocolError
@_exported import struct TetherCore.RTTEstimator
@_exported import struct TetherCore.StatusCode
@_exported import struct TetherCore.SystemClock
@_exported import protocol TetherCore.TetherClock
@_exported import struct TetherCore.TetherInstant
@_exported import struct TetherNIO.CertificatePin
@_exported import struct TetherNIO.ClientTLSConfiguration
@_exported import protocol TetherNIO.ClientTransport
@_exported import enum TetherNIO.PEMSource
@_exported import struct TetherNIO.TCPClientTransport
@_exported import struct TetherNIO.TransportError
