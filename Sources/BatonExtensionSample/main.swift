// A notification service extension reduced to what Baton needs, built the way the README
// recommends for the 24 MB limit: only `BatonDatabase` (no command-line parser, no other
// module of the app), Swift runtime linked statically and, on Linux, a non-PIE executable:
//
//     swift build -c release --static-swift-stdlib -Xlinker -no-pie --product baton-extension-sample
//
//     baton-extension-sample CONTAINER MESSAGE_ID [PORT]
//
// Gets the message (from the store, from the app, or by running the loopback core on PORT as
// the executor), claims it for display, prints `message ID route=R shown=B payload=P`, then
// `done AT_NS PEAK_KB MAXRSS_KB PRIVATE_DIRTY_KB LINKAGE` (see SampleMemory).
//
//     baton-extension-sample --raw-read CONTAINER MESSAGE_ID
//
// reads the row with plain GRDB instead (the benchmark's floor, in the same binary).
import Baton
import BatonDatabase
import BatonLoopback
import CBatonShims
import CBatonHarness
import GRDB
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

var arguments = Array(CommandLine.arguments.dropFirst())
let rawRead = arguments.first == "--raw-read"
if rawRead { arguments.removeFirst() }
guard arguments.count >= 2 else {
    standardError("usage: baton-extension-sample [--raw-read] CONTAINER MESSAGE_ID [PORT]")
    exit(2)
}
if getenv("BATON_DIE_WITH_PARENT") != nil { _ = baton_exit_with_parent() }
do {
    let id = arguments[1]
    if rawRead {
        var configuration = Configuration()
        configuration.readonly = true
        let queue = try DatabaseQueue(path: arguments[0] + "/" + Inbox.defaultFileName, configuration: configuration)
        let payload = try queue.read { db in
            try Data.fetchOne(db, sql: "SELECT payload FROM \(InboxMessage.databaseTableName) WHERE id = ?", arguments: [id])
        }
        guard let payload else { throw BatonError(.notFound, "no message \(id)") }
        print("message \(id) route=raw shown=false payload=\(String(decoding: payload, as: UTF8.self))")
    } else {
        let container = try SharedContainer(path: arguments[0])
        let inbox = try await Inbox.open(container: container)
        let source = arguments.count > 2 ? UInt16(arguments[2]).map { LoopbackMessageSource(port: $0) } : nil
        switch try await inbox.message(id: id, deadline: .after(.seconds(30)), source: source) {
        case .message(let message, let route):
            let shown = try await inbox.claimForDisplay(id: message.id)
            print("message \(message.id) route=\(route) shown=\(shown) payload=\(String(decoding: message.payload, as: UTF8.self))")
        case .timedOut:
            print("timedOut \(id)")
        }
    }
    let at = baton_monotonic_ns()
    print("done \(at) \(SampleMemory.report())")
    fflush(nil)
} catch {
    standardError("error: \(error)")
    exit(1)
}

func standardError(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
}
