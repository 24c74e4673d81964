"""The files the Swift caption tokenizer is built and tested from are what their generators
write now: the HTML entity / whitespace tables (tests/swift_html_entities.py) and the Unigram
fixtures (tests/swift_unigram_fixtures.py). The XCTests themselves run in
tests/test_swift_runtime.py (`swift test`)."""

from __future__ import annotations

import json

import swift_html_entities
import swift_unigram_fixtures

from edge.core.tokenizer import load_tokenizer


def test_html_entity_tables_are_current():
    assert swift_html_entities.SWIFT_FILE.read_text() == swift_html_entities.render(), (
        "run python tests/swift_html_entities.py")


def test_unigram_fixtures_are_current():
    root = swift_unigram_fixtures.UNIGRAM.parent
    for name, data in swift_unigram_fixtures.build_unigram().items():
        on_disk = json.loads((root / name).read_text())
        assert on_disk == json.loads(json.dumps(data)), f"{name}: run tests/swift_fixtures.py"


def test_the_trained_tokenizer_is_umt5_like():
    """The committed sentencepiece-made tokenizer has what the real UMT5 one has: a Unigram
    model with byte pieces, the Precompiled (nmt_nfkc) normalizer, Metaspace, "$A </s>"."""
    path = swift_unigram_fixtures.TRAINED
    data = json.loads(path.read_text())
    assert data["model"]["type"] == "Unigram"
    pieces = {p for p, _ in data["model"]["vocab"]}
    assert {"<pad>", "</s>", "<unk>", "<0x00>", "<0xFF>", "▁"} <= pieces
    assert data["normalizer"]["type"] == "Precompiled"
    assert "Metaspace" in json.dumps(data["pre_tokenizer"])
    tok = load_tokenizer(path, 8, "<pad>")
    enc = tok.encode("Ｆｕｌｌｗｉｄｔｈ ﬁne")
    assert enc.tokens[-1] == "</s>" and "ｆ" not in "".join(enc.tokens)
