"""Typer parameters made from options declared as data (edge/core/declared.py): a command
whose options the targets and families declare (`edge export`) gets one --option for each
name, its help merged from every declarer's, and its values parsed as the declaration says."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from edge.core.console import fail
from edge.core.declared import Option, merged_help


def _parameter(takers: list[tuple[str, Option]]) -> inspect.Parameter:
    option = takers[0][1]
    value = list[str] if option.kind is list else option.kind
    extra = {} if option.minimum is None else {"min": option.minimum}
    declarations = (option.switch,) if option.switch else ()
    annotation = Annotated[value | None, typer.Option(*declarations, help=merged_help(takers),
                                                      **extra)]
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=annotation)


def with_declared_options(function: Callable[..., Any],
                          declared: dict[str, list[tuple[str, Option]]]) -> Callable[..., Any]:
    """`function` as a command taking its own parameters (typer-annotated, all but its
    **kwargs) and then one option for each declared name, in the order given; the declared
    ones reach `function` through its **kwargs, None where not given."""
    own = inspect.signature(function, eval_str=True)
    fixed = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    clash = {p.name for p in fixed} & set(declared)
    if clash:
        raise TypeError(f"{function.__name__}: declared options {sorted(clash)} are its own")
    parameters = [*fixed, *(_parameter(takers) for takers in declared.values())]

    @functools.wraps(function)
    def command(**kwargs):
        return function(**kwargs)

    command.__signature__ = own.replace(parameters=parameters)
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command


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
