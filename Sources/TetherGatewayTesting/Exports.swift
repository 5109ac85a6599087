// The gateway's side of the testing kit builds on the app's side: a test that imports
// TetherGatewayTesting has the manual clock and the fault proxy too.
@_exported public import TetherTesting
