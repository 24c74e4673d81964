"""Validation of a CoreML package on a machine where CoreML cannot predict (Linux).

Structural: each saved program's inputs and outputs (names, shapes, dtypes, read from its
spec; in a multifunction program, the function's) are the ones the manifest records, a
multifunction program holds exactly the functions the manifest names in it (the block's own
the default), and the blocks chain: every input is an input of the component or an output
of an earlier block with the same shape and dtype, and the components fit one another
(caption tokens, latents, frames).

Numeric: each program's weights, read back out of the `.mlpackage` and decompressed
(edge.exporters.iphone.coreml.weights), run in the PyTorch reference block on its example inputs and
are compared with the fp32 block (max-abs error); end to end, the whole pipeline with those weights
renders the validation prompt and is compared with fp32 PyTorch (PSNR). This measures what weight
compression costs. It does not measure fp16 activation arithmetic on the device, which only a Mac or
an iPhone can run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from edge.core.manifest_schema import as_variant
from edge.core.tiles import Tiling
from edge.exporters.iphone.compression import Compression, compression
from edge.exporters.iphone.coreml.weights import (
    MAIN,
    import_coremltools,
    mil_constants,
    program_functions,
    read_parameters,
    tensor_sizes,
)
from edge.exporters.shared.validation import output_error
from edge.exporters.shared.weights_in_place import stored_video_check, weights_replaced
from edge.graph.blocks import Block
from edge.graph.family_model import FamilyModel

_DTYPES = {65568: "float32", 65552: "float16", 131104: "int32"}  # CoreML ArrayDataType


def program_interface(mlpackage: Path, function: str = MAIN) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of a saved program (of its function `function`) as {"name",
    "dtype", "shape"} records."""
    ct = import_coremltools()
    spec = ct.models.MLModel(str(mlpackage), skip_model_load=True).get_spec()
    functions = {f.name: f for f in spec.description.functions}
    if functions and function not in functions:
        raise ValueError(f"{mlpackage}: no function {function!r} (it has "
                         f"{', '.join(functions)})")
    described = functions.get(function, spec.description)

    def records(features) -> list[dict]:
        out = []
        for f in features:
            array = f.type.multiArrayType
            out.append({"name": f.name, "dtype": _DTYPES.get(array.dataType, str(array.dataType)),
                        "shape": [int(d) for d in array.shape]})
        return out

    return records(described.input), records(described.output)


def _interface_problems(root: Path, where: str, record: dict, block: dict,
                        prefix: str) -> list[str]:
    try:
        inputs, outputs = program_interface(root / record["model"],
                                            record.get("function", MAIN))
    except ValueError as err:
        return [f"{where}: {err}"]
    want_out = [{**s, "name": prefix + s["name"]} for s in block["outputs"]]
    problems = []
    if inputs != block["inputs"]:
        problems.append(f"{where}: program inputs {inputs} differ from the manifest's "
                        f"{block['inputs']}")
    # output shapes are not always inferred into the spec; names must match, shapes when known
    if [o["name"] for o in outputs] != [o["name"] for o in want_out]:
        problems.append(f"{where}: program outputs {[o['name'] for o in outputs]} differ from "
                        f"the manifest's {[o['name'] for o in want_out]}")
    for got, want in zip(outputs, want_out, strict=False):
        if got["shape"] and got["shape"] != want["shape"]:
            problems.append(f"{where}: output {want['name']} has shape {got['shape']}, the "
                            f"manifest says {want['shape']}")
    return problems


def _function_problems(root: Path, where: str, block: dict) -> list[str]:
    """A program's functions are the ones the manifest names in it, its default the
    block's own."""
    named: dict[str, list[str]] = {}   # model -> functions the manifest runs in it
    for record in [block, *block.get("variants", {}).values()]:
        named.setdefault(record["model"], []).append(record.get("function", MAIN))
    problems = []
    for model, want in named.items():
        have, default = program_functions(root / model)
        if sorted(have) != sorted(want):
            problems.append(f"{where}: {model} holds functions {sorted(have)}, the manifest "
                            f"names {sorted(want)}")
        elif default != want[0]:
            problems.append(f"{where}: {model}'s default function is {default!r}, not the "
                            f"block's {want[0]!r}")
    return problems


def _chain_problems(name: str, blocks: list[dict], carried: set[str] = frozenset()
                    ) -> tuple[list[str], dict[str, dict]]:
    """Problems of one component's chain, and every tensor it ends up with by name.
    `carried`: state a chunked component's blocks give back to themselves on the next piece
    (an input of the chain without an earlier block giving it)."""
    problems: list[str] = []
    available = {s["name"]: s for s in blocks[0]["inputs"]}
    for block in blocks:
        where = f"block {name}/{block['name']}"
        for s in block["inputs"]:
            if s["name"] in carried:
                continue
            have = available.get(s["name"])
            if have is None:
                problems.append(f"{where}: input {s['name']!r} is neither a component input "
                                "nor an earlier block's output")
            elif (have["shape"], have["dtype"]) != (s["shape"], s["dtype"]):
                problems.append(f"{where}: input {s['name']} is {s['dtype']} {s['shape']} but "
                                f"arrives as {have['dtype']} {have['shape']}")
        available |= {s["name"]: s for s in block["outputs"]}
    return problems, available


def check_structure(root: Path, manifest: dict) -> list[str]:
    """Every mismatch between the saved programs, the manifest and the block chain."""
    prefix = manifest["coreml"]["output_prefix"]
    problems: list[str] = []
    tensors: dict[str, dict[str, dict]] = {}
    for comp in manifest["components"]:
        for block in comp["blocks"]:
            where = f"block {comp['name']}/{block['name']}"
            problems += _interface_problems(root, where, block, block, prefix)
            for vname, variant in block.get("variants", {}).items():
                problems += _interface_problems(root, f"{where} variant {vname}", variant,
                                                as_variant(block, vname), prefix)
            problems += _function_problems(root, where, block)
        carried = set(comp.get("chunked", {}).get("state", []))
        found, tensors[comp["name"]] = _chain_problems(comp["name"], comp["blocks"], carried)
        problems += found
    if set(tensors) != {"text_encoder", "transformer", "vae_decoder"}:
        return problems  # a partial export (tests): nothing to link across components
    latent = list(manifest["latent_shape"])
    tokens = manifest["tokenizer"]["max_tokens"]
    text, dit, vae = (tensors[k] for k in ("text_encoder", "transformer", "vae_decoder"))
    decoder = next(comp for comp in manifest["components"] if comp["name"] == "vae_decoder")
    if manifest.get("latent_layout", "frames") == "frames":  # (frames, C, h, w) per call
        c, t, h, w = latent
        z_link = ("latent frames -> vae_decoder z", [t, c, h, w], vae["z"]["shape"])
    else:  # diffusers' layout of one video, cut where the decoder is chunked (a later piece)
        z = [1, *latent]
        if "chunked" in decoder:
            z[decoder["chunked"]["axis"]] = decoder["chunked"]["size"]
        if "tiles" in decoder:  # its programs take the first tile; the others are variants
            z[-2:] = Tiling.from_dict(decoder["tiles"]).tile_sizes(*latent[-2:])[0]
        z_link = ("latents (one video) -> vae_decoder z", z, vae["z"]["shape"])
    links = [  # (what, got, want): shapes that must agree across components
        ("text_encoder hidden -> transformer caption (one prompt + null caption)",
         [2 * d if i == 0 else d for i, d in enumerate(text["hidden"]["shape"])],
         dit["caption"]["shape"]),
        ("tokenizer max_tokens -> text_encoder input_ids", tokens,
         text["input_ids"]["shape"][1]),
        ("latent_shape -> transformer latent", latent, dit["latent"]["shape"][1:]),
        ("transformer velocity -> latent", dit["velocity"]["shape"], dit["latent"]["shape"]),
        z_link,
    ]
    problems += [f"{what}: {got} vs {want}" for what, got, want in links if got != want]
    return problems


@torch.no_grad()
def block_numerics(mlpackage: Path, module: nn.Module, block: Block,
                   reference: tuple[torch.Tensor, ...], function: str = MAIN,
                   tensors: dict[str, int] | None = None) -> dict:
    """The weights stored in the program (its function `function`) run in the PyTorch block
    against fp32 `reference`. `tensors`: updated with the distinct tensors the function
    stores (edge.exporters.iphone.coreml.weights.tensor_sizes)."""
    params = {n: p.detach() for n, p in module.named_parameters()}
    constants = mil_constants(mlpackage, function)
    if tensors is not None:
        tensors.update(tensor_sizes(constants))
    stored, how = read_parameters(mlpackage, params, function, constants)
    weight_error = max((float((stored[n] - p).abs().max()) for n, p in params.items()),
                       default=0.0)
    out = torch.func.functional_call(module, stored, block.example)
    out = out if isinstance(out, tuple) else (out,)
    return {**output_error([o.numpy() for o in out], reference),
            "weights_max_abs_error": weight_error, "weights_found": how}


def load_stored_weights(components: dict[str, list[Block]], root: Path,
                        manifest: dict) -> None:
    """Overwrite the parameters of the exported blocks (`components`, which share them with
    their family's model) with the ones stored in the package's programs, in place, so the
    model runs as the package would without a second copy of it; a parameter two blocks
    share is written once."""
    records = {f"{c['name']}/{r['name']}": r for c in manifest["components"]
               for r in c["blocks"]}
    written: set[int] = set()
    for blocks in components.values():
        for block in blocks:
            record = records[block.key]
            params = {n: p for n, p in block.module.named_parameters()
                      if id(p) not in written}
            stored, _ = read_parameters(root / record["model"],
                                        {n: p.detach() for n, p in params.items()},
                                        record.get("function", MAIN))
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(stored[n])
                    written.add(id(p))


def stored_weights_in_place(components: dict[str, list[Block]], root: Path, manifest: dict):
    """The model with the package's stored weights for the duration of the block (its own
    restored after)."""
    return weights_replaced(components, lambda c: load_stored_weights(c, root, manifest))


def end_to_end_check(model: FamilyModel, quantize: str | Compression, seed: int = 0,
                     steps: int | None = None,
                     on_step: Callable[[int, int], None] | None = None
                     ) -> Callable[[Path, dict, dict], dict]:
    """A check for `export_coreml`: PSNR of the family's reference video rendered with the
    package's stored weights against the same reference in fp32 (diffusers' own pipeline for
    a diffusers folder), on a fixed prompt and seed; fails under the setting's floor
    (`Compression.psnr_floor_db`). The check is given the exported blocks, which share the model's
    parameters: the stored weights replace them for the second render, then are undone.
    `on_step(done, total)`: both renders' steps."""

    setting = compression(quantize, model)   # a bad setting is refused before any render
    floor = setting.psnr_floor_db

    def check(root: Path, manifest: dict, components: dict[str, list[Block]]) -> dict:
        return stored_video_check(
            model, components, lambda c: load_stored_weights(c, root, manifest), floor,
            f"the package's {setting.setting} weights", "stored weights in fp32 PyTorch",
            seed, steps, on_step)

    return check
