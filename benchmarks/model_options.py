"""What the quality benchmarks share (benchmarks/: run as scripts, they import this beside
them): the model options (tiny-sora, or a diffusers folder at a size) and the prompts and
seeds each setting's videos are rendered for."""

from __future__ import annotations

import argparse
from pathlib import Path

from edge.families import load_model
from edge.graph.family_model import FamilyModel

PROMPTS = ["a red circle moving left", "a blue square moving up",
           "a green triangle moving right", "a yellow ball moving down"]
SEEDS = (0, 1)
SIZES = ("height", "width", "frames", "steps")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="a diffusers folder (default: tiny-sora)")
    for size in SIZES:
        parser.add_argument(f"--{size}", type=int, help="for a diffusers folder")


def model_from(args: argparse.Namespace) -> FamilyModel:
    return load_model(args.model, **{k: getattr(args, k) for k in SIZES
                                     if getattr(args, k) is not None})


def cases(count: int) -> list[tuple[str, int]]:
    """The first `count` (prompt, seed) videos of PROMPTS x SEEDS, seed by seed."""
    return [(p, s) for s in SEEDS for p in PROMPTS][:count]
