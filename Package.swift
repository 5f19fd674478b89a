// swift-tools-version: 6.1
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
        .library(name: "BatonSimulator", targets: ["BatonSimulator"]),
        .executable(name: "baton", targets: ["BatonCLI"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
    ],
    targets: [
        .target(name: "CBatonShims"),
        .target(
            name: "Baton",
            dependencies: ["CBatonShims"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "BatonSimulator",
            dependencies: ["Baton", "CBatonShims"],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "BatonCLI",
            dependencies: [
                "Baton",
                "BatonSimulator",
                "CBatonShims",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "BatonTests",
            dependencies: ["Baton", "BatonCLI", "BatonSimulator"],
            swiftSettings: swiftSettings
        ),
    ]
)
