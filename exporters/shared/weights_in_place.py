"""A family's model run with other weights for a while (the weights a package stores, read
back or decoded), its own kept in a scratch file on disk meanwhile: the model is held once (a
deep copy would hold it twice, 6 GB more for Wan 1.3B). The exporters' end-to-end checks of
stored forms render the model's reference video this way."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

from edge.core.video_metrics import psnr, snr
from edge.exporters import ExportValidationError
from edge.exporters.shared.validation import VALIDATION_PROMPT
from edge.graph.blocks import Block
from edge.graph.family_model import FamilyModel
from edge.graph.reference_device import reference_record


@contextmanager
def weights_replaced(components: dict[str, list[Block]],
                     replace: Callable[[dict[str, list[Block]]], None]) -> Iterator[None]:
    """`replace(components)` overwrites the blocks' parameters (shared with their family's
    model) in place for the duration of the block; they are restored after, even on error."""
    originals = {id(p): p for blocks in components.values() for b in blocks
                 for p in b.module.parameters()}
    with tempfile.TemporaryFile(prefix="edge-fp32-weights-") as spill:
        for p in originals.values():
            spill.write(p.detach().numpy().tobytes())
        try:
            replace(components)
            yield
        finally:
            spill.seek(0)
            with torch.no_grad():
                for p in originals.values():
                    data = bytearray(spill.read(p.numel() * p.element_size()))
                    p.copy_(torch.frombuffer(data, dtype=p.dtype).view_as(p))


def stored_video_check(model: FamilyModel, components: dict[str, list[Block]],
                       replace: Callable[[dict[str, list[Block]]], None], floor: float,
                       stored_as: str, measures: str, seed: int = 0,
                       steps: int | None = None,
                       on_step: Callable[[int, int], None] | None = None) -> dict:
    """An end-to-end check of stored weights: the family's video on the validation prompt
    rendered with them (`replace`, as `weights_replaced` takes it) against the same video in
    fp32; an ExportValidationError naming `stored_as` under `floor` (PSNR, dB), else the
    manifest's `validation` record (`measures`: what the stored weights were run in).
    `on_step(done, total)` counts the denoising steps of both generations (minutes on a
    model of real size)."""

    def progress(first: bool) -> Callable[[int, int], None] | None:
        if on_step is None:
            return None
        return lambda i, n: on_step(i if first else n + i, 2 * n)

    want = model.generate(VALIDATION_PROMPT, seed=seed, steps=steps, on_step=progress(True))
    with weights_replaced(components, replace):
        got = model.generate(VALIDATION_PROMPT, seed=seed, steps=steps,
                             on_step=progress(False))
    return stored_video_record(got, want, floor, stored_as, measures, seed,
                               steps or model.sampler.steps)


def stored_video_record(got: np.ndarray, want: np.ndarray, floor: float, stored_as: str,
                        measures: str, seed: int, steps: int) -> dict:
    """The manifest's `validation` record of a video rendered with stored weights (`got`)
    against fp32 PyTorch's (`want`); an ExportValidationError naming `stored_as` under
    `floor` (PSNR, dB)."""
    value = psnr(got, want)
    if not value >= floor:
        raise ExportValidationError(
            f"end to end: with {stored_as} the video differs from fp32 PyTorch by PSNR "
            f"{value:.1f} dB < {floor:g} dB on {VALIDATION_PROMPT!r}, seed {seed}")
    # identical videos have an infinite PSNR, which JSON cannot hold: null and a flag
    identical = bool(np.array_equal(got, want))
    return {"prompt": VALIDATION_PROMPT, "seed": seed, "steps": steps, "identical": identical,
            "psnr_db": None if identical else round(value, 2),
            "snr_db": None if identical else round(snr(got, want), 2),
            "psnr_floor_db": floor, "measures": measures, **reference_record()}
