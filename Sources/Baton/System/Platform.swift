// One chain of platform imports for the whole module.
#if canImport(Glibc)
@_exported import Glibc
#elseif canImport(Musl)
@_exported import Musl
#elseif canImport(Darwin)
@_exported import Darwin
#else
#error("Baton supports Linux (Glibc, Musl) and Apple platforms only")
#endif
