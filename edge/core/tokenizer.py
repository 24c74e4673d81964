"""Caption tokenisation with the `tokenizers` library, shared by the PyTorch pipeline and the
runtimes (no torch here). Captions are padded and truncated to a fixed length so every block
sees one shape."""

from __future__ import annotations

import html
import re
import warnings
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from edge.core.files import EdgeNotice


def load_tokenizer(tokenizer_json: str | Path, max_tokens: int,
                   pad_token: str = "[PAD]") -> Tokenizer:
    tok = Tokenizer.from_file(str(tokenizer_json))
    pad_id = tok.token_to_id(pad_token)
    if pad_id is None:
        raise ValueError(f"{tokenizer_json}: no pad token {pad_token!r} in the vocabulary")
    tok.enable_truncation(max_tokens)
    tok.enable_padding(length=max_tokens, pad_id=pad_id, pad_token=pad_token)
    return tok


# How a package's prompts are cleaned before tokenizing (manifest `tokenizer.clean`)
CLEANERS = ("none", "wan")


def clean_prompt(text: str, kind: str) -> str:
    """"wan": WanPipeline's prompt_clean without ftfy (which diffusers uses only when it is
    installed): HTML entities unescaped twice, whitespace runs collapsed, ends stripped."""
    if kind == "wan":
        text = html.unescape(html.unescape(text)).strip()
        return re.sub(r"\s+", " ", text).strip()
    return text


class PromptTruncatedWarning(EdgeNotice):
    """A caption longer than the model reads; only its beginning is used (the command line
    prints it as a note)."""


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
