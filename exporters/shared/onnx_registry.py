"""torch.onnx's table of ATen → ONNX functions, built once a process instead of once a graph.

`torch.onnx.export` (dynamo) builds that table (`ONNXRegistry.from_torchlib`: every torchlib
function looked up and wrapped) anew on every call, 0.5 s here, and an export converts one
graph per block: on the tiny CogVideoX package it was 35 s of a 141 s ONNX export. The table
depends only on the opset, so the first one built is kept and each export gets a copy of
it, with lists of functions of its own, to which the export adds its custom ops as before.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator

_kept: dict[tuple, object] = {}  # (class, opset) -> the table torch built for them
_lock = threading.Lock()


@contextlib.contextmanager
def reused_torchlib_registry() -> Iterator[None]:
    """`ONNXRegistry.from_torchlib` answers with a copy of a kept table while the block
    lasts. A torch without that classmethod (the exporter's internals moved) is left as it
    is: each export then builds its own, as before."""
    try:
        from torch.onnx._internal.exporter._constants import TORCHLIB_OPSET
        from torch.onnx._internal.exporter._registration import ONNXRegistry
    except ImportError:
        yield
        return
    build = ONNXRegistry.__dict__.get("from_torchlib")
    if not isinstance(build, classmethod):
        yield
        return

    def copy_of_kept(cls, opset_version=TORCHLIB_OPSET):
        key = (cls, opset_version)
        with _lock:
            if key not in _kept:
                _kept[key] = build.__get__(None, cls)(opset_version=opset_version)
            kept = _kept[key]
        registry = copy.copy(kept)
        registry.functions = {k: list(v) for k, v in kept.functions.items()}
        return registry

    ONNXRegistry.from_torchlib = classmethod(copy_of_kept)
    try:
        yield
    finally:
        ONNXRegistry.from_torchlib = build
