"""The web export's end-to-end check of its stored form: the family's reference video
rendered with the weights the page decodes (exporters/web_storage.py) against the same video
in float32, on a fixed prompt and seed. It runs before any block is exported, so a setting
that misses its floor writes nothing. The blocks' compiled forms are checked apart, each
against PyTorch with the decoded weights (exporters/web.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from edge.blocks import Block
from edge.exporters.web_storage import WebStorage, stored_weights
from edge.exporters.weights_in_place import stored_video_check
from edge.family_model import FamilyModel

# the floor of each setting the web stores alike (a family's "4" carries its own, from its
# rule): it guards against a broken export; benchmarks/web_quantize.py measures the cost
PSNR_FLOOR_DB = {"fp32": 60.0, "fp16": 40.0, "8": 30.0}


def floor_of(storage: WebStorage) -> float:
    return storage.rule.psnr_floor_db if storage.rule is not None \
        else PSNR_FLOOR_DB[storage.setting]


def decode_in_place(components: dict[str, list[Block]], storage: WebStorage) -> None:
    """Overwrite the blocks' parameters with their decoded stored forms; a parameter two
    blocks share is written once (by the first block's form)."""
    written: set[int] = set()
    for blocks in components.values():
        for block in blocks:
            params = dict(block.module.named_parameters())
            with torch.no_grad():
                for t in stored_weights(block, storage):
                    p = params.get(t.name)
                    if p is not None and id(p) not in written:
                        p.copy_(torch.from_numpy(t.decoded))
                        written.add(id(p))


def end_to_end_check(model: FamilyModel, components: dict[str, list[Block]],
                     storage: WebStorage, seed: int = 0,
                     on_step: Callable[[int, int], None] | None = None) -> dict:
    """The manifest's `validation`: PSNR and SNR of the video with the decoded weights
    against float32; an ExportValidationError under the setting's floor. `on_step(done,
    total)`: the two generations' steps."""
    return stored_video_check(model, components, lambda c: decode_in_place(c, storage),
                              floor_of(storage), f"weights stored as {storage.setting}",
                              "decoded stored weights in float32 PyTorch", seed,
                              on_step=on_step)
