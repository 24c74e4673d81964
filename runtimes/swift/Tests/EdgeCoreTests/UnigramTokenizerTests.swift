import Foundation
import XCTest
@testable import EdgeCore

/// The Unigram caption tokenizer and the prompt cleaner against what the Python runtime
/// computes (tests/swift_unigram_fixtures.py writes tests/fixtures/swift/unigram/).
final class UnigramTokenizerTests: XCTestCase {
    static let folder = "swift/unigram"

    func testIdsAndMasksMatchPython() throws {
        let f = try Fixtures.object("\(Self.folder)/tokens.json")
        let captions = try XCTUnwrap(f["captions"] as? [String])
        let cleaned = try XCTUnwrap(f["cleaned"] as? [String: [String]])
        let tokenizers = try XCTUnwrap(f["tokenizers"] as? [[String: Any]])
        XCTAssertEqual(tokenizers.count, 4)
        var compared = 0
        for entry in tokenizers {
            let file = try XCTUnwrap(entry["file"] as? String)
            for run in try XCTUnwrap(entry["runs"] as? [[String: Any]]) {
                let clean = try XCTUnwrap(run["clean"] as? String)
                let maxTokens = try XCTUnwrap(run["max_tokens"] as? Int)
                let tok = try loadCaptionTokenizer(
                    contentsOf: Fixtures.url("\(Self.folder)/\(file)"), maxTokens: maxTokens,
                    padToken: entry["pad_token"] as? String)
                XCTAssertTrue(tok is UnigramTokenizer, file)
                XCTAssertEqual(tok.maxTokens, maxTokens)
                let cleaner = try PromptCleaner(kind: clean)
                let ids = try XCTUnwrap(run["input_ids"] as? [[Int]])
                let masks = try XCTUnwrap(run["attention_mask"] as? [[Int]])
                XCTAssertEqual(ids.count, captions.count)
                for (i, caption) in captions.enumerated() {
                    let text = cleaner.clean(caption)
                    if let want = cleaned[clean]?[i] {
                        XCTAssertEqual(text, want, "clean \(clean) of \(caption.debugDescription)")
                    }
                    let (gotIds, gotMask) = tok.encode(text)
                    XCTAssertEqual(gotIds.map(Int.init), ids[i],
                                   "\(file) \(clean) \(maxTokens): \(text.debugDescription)")
                    XCTAssertEqual(gotMask.map(Int.init), masks[i],
                                   "\(file) \(clean) \(maxTokens): \(text.debugDescription)")
                    compared += 1
                }
            }
        }
        XCTAssertEqual(compared, 8 * captions.count)
    }

    func testTruncationKeepsTheEndToken() throws {
        let tok = try UnigramTokenizer(
            contentsOf: Fixtures.url("\(Self.folder)/wan_tiny_tokenizer.json"),
            maxTokens: 6, padToken: "<pad>")
        let long = tok.encode("a red cat and a blue dog moving left")
        XCTAssertEqual(long.ids.count, 6)
        XCTAssertEqual(long.ids.last, 1)  // </s>
        XCTAssertEqual(long.mask, [1, 1, 1, 1, 1, 1])
        let short = tok.encode("a cat")
        XCTAssertEqual(Array(short.ids.suffix(3)), [0, 0, 0])
        XCTAssertEqual(short.mask, [1, 1, 1, 0, 0, 0])
        XCTAssertEqual(tok.encode("").ids, [1, 0, 0, 0, 0, 0])
    }

    func testPromptCleanerMatchesPython() throws {
        let f = try Fixtures.object("\(Self.folder)/tokens.json")
        let cases = try XCTUnwrap(f["clean_cases"] as? [[String: String]])
        XCTAssertGreaterThan(cases.count, 20)
        for c in cases {
            let text = try XCTUnwrap(c["text"])
            for kind in ["wan", "none"] {
                let got = try cleanPrompt(text, kind: kind)
                // compare code points: String's == is canonical equivalence
                XCTAssertEqual(Array(got.unicodeScalars),
                               Array(try XCTUnwrap(c[kind]).unicodeScalars),
                               "\(kind): \(text.debugDescription) -> \(got.debugDescription)")
            }
        }
        XCTAssertEqual(PromptCleaner.wan.clean("&amp;lt;&#x41;&notit;\u{3000}x\n\n"), "<A¬it; x")
    }

    /// The ids a tokenizer.json can give, as tokenizers' get_vocab_size(with_added_tokens=True):
    /// a WordPiece map by its highest id, a Unigram list by its length, added tokens past both.
    func testVocabularySizeCountsTheModelAndAddedTokens() throws {
        func size(_ json: String) throws -> Int {
            try vocabularySize(ofTokenizerJSON: Data(json.utf8))
        }
        XCTAssertEqual(try size(#"{"model": {"type": "WordPiece", "vocab": {"a": 0, "b": 7}}}"#), 8)
        XCTAssertEqual(try size(#"{"model": {"type": "Unigram", "vocab": [["a", 0.0], "# +
                                #"["b", -1.0]]}, "added_tokens": [{"id": 5}]}"#), 6)
        XCTAssertEqual(try size(#"{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}, "# +
                                #""added_tokens": [{"id": 0}]}"#), 1)
        XCTAssertThrowsError(try size(#"{"model": {"type": "BPE"}}"#))
        XCTAssertThrowsError(try size("[1]"))
    }

    func testLoaderPicksWordPieceForMiniLM() throws {
        let f = try Fixtures.object("swift/tokens.json")
        let tok = try loadCaptionTokenizer(contentsOf: Fixtures.url("swift/tokenizer.json"),
                                           maxTokens: f["max_tokens"] as! Int)
        XCTAssertTrue(tok is WordPieceTokenizer)
        let prompts = f["prompts"] as! [String], ids = f["input_ids"] as! [[Int]]
        for (i, prompt) in prompts.enumerated() {
            XCTAssertEqual(tok.encode(prompt).ids.map(Int.init), ids[i], prompt)
        }
    }

    // MARK: refusals

    /// The tiny Wan tokenizer.json with `edit` applied, loaded by `loadCaptionTokenizer`:
    /// the error's text.
    func loadError(padToken: String = "<pad>", maxTokens: Int = 16,
                   _ edit: (inout [String: Any]) -> Void) throws -> String {
        var json = try Fixtures.object("\(Self.folder)/wan_tiny_tokenizer.json")
        edit(&json)
        let url = FileManager.default.temporaryDirectory
            .appendingPathComponent("edge-unigram-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: json).write(to: url)
        defer { try? FileManager.default.removeItem(at: url) }
        do {
            _ = try loadCaptionTokenizer(contentsOf: url, maxTokens: maxTokens, padToken: padToken)
        } catch {
            return "\(error)"
        }
        XCTFail("loaded a tokenizer.json it should refuse")
        return ""
    }

    func assertRefused(_ words: [String], padToken: String = "<pad>", maxTokens: Int = 16,
                       file: StaticString = #filePath, line: UInt = #line,
                       _ edit: (inout [String: Any]) -> Void) throws {
        let message = try loadError(padToken: padToken, maxTokens: maxTokens, edit)
        for word in words {
            XCTAssertTrue(message.contains(word), "\(message) does not name \(word)", file: file,
                          line: line)
        }
    }

    func testRefusesOtherModels() throws {
        try assertRefused(["model.type", "BPE"]) { json in
            var model = json["model"] as! [String: Any]
            model["type"] = "BPE"
            json["model"] = model
        }
        try assertRefused(["model.unk_id"]) { json in
            var model = json["model"] as! [String: Any]
            model["unk_id"] = NSNull()
            json["model"] = model
        }
    }

    func testRefusesOtherNormalizers() throws {
        try assertRefused(["normalizer.type", "NFKD"]) { $0["normalizer"] = ["type": "NFKD"] }
        try assertRefused(["normalizer.normalizers[1].type", "Lowercase"]) {
            $0["normalizer"] = ["type": "Sequence", "normalizers": [
                ["type": "Strip", "strip_left": true, "strip_right": true], ["type": "Lowercase"]]]
        }
        try assertRefused(["normalizer.pattern.Regex", "[a-z]+"]) {
            $0["normalizer"] = ["type": "Replace", "pattern": ["Regex": "[a-z]+"], "content": "x"]
        }
        try assertRefused(["normalizer.pattern.Regex", "\\s+"]) {
            $0["normalizer"] = ["type": "Replace", "pattern": ["Regex": "\\s+"], "content": " "]
        }
        try assertRefused(["precompiled_charsmap"]) {
            $0["normalizer"] = ["type": "Precompiled", "precompiled_charsmap": "not base64!"]
        }
    }

    func testRefusesOtherPreTokenizersAndPostProcessors() throws {
        try assertRefused(["pre_tokenizer.type", "ByteLevel"]) {
            $0["pre_tokenizer"] = ["type": "ByteLevel"]
        }
        try assertRefused(["pre_tokenizer.pretokenizers[0].prepend_scheme", "first"]) {
            $0["pre_tokenizer"] = ["type": "Sequence", "pretokenizers": [
                ["type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                 "split": true]]]
        }
        try assertRefused(["post_processor.type", "BertProcessing"]) {
            $0["post_processor"] = ["type": "BertProcessing", "sep": ["</s>", 1],
                                    "cls": ["<pad>", 0]]
        }
    }

    func testRefusesAMissingPadTokenAndNoRoom() throws {
        try assertRefused(["no pad token", "[PAD]"], padToken: "[PAD]") { _ in }
        try assertRefused(["max_tokens 0"], maxTokens: 0) { _ in }
        // room for the end token alone, as in tokenizers
        let tok = try UnigramTokenizer(
            contentsOf: Fixtures.url("\(Self.folder)/wan_tiny_tokenizer.json"),
            maxTokens: 1, padToken: "<pad>")
        XCTAssertEqual(tok.encode("a red cat").ids, [1])
        XCTAssertThrowsError(try PromptCleaner(kind: "ftfy")) { error in
            XCTAssertTrue("\(error)".contains("clean ftfy"), "\(error)")
        }
    }

    func testParsesTheConvertersRegularExpressions() throws {
        for pattern in [" {2,}", "\\A +| +\\z", "\\A▁", "a{2}b?c*", "\\.+"] {
            XCTAssertNotNil(ReplacePattern.parse(pattern), pattern)
        }
        for pattern in ["", "a*", "\\A", "(a)", "a+?", "\\w", "a{,2}", "a|", "\\za"] {
            XCTAssertNil(ReplacePattern.parse(pattern), pattern)
        }
    }

    /// EDGE_TOKENIZER_CHECK=file written by `python tests/swift_fixtures.py --check-tokenizer
    /// tokenizer.json --out file`: thousands of captions through any tokenizer.json (a real
    /// Wan package's, say). Without the variable there is nothing to compare.
    func testWiderCheckFromTheEnvironment() throws {
        guard let path = ProcessInfo.processInfo.environment["EDGE_TOKENIZER_CHECK"] else { return }
        let f = try XCTUnwrap(try JSONSerialization.jsonObject(
            with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any])
        let captions = try XCTUnwrap(f["captions"] as? [String])
        let url = URL(fileURLWithPath: try XCTUnwrap(f["tokenizer"] as? String))
        var mismatches = 0, compared = 0
        for (i, want) in ((f["cleaned"] as? [String: [String]])?["wan"] ?? []).enumerated() {
            let got = PromptCleaner.wan.clean(captions[i])
            if Array(got.unicodeScalars) != Array(want.unicodeScalars) {
                mismatches += 1
                XCTFail("clean wan \(captions[i].debugDescription): \(got.debugDescription) " +
                        "vs \(want.debugDescription)")
            }
        }
        for run in try XCTUnwrap(f["runs"] as? [[String: Any]]) {
            let clean = try PromptCleaner(kind: run["clean"] as? String)
            var started = Date()
            let tok = try loadCaptionTokenizer(contentsOf: url,
                                               maxTokens: run["max_tokens"] as! Int,
                                               padToken: f["pad_token"] as? String)
            print(String(format: "EDGE_TOKENIZER_CHECK: loaded in %.2f s",
                         Date().timeIntervalSince(started)))
            started = Date()
            defer {
                print(String(format: "EDGE_TOKENIZER_CHECK: %d captions in %.2f s", captions.count,
                             Date().timeIntervalSince(started)))
            }
            let ids = run["input_ids"] as! [[Int]], masks = run["attention_mask"] as! [[Int]]
            for (i, caption) in captions.enumerated() {
                let (gotIds, gotMask) = tok.encode(clean.clean(caption))
                compared += 1
                if gotIds.map(Int.init) != ids[i] || gotMask.map(Int.init) != masks[i] {
                    mismatches += 1
                    if mismatches <= 10 {
                        XCTFail("\(clean) \(caption.debugDescription): \(gotIds) vs \(ids[i])")
                    }
                }
            }
        }
        print("EDGE_TOKENIZER_CHECK: \(compared) captions compared, \(mismatches) differ")
        XCTAssertEqual(mismatches, 0)
    }
}
