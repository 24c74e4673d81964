"""LoRA adapters fused into a diffusers family's transformer before it is cut.

`edge export --model FOLDER --lora FILE[:SCALE]` takes the adapter files diffusers'
`load_lora_weights` reads for the family's pipeline (diffusers' own format and the formats
its loaders convert), fuses each at its scale into the transformer's weights, then drops the
adapter layers: the blocks are cut from plain weights, so every target's graphs and
weight files are the adapted model's and the package runs at no extra cost. The reference
an export is checked against is the same pipeline with the same adapters.

Checked before any export work: the scale (a finite number), the file (missing, not a
file, a link loop, a truncated or altered safetensors header), its sizes from the header
alone before a byte of it is read (no rank above the transformer's widest layer, no more
bytes than twice the transformer's float32 weights: a sparse file cannot make the export
allocate gigabytes), then every adapter tensor against the module it adapts (the module
exists and is a linear layer, A's columns are its inputs, B's rows its outputs, A's rows are
B's columns) and its values (finite), the first that does not fit named with its file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from edge.core.package import sha256_of
from edge.families import FamilyError

# diffusers' converters turn a bias difference (Wan's `diff_b`) into a `lora_B.bias`
LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_B.bias")


@dataclass(frozen=True)
class Adapter:
    path: Path
    scale: float = 1.0

    @classmethod
    def parse(cls, spec: str | Adapter) -> Adapter:
        """`FILE` or `FILE:SCALE` (a path may hold colons: only a number after the last one
        is a scale)."""
        if isinstance(spec, Adapter):
            return spec
        head, _, tail = str(spec).rpartition(":")
        if head:
            try:
                scale = float(tail)
            except ValueError:
                return cls(Path(spec))
            if not math.isfinite(scale):
                raise FamilyError(f"--lora {spec}: the scale {tail} is not a finite number")
            return cls(Path(head), scale)
        return cls(Path(spec))

    def record(self) -> dict:
        """The manifest's entry: the file's name, its SHA-256 and the scale fused at."""
        return {"file": self.path.name, "sha256": sha256_of(self.path), "scale": self.scale}


def check_adapter_file(adapter: Adapter) -> None:
    """The file exists and is a whole safetensors file (its header against its size,
    `lazy_weights.read_header`, as the folders' shards are checked); refused naming it."""
    from edge.core.files import kind_of
    from edge.graph.lazy_weights import ShardError, read_header

    kind = kind_of(adapter.path)
    if kind == "missing":
        raise FamilyError(f"--lora {adapter.path}: no such file")
    if kind != "a file":  # a link loop, a broken link, a folder, a FIFO...
        raise FamilyError(f"--lora {adapter.path}: is {kind}, not a LoRA file")
    try:
        tensors = read_header(adapter.path)
    except ShardError as err:
        raise FamilyError(f"--lora {err}") from None
    if not tensors:
        raise FamilyError(f"--lora {adapter.path}: holds no tensors")


# the down projection's names in diffusers' and PEFT's format and in kohya's: its rows are
# the rank
_DOWN_SUFFIXES = (".lora_A.weight", ".lora_down.weight")


def check_adapter_sizes(adapter: Adapter, transformer) -> None:
    """From the file's header alone, before diffusers reads a byte of it: no adapter rank
    above the transformer's widest linear layer (a LoRA of higher rank than its layer adds
    nothing a full weight would not), and no more bytes than twice the transformer's float32
    weights (a full-rank A and B of every layer)."""
    from edge.graph.lazy_weights import read_header

    tensors = read_header(adapter.path)
    widest = max((max(m.in_features, m.out_features) for m in transformer.modules()
                  if hasattr(m, "in_features") and hasattr(m, "out_features")), default=0)
    for name, tensor in sorted(tensors.items()):
        if name.endswith(_DOWN_SUFFIXES) and tensor.shape and tensor.shape[0] > widest:
            raise FamilyError(f"--lora {adapter.path}: tensor {name!r} has rank "
                              f"{tensor.shape[0]}; the transformer's widest linear layer has "
                              f"{widest} features (a LoRA for another model?)")
    most = 2 * 4 * sum(p.numel() for p in transformer.parameters())
    total = sum(t.nbytes for t in tensors.values())
    if total > most:
        raise FamilyError(f"--lora {adapter.path}: holds {total:,} bytes of tensors, more than "
                          f"twice the transformer's float32 weights ({most // 2:,} bytes): not "
                          "a LoRA for this model")


def _check_finite(adapter: Adapter, state: dict) -> None:
    import torch

    for key, tensor in state.items():
        if torch.is_tensor(tensor) and tensor.is_floating_point() \
                and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise FamilyError(f"--lora {adapter.path}: tensor {key!r} holds {bad} NaN or "
                              "infinite values; fused, they would make every video NaN")


def _check_fits(adapter: Adapter, state: dict, transformer) -> None:
    """Every adapter tensor against the transformer module it adapts."""
    modules = dict(transformer.named_modules())
    for key in state:
        if not key.startswith("transformer.") or not key.endswith(LORA_SUFFIXES):
            raise FamilyError(f"--lora {adapter.path}: tensor {key!r} adapts no "
                              "transformer linear layer (a LoRA for another family?)")
    layers = sorted({k.removeprefix("transformer.").rsplit(".lora_", 1)[0] for k in state})
    for name in layers:
        module = modules.get(name)
        if module is None or not hasattr(module, "in_features"):
            first = min(k for k in state if k.startswith(f"transformer.{name}.lora_"))
            raise FamilyError(f"--lora {adapter.path}: tensor {first!r}: the transformer has "
                              f"no linear layer {name!r} (a LoRA for another family or "
                              "model?)")
        tensors = {part: state.get(f"transformer.{name}.{part}")
                   for part in ("lora_A.weight", "lora_B.weight", "lora_B.bias")}
        down = tensors["lora_A.weight"]
        if down is None or tensors["lora_B.weight"] is None:
            raise FamilyError(f"--lora {adapter.path}: {name!r} has only one of its "
                              "lora_A and lora_B tensors")
        want = {"lora_A.weight": (down.shape[0], module.in_features),
                "lora_B.weight": (module.out_features, down.shape[0]),
                "lora_B.bias": (module.out_features,)}
        for part, tensor in tensors.items():
            if tensor is not None and tuple(tensor.shape) != want[part]:
                raise FamilyError(
                    f"--lora {adapter.path}: tensor 'transformer.{name}.{part}' has "
                    f"shape {list(tensor.shape)}; {name} ({module.in_features} -> "
                    f"{module.out_features}) at rank {down.shape[0]} takes "
                    f"{list(want[part])} (a LoRA for another base size?)")


def fuse_adapters(pipe, adapters: list[Adapter]) -> list[dict]:
    """Fuse each adapter at its scale into `pipe`'s transformer, then drop the adapter
    layers; the manifest's records. Refused naming the file: one that does not fit."""
    for i, adapter in enumerate(adapters):
        check_adapter_sizes(adapter, pipe.transformer)
        try:
            state = pipe.lora_state_dict(str(adapter.path))
        except KeyError as err:  # a converter looking for a key of its own format
            raise FamilyError(f"--lora {adapter.path}: its tensor names are not those of a "
                              f"{type(pipe).__name__} LoRA (diffusers' converter looked for "
                              f"{str(err)[:120]}): a LoRA for another model?") from None
        except (OSError, ValueError, RuntimeError) as err:
            raise FamilyError(f"--lora {adapter.path}: diffusers cannot read it as a "
                              f"{type(pipe).__name__} LoRA: {str(err).strip()[:300]}") from None
        state = state[0] if isinstance(state, tuple) else state
        _check_fits(adapter, state, pipe.transformer)
        _check_finite(adapter, state)
        pipe.load_lora_weights(str(adapter.path), adapter_name=f"edge_{i}")
        pipe.fuse_lora(components=["transformer"], lora_scale=adapter.scale,
                       adapter_names=[f"edge_{i}"])
        pipe.unload_lora_weights()   # the fused weights stay; the adapter layers go
    return [a.record() for a in adapters]
