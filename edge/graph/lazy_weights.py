"""Models larger than memory: a component built without storage (PyTorch's meta device),
its parameters read from the folder's safetensors files only while a block that uses them is
exported or run, then dropped.

`empty_component(build, folder)` builds a module with meta parameters (accelerate's
`init_empty_weights`: buffers stay real, and persistent ones are read now, being small) and
tells each parameter where its bytes are; `materialized(module)` reads the parameters of
`module` (a block: a few of the component's submodules) for the duration of a `with`, in
float32, and puts the meta ones back after, so memory holds one block's weights, not the
model's.

The safetensors files are read with plain reads rather than through `safetensors.safe_open`:
safe_open maps the whole file, and pages of a mapping count in the process's resident
memory while it is open, which is what an out-of-core export must keep small. The format is
small and documented (an 8-byte little-endian header length, a JSON header of name -> dtype,
shape, byte offsets, then the data), and reading it here is also where a missing or truncated
shard is named before any work.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from edge.core.files import kind_of
from edge.graph import shapes_only

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "F64": torch.float64}
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on the JSON header
LAZY = "_edge_lazy_source"    # the attribute a meta parameter carries: where its bytes are


class ShardError(ValueError):
    """A component folder whose safetensors files cannot give its weights; the message names
    the file and what is wrong."""


@dataclass(frozen=True)
class StoredTensor:
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int   # byte offset in the file
    nbytes: int


def read_header(path: Path) -> dict[str, StoredTensor]:
    """The tensors a safetensors file holds, checked against its size (a truncated file is
    refused, naming it, before anything is read from it)."""
    kind = kind_of(path)
    if kind != "a file":  # a FIFO would block the read for ever
        raise ShardError(f"{path}: is {kind}, not a safetensors file" if kind != "missing"
                         else f"{path}: missing")
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ShardError(f"{path}: truncated: {len(head)} bytes, not a safetensors "
                                 "file")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES:
                raise ShardError(f"{path}: a header of {length} bytes: not a safetensors file")
            text = f.read(length)
        size = path.stat().st_size
    except OSError as err:
        raise ShardError(f"{path}: cannot read it ({err.strerror})") from None
    if len(text) < length:
        raise ShardError(f"{path}: truncated: {size} bytes, shorter than its header")
    try:
        header = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ShardError(f"{path}: not a safetensors header ({err})") from None
    if not isinstance(header, dict):
        raise ShardError(f"{path}: not a safetensors header (a JSON {type(header).__name__}, "
                         "not an object of tensors)")
    tensors, data = {}, 8 + length
    for name, spec in header.items():
        if name != "__metadata__":
            tensors[name] = _stored_tensor(path, name, spec, data)
    need = max((t.start + t.nbytes for t in tensors.values()), default=data)
    if size < need:
        raise ShardError(f"{path}: truncated: {size} bytes, its header describes {need}")
    return tensors


def _stored_tensor(path: Path, name: str, spec, data: int) -> StoredTensor:
    """A header entry as a StoredTensor (`data`: where the file's data begins), every field
    checked: its dtype one edge reads, its shape a list of sizes, its offsets two integers
    spanning exactly the shape's bytes."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(spec, dict):
        raise ShardError(f"{where}: its header entry is not an object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ShardError(f"{where} is {dtype!s:.20}; edge reads {', '.join(DTYPES)}")
    if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        raise ShardError(f"{where}: shape {shape!s:.60} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(n) is int and n >= 0 for n in offsets) and offsets[0] <= offsets[1]):
        raise ShardError(f"{where}: data_offsets {offsets!s:.60} are not two byte offsets, "
                         "first to last")
    nbytes = math.prod(shape) * DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise ShardError(f"{where}: spans {offsets[1] - offsets[0]} bytes; {dtype} of shape "
                         f"{shape} takes {nbytes}")
    return StoredTensor(path, dtype, tuple(shape), data + offsets[0], nbytes)


class FolderWeights:
    """The tensors of one component folder's safetensors files, read on demand: through its
    index (`*.safetensors.index.json`, every shard it names checked) or, without one, every
    `*.safetensors` file in it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tensors: dict[str, StoredTensor] = {}
        indexes = sorted(folder.glob("*.safetensors.index.json"))
        if indexes:
            shards = self._shards_of(indexes[0])
        else:
            shards = sorted(folder.glob("*.safetensors"))
            if not shards:
                raise ShardError(f"{folder}: no .safetensors weights")
        for shard in shards:
            self.tensors |= read_header(shard)
        if indexes:
            self._check_index(indexes[0])

    def _shards_of(self, index: Path) -> list[Path]:
        try:
            self.weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
            raise ShardError(f"{index}: not a safetensors index ({err})") from None
        shards = []
        for name in dict.fromkeys(self.weight_map.values()):
            shard = self.folder / name
            if not shard.is_file():
                raise ShardError(f"{shard}: missing (a shard {index.name} lists)")
            shards.append(shard)
        return shards

    def _check_index(self, index: Path) -> None:
        for name, shard in self.weight_map.items():
            stored = self.tensors.get(name)
            if stored is None or stored.path.name != shard:
                raise ShardError(f"{self.folder / shard}: has no tensor {name!r} "
                                 f"({index.name} places it there)")

    def read(self, name: str) -> torch.Tensor:
        """Tensor `name` in float32 (the packages' dtype), read from its file."""
        stored = self.tensors[name]
        raw = torch.empty(stored.nbytes, dtype=torch.uint8)
        with open(stored.path, "rb") as f:
            f.seek(stored.start)
            got = f.readinto(memoryview(raw.numpy()))
        if got != stored.nbytes:
            raise ShardError(f"{stored.path}: truncated while reading {name!r}")
        tensor = raw.view(DTYPES[stored.dtype]).reshape(stored.shape)
        return tensor if tensor.dtype == torch.float32 else tensor.float()


@dataclass(frozen=True)
class LazySource:
    weights: FolderWeights
    name: str


def _stored_name(weights: FolderWeights, names: list[str], shape: torch.Size) -> str:
    """The stored name of a tensor known in the module by `names` (a tied parameter has
    several), its stored shape checked against the module's."""
    for name in names:
        stored = weights.tensors.get(name)
        if stored is not None:
            if stored.shape != tuple(shape):
                raise ShardError(f"{stored.path}: tensor {name!r} has shape "
                                 f"{list(stored.shape)}, but "
                                 f"{weights.folder / 'config.json'} makes it {list(shape)}")
            return name
    raise ShardError(f"{weights.folder}: no tensor {names[0]!r} in its safetensors files")


def empty_component(build: Callable[[], nn.Module], folder: Path) -> nn.Module:
    """`build()` run without storage for parameters, each parameter told where its bytes are
    in `folder`; persistent buffers are read now. Refused (ShardError) when a tensor the
    module has is missing from the folder or stored in another shape."""
    from accelerate import init_empty_weights

    weights = FolderWeights(folder)
    with init_empty_weights(include_buffers=False):
        module = build().eval()
    if hasattr(module, "tie_weights"):
        # transformers ties shared weights (T5's embeddings) in from_pretrained, not when a
        # model is built; tied inside init_empty_weights, a parameter would be copied
        module.tie_weights()
    names: dict[int, tuple[nn.Parameter, list[str]]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), (p, []))[1].append(name)
    for p, known_as in names.values():
        setattr(p, LAZY, LazySource(weights, _stored_name(weights, known_as, p.shape)))
    persistent = {n for n, _ in module.state_dict(keep_vars=True).items()}
    for name, buffer in list(module.named_buffers()):
        if name in persistent and name in weights.tensors:
            owner, _, attr = name.rpartition(".")
            stored = weights.read(_stored_name(weights, [name], buffer.shape))
            module.get_submodule(owner).register_buffer(attr, stored.to(buffer.dtype))
    return module


@dataclass
class Residency:
    """Bytes of read parameters held now and at most since `reset`: what an export out of
    core held of the model at once (tests check it is one block's)."""

    now: int = 0
    peak: int = 0

    def add(self, nbytes: int) -> None:
        self.now += nbytes
        self.peak = max(self.peak, self.now)

    def reset(self) -> None:
        self.peak = self.now


RESIDENCY = Residency()


@contextmanager
def materialized(module: nn.Module) -> Iterator[nn.Module]:
    """Within the `with`, `module`'s storage-less parameters hold their stored values
    (float32, read now); after it, the meta ones again, so the memory goes once nothing else
    refers to it. Nested or repeated on parameters already read, it reads nothing."""
    swapped: list[tuple[dict, str, nn.Parameter]] = []
    read: dict[int, nn.Parameter] = {}  # a tied parameter is read once
    try:
        for sub in module.modules():
            for attr, p in sub._parameters.items():
                source = getattr(p, LAZY, None)
                if source is None or not p.is_meta:
                    continue
                if id(p) not in read:
                    # a plan (shapes only): a CPU tensor of the shape, made fake, read nothing
                    value = (torch.empty(p.shape, dtype=torch.float32) if shapes_only.active()
                             else source.weights.read(source.name))
                    read[id(p)] = nn.Parameter(value, requires_grad=False)
                    RESIDENCY.add(read[id(p)].nbytes)
                swapped.append((sub._parameters, attr, p))
                sub._parameters[attr] = read[id(p)]
        yield module
    finally:
        for params, attr, meta in swapped:
            params[attr] = meta
        RESIDENCY.now -= sum(p.nbytes for p in read.values())
