"""`edge train tiny-sora`: the shipped weights reproduced from scratch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from edge.core.console import echo, fail


def train_tiny_sora(
    out: Annotated[Path, typer.Option(help="Folder to write the weights to.")] = Path(
        "runs/tiny-sora"),
    seed: Annotated[int, typer.Option(min=0)] = 0,
    transformer_steps: Annotated[int | None, typer.Option(
        min=1, help="Transformer optimisation steps [default: the shipped recipe's].")] = None,
    checkpoint_every: Annotated[int, typer.Option(
        min=0, help="Also save the transformer every N steps (0: never).")] = 0,
) -> None:
    """Reproduce the shipped tiny-sora weights (VAE, transformer, classifier) on the CPU.

    Takes about 50 minutes on 2 cores with the default recipe. Copy the result over
    edge/weights/tiny-sora to ship it."""
    from dataclasses import replace

    from edge.core.files import OutputError, check_writable_parent, kind_of
    from edge.train import TrainingRecipe
    from edge.train import train_tiny_sora as train

    try:  # before fifty minutes of training, not after
        if kind_of(out) not in ("missing", "a folder"):
            raise OutputError(f"--out {out}: is {kind_of(out)}, not a folder")
        check_writable_parent(out / "tiny-sora.json", "--out")
    except OutputError as err:
        fail(str(err))
    recipe = TrainingRecipe(seed=seed)
    if transformer_steps:
        recipe = replace(recipe, transformer_steps=transformer_steps)
    log = train(out, recipe, checkpoint_every=checkpoint_every)
    echo(json.dumps(log, indent=2))
    echo(f"wrote {out} in {log['total_seconds'] / 60:.1f} min")
