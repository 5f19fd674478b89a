import Baton
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

extension BatonError.Code {
    /// The simulator could not do what it was asked (a child would not start, a socket failed).
    public static let simulationFailed = BatonError.Code("simulationFailed")
}

enum SimulatorError {
    static func system(_ call: String, _ number: Int32) -> BatonError {
        BatonError(.simulationFailed, "\(call) failed: \(String(cString: strerror(number))) (errno \(number))")
    }
}
