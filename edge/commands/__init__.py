"""The `edge` command line: one module per command, above everything they call. Each
command imports its heavy parts (torch, diffusers, a target's compiler) inside itself, so
`edge --help` stays instant and the base install (no torch) runs the commands on packages;
a command that needs an extra the install lacks says which, in one line (extras.py)."""

from __future__ import annotations

import typer

from edge.commands import (
    bench,
    evaluate,
    export,
    generate,
    record,
    scale_model,
    serve,
    train,
)
from edge.commands.extras import one_line_for_missing_extras

app = typer.Typer(
    help="edge: make text-to-video models fit and run fast on devices.\n\n"
         "The default model, tiny-sora, ships with the package: every command works offline.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_show_locals=False)
train_app = typer.Typer(help="Train a model the project ships, from scratch.",
                        no_args_is_help=True)
app.add_typer(train_app, name="train")

app.command("generate")(one_line_for_missing_extras("generate", generate.generate))
app.command("record")(one_line_for_missing_extras("record", record.record))
app.command("bench")(one_line_for_missing_extras("bench", bench.bench))
app.command("serve")(one_line_for_missing_extras("serve", serve.serve))
app.command("export")(one_line_for_missing_extras("export", export.export))
app.command("eval")(one_line_for_missing_extras("eval", evaluate.evaluate))
app.command("scale-model")(one_line_for_missing_extras("scale-model", scale_model.scale_model))
train_app.command("tiny-sora")(one_line_for_missing_extras("train tiny-sora",
                                                           train.train_tiny_sora))


def main() -> None:
    app()
