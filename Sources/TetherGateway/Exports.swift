// What a server needs of the lower layers comes with `import TetherGateway`, and nothing
// more: the protocol's machinery stays in TetherCore.
@_exported import struct TetherCore.ChannelPattern
@_exported import struct TetherCore.ChannelPosition
@_exported import struct TetherCore.ChannelRetention
@_exported import struct TetherCore.ConfigurationError
@_exported import struct TetherCore.ConversationSequence
@_exported import struct TetherCore.DedupState
@_exported import struct TetherCore.DeliveryReceipt
@_exported import struct TetherCore.Endpoint
@_exported import struct TetherCore.EndpointParseError
@_exported import struct TetherCore.EventLoopClock
@_exported import enum TetherCore.Framing
@_exported import struct TetherCore.NewDelivery
@_exported import struct TetherCore.OutboxID
@_exported import struct TetherCore.ProcessedMessage
@_exported import struct TetherCore.RecordedOutcome
@_exported import struct TetherCore.StatusCode
@_exported import struct TetherCore.StoreWrite
@_exported import struct TetherCore.StoredDelivery
@_exported import struct TetherCore.StreamUsage
@_exported import struct TetherCore.SystemClock
@_exported import protocol TetherCore.TetherClock
@_exported import struct TetherCore.TetherInstant
@_exported import let TetherCore.messageStoreOutcomeWindow
@_exported import enum TetherNIOTransports.PEMSource
@_exported import enum TetherNIOTransports.WebSocketBinding
