"""`--quantize auto[:TARGET]` for the Core AI layout (`--min-ios 27`): each block's stored
form chosen by measurement, as for the Core ML layouts (exporters/iphone/coreml/recipe.py: each
block's forms rendered alone, the errors added, the recipe off the blocks' hulls), with two
differences:

- the forms are coreai-opt's linear ones, fp16, int8 per output channel and int4 with a
  scale per 32 inputs (its k-means does not store faithfully yet: coreai.stored_precision);
- a block's weights in each form are simulated in PyTorch as coreai-opt stores them
  (exporters/iphone/coreai/simulated.py, equal to its formula to the last bit) instead of converted:
  a conversion through Core AI costs minutes a block at real size, the simulation a
  torch.export of the block and some arithmetic. The bytes are counted from the same
  simulation: each tensor coreai-opt compresses at its form's bits (scales counted), every
  other at float16, as the program stores them.

Core AI's interpreter emulates float16 on Linux (about 100x float32), so the chosen recipe
is not generated through Core AI at export: every program is executed block by block as at
any setting, and the recipe is rendered whole with its simulated weights against fp32
(`recipe_check`), held to the prediction's floor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from edge.exporters.iphone.compression import STORAGES, Compression
from edge.exporters.iphone.coreai.package import HalfPrecision, Precision, stored_precision
from edge.exporters.iphone.coreai.simulated import quantized, weight_axes
from edge.exporters.iphone.coreml.recipe import VIDEOS, FormTrial, chosen_setting, write_parameters
from edge.exporters.shared.weights_in_place import stored_video_check
from edge.graph.blocks import Block
from edge.graph.family_model import FamilyModel
from edge.graph.token_chunks import token_chunks

# coreai-opt's linear forms, the ones a Core AI package stores faithfully
CANDIDATES = ("fp16", "int8", "int4-b32")


def compressed_axes(block: Block) -> dict[str, tuple[int, int]]:
    """The block's parameters coreai-opt compresses (read by a matrix product, a 2-D
    convolution or a gather, over its threshold): name -> (output axis, input axis), read off
    the graph torch.export captures at the block's example shapes (the float16 graph the
    converter is given, as exporters/iphone/coreai/package.py traces it)."""
    example = tuple(t.contiguous() for t in block.example)
    with token_chunks():
        program = torch.export.export(HalfPrecision(block.module.eval()), example)
    return weight_axes(program, HalfPrecision.PREFIX)


def _stored(weight: torch.Tensor, axes: tuple[int, int] | None, record: dict | None
            ) -> tuple[torch.Tensor, float]:
    """A weight as a program stores it at the form `record` (None: as computed, float16) and
    its bits a value: float16 where coreai-opt leaves it (not compressed, or its blocks do
    not divide the input axis)."""
    w = weight.detach().numpy()
    per_block = record is not None and record["granularity"] == "per_block"
    block_size = record.get("block_size", 32) if per_block else None
    if record is None or axes is None or (block_size and w.shape[axes[1]] % block_size):
        return torch.from_numpy(w.astype(np.float16).astype(np.float32)), 16.0
    bits = float(record["dtype"].removeprefix("int"))
    # a float16 scale per output channel, and per block of inputs
    scales = w.shape[axes[0]] * (w.shape[axes[1]] // block_size if block_size else 1)
    q = quantized(w, axes, record["dtype"], block_size).astype(np.float32)
    return torch.from_numpy(q), bits + 16.0 * scales / w.size


def simulated_forms(block: Block, forms: Sequence[str]
                    ) -> dict[str, tuple[dict[str, torch.Tensor], int]]:
    """`block`'s parameters as a Core AI program stores them in each of `forms`, and the bytes
    they take there: {form: (parameters by name, bytes)} (exporters/iphone/coreml/recipe.py
    StoreForms)."""
    axes = compressed_axes(block)
    params = dict(block.module.named_parameters())
    out = {}
    for form in forms:
        storage = STORAGES[form]
        record = storage.record if storage.op_config else None
        stored, bits = {}, 0.0
        for name, p in params.items():
            stored[name], b = _stored(p, axes.get(name), record)
            bits += b * p.numel()
        out[form] = (stored, int(bits // 8))
    return out


def form_name(weights: dict | None) -> str:
    """The name in STORAGES of a stored form's record (None: fp16, as computed)."""
    return next((name for name, storage in STORAGES.items()
                 if storage.op_config and storage.record == weights), "fp16")


def chosen_precision(model: FamilyModel, components: dict[str, list[Block]], quantize: str,
                     on_trial: Callable[[int, int, FormTrial], None] | None = None,
                     videos: Sequence[tuple[str, int]] = VIDEOS, steps: int | None = None
                     ) -> tuple[Precision, Compression]:
    """`--quantize auto[:TARGET]` measured on the blocks to export: the Core AI setting (a
    stored form per block key, float16 compute) and the recipe as a setting (its floor and
    note). `videos`, `steps`: what each trial renders. A ValueError names a target no recipe
    reaches."""
    setting = chosen_setting(model, components, quantize, on_trial=on_trial,
                             forms=CANDIDATES, store=simulated_forms, videos=videos,
                             steps=steps)
    return stored_precision(setting, model), setting


def recipe_check(model: FamilyModel, components: dict[str, list[Block]],
                 chosen: Precision, setting: Compression,
                 on_step: Callable[[int, int], None] | None = None,
                 steps: int | None = None) -> dict:
    """The recipe rendered whole on the validation prompt with every block's weights as its
    program stores them (simulated) against fp32; an ExportValidationError under the
    recipe's floor, else the record (exporters/shared/weights_in_place.py)."""
    by_form = {}
    for blocks in components.values():
        for block in blocks:
            name = form_name(chosen.stored_form(block.key).weights)
            by_form[block.key] = simulated_forms(block, [name])[name][0]

    def replace(_components) -> None:
        for blocks in components.values():
            for block in blocks:
                write_parameters(block, by_form[block.key])

    return stored_video_check(model, components, replace, setting.psnr_floor_db,
                              f"the package's {setting.setting} weights (simulated)",
                              "coreai-opt's stored weights simulated in fp32 PyTorch",
                              steps=steps, on_step=on_step)
