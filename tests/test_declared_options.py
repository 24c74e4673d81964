"""Options as data: the targets (exporters/<target>/__init__.py) and the families
(edge/families/<family>/__init__.py) declare the export options they take, and `edge export`
is made from the declarations: each declared option is on the command line with its
declarers' help, reaches what declared it, and is refused, naming its takers, by a target
that does not declare it. The command itself names no target and no family."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edge import exporters
from edge.commands import app
from edge.core.declared import Option, by_name, merged_help, takers_text
from edge.exporters import ExportOptionError, ExportOptions
from edge.families import FAMILIES, declared_options, registered

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_one_help_text_names_each_declarer_once():
    a, b = Option("q", str, "Bits."), Option("q", str, "Forms.")
    assert merged_help([("iphone", a), ("web", b)]) == "iphone: Bits. web: Forms."
    assert merged_help([("onnx", a), ("iphone", a)]) == "onnx, iphone: Bits."


def test_refusals_name_the_takers_and_their_layouts():
    a = Option("x", str, "X.")
    b = Option("x", str, "X.", only="--min-ios 27")
    assert takers_text([("web", a)]) == "web"
    assert takers_text([("onnx", a), ("iphone", b), ("web", a)]) == \
        "onnx, iphone --min-ios 27 and web"


def test_two_declarations_of_one_name_must_agree_on_its_kind():
    with pytest.raises(TypeError, match="--x: web and onnx declare it with different kinds"):
        by_name({"onnx": [Option("x", str, "X.")], "web": [Option("x", int, "X.")]})
    with pytest.raises(TypeError, match="kind"):
        Option("x", dict, "X.")


def test_export_options_are_the_targets_declarations():
    declared = {o.name for t in exporters.TARGETS for o in exporters.registered(t).OPTIONS}
    assert {f.name for f in fields(ExportOptions)} == declared | {"end_to_end"}


def test_a_target_refuses_what_it_does_not_declare_naming_who_takes_it():
    """Every option some target declares, given to a target that does not: refused before
    any work, with the takers named as the declarations say."""
    cases = 0
    for name, takers in exporters.declared_options().items():
        for target in exporters.TARGETS:
            if target in dict(takers):
                continue
            module = exporters.target(target) if target != "iphone" else None
            if module is None:  # the iphone target's module needs coremltools
                pytest.importorskip("coremltools")
                module = exporters.target(target)
            with pytest.raises(ExportOptionError, match=re.escape(
                    f"applies to --target {takers_text(takers)}, not {target}")
                    if name != "memory_budget" else "--memory-budget"):
                module.check(ExportOptions(**{name: "x"}))
            cases += 1
    assert cases >= 8


def test_every_declared_option_is_on_the_command_line():
    """`edge export --help` lists each target's and each family's options (typer's table
    may cut a long flag, so the names are looked up in a wide terminal)."""
    res = runner.invoke(app, ["export", "--help"], terminal_width=400, env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    flags = {o.flag for t in exporters.TARGETS for o in exporters.registered(t).OPTIONS}
    flags |= {o.flag for f in FAMILIES for o in declared_options(f)}
    missing = sorted(f for f in flags if f not in res.output)
    assert not missing, f"declared but not on `edge export`: {missing}"


def test_the_export_command_names_no_target_and_no_family():
    """What a target or family takes is theirs to declare: the command's source names none
    of them (a new target or family adds no line to it)."""
    names = [*exporters.TARGETS, *FAMILIES,
             *(registered(f).PIPELINE for f in FAMILIES if registered(f).PIPELINE),
             "tiny_sora", "open-sora", "wan", "ltx-video"]
    source = (REPO / "edge" / "commands" / "export.py").read_text().lower()
    named = sorted({n for n in names if re.search(rf"\b{re.escape(n.lower())}\b", source)})
    assert not named, f"edge/commands/export.py names {named}"


def test_the_registrations_load_without_torch():
    """The command line reads every registration at start: none may import torch."""
    import subprocess
    import sys

    code = ("import sys\n"
            "sys.modules['torch'] = None\n"
            "import edge.commands.export\n"
            "from edge.families import FAMILIES, registered\n"
            "from edge import exporters\n"
            "[registered(f) for f in FAMILIES]\n"
            "[exporters.registered(t) for t in exporters.TARGETS]\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_an_option_names_a_help_group_edge_lists():
    from edge.core.declared import GROUPS, Option

    assert Option("x", int, "h").group in GROUPS
    with pytest.raises(TypeError, match="group 'Misc' is not one of"):
        Option("x", int, "h", group="Misc")
