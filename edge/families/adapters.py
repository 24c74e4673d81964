"""LoRA adapters fused into a diffusers family's transformer before it is cut.

`edge export --model FOLDER --lora FILE[:SCALE]` takes the adapter files diffusers'
`load_lora_weights` reads for the family's pipeline (diffusers' own format and the formats
its loaders convert), fuses each at its scale into the transformer's weights, then drops the
adapter layers: the blocks are cut from plain weights, so every target's graphs and
weight files are the adapted model's and the package runs at no extra cost. The reference
an export is checked against is the same pipeline with the same adapters.

Checked before any export work: the file (missing, not a file, a truncated or altered
safetensors header), then every adapter tensor against the module it adapts (the module
exists and is a linear layer, A's columns are its inputs, B's rows its outputs, A's rows are
B's columns), the first that does not fit named with its file.
"""

from __future__ import annotations

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
                return cls(Path(head), float(tail))
            except ValueError:
                pass
        return cls(Path(spec))

    def record(self) -> dict:
        """The manifest's entry: the file's name, its SHA-256 and the scale fused at."""
        return {"file": self.path.name, "sha256": sha256_of(self.path), "scale": self.scale}


def check_adapter_file(adapter: Adapter) -> None:
    """The file exists and is a whole safetensors file (its header against its size,
    `lazy_weights.read_header`, as the folders' shards are checked); refused naming it."""
    from edge.graph.lazy_weights import ShardError, read_header

    if not adapter.path.exists():
        raise FamilyError(f"--lora {adapter.path}: no such file")
    try:
        tensors = read_header(adapter.path)
    except ShardError as err:
        raise FamilyError(f"--lora {err}") from None
    if not tensors:
        raise FamilyError(f"--lora {adapter.path}: holds no tensors")


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
        try:
            state = pipe.lora_state_dict(str(adapter.path))
        except (OSError, ValueError, KeyError, RuntimeError) as err:
            raise FamilyError(f"--lora {adapter.path}: diffusers cannot read it as a "
                              f"{type(pipe).__name__} LoRA: {str(err).strip()[:300]}") from None
        state = state[0] if isinstance(state, tuple) else state
        _check_fits(adapter, state, pipe.transformer)
        pipe.load_lora_weights(str(adapter.path), adapter_name=f"edge_{i}")
        pipe.fuse_lora(components=["transformer"], lora_scale=adapter.scale,
                       adapter_names=[f"edge_{i}"])
        pipe.unload_lora_weights()   # the fused weights stay; the adapter layers go
    return [a.record() for a in adapters]
