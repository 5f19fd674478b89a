// A stand-in for Apple's `Darwin` module, for type-checking Baton's Apple code on Linux.
// Never linked or run. It re-exports Glibc (the POSIX part both share), re-exports the Apple C
// declarations transcribed in ../include (each header names its source), adds the few
// declarations whose Swift form cannot come from a C header on Linux, and shadows Linux-only
// glibc names with unavailable declarations, so Apple-compiled code that calls them fails.
@_exported import Glibc
@_exported import CAppleSDK
import Dispatch

// MARK: - Apple declarations whose Swift form differs from what Linux would import

/// developer.apple.com/documentation/darwinnotify/notify_handler_t
/// (`typealias notify_handler_t = (Int32) -> Void`, a C block).
public typealias notify_handler_t = @convention(block) (Int32) -> Void

/// developer.apple.com/documentation/darwinnotify/notify_register_dispatch(_:_:_:_:)
/// (`dispatch_queue_t` imports as `DispatchQueue` on Apple platforms, not on Linux).
public func notify_register_dispatch(
    _ name: UnsafePointer<CChar>!,
    _ out_token: UnsafeMutablePointer<Int32>!,
    _ queue: DispatchQueue!,
    _ handler: notify_handler_t!
) -> UInt32 { fatalError("type-check stub") }

// Linux-only names are made unavailable in the C headers of ../include (unistd.h, fcntl.h,
// pthread.h, sys/inotify.h redeclare glibc's functions with `unavailable`; Linux-only headers
// such as <sys/epoll.h> are an #error). Swift-level shadows were tried first and do not work:
// when glibc's declaration is also reachable through Foundation or CBatonShims, overload
// resolution quietly prefers the available one.
//
// Not caught: Linux-only struct members (`stat.st_mtim`; Apple's is `st_mtimespec`).
