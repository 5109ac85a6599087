// The fault proxy lives in a module of its own (the CLI's `tether proxy` and the lab use it,
// and no module named "Testing" ships in `tether`); tests that import TetherTesting keep it.
@_exported public import TetherFaultProxy
