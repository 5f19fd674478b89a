#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A JSON decoding error in words, with where in the document it is (instead of Swift's
/// `DecodingError.dataCorrupted(Context(codingPath: [], debugDescription: ...))`).
package func describeDecodingError(_ error: any Error) -> String {
    guard let error = error as? DecodingError else { return "\(error)" }
    func location(_ context: DecodingError.Context) -> String {
        let path = context.codingPath.map { key in key.intValue.map { "[\($0)]" } ?? "." + key.stringValue }.joined()
        return path.isEmpty ? "" : " at \(path)"
    }
    switch error {
    case .dataCorrupted(let context):
        if context.codingPath.isEmpty {
            return "not valid JSON: check quotes, commas and brackets"
        }
        return "an invalid value\(location(context)): \(context.debugDescription)"
    case .keyNotFound(let key, let context):
        return "the key \"\(key.stringValue)\" is missing\(location(context))"
    case .typeMismatch(let type, let context):
        return "the wrong kind of value\(location(context)) (expected \(type))"
    case .valueNotFound(let type, let context):
        return "null\(location(context)) where \(type) is expected"
    @unknown default:
        return "the JSON could not be read"
    }
}
