"""Commands whose options are given as data: options declared by targets and families
(edge/core/declared.py) for `edge export`, one --option for each name, its help merged from
every declarer's, its values parsed as the declaration says; and a set of typer options
several commands share (the sampler's, `generate` and `record`), declared once."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from edge.core.console import fail
from edge.core.declared import Option, merged_help


def _annotation(takers: list[tuple[str, Option]]):
    option = takers[0][1]
    value = list[str] if option.kind is list else option.kind
    extra = {} if option.minimum is None else {"min": option.minimum}
    declarations = (option.switch,) if option.switch else ()
    return Annotated[value | None, typer.Option(*declarations, help=merged_help(takers),
                                                rich_help_panel=option.group, **extra)]


def with_options(function: Callable[..., Any], options: dict[str, Any]) -> Callable[..., Any]:
    """`function` as a command taking its own parameters (typer-annotated, all but its
    **kwargs) and then `options` (name -> typer-annotated type, each default None), in the
    order given; those reach `function` through its **kwargs, None where not given."""
    own = inspect.signature(function, eval_str=True)
    fixed = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    clash = {p.name for p in fixed} & set(options)
    if clash:
        raise TypeError(f"{function.__name__}: options {sorted(clash)} are its own")
    parameters = [*fixed, *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                              default=None, annotation=annotation)
                            for name, annotation in options.items())]

    @functools.wraps(function)
    def command(**kwargs):
        return function(**kwargs)

    command.__signature__ = own.replace(parameters=parameters)
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command


def with_declared_options(function: Callable[..., Any],
                          declared: dict[str, list[tuple[str, Option]]]) -> Callable[..., Any]:
    """`function` as a command taking one option for each declared name after its own, the
    help merged from every declarer's."""
    return with_options(function, {name: _annotation(takers)
                                   for name, takers in declared.items()})


def parsed(given: dict[str, Any], declared: dict[str, list[tuple[str, Option]]]) -> dict:
    """The declared options given (not None, not an empty list), each made a value by its
    declaration's `parse`; a value it refuses ends the command naming the option."""
    out = {}
    for name, value in given.items():
        if name not in declared or value is None or value == []:
            continue
        option = declared[name][0][1]
        try:
            out[name] = value if option.parse is None else option.parse(value)
        except ValueError as err:
            text = str(err)
            fail(text if text.startswith(option.flag) else f"{option.flag} {text}")
    return out
