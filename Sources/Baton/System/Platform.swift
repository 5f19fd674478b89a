// One chain of platform imports for the whole module. Darwin comes first: the Apple check
// (scripts/check-apple.sh) runs on Linux with a Darwin stub module that re-exports Glibc.
#if canImport(Darwin)
@_exported import Darwin
#elseif canImport(Glibc)
@_exported import Glibc
#elseif canImport(Musl)
@_exported import Musl
#else
#error("Baton supports Linux (Glibc, Musl) and Apple platforms only")
#endif
