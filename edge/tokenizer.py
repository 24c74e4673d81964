"""Caption tokenisation with the `tokenizers` library, shared by the PyTorch pipeline and the
runtimes (no torch here). Captions are padded and truncated to a fixed length so every block
sees one shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


def load_tokenizer(tokenizer_json: str | Path, max_tokens: int) -> Tokenizer:
    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.enable_truncation(max_tokens)
    tok.enable_padding(length=max_tokens, pad_id=0, pad_token="[PAD]")
    return tok


def tokenize(tok: Tokenizer, captions: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask), both int64 of shape (batch, max_tokens)."""
    enc = tok.encode_batch(captions)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    return ids, mask
