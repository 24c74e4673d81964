"""Identical blocks converted to ONNX once per export.

An ONNX graph here takes its block's weights as inputs, so blocks of one architecture (Wan
1.3B's 30 transformer blocks, a text encoder's layers, tiny-sora's pairs and their TDTM
variants) have byte-identical graphs: converting each again costs seconds to minutes a
block for nothing. Within `reusing_graphs()`, a graph is keyed by what decides its bytes,
the traced program (its code, with every literal), the tensors it embeds (buffers and
lifted constants, by value) and the names and signatures of its inputs and outputs; a block
whose key was seen gets a copy of the earlier graph. The copy is then validated with the
block's own weights against the block in PyTorch like any other graph, so a key that missed
something would fail the export, not ship a wrong graph.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import torch

_GRAPHS: ContextVar[dict[str, Path] | None] = ContextVar("edge_graph_reuse", default=None)


@contextmanager
def reusing_graphs() -> Iterator[None]:
    """Within: `export_graph` copies a graph it has converted before (see the module)."""
    token = _GRAPHS.set({})
    try:
        yield
    finally:
        _GRAPHS.reset(token)


def _tensor_digest(digest, tensor: torch.Tensor) -> None:
    t = tensor.detach().contiguous().cpu()
    digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def graph_key(program: torch.export.ExportedProgram, interface: object) -> str:
    """What decides a converted graph's bytes: the program's code, the buffers and
    constants it embeds, and `interface` (input and output names, shapes, dtypes)."""
    digest = hashlib.sha256(program.graph_module.code.encode())
    signature = program.graph_signature
    for name in sorted(signature.buffers):   # a non-persistent buffer is a constant
        if name in program.state_dict:
            digest.update(name.encode())
            _tensor_digest(digest, program.state_dict[name])
    for name, value in sorted(program.constants.items()):
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            _tensor_digest(digest, value)
        else:  # a script object: no way to compare it, so never reused
            digest.update(str(id(value)).encode())
    digest.update(repr(interface).encode())
    return digest.hexdigest()


def copy_of_earlier(key: str, path: Path) -> bool:
    """Copy the graph converted earlier under `key` to `path`; False if there is none (or
    no `reusing_graphs` is in force)."""
    graphs = _GRAPHS.get()
    if graphs is None or key not in graphs:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(graphs[key], path)
    return True


def remember(key: str, path: Path) -> None:
    graphs = _GRAPHS.get()
    if graphs is not None:
        graphs[key] = path
