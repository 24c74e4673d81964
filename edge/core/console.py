"""What the command line prints: every line escaped (names and values read from packages and
model folders may hold control characters), errors on a line of their own with exit status 2.
"""

from __future__ import annotations

from typing import NoReturn

import typer

from edge.core.files import printable


def echo(text: str, err: bool = False) -> None:
    typer.echo(printable(text), err=err)


def fail(message: str) -> NoReturn:
    """Print `error: message` on its own line (after any progress bar still drawn) and exit
    with status 2."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):  # end their line: ours starts fresh
        bar.close()
    typer.secho(f"error: {printable(message)}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)
