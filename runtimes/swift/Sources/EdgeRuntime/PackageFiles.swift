import EdgeCore
import Foundation
#if canImport(CryptoKit)
import CryptoKit
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What a file was when it was verified (size, modification time, inode, device); compared
/// again whenever a block is loaded, so a file changed on disk after verification is refused
/// (edge/core/package.py FileIdentity).
public struct FileIdentity: Equatable {
    public let size: Int
    public let modifiedSeconds: Int
    public let modifiedNanoseconds: Int
    public let inode: UInt64
    public let device: UInt64

    /// The identity of the file at `path`, or nil if it cannot be stat'ed.
    public static func of(_ path: String) -> FileIdentity? {
        var st = stat()
        guard stat(path, &st) == 0 else { return nil }
        #if canImport(Darwin)
        let (sec, nsec) = (Int(st.st_mtimespec.tv_sec), Int(st.st_mtimespec.tv_nsec))
        #else
        let (sec, nsec) = (Int(st.st_mtim.tv_sec), Int(st.st_mtim.tv_nsec))
        #endif
        return FileIdentity(size: Int(st.st_size), modifiedSeconds: sec, modifiedNanoseconds: nsec,
                            inode: UInt64(st.st_ino), device: UInt64(st.st_dev))
    }
}

/// Checks a package folder against its manifest before anything runs, as the Python runtime's
/// read_package does: no path leaves the folder, every listed file has the listed size and
/// sha256. A file the manifest does not list (a README someone added) is named in a notice
/// and neither checked nor used.
public enum PackageFiles {
    /// Files the operating system leaves in folders; never part of a package.
    static let noise: Set<String> = [".DS_Store", "Thumbs.db", "desktop.ini"]

    /// `root/relative`, refusing absolute paths, `..` and a path whose symbolic links lead
    /// out of `root` (where: the field naming it; folderKind: "package" or "bundle").
    public static func resolve(_ root: URL, _ relative: String, _ where: String,
                               folderKind: String = "package") throws -> URL {
        let parts = relative.split(separator: "/", omittingEmptySubsequences: false)
        let escapes = RuntimeError.package("\(`where`): file path \(relative) " +
                                           "escapes the \(folderKind) folder")
        if relative.isEmpty || relative.hasPrefix("/") || parts.contains("..")
            || relative.contains("\0") {
            throw escapes
        }
        let url = root.appendingPathComponent(relative)
        let real = url.resolvingSymlinksInPath().standardizedFileURL.path
        let top = root.resolvingSymlinksInPath().standardizedFileURL.path
        guard real == top || real.hasPrefix(top.hasSuffix("/") ? top : top + "/") else {
            throw escapes
        }
        return url
    }

    /// What `verify` found: each listed file's identity (by absolute path) at verification,
    /// for the loader's checks at later loads, and what the caller should tell the user.
    public struct Verified {
        public let identities: [String: FileIdentity]
        public let notices: [String]
    }

    /// Verify every listed file.
    public static func verify(_ manifest: Manifest, root: URL,
                              hashes: Bool = true) throws -> Verified {
        let records = manifest.allFiles
        let urls = try records.map { try resolve(root, $0.path, "manifest.json") }
        var notices: [String] = []
        let extra = unlisted(root, listed: Set(records.map(\.path)))
        if !extra.isEmpty {
            let shown = extra.prefix(5).joined(separator: ", ")
                + (extra.count > 5 ? " and \(extra.count - 5) more" : "")
            notices.append("\(root.path): files not listed in manifest.json: \(shown); they are " +
                           "not checked and not used")
        }
        var identities: [String: FileIdentity] = [:]
        for (file, url) in zip(records, urls) {
            guard let before = FileIdentity.of(url.path) else {
                throw RuntimeError.package("\(file.path): missing (listed in manifest.json)")
            }
            if before.size != file.bytes {
                throw RuntimeError.package("\(file.path): \(before.size) bytes, manifest.json " +
                                           "says \(file.bytes) (truncated or altered)")
            }
            if hashes {
                if try sha256Hex(of: url) != file.sha256 {
                    throw RuntimeError.package("\(file.path): sha256 differs from " +
                                               "manifest.json (altered or corrupt)")
                }
                if FileIdentity.of(url.path) != before {
                    throw RuntimeError.package("\(file.path): changed on disk " +
                                               "while it was being verified")
                }
            }
            identities[url.path] = before
        }
        return Verified(identities: identities, notices: notices)
    }

    /// Package-relative paths in the folder that the manifest does not list.
    static func unlisted(_ root: URL, listed: Set<String>) -> [String] {
        let base = root.standardizedFileURL.path
        guard let walker = FileManager.default.enumerator(atPath: base) else { return [] }
        var extra: [String] = []
        while let relative = walker.nextObject() as? String {
            let name = (relative as NSString).lastPathComponent
            var isFolder: ObjCBool = false
            let exists = FileManager.default.fileExists(atPath: base + "/" + relative,
                                                        isDirectory: &isFolder)
            if !exists || isFolder.boolValue || relative == "manifest.json" || noise.contains(name)
                || name.hasPrefix("._") {
                continue
            }
            if !listed.contains(relative) { extra.append(relative) }
        }
        return extra.sorted()
    }

    /// Refuse a file whose identity differs from when it was verified.
    public static func checkUnchanged(_ url: URL, _ expected: FileIdentity?,
                                      shownAs name: String) throws {
        guard let expected else { return }
        if FileIdentity.of(url.path) != expected {
            throw RuntimeError.package("\(name): changed on disk since the package " +
                                       "was verified (size, modification time or " +
                                       "inode differ); load the package again")
        }
    }

    /// Lowercase hex sha256 of a file, read in 8 MiB chunks (CryptoKit where it exists, else
    /// EdgeCore's StreamingSHA256: Foundation on Linux has no SHA-256).
    public static func sha256Hex(of url: URL) throws -> String {
        let handle = try FileHandle(forReadingFrom: url)
        defer { try? handle.close() }
        #if canImport(CryptoKit)
        var hasher = CryptoKit.SHA256()
        while let chunk = try handle.read(upToCount: 8 << 20), !chunk.isEmpty {
            hasher.update(data: chunk)
        }
        return hasher.finalize().map { String(format: "%02x", $0) }.joined()
        #else
        var hasher = StreamingSHA256()
        while let chunk = try handle.read(upToCount: 8 << 20), !chunk.isEmpty {
            hasher.update(chunk)
        }
        return hexString(hasher.finalize())
        #endif
    }

    /// Ask the OS to drop a file's pages from the page cache, so the next read comes from
    /// storage (Linux: posix_fadvise DONTNEED; a no-op elsewhere, where reads with F_NOCACHE
    /// are the backend's business). Returns whether the OS was asked.
    @discardableResult
    public static func dropFromPageCache(_ url: URL) -> Bool {
        #if os(Linux)
        let fd = open(url.path, O_RDONLY)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return posix_fadvise(fd, 0, 0, Int32(POSIX_FADV_DONTNEED)) == 0
        #else
        return false
        #endif
    }
}
