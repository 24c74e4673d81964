"""Agreement between a package's manifest and the graphs it ships, checked when sessions are
created and before any block runs.

The manifest's structure is checked alone (edge/core/manifest_schema.py) and its files by size and
sha256 (edge/core/package.py); neither proves that the signatures it declares are the graphs'. A
manifest whose tensor table, inputs or outputs disagree with its graphs (a faulty exporter,
or a manifest edited and re-stamped) would otherwise fail inside onnxruntime in the middle of
a generation. Here each block's declared weights and activations are compared with its
graph's inputs and outputs, each block's inputs with what feeds them (the runtime's own feeds
or an earlier block's declared outputs), and the refusal names the block and the tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from edge.core.manifest_schema import (
    DYNAMIC_AXES,
    MANIFEST,
    TILE_AXES,
    PackageError,
    as_variant,
    fed_as,
)
from edge.core.pieces import piece_bounds

# NumPy dtype names of the manifest -> onnxruntime's type strings
ORT_TYPES = {"float32": "tensor(float)", "float16": "tensor(float16)",
             "int64": "tensor(int64)", "int32": "tensor(int32)", "int8": "tensor(int8)",
             "uint8": "tensor(uint8)", "bool": "tensor(bool)"}
BATCH = "batch"


def _dims_agree(declared: list, actual: Iterable[Any]) -> bool:
    """A declared shape (sizes, or "batch", "height", "width" for dynamic axes) agrees with
    a graph's (sizes, or names/None for dynamic axes): same rank, equal wherever both are
    sizes, a dynamic axis declared only where the graph's axis is dynamic."""
    actual = list(actual)
    if len(declared) != len(actual):
        return False
    for d, a in zip(declared, actual, strict=True):
        fixed = isinstance(a, int)
        if d in DYNAMIC_AXES and fixed:
            return False
        if d not in DYNAMIC_AXES and fixed and d != a:
            return False
    return True


def _check_args(where: str, what: str, declared: Mapping[str, tuple[str, list]],
                graph_args: Mapping[str, Any]) -> None:
    for name, (dtype, shape) in declared.items():
        arg = graph_args.get(name)
        if arg is None:
            raise PackageError(f"{where}: {what} {name!r} is not in the block's graph")
        if ORT_TYPES.get(dtype) != arg.type:
            raise PackageError(f"{where}: {what} {name!r} is {dtype} in {MANIFEST} but "
                               f"{arg.type} in the graph")
        if not _dims_agree(shape, arg.shape):
            raise PackageError(f"{where}: {what} {name!r} has shape {shape} in {MANIFEST} but "
                               f"{arg.shape} in the graph")


def check_block_graph(where: str, block: dict, session: Any) -> None:
    """The block's weights and inputs are exactly its graph's inputs, and its outputs are
    among the graph's outputs (named `out:<name>`), with the declared dtypes and shapes."""
    tensors = {t["name"]: fed_as(t) for t in block["weights"]["tensors"]}
    inputs = {s["name"]: (s["dtype"], s["shape"]) for s in block["inputs"]}
    clash = sorted(set(tensors) & set(inputs))
    if clash:
        raise PackageError(f"{where}: {clash[0]!r} is both a weight and an activation input")
    graph_inputs = {a.name: a for a in session.get_inputs()}
    unfed = sorted(set(graph_inputs) - set(tensors) - set(inputs))
    if unfed:
        raise PackageError(f"{where}: the graph needs input {unfed[0]!r}, which {MANIFEST} "
                           "lists neither as a weight nor as an input")
    _check_args(where, "weight", tensors, graph_inputs)
    _check_args(where, "input", inputs, graph_inputs)
    outputs = {f"out:{s['name']}": (s["dtype"], s["shape"]) for s in block["outputs"]}
    _check_args(where, "output", outputs, {a.name: a for a in session.get_outputs()})


def check_feeds(component: str, blocks: list[dict], given: Mapping[str, tuple[str, list]]
                ) -> None:
    """Each block input agrees with what feeds it: `given` (the runtime's inputs of the
    component, "batch" for the batch axis) or the latest earlier block's declared output."""
    available = dict(given)
    for block in blocks:
        where = f"{MANIFEST} block {component}/{block['name']}"
        for s in block["inputs"]:
            source = available.get(s["name"])
            if source is None:
                continue  # a gap; check_chain refuses it by name
            dtype, shape = source
            if dtype != s["dtype"] or not _fed_shape_fits(s["shape"], shape):
                raise PackageError(f"{where}: input {s['name']!r} is declared {s['dtype']} "
                                   f"{s['shape']}, but what feeds it is {dtype} {list(shape)}")
        available |= {s["name"]: (s["dtype"], s["shape"]) for s in block["outputs"]}


def _fed_shape_fits(declared: list, fed: list) -> bool:
    """What feeds an input fits its declared shape: the same dims, where the input's is not
    one it takes at any size."""
    return len(declared) == len(fed) and all(
        d == f or d in TILE_AXES for d, f in zip(declared, fed, strict=True))


def _outputs(blocks: list[dict]) -> dict[str, tuple[str, list]]:
    return {s["name"]: (s["dtype"], list(s["shape"])) for b in blocks for s in b["outputs"]}


def check_chunked_feeds(comp: dict, given: Mapping[str, tuple[str, list]]) -> None:
    """A chunked component's feeds: its input cut into pieces; the first piece's chain (the
    first variants) fed by the piece, the later pieces' chain by the piece and the state the
    piece before gave, which must have one shape whichever chain gave it."""
    spec, name = comp["chunked"], comp["name"]
    dtype, shape = given[spec["input"]]
    axis, size = spec["axis"], spec["size"]
    first_size = spec.get("first_size", size)
    if axis >= len(shape) or shape[axis] == BATCH:
        raise PackageError(f"{MANIFEST} component {name} chunked: axis {axis} of "
                           f"{spec['input']!r} {list(shape)} cannot be cut")
    try:
        bounds = piece_bounds(shape[axis], size, first_size)
    except ValueError as err:
        raise PackageError(f"{MANIFEST} component {name} chunked: axis {axis} of "
                           f"{spec['input']!r} {list(shape)}: {err}") from None

    def piece(length: int) -> dict:
        return {spec["input"]: (dtype, [*shape[:axis], length, *shape[axis + 1:]])}

    firsts = [as_variant(b, spec.get("first_variant")) for b in comp["blocks"]]
    check_feeds(name, firsts, dict(given) | piece(first_size))
    if len(bounds) == 1:  # no later piece runs: its graphs were traced on a stand-in
        return
    first_state = {n: s for n, s in _outputs(firsts).items() if n in spec["state"]}
    check_feeds(name, comp["blocks"], dict(given) | piece(size) | first_state)
    for n, s in _outputs(comp["blocks"]).items():
        if n in first_state and s != first_state[n]:
            raise PackageError(f"{MANIFEST} component {name}: state {n!r} is {s[0]} {s[1]} "
                               f"after a later piece but {first_state[n][0]} "
                               f"{first_state[n][1]} after the first")


def check_runtime_feeds(manifest: dict, null_caption: Any) -> None:
    """The Python runtime's feeds (token ids of `max_tokens`, latents of `latent_shape`, the
    null caption) agree with what the blocks declare, and the text encoder's output with the
    caption the transformer takes."""
    tokens = manifest["tokenizer"]["max_tokens"]
    c, _, h, w = manifest["latent_shape"]
    if null_caption is not None:
        if str(null_caption.dtype) != "float32" or null_caption.ndim != 2:
            raise PackageError(f"{MANIFEST} conditioning.null_caption: must be a float32 "
                               f"matrix (tokens x width), is {null_caption.dtype} "
                               f"{null_caption.shape}")
        bad = int(null_caption.size - np.isfinite(null_caption).sum())
        if bad:  # else every video would come back NaN
            raise PackageError(f"{MANIFEST} conditioning.null_caption: {bad} of its "
                               f"{null_caption.size} values are not finite (NaN or "
                               "infinity); re-export the package")
        caption = [BATCH, *null_caption.shape]
    else:  # the unconditional caption is encoded like the prompt: as wide as the encoder says
        encoded = {s["name"]: s for comp in manifest["components"]
                   if comp["name"] == "text_encoder" for b in comp["blocks"]
                   for s in b["outputs"]}
        width = encoded["hidden"]["shape"][-1] if "hidden" in encoded else None
        caption = [BATCH, tokens, width]
    z = ([BATCH, *manifest["latent_shape"]] if manifest.get("latent_layout") == "video"
         else [BATCH, c, h, w])
    given = {
        "text_encoder": {"input_ids": ("int64", [BATCH, tokens]),
                         "attention_mask": ("int64", [BATCH, tokens])},
        "transformer": {"latent": ("float32", [BATCH, *manifest["latent_shape"]]),
                        "t": ("float32", [BATCH]), "caption": ("float32", caption),
                        "caption_mask": ("int64", [BATCH, tokens])},
        "vae_decoder": {"z": ("float32", z)},
    }
    made = {}
    for comp in manifest["components"]:
        if comp["name"] in given and "chunked" in comp:
            check_chunked_feeds(comp, given[comp["name"]])
        elif comp["name"] in given:
            check_feeds(comp["name"], comp["blocks"], given[comp["name"]])
        made[comp["name"]] = _outputs(comp["blocks"])
    takes = {"text_encoder": ("hidden", ("float32", caption)),
             "transformer": ("velocity", ("float32", [BATCH, *manifest["latent_shape"]]))}
    for comp, (name, want) in takes.items():
        got = made.get(comp, {}).get(name)
        if got is not None and got != want:
            raise PackageError(f"{MANIFEST} component {comp}: output {name!r} is declared "
                               f"{got[0]} {got[1]}, the runtime needs {want[0]} {want[1]}")
