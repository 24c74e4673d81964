"""Identical blocks converted to ONNX once per process.

An ONNX graph here takes its block's weights as inputs, so blocks of one architecture (Wan
1.3B's 30 transformer blocks, a text encoder's layers, tiny-sora's pairs and their TDTM
variants) have byte-identical graphs, and so do two exports of one architecture (the same
transformer with another scheduler, a package re-exported for another budget): converting
each again costs seconds to minutes a block for nothing. A graph is keyed by what decides
its bytes, the traced program (its code, with every literal), the tensors it embeds
(buffers and lifted constants, by value) and the names and signatures of its inputs and
outputs; a block whose key was seen gets a copy of the earlier graph. The copy is then
validated with the block's own weights against the block in PyTorch like any other graph,
so a key that missed something would fail the export, not ship a wrong graph.

The graphs are kept in memory (they hold no weights: kilobytes to a few megabytes each),
the least recently used dropped beyond `LIMIT_BYTES`.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path

import torch

LIMIT_BYTES = 256 << 20
# a graph larger than this embeds big constants: kept out so it cannot push out the rest
LARGEST_KEPT = LIMIT_BYTES // 8

_graphs: OrderedDict[str, bytes] = OrderedDict()
_kept_bytes = 0
_lock = threading.Lock()


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
    """Write the graph converted earlier under `key` to `path`; False if none is kept."""
    with _lock:
        graph = _graphs.get(key)
        if graph is None:
            return False
        _graphs.move_to_end(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(graph)
    return True


def remember(key: str, path: Path) -> None:
    """Keep the graph just converted to `path` for later blocks under `key`."""
    global _kept_bytes
    graph = path.read_bytes()
    if len(graph) > LARGEST_KEPT:
        return
    with _lock:
        if key in _graphs:
            return
        _graphs[key] = graph
        _kept_bytes += len(graph)
        while _kept_bytes > LIMIT_BYTES:
            _, dropped = _graphs.popitem(last=False)
            _kept_bytes -= len(dropped)


def forget_graphs() -> None:
    """Drop every kept graph (the next block of each architecture converts again)."""
    global _kept_bytes
    with _lock:
        _graphs.clear()
        _kept_bytes = 0
