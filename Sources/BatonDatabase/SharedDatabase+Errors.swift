#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Baton
import GRDB

extension SharedDatabase {
    /// Turns SQLite failures that callers must tell apart into typed ``BatonError``s; other
    /// errors (the closure's own, constraint violations...) pass through unchanged.
    func translate(_ error: any Error) -> any Error {
        if let error = error as? DatabaseError {
            switch error.resultCode {
            case .SQLITE_INTERRUPT where interruption.isSet, .SQLITE_ABORT where interruption.isSet:
                return BatonError(.suspended, "the operation on \(path) was interrupted because the process is being suspended; retry after resume()", cause: error)
            case .SQLITE_NOTADB:
                return BatonError(.notADatabase, "\(path) is not an SQLite database (its header is wrong): it is another kind of file or was overwritten. Move it away or restore it from a backup", cause: error)
            case .SQLITE_CORRUPT:
                return BatonError(.corrupt, "the SQLite database \(path) is corrupt: run `baton db check` on it, then restore it from a backup", cause: error)
            case .SQLITE_CANTOPEN:
                return BatonError(.notFound, "cannot open \(path): its directory is missing or not accessible", cause: error)
            case .SQLITE_READONLY:
                return BatonError(.notWritable, "\(path) is read-only for this process: check the file's and its directory's permissions", cause: error)
            case .SQLITE_BUSY:
                return BatonError(.busy, "\(path) stayed locked by another connection for the whole busy timeout; retry later", cause: error)
            default:
                return error
            }
        }
        if let error = error as? BatonError, error.code == .busy, let holder = error.cause as? HolderProcess, holder.kind == nil {
            // Name the holder's kind when it registered its presence.
            if let record = try? container.presence.list().first(where: { $0.pid == holder.pid }) {
                var named = error
                named.cause = HolderProcess(pid: holder.pid, kind: record.kind)
                named.message = error.message + " (process \(holder.pid) is a \"\(record.kind)\")"
                return named
            }
        }
        return error
    }
}
