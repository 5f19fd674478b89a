#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// The value of the environment variable `name`, if set.
package func environment(_ name: String) -> String? {
    getenv(name).map { String(cString: $0) }
}

/// Writes a line to standard output and flushes it (the tests read output line by line).
package func emit(_ line: String) {
    print(line)
    fflush(nil)
}

/// Standard error, written unbuffered, one line at a time.
package enum FileHandleOutput {
    package static func standardError(_ line: String) {
        var text = line + "\n"
        text.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
    }
}

/// Reads one line from standard input (blocking; worker processes only).
package func readStandardInputLine() -> String? {
    var bytes: [UInt8] = []
    var byte: UInt8 = 0
    while read(0, &byte, 1) == 1 {
        if byte == 10 { return String(decoding: bytes, as: UTF8.self) }
        bytes.append(byte)
    }
    return bytes.isEmpty ? nil : String(decoding: bytes, as: UTF8.self)
}

/// A number with two decimals.
package func fixed(_ value: Double) -> String {
    guard value.isFinite else { return "\(value)" }
    let scaled = (value * 100).rounded()
    let whole = Int(scaled / 100)
    let fraction = Int(abs(scaled).truncatingRemainder(dividingBy: 100))
    return "\(scaled < 0 && whole == 0 ? "-" : "")\(whole).\(fraction < 10 ? "0" : "")\(fraction)"
}

extension String {
    /// The text followed by spaces up to `width` characters (one space when already as wide).
    package func padding(_ width: Int) -> String { count >= width ? self + " " : self + String(repeating: " ", count: width - count) }

    package var trimmingTrailingNewlines: String {
        var text = self
        while text.last?.isNewline == true { text.removeLast() }
        return text
    }
}
