// swift-tools-version: 6.2
import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

let package = Package(
    name: "Baton",
    platforms: [.macOS(.v15), .iOS(.v18)],
    products: [
        .library(name: "Baton", targets: ["Baton"]),
        .library(name: "BatonDatabase", targets: ["BatonDatabase"]),
        .library(name: "BatonSimulator", targets: ["BatonSimulator", "BatonLoopback"]),
        .executable(name: "baton", targets: ["BatonCLI"]),
        .executable(name: "baton-harness", targets: ["BatonHarness"]),
        .executable(name: "baton-extension-sample", targets: ["BatonExtensionSample"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
    ],
    targets: [
        .target(name: "CBatonShims"),
        // C helpers for Baton's own test and benchmark processes (not part of the library).
        .target(name: "CBatonHarness", dependencies: ["CBatonShims"]),
        .target(
            name: "Baton",
            dependencies: ["CBatonShims", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "BatonDatabase",
            dependencies: [
                "Baton",
                "CBatonShims",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ],
            swiftSettings: swiftSettings
        ),
        // The one process spawner of the command line, the simulator and the tests (not a product).
        .target(
            name: "BatonSpawn",
            dependencies: ["Baton", "CBatonHarness"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "BatonLoopback",
            dependencies: ["Baton", "BatonDatabase", "BatonSpawn", "CBatonShims", "CBatonHarness"],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "BatonExtensionSample",
            dependencies: [
                "Baton",
                "BatonDatabase",
                "BatonLoopback",
                "CBatonShims",
                "CBatonHarness",
                .product(name: "GRDB", package: "GRDB.swift"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "BatonSimulator",
            dependencies: ["Baton", "BatonDatabase", "BatonLoopback", "BatonSpawn", "CBatonShims"],
            swiftSettings: swiftSettings
        ),
        // What both executables' commands share: the root command's main, exit statuses,
        // option groups, output helpers.
        .target(
            name: "BatonCommandSupport",
            dependencies: [
                "Baton",
                "BatonDatabase",
                "BatonSimulator",
                "CBatonShims",
                "CBatonHarness",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // Test fixtures shared by the harness, the benchmarks and the tests: the hand-over
        // permit, the test database schema.
        .target(
            name: "BatonFixtures",
            dependencies: [
                "Baton",
                "CBatonShims",
                .product(name: "GRDB", package: "GRDB.swift"),
            ],
            swiftSettings: swiftSettings
        ),
        // The benchmark suites behind `baton bench`; their workers run in `baton-harness`.
        .target(
            name: "BatonBench",
            dependencies: [
                "Baton",
                "BatonCommandSupport",
                "BatonDatabase",
                "BatonFixtures",
                "BatonLoopback",
                "BatonSpawn",
                "CBatonShims",
                "CBatonHarness",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "BatonCLI",
            dependencies: [
                "Baton",
                "BatonBench",
                "BatonCommandSupport",
                "BatonDatabase",
                "BatonSimulator",
                "CBatonShims",
                "CBatonHarness",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ],
            swiftSettings: swiftSettings
        ),
        // `baton-harness`: the worker processes of Baton's own tests and benchmarks (not a
        // user command). It sits next to `baton` in the build directory.
        .executableTarget(
            name: "BatonHarness",
            dependencies: [
                "Baton",
                "BatonBench",
                "BatonCommandSupport",
                "BatonDatabase",
                "BatonFixtures",
                "BatonLoopback",
                "BatonSimulator",
                "BatonSpawn",
                "CBatonShims",
                "CBatonHarness",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "BatonTestSupport",
            dependencies: ["Baton", "BatonCommandSupport", "BatonSimulator", "BatonFixtures", "BatonSpawn", .product(name: "Logging", package: "swift-log")],
            path: "Tests/BatonTestSupport",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "BatonTests",
            dependencies: ["Baton", "BatonBench", "BatonCLI", "BatonHarness", "CBatonHarness", "BatonFixtures", "BatonLoopback", "BatonSimulator", "BatonSpawn", "BatonTestSupport", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "BatonDatabaseTests",
            dependencies: [
                "BatonTestSupport",
                "Baton",
                "BatonDatabase",
                "BatonFixtures",
                "BatonCLI",
                "BatonHarness",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
    ]
)
