"""Caption tokenisation with the `tokenizers` library, shared by the PyTorch pipeline and the
runtimes (no torch here). Captions are padded and truncated to a fixed length so every block
sees one shape."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


def load_tokenizer(tokenizer_json: str | Path, max_tokens: int) -> Tokenizer:
    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.enable_truncation(max_tokens)
    tok.enable_padding(length=max_tokens, pad_id=0, pad_token="[PAD]")
    return tok


class PromptTruncatedWarning(UserWarning):
    """A caption longer than the model reads; only its beginning is used."""


def tokenize(tok: Tokenizer, captions: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask), both int64 of shape (batch, max_tokens). A caption longer
    than max_tokens is truncated with a PromptTruncatedWarning naming what was dropped."""
    enc = tok.encode_batch(captions)
    for caption, e in zip(captions, enc, strict=True):
        if e.overflowing:
            kept = e.offsets[-2][1] if len(e.offsets) > 1 else 0  # last token before [SEP]
            warnings.warn(PromptTruncatedWarning(
                f"prompt {caption[:40]!r}... is longer than the {len(e.ids)} tokens the model "
                f"reads; the text after {caption[:kept][-20:]!r} is ignored"), stacklevel=2)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    return ids, mask
