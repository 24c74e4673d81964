"""Every command's `--help` as a user reads it: nothing a help string says is lost, and it
fits 100 columns. typer's rich formatter read "[default: 30]" inside a help string as a
markup tag and deleted it ("Denoising steps ."), boxed the options and cut their names."""

from __future__ import annotations

import re

import click
import typer
from typer.testing import CliRunner

from edge.commands import app

runner = CliRunner()


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


def _words(text: str) -> str:
    """Without whitespace: the formatter wraps lines, also at a word's hyphen."""
    return "".join(text.split())


def test_every_help_string_is_shown_whole_within_100_columns():
    commands = list(_commands(typer.main.get_command(app)))
    assert len(commands) >= 8
    defaults = 0
    for path, command in commands:
        res = runner.invoke(app, [*path, "--help"], terminal_width=100, env={"COLUMNS": "100"})
        assert res.exit_code == 0, (path, res.output)
        long = [line for line in res.output.splitlines() if len(line) > 100]
        assert not long, f"edge {' '.join(path)} --help: lines over 100 columns: {long[:3]}"
        shown = _words(res.output)
        for param in command.params:
            text = getattr(param, "help", None)
            if not text:
                continue
            # each bracketed part a help string says (its default) is in the help as written
            for said in re.findall(r"\[[^\]]*\]", text):
                defaults += 1
                assert _words(said) in shown, (f"edge {' '.join(path)} --help lost {said!r} "
                                              f"of {param.name}'s help")
    assert defaults >= 20   # the help strings do state their defaults


def test_version_names_edge_and_the_package_format():
    from edge import __version__
    from edge.core.manifest_schema import FORMAT_VERSION

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"edge {__version__} (package format {FORMAT_VERSION})"


def test_export_lists_its_options_under_their_groups():
    """`edge export --help` writes a heading for each group (edge.core.declared.GROUPS) in
    that order, and each option under the one its declaration (or the command) names."""
    from edge.commands.export import FAMILY_OPTIONS, TARGET_OPTIONS
    from edge.core.declared import GROUPS

    res = runner.invoke(app, ["export", "--help"], terminal_width=100, env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    headings = [line[:-1] for line in res.output.splitlines() if re.fullmatch(r"[A-Z][\w ]*:",
                                                                               line)]
    assert headings == [*GROUPS, "Options"], headings
    under = {}
    for line in res.output.splitlines():
        if line[:-1] in headings:
            group = line[:-1]
        option = re.match(r"  (?:-\w, )?(--[a-z][a-z-]*)", line)  # not a wrapped help line
        if option:
            under[option[1]] = group
    for name, takers in (TARGET_OPTIONS | FAMILY_OPTIONS).items():
        assert under[takers[0][1].flag] == takers[0][1].group, name
    assert (under["--model"], under["--target"], under["--device"]) == ("Model", "Target",
                                                                         "Checks")
    assert under["--quantize"] == "Quantization" and under["--height"] == "Video size"
