// One chain of platform imports for the whole module. Apple first: the Apple type-check
// (scripts/check-apple.sh) provides a `Darwin` module on Linux.
#if canImport(Darwin)
@_exported import Darwin
#elseif canImport(Glibc)
@_exported import Glibc
#elseif canImport(Musl)
@_exported import Musl
#else
#error("Baton supports Linux (Glibc, Musl) and Apple platforms only")
#endif
