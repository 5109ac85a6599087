// The protocol's vocabulary (Endpoint, StatusCode, Backoff, Frame, …) is part of the client's
// API: `import Tether` is all an app needs.
@_exported import TetherCore
