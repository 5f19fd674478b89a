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
        .executable(name: "baton-extension-sample", targets: ["BatonExtensionSample"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
    ],
    targets: [
        .target(name: "CBatonShims"),
        // C helpers for Baton's own test and benchmark processes (not part of the library).
        .target(name: "CBatonHarness"),
        .target(
            name: "Baton",
            dependencies: ["CBatonShims"],
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
        .executableTarget(
            name: "BatonCLI",
            dependencies: [
                "Baton",
                "BatonDatabase",
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
            dependencies: ["BatonSimulator", "BatonSpawn"],
            path: "Tests/BatonTestSupport",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "BatonTests",
            dependencies: ["Baton", "BatonCLI", "BatonLoopback", "BatonSimulator", "BatonTestSupport"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "BatonDatabaseTests",
            dependencies: [
                "BatonTestSupport",
                "Baton",
                "BatonDatabase",
                "BatonCLI",
                .product(name: "GRDB", package: "GRDB.swift"),
            ],
            swiftSettings: swiftSettings
        ),
    ]
)
