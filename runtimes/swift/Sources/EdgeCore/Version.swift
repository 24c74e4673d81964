/// The runtime's version: edge's own (pyproject's, `edge.__version__`), the tag an app's
/// Package.swift depends on (`.package(url: ..., from: "0.1.0")`). The package format it reads
/// is `ManifestReader.formatVersion`. tests/test_swift_package.py holds both to the Python side's.
public enum EdgeVersion {
    public static let runtime = "0.1.0"
}
