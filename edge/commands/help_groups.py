"""Plain-text `--help` with the options under headings (Model, Video size, Sampler, Target,
Quantization, Checks: edge.core.declared.GROUPS), as the rich formatter's panels would show
them. The rich formatter is off (edge/commands/__init__.py: it deletes "[default: ...]" from
help texts), and click's plain one lists every option under one "Options" heading, so this
writes the sections itself; an option's heading is its typer `rich_help_panel`."""

from __future__ import annotations

import click
from typer.core import TyperCommand

from edge.core.declared import GROUPS

UNGROUPED = "Options"   # --help, and a command's options that name no group


class GroupedHelp(TyperCommand):
    """A command whose help lists its arguments, then its options group by group."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        arguments, groups = [], {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                group = getattr(param, "rich_help_panel", None) or UNGROUPED
                groups.setdefault(group, []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        order = [*GROUPS, UNGROUPED]
        for group in sorted(groups, key=lambda g: order.index(g) if g in order else len(order)):
            with formatter.section(group):
                formatter.write_dl(groups[group])
