import Baton
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// A failed system call of the simulator, thrown as `simulationFailed` (a code of the one list,
/// `BatonErrorCodes`, in Baton's `BatonError.swift`).
enum SimulatorError {
    static func system(_ call: String, _ number: Int32) -> BatonError {
        BatonError(.simulationFailed, "\(call) failed: \(String(cString: strerror(number))) (errno \(number))")
    }
}
