"""What the tiny random-weight pipeline folders and the tests that edit them share: a tiny
T5 v1.1 encoder (CogVideoX, LTX-Video) and a folder copied with one JSON file changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def tiny_t5_encoder(vocab_size: int, layers: int = 2):
    """A T5 v1.1 encoder of width 32 (gated GELU, 8 relative position buckets)."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(
        vocab_size=vocab_size, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=layers,
        relative_attention_num_buckets=8, relative_attention_max_distance=16,
        feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1))


def edited_copy(source: Path, dest: Path, file: str, **fields) -> Path:
    """`source` copied to `dest` with `fields` set in its JSON file `file` (relative)."""
    shutil.copytree(source, dest)
    path = dest / file
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))
    return dest


def package_files(manifest: dict) -> dict[str, str]:
    """Every block file of a package's manifest, path -> sha256: two exports of the same
    model compared file for file."""
    return {f["path"]: f["sha256"] for c in manifest["components"] for b in c["blocks"]
            for f in b["files"]}
