"""The `edge` command line: one module per command, above everything they call. Each
command imports its heavy parts (torch, diffusers, a target's compiler) inside itself, so
`edge --help` stays instant and the base install (no torch) runs the commands on packages;
a command that needs an extra the install lacks says which, in one line (extras.py)."""

from __future__ import annotations

from typing import Annotated

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
from edge.commands.common import interruptions_in_a_line, notices_as_notes
from edge.commands.extras import one_line_for_missing_extras
from edge.commands.help_groups import GroupedHelp

# help as plain text (click's formatter): typer's rich formatter reads "[default: 30]" in a
# help string as a markup tag and deletes it, boxes the options and cuts their names
app = typer.Typer(
    help="edge: make text-to-video models fit and run fast on devices.\n\n"
         "The default model, tiny-sora, ships with the package: every command works offline.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_show_locals=False,
    rich_markup_mode=None)
train_app = typer.Typer(help="Train a model the project ships, from scratch.",
                        no_args_is_help=True, rich_markup_mode=None)
app.add_typer(train_app, name="train")


def _show_version(asked: bool) -> None:
    if asked:
        from edge import __version__
        from edge.core.manifest_schema import FORMAT_VERSION

        typer.echo(f"edge {__version__} (package format {FORMAT_VERSION})")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_show_version,
        help="Print edge's version and the package format it writes and reads, and exit.")]
        = False) -> None:
    """The options before any command (the app's help is the Typer's own)."""


def command(name: str, function):
    """A command as the CLI runs it: notices as `note:` lines, a missing extra as one line,
    Ctrl-C and SIGTERM as one line and the signal's exit status."""
    return one_line_for_missing_extras(name, interruptions_in_a_line(notices_as_notes(function)))


app.command("generate", cls=GroupedHelp)(command("generate", generate.generate))
app.command("record", cls=GroupedHelp)(command("record", record.record))
app.command("bench", cls=GroupedHelp)(command("bench", bench.bench))
app.command("serve", cls=GroupedHelp)(command("serve", serve.serve))
app.command("export", cls=GroupedHelp)(command("export", export.export))
app.command("eval", cls=GroupedHelp)(command("eval", evaluate.evaluate))
app.command("scale-model", cls=GroupedHelp)(command("scale-model", scale_model.scale_model))
train_app.command("tiny-sora", cls=GroupedHelp)(command("train tiny-sora", train.train_tiny_sora))


def main() -> None:
    app()
