"""Options as data: what an export target (exporters/<target>/__init__.py) or a model family
(edge/families/<family>/__init__.py) declares it takes. `edge export` makes its --options from
these declarations, and the refusal of an option a target does not take is written from them,
so a new option is declared once, by what takes it. Plain data: no torch, no typer."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = (str, int, float, bool, Path, list)
# the headings `--help` lists options under, in this order (edge/commands/help_groups.py)
GROUPS = ("Model", "Video size", "Sampler", "Target", "Quantization", "Checks")


@dataclass(frozen=True)
class Option:
    """One --option: `name` is the parameter (min_ios is --min-ios), `kind` the type of its
    text on the command line (list: repeatable, each a string), `help` what it does for the
    one declaring it, without naming that one (the command line prefixes it)."""

    name: str
    kind: type
    help: str
    switch: str | None = None      # a bool's two flags, e.g. "--out-of-core/--in-memory"
    minimum: float | None = None
    # text -> value (e.g. "64MB" -> bytes), raising ValueError that says what is wrong
    parse: Callable[[Any], Any] | None = None
    # where a target takes it in only some of its layouts, as refusals say it: "--min-ios 27"
    only: str | None = None
    choices: tuple[str, ...] | None = None   # the values it takes, where it takes a few
    group: str = "Target"   # its heading in `--help`, one of GROUPS

    def check_choice(self, value) -> None:
        """Refuse, naming the option and its choices, a value outside them."""
        if self.choices is not None and value is not None and value not in self.choices:
            raise ValueError(f"{self.flag} {value!r}: one of {', '.join(self.choices)}")

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TypeError(f"option {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.group not in GROUPS:
            raise TypeError(f"option {self.name}: group {self.group!r} is not one of {GROUPS}")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def by_name(declared: dict[str, Iterable[Option]]) -> dict[str, list[tuple[str, Option]]]:
    """Option name -> (declarer, declaration) for every declarer that takes it, in the
    declarers' order; two declarations of one name must agree on its kind and flags."""
    out: dict[str, list[tuple[str, Option]]] = {}
    for owner, options in declared.items():
        for option in options:
            taken = out.setdefault(option.name, [])
            first = taken[0][1] if taken else option
            if (first.kind, first.switch, first.group) != (option.kind, option.switch,
                                                           option.group):
                raise TypeError(f"{option.flag}: {owner} and {taken[0][0]} declare it with "
                                "different kinds, flags or help groups")
            taken.append((owner, option))
    return out


def merged_help(takers: list[tuple[str, Option]]) -> str:
    """One help text for an option several declare: each distinct text once, after the
    declarers it is theirs: "iphone: ... web: ..."; "onnx, iphone: ..." where they agree."""
    texts: dict[str, list[str]] = {}
    for owner, option in takers:
        texts.setdefault(option.help, []).append(owner)
    return " ".join(f"{', '.join(owners)}: {text}" for text, owners in texts.items())


def takers_text(takers: list[tuple[str, Option]]) -> str:
    """Who takes an option, as a refusal says it: "web and iphone --min-ios 18 or 27"."""
    names = [owner if option.only is None else f"{owner} {option.only}"
             for owner, option in takers]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
