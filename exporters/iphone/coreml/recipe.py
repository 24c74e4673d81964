"""Mixed-bit recipes for the iphone target, chosen by measurement: which stored form each
block of a model takes so that the package reaches a size (or a quality) at the least loss.

The measurement (`measure_forms`): each device block is converted once, then stored in every
candidate form by the same coremltools pass the exporter runs (`Compression.compressor`),
and its weights are read back out of the program; for each form the family's videos are
rendered with that one block stored so (the rest fp32) and compared with the fp32 videos.
What a form costs is the mean squared error it adds to the uint8 frames, and what it saves is
its weight file's bytes: the measured bytes, not an estimate (coremltools leaves some tensors
uncompressed under some forms).

The choice (`choose`): blocks' errors are taken to add (each block's error is small and
independent of the others'; `check_recipe` renders the chosen recipe whole to see that it
holds). Each block's forms on the lower convex hull of (bytes, error) are its useful steps
down; all blocks' steps, taken cheapest error per byte saved first, give every recipe worth
having, from all fp16 to all smallest. A size target stops at the first recipe within it; a
PSNR target at the last one predicted above it.

Why by hand: coremltools compresses but measures nothing, and the anchor
(apple/ml-stable-diffusion's mixed-bit palettization) is a script for its own UNet's layers;
what is measured here is the whole video, where a family's errors compound (a transformer's
at every step, a decoder's once).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from edge.core.budget import MIB
from edge.core.video_metrics import mse
from edge.core.video_metrics import psnr_of_mse as psnr_of
from edge.exporters.iphone.coreml.package import (
    AUTO,
    DEFAULT_MIN_IOS,
    FP16,
    STORAGES,
    Compression,
    auto_target,
    convert_module,
    save_program,
    weights_file_bytes,
)
from edge.exporters.iphone.coreml.weights import read_parameters
from edge.exporters.shared.weights_in_place import weights_replaced
from edge.graph.blocks import Block
from edge.graph.family_model import FamilyModel

# the forms tried for each block: every stored form the deployment target decompresses
CANDIDATES = ("fp16", "int8", "lut6", "lut4", "lut3", "lut6-g16", "lut4-g16", "int4-b32")
# the videos a form's error is measured on: (prompt, seed)
VIDEOS = (("a red circle moving left", 0), ("a blue square moving up", 1))


# How a layout stores a block in each of some forms: {form: (its parameters as the program
# holds them, the stored bytes)} (`stored_forms` for the Core ML layouts; the Core AI layout
# simulates coreai-opt's forms instead, exporters/iphone/coreai/recipe.py)
StoreForms = Callable[[Block, Sequence[str]], dict[str, tuple[dict[str, torch.Tensor], int]]]


@dataclass(frozen=True)
class FormTrial:
    """One block stored in one form: its weight file and the error it adds to the videos."""

    block: str
    form: str
    weight_bytes: int
    mse: tuple[float, ...]      # per video, against fp32 (uint8 frames)

    @property
    def mean_mse(self) -> float:
        return float(np.mean(self.mse))


def candidate_forms(min_ios: int, forms: Sequence[str] | None = None) -> list[str]:
    """The candidate forms `min_ios` decompresses (or those of `forms`, checked by name)."""
    names = list(forms or CANDIDATES)
    unknown = [f for f in names if f not in STORAGES]
    if unknown:
        raise ValueError(f"stored form {unknown[0]!r} is not one of {', '.join(STORAGES)}")
    return [f for f in names if STORAGES[f].min_ios <= min_ios]


def _setting(form: str) -> Compression:
    return Compression(form, (("*", STORAGES[form]),), psnr_floor_db=0.0)


def stored_forms(block: Block, forms: Sequence[str], min_ios: int = DEFAULT_MIN_IOS
                 ) -> dict[str, tuple[dict[str, torch.Tensor], int]]:
    """`block` converted once and stored in each of `forms`: {form: (its parameters as the
    program stores them, the weight file's bytes)}."""
    base = convert_module(block.module, block, _setting("fp16"), min_ios)
    params = block.parameters()
    out = {}
    with tempfile.TemporaryDirectory(prefix="edge-recipe-") as tmp:
        for form in forms:
            compress = _setting(form).compressor(block.key)
            model = base if compress is None else compress(base)
            path = Path(tmp) / f"{form}.mlpackage"
            save_program(model, path)
            stored, _ = read_parameters(path, params)
            out[form] = (stored, weights_file_bytes(path))
    return out


def _render(model: FamilyModel, videos: Sequence[tuple[str, int]], steps: int | None
            ) -> list[np.ndarray]:
    return [model.generate(prompt, seed=seed, steps=steps) for prompt, seed in videos]


def _errors(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float, ...]:
    return tuple(mse(g, w) for g, w in zip(got, want, strict=True))


def write_parameters(block: Block, stored: dict[str, torch.Tensor]) -> None:
    """`stored` into the block's parameters, in place (under `weights_replaced`)."""
    with torch.no_grad():
        for name, p in block.module.named_parameters():
            p.copy_(stored[name])


def _coreml_store(min_ios: int) -> StoreForms:
    return lambda block, forms: stored_forms(block, forms, min_ios)


def measure_forms(model: FamilyModel, components: dict[str, list[Block]],
                  forms: Sequence[str], videos: Sequence[tuple[str, int]] = VIDEOS,
                  steps: int | None = None, min_ios: int = DEFAULT_MIN_IOS,
                  on_trial: Callable[[FormTrial], None] | None = None,
                  store: StoreForms | None = None) -> list[FormTrial]:
    """Every block of `components` (the device cut, sharing the model's parameters) in every
    form of `forms`, measured alone: the trials, block by block. fp16 blocks are measured
    too (the error of storing at all). `on_trial` sees each trial as it is measured.
    `store`: how the layout stores a block (default: converted for `min_ios`)."""
    store = store or _coreml_store(min_ios)
    want = _render(model, videos, steps)
    trials = []
    for blocks in components.values():
        for block in blocks:
            for form, (stored, size) in store(block, forms).items():
                # called at once, inside the with: the loop's current block and form
                with weights_replaced({"one": [block]},
                                      lambda _, b=block, s=stored: write_parameters(b, s)):
                    got = _render(model, videos, steps)
                trial = FormTrial(block.key, form, size, _errors(got, want))
                trials.append(trial)
                if on_trial is not None:
                    on_trial(trial)
    return trials


@dataclass(frozen=True)
class Recipe:
    """A form for every block, with what the measurement predicts of it."""

    forms: dict[str, str]            # block key -> stored form
    weight_bytes: int                # the blocks' weight files at those forms
    mse: tuple[float, ...]           # predicted per video: the blocks' errors added

    @property
    def psnr_db(self) -> float:
        """Predicted PSNR of the worst video."""
        return psnr_of(max(self.mse))

    def setting(self, floor_db: float, note: str = "", name: str = AUTO) -> Compression:
        """The recipe as a `--quantize` setting named `name`: one rule per block key."""
        rules = tuple((key, STORAGES[form]) for key, form in self.forms.items())
        return Compression(name, (*rules, ("*", FP16)), psnr_floor_db=floor_db, note=note)


def _hull(trials: list[FormTrial]) -> list[FormTrial]:
    """A block's trials on the lower convex hull of (bytes, mean error), largest first: the
    forms worth stepping down to, each costing more error per byte saved than the last."""
    # from the smallest up, a form is worth its bytes only with less error than every
    # smaller one (ties: the first, smallest, wins)
    frontier: list[FormTrial] = []
    for t in sorted(trials, key=lambda t: (t.weight_bytes, t.mean_mse)):
        if not frontier or t.mean_mse < frontier[-1].mean_mse:
            frontier.append(t)
    frontier.reverse()  # largest (least error) first
    hull: list[FormTrial] = []
    for t in frontier:
        while len(hull) >= 2 and _slope(hull[-2], hull[-1]) >= _slope(hull[-2], t):
            hull.pop()
        hull.append(t)
    return hull


def _slope(a: FormTrial, b: FormTrial) -> float:
    """Error added per byte saved going from `a` (larger) to `b`."""
    saved = a.weight_bytes - b.weight_bytes
    return (b.mean_mse - a.mean_mse) / saved if saved > 0 else math.inf


def recipes(trials: list[FormTrial]) -> list[Recipe]:
    """Every recipe the hulls give, from each block's least-error form to its smallest,
    stepping down where an error is cheapest per byte saved."""
    by_block: dict[str, list[FormTrial]] = {}
    for t in trials:
        by_block.setdefault(t.block, []).append(t)
    hulls = {key: _hull(ts) for key, ts in by_block.items()}
    steps = sorted(((_slope(h[i], h[i + 1]), key, i + 1) for key, h in hulls.items()
                    for i in range(len(h) - 1)))
    at = {key: 0 for key in hulls}

    def recipe() -> Recipe:
        chosen = {key: hulls[key][at[key]] for key in hulls}
        mse = np.sum([t.mse for t in chosen.values()], axis=0)
        return Recipe({k: t.form for k, t in chosen.items()},
                      sum(t.weight_bytes for t in chosen.values()), tuple(map(float, mse)))

    out = [recipe()]
    for _, key, index in steps:
        at[key] = index
        out.append(recipe())
    return out


def choose(trials: list[FormTrial], max_bytes: int | None = None,
           min_psnr_db: float | None = None) -> Recipe:
    """The recipe for a target: the least-error one within `max_bytes`, or the smallest
    predicted at or above `min_psnr_db` on its worst video. A ValueError names the target
    where no recipe reaches it."""
    if (max_bytes is None) == (min_psnr_db is None):
        raise ValueError("give one target: a size or a PSNR")
    options = recipes(trials)
    if max_bytes is not None:
        fit = [r for r in options if r.weight_bytes <= max_bytes]
        if not fit:
            smallest = options[-1]
            raise ValueError(f"no recipe fits {max_bytes} bytes of weights: the smallest "
                             f"is {smallest.weight_bytes} bytes")
        return min(fit, key=lambda r: (max(r.mse), r.weight_bytes))
    fit = [r for r in options if r.psnr_db >= min_psnr_db]
    if not fit:
        raise ValueError(f"no recipe reaches {min_psnr_db:g} dB: with every block at its "
                         f"least-error form the worst video is predicted at "
                         f"{options[0].psnr_db:.1f} dB")
    return min(fit, key=lambda r: r.weight_bytes)


# The blocks' errors add only roughly: the export's end-to-end check holds the chosen recipe
# to this far under what the measurement predicts for its validation video
PREDICTION_MARGIN_DB = 3.0


def chosen_setting(model: FamilyModel, components: dict[str, list[Block]], quantize: str,
                   min_ios: int = DEFAULT_MIN_IOS,
                   on_trial: Callable[[int, int, FormTrial], None] | None = None,
                   forms: Sequence[str] | None = None, store: StoreForms | None = None,
                   videos: Sequence[tuple[str, int]] = VIDEOS, steps: int | None = None
                   ) -> Compression:
    """`--quantize auto[:TARGET]` made a setting: every block of `components` measured in
    every form `min_ios` decompresses (or of `forms`, stored by `store`), the recipe chosen
    for the target, one rule per block key; its end-to-end floor PREDICTION_MARGIN_DB under
    the prediction for the validation video (VIDEOS[0]), its note the target and the
    prediction. `on_trial(done, total, trial)` after each trial. `videos` and `steps`: what
    a trial renders (a test's shorter run; the first video is the floor's). A ValueError
    names a target no recipe reaches."""
    target = auto_target(quantize)
    if target is None:
        raise ValueError(f"--quantize {quantize!r} is not an auto setting")
    forms = list(forms or candidate_forms(min_ios))
    total = len(forms) * sum(len(blocks) for blocks in components.values())
    done = []

    def seen(trial: FormTrial) -> None:
        done.append(trial)
        if on_trial is not None:
            on_trial(len(done), total, trial)

    trials = measure_forms(model, components, forms, videos, steps, min_ios=min_ios,
                           on_trial=seen, store=store)
    fp32 = sum(b.weight_bytes() for blocks in components.values() for b in blocks)
    try:
        recipe = choose(trials, max_bytes=target.weight_bytes(fp32),
                        min_psnr_db=target.min_psnr_db)
    except ValueError as err:
        raise ValueError(f"--quantize {quantize}: {err}") from None
    smaller = fp32 / recipe.weight_bytes
    note = (f"chosen by measurement for {quantize}: {len(forms)} forms of each of "
            f"{total // len(forms)} blocks, each alone on {len(videos)} videos; predicted "
            f"{recipe.weight_bytes / MIB:.2f} MiB of weight files ({smaller:.2f}x smaller "
            f"than fp32), worst video {recipe.psnr_db:.1f} dB")
    floor = psnr_of(recipe.mse[0]) - PREDICTION_MARGIN_DB
    return recipe.setting(round(floor, 1), note=note, name=quantize)


def check_recipe(model: FamilyModel, components: dict[str, list[Block]], recipe: Recipe,
                 videos: Sequence[tuple[str, int]], steps: int | None = None,
                 min_ios: int = DEFAULT_MIN_IOS, store: StoreForms | None = None
                 ) -> tuple[float, ...]:
    """The recipe rendered whole: each video's PSNR against fp32 (the prediction's check)."""
    store = store or _coreml_store(min_ios)
    want = _render(model, videos, steps)
    stored = {}
    for blocks in components.values():
        for block in blocks:
            form = recipe.forms[block.key]
            stored[block.key] = store(block, [form])[form][0]

    def replace(_components) -> None:
        for blocks in components.values():
            for block in blocks:
                write_parameters(block, stored[block.key])

    with weights_replaced(components, replace):
        got = _render(model, videos, steps)
    return tuple(psnr_of(e) for e in _errors(got, want))
