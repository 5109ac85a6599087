import CLibFuzzer

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

// Runs the programs libFuzzer writes on the gateway's HTTP listener: see
// HTTPListenerProgram.swift (a link to the file the tests replay the corpus with).
let program = HTTPListenerProgram()

@_cdecl("LLVMFuzzerTestOneInput")
func fuzzHTTPListener(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start else { return 0 }
    if let failure = program.run(UnsafeBufferPointer(start: start, count: count)) { fatalError(failure) }
    return 0
}

// SwiftPM links this file's top-level code as the program's entry point; hand over to libFuzzer.
var argc = CommandLine.argc
var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
exit(LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzHTTPListener(data, size) })
