"""Structure checks of an edge package's manifest, before any file is opened.

`check_manifest` walks the parsed JSON and raises `PackageError` naming the field and the
problem: wrong types, an unknown format version or target, duplicate names, file records that
disagree with each other or with the tensor tables, and blocks that do not chain (a block's
input must be an input of its component or an output of an earlier block). Everything here is
about the JSON alone; edge/core/package.py checks the files on disk. Unknown extra fields are
ignored, so a package may carry fields a later edge adds within one format version.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Collection, Iterator, Sequence
from pathlib import PurePosixPath
from typing import Any

MANIFEST = "manifest.json"
FORMAT = "edge-package"
FORMAT_VERSION = 1
TARGETS = ("onnx", "iphone", "web")
TENSOR_ALIGN = 64          # tensors start 64-byte aligned in a weights file
DIGEST_FIELD = "manifest_sha256"
# the names a signature gives a dynamic axis: a batch, and a tiled decoder's tile height and
# width (any size the graph takes, whatever size feeds them)
TILE_AXES = ("height", "width")
DYNAMIC_AXES = ("batch", *TILE_AXES)
# dtypes a weights file or an activation may hold (NumPy names, little-endian on disk)
DTYPES = {"float32": 4, "float16": 2, "int64": 8, "int32": 4, "int8": 1, "uint8": 1,
          "bool": 1}
# a weights file's tables also hold int4 (a web package's `--quantize 4`): two a byte
WEIGHT_DTYPES = DTYPES | {"int4": 0.5}
_SHA256 = re.compile(r"[0-9a-f]{64}")


class PackageError(ValueError):
    """A package that must not run; the message names the file and the problem."""


def _type_name(kind: type | tuple[type, ...]) -> str:
    return "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))


def _json_type(value: Any) -> str:
    return type(value).__name__


def require(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """`obj[key]`, refusing a missing key or a value of another JSON type (booleans are not
    integers here, though Python says they are)."""
    if not isinstance(obj, dict):
        raise PackageError(f"{where}: must be an object, got {_json_type(obj)}")
    if key not in obj:
        raise PackageError(f"{where}: missing field {key!r}")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise PackageError(f"{where}: field {key!r} must be {_type_name(kind)}, got "
                           f"{_json_type(value)}")
    return value


def _count(obj: dict, key: str, where: str, minimum: int = 0) -> int:
    value = require(obj, key, int, where)
    if value < minimum:
        raise PackageError(f"{where}: field {key!r} is {value}, must be at least {minimum}")
    return value


def _items(obj: dict, key: str, where: str) -> list:
    return require(obj, key, list, where)


def check_relative_path(path: str, where: str) -> None:
    """A package path: relative, POSIX, no `..` and no empty or `.` segments."""
    parts = path.split("/")
    if (not path or path.startswith("/") or "\\" in path or "\0" in path
            or PurePosixPath(path).is_absolute() or re.match(r"[A-Za-z]:", path)
            or any(p in ("", ".", "..") for p in parts)):
        raise PackageError(f"{where}: file path {path!r} escapes the package folder or is "
                           "not a plain relative path")


def check_file_record(record: Any, where: str) -> None:
    check_relative_path(require(record, "path", str, where), where)
    _count(record, "bytes", where)
    digest = require(record, "sha256", str, where)
    if not _SHA256.fullmatch(digest):
        raise PackageError(f"{where}: field 'sha256' is not a lowercase sha256 hex digest")


def iter_file_records(manifest: dict) -> Iterator[tuple[str, Any]]:
    """Every file record in the manifest, with where it sits (for error messages)."""
    tok = require(manifest, "tokenizer", dict, MANIFEST)
    for i, f in enumerate(_items(tok, "files", f"{MANIFEST} tokenizer")):
        yield f"{MANIFEST} tokenizer.files[{i}]", f
    for name, f in require(manifest, "conditioning", dict, MANIFEST).items():
        yield f"{MANIFEST} conditioning.{name}", f
    for i, f in enumerate(manifest.get("files", [])):  # optional: further files of a target
        yield f"{MANIFEST} files[{i}]", f
    for comp in _items(manifest, "components", MANIFEST):
        cname = require(comp, "name", str, f"{MANIFEST} components[]")
        for block in _items(comp, "blocks", f"{MANIFEST} component {cname}"):
            bname = require(block, "name", str, f"{MANIFEST} component {cname} blocks[]")
            where = f"{MANIFEST} block {cname}/{bname}"
            for i, f in enumerate(_items(block, "files", where)):
                yield f"{where} files[{i}]", f


def _check_files(manifest: dict) -> dict[str, dict]:
    """Every file record well formed; one path listed twice must agree. Returns path ->
    record."""
    if "files" in manifest:
        require(manifest, "files", list, MANIFEST)
    seen: dict[str, tuple[str, dict]] = {}
    for where, record in iter_file_records(manifest):
        check_file_record(record, where)
        earlier = seen.setdefault(record["path"], (where, record))
        if (earlier[1]["bytes"], earlier[1]["sha256"]) != (record["bytes"], record["sha256"]):
            raise PackageError(f"{where}: {record['path']!r} is also listed by {earlier[0]} "
                               "with another size or sha256")
    return {path: record for path, (_, record) in seen.items()}


def _check_signature(items: Any, where: str) -> list[str]:
    names = []
    for i, s in enumerate(items):
        at = f"{where}[{i}]"
        names.append(require(s, "name", str, at))
        dtype = require(s, "dtype", str, at)
        if dtype not in DTYPES:
            raise PackageError(f"{at}: unknown dtype {dtype!r}")
        for d in require(s, "shape", list, at):
            if not (d in DYNAMIC_AXES
                    or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)):
                raise PackageError(f"{at}: shape entry {d!r} must be a size, \"batch\", "
                                   "\"height\" or \"width\"")
    if len(set(names)) != len(names):
        raise PackageError(f"{where}: a name appears twice")
    return names


def _check_weights(block: dict, files: dict[str, dict], where: str) -> None:
    weights = require(block, "weights", dict, where)
    path = require(weights, "path", str, f"{where} weights")
    listed = {f["path"] for f in block["files"]}
    if path not in listed:
        raise PackageError(f"{where}: weights file {path!r} is not one of the block's files")
    # web packages split a large block's weights into shards (`shards`, the first being
    # `path`); tensor offsets then index the shards' concatenation
    shards = require(weights, "shards", list, f"{where} weights") if "shards" in weights \
        else [path]
    if not shards or shards[0] != path or any(s not in listed for s in shards):
        raise PackageError(f"{where} weights: shards {shards!r} must start with {path!r} and "
                           "all be files of the block")
    size = sum(files[s]["bytes"] for s in shards)
    names, spans = set(), []
    for i, t in enumerate(require(weights, "tensors", list, f"{where} weights")):
        at = f"{where} weights.tensors[{i}]"
        name = require(t, "name", str, at)
        if name in names:
            raise PackageError(f"{at}: tensor {name!r} appears twice")
        names.add(name)
        dtype = require(t, "dtype", str, at)
        if dtype not in WEIGHT_DTYPES:
            raise PackageError(f"{at}: unknown dtype {dtype!r}")
        shape = require(t, "shape", list, at)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise PackageError(f"{at}: shape {shape!r} must be a list of sizes")
        offset, nbytes = _count(t, "offset", at), _count(t, "bytes", at)
        if nbytes != math.prod(shape) * WEIGHT_DTYPES[dtype]:
            raise PackageError(f"{at}: {nbytes} bytes disagree with shape {shape} of {dtype}")
        if offset + nbytes > size:
            raise PackageError(f"{at}: tensor {name!r} ends at byte {offset + nbytes}, beyond "
                               f"{path} ({size} bytes)")
        if offset % TENSOR_ALIGN:
            raise PackageError(f"{at}: tensor {name!r} starts at byte {offset}, not "
                               f"{TENSOR_ALIGN}-byte aligned")
        spans.append((offset, offset + nbytes, name))
    _check_scales(weights["tensors"], where)
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise PackageError(f"{where} weights: tensors {a!r} and {b!r} overlap in {path}")


def fed_as(tensor: dict) -> tuple[str, list[int]]:
    """The dtype and shape a weights table's tensor is fed to a graph as: as stored, but an
    int4 tensor as its packed bytes (uint8, one axis), which the graph unpacks."""
    if tensor["dtype"] == "int4":
        return "uint8", [tensor["bytes"]]
    return tensor["dtype"], tensor["shape"]


def _check_scales(tensors: list[dict], where: str) -> None:
    """A tensor stored as int8 or int4 (a web package's `--quantize 8` or `4`) names its
    scales' entry: an int8 tensor float32, one per row of its first axis; an int4 matrix
    float16, one per `group` inputs of each row."""
    by_name = {t["name"]: t for t in tensors}
    for t in tensors:
        at = f"{where} weights: tensor {t['name']!r}"
        if t["dtype"] == "int4" and "scale" not in t:
            raise PackageError(f"{at}: an int4 tensor needs its scales (`scale`)")
        if "scale" not in t:
            continue
        scale = by_name.get(require(t, "scale", str, at))
        if t["dtype"] == "int8" and t["shape"]:
            want, want_dtype = t["shape"][:1], "float32"
        elif t["dtype"] == "int4" and len(t["shape"]) == 2:
            group = _count(t, "group", at, minimum=1)
            if t["shape"][1] % group:
                raise PackageError(f"{at}: group {group} does not divide its rows of "
                                   f"{t['shape'][1]}")
            want, want_dtype = [t["shape"][0], t["shape"][1] // group], "float16"
        else:
            raise PackageError(f"{at}: only an int8 tensor of one or more axes or an int4 "
                               "matrix has a scale")
        if scale is None or scale["dtype"] != want_dtype or scale["shape"] != want:
            raise PackageError(f"{at}: its scale {t['scale']!r} must be a {want_dtype} tensor "
                               f"of the block of shape {want}")


def check_chain(name: str, blocks: list[dict], provided: set[str] | None = None) -> None:
    """Blocks pass tensors on by name: every input of a block must be an input of the
    component (`provided`; by default the first block's inputs) or an output of an earlier
    block. Refuses gaps (an input nothing produces) and cycles or misordering (an input only
    a later block produces)."""
    if not blocks:
        return
    names = [[s["name"] for s in b["inputs"]] for b in blocks]
    if provided is None:
        # The first block's inputs, bar those only a later block makes (a block that takes
        # and gives the same name, like a transformer pair's x, may still be first).
        own = {s["name"] for s in blocks[0]["outputs"]}
        later = {s["name"] for b in blocks[1:] for s in b["outputs"]}
        provided = set(names[0]) - (later - own)
    available = set(provided)
    for i, block in enumerate(blocks):
        where = f"{MANIFEST} block {name}/{block['name']}"
        for x in names[i]:
            if x in available:
                continue
            later = [b["name"] for b in blocks[i + 1:]
                     if x in (s["name"] for s in b["outputs"])]
            if later:
                raise PackageError(f"{where}: input {x!r} comes only from the later block "
                                   f"{name}/{later[0]} (blocks out of order or in a cycle)")
            raise PackageError(f"{where}: input {x!r} is neither an input of component "
                               f"{name!r} nor an output of an earlier block (a gap)")
        available |= {s["name"] for s in block["outputs"]}


def _check_block(block: dict, files: dict[str, dict], where: str) -> None:
    graph = require(block, "graph", str, where)
    if graph not in {f["path"] for f in block["files"]}:
        raise PackageError(f"{where}: graph {graph!r} is not one of the block's files")
    _check_weights(block, files, where)
    _check_signature(require(block, "inputs", list, where), f"{where} inputs")
    _check_signature(require(block, "outputs", list, where), f"{where} outputs")
    if not block["outputs"]:
        raise PackageError(f"{where}: a block must have at least one output")
    if "weight_bytes" in block:
        _count(block, "weight_bytes", where)
    _check_flops(block, where, block["inputs"])
    listed = {f["path"] for f in block["files"]}
    _check_wasm_graph(block, listed, where)
    variants = require(block, "variants", dict, where) if "variants" in block else {}
    for variant, record in variants.items():
        at = f"{where} variant {variant}"
        vgraph = require(record, "graph", str, at)
        if vgraph not in listed:  # so it is verified like every other file of the block
            raise PackageError(f"{at}: graph {vgraph!r} is not one of the block's files")
        _check_wasm_graph(record, listed, at)
        _check_flops(record, at, block["inputs"])
        # a variant may declare a signature of its own (same output names, other shapes)
        if "inputs" in record or "outputs" in record:
            _check_signature(require(record, "inputs", list, at), f"{at} inputs")
            names = _check_signature(require(record, "outputs", list, at), f"{at} outputs")
            if names != [o["name"] for o in block["outputs"]]:
                raise PackageError(f"{at}: outputs {names} are not the block's "
                                   f"{[o['name'] for o in block['outputs']]}")


def _check_flops(record: dict, where: str, inputs: list) -> None:
    """A block's (or variant's) optional `flops`: a count per row of the batch, and the input
    (one of `inputs`, the block's, or the variant's own where it declares them) whose first
    axis counts the rows, or null."""
    if "flops" not in record:
        return
    flops = require(record, "flops", dict, where)
    _count(flops, "per_row", f"{where} flops")
    rows = flops.get("rows_input")
    names = [s["name"] for s in record.get("inputs", inputs)]
    if rows is not None and rows not in names:
        raise PackageError(f"{where} flops: rows_input {rows!r} is not one of the inputs "
                           f"{names}")


# the variant of a transformer block at the caption's half of the guidance batch, for calls
# without guidance (a target of static shapes); `tdtm_unguided`: the merged variant's
UNGUIDED = "unguided"


def unguided_variant(variant: str | None) -> str:
    """The name of the caption-half form of `variant` (None: the block's own)."""
    return f"{variant}_{UNGUIDED}" if variant else UNGUIDED


TILE_VARIANT = re.compile(r"(?:^|_)tile_(\d+)x(\d+)$")


def tile_variant(variant: str | None, size: Sequence[int], base: Sequence[int]) -> str | None:
    """The variant a tile of `size` latent rows and columns runs for `variant` (None: the
    block's own; "first": a chunked decoder's first piece) in a package of static shapes,
    whose blocks were traced at the tile size `base`: `variant` itself at `base`, else its
    `tile_RxC` form (`first_tile_RxC`), a program of that tile's shape."""
    if tuple(size) == tuple(base):
        return variant
    tag = f"tile_{size[0]}x{size[1]}"
    return f"{variant}_{tag}" if variant else tag


def call_variant(merged: bool, alone: bool) -> str | None:
    """Which variant a transformer call runs: merged (TDTM) or not, and the caption's half
    alone (`alone`: an unguided call on a package with `unguided` variants)."""
    variant = "tdtm" if merged else None
    return unguided_variant(variant) if alone else variant


def block_variant(present: Collection[str], variant: str | None) -> str | None:
    """The variant one block runs for a call's `variant`, given the variants it has
    (`present`): merging applies where a block has a merged form (TDTM pairs; a prologue
    runs its own graph), the caption's half to every block: `tdtm` falls back to the
    block's own graph and `tdtm_unguided` to `unguided` where the block does not merge; any
    other variant must be there."""
    if variant is None or variant in present:
        return variant
    if variant == "tdtm":
        return None
    if variant == unguided_variant("tdtm") and UNGUIDED in present and "tdtm" not in present:
        return UNGUIDED
    raise KeyError(f"the block has no variant {variant!r} (it has: "
                   f"{', '.join(sorted(present)) or 'none'})")


def as_variant(block: dict, variant: str | None) -> dict:
    """The block's record as its variant `variant` runs: that graph (and program and
    function, in the layouts that have them), and the variant's own inputs and outputs
    where it declares them; None: the block itself."""
    if variant is None:
        return block
    record = block["variants"][variant]
    return block | {"graph": record["graph"]} | {
        k: record[k] for k in ("inputs", "outputs", "model", "function", "flops", "wasm")
        if k in record}


def _check_chunked(comp: dict, where: str) -> None:
    """A chunked component: the piece and the state named, every block with the first
    piece's variant; the later pieces' chain fed by the piece and the state, the first
    piece's by the piece alone, and every state tensor given back by the first piece."""
    spec = require(comp, "chunked", dict, where)
    at = f"{where} chunked"
    piece, output = require(spec, "input", str, at), require(spec, "output", str, at)
    _count(spec, "axis", at)
    _count(spec, "size", at, minimum=1)
    for optional, least in (("first_size", 1), ("output_axis", 0)):
        if optional in spec:
            _count(spec, optional, at, minimum=least)
    first = spec.get("first_variant")
    if first is not None and not isinstance(first, str):
        raise PackageError(f"{at}: first_variant must be a variant's name, is {first!r}")
    state = require(spec, "state", list, at)
    if not all(isinstance(n, str) for n in state) or len(set(state)) != len(state):
        raise PackageError(f"{at}: state must be distinct tensor names")
    blocks, name = comp["blocks"], comp["name"]
    if first is None and state:
        raise PackageError(f"{at}: state {state[0]!r} is carried from piece to piece but "
                           "there is no first_variant to run the first piece without it")
    missing = [b["name"] for b in blocks
               if first is not None and first not in b.get("variants", {})]
    if missing:
        raise PackageError(f"{MANIFEST} block {name}/{missing[0]}: no variant {first!r}, which "
                           f"the chunked component {name!r} runs on its first piece")
    check_chain(name, blocks, provided={piece, *state})
    firsts = [as_variant(b, first) for b in blocks]
    check_chain(name, firsts, provided={piece})
    for label, chain in (("later", blocks), ("first", firsts)):
        made = {o["name"] for b in chain for o in b["outputs"]}
        gone = [n for n in [output, *state] if n not in made]
        if gone:
            raise PackageError(f"{at}: {gone[0]!r} is given by none of the blocks on the "
                               f"{label} pieces")


def _check_tiles(comp: dict, where: str, latent_shape: list[int] | None) -> None:
    """A component decoded in spatial tiles (edge/core/tiles.py): a valid tiling, and graphs
    that take any tile's height and width (ONNX) or, in a package of static shapes, traced
    at the first tile of its latents with a `tile_RxC` variant for every other tile size
    they need (and its first piece's, where the component is chunked)."""
    from edge.core.tiles import Tiling

    spec = require(comp, "tiles", dict, where)
    try:
        tiling = Tiling.from_dict(spec)
    except (KeyError, TypeError, ValueError) as err:
        raise PackageError(f"{where} tiles: {err}") from None
    dynamic = [any(d in TILE_AXES for s in b["inputs"] for d in s["shape"])
               for b in comp["blocks"]]
    if all(dynamic):
        return
    if any(dynamic) or latent_shape is None:
        fixed = comp["blocks"][dynamic.index(False)]["name"]
        raise PackageError(f"{where} tiles: block {fixed!r} takes one size, not any tile's "
                           "height and width" + ("" if any(dynamic) else
                                                 ", and there is no latent_shape to tile"))
    sizes = tiling.tile_sizes(*latent_shape[-2:])
    first = comp.get("chunked", {}).get("first_variant")
    head = comp["blocks"][0]
    traced = [s["shape"][-2:] for s in head["inputs"] if len(s["shape"]) == 5]
    if traced[:1] != [list(sizes[0])]:
        raise PackageError(f"{where} tiles: block {head['name']!r} takes latents of "
                           f"{'x'.join(map(str, traced[0])) if traced else 'no video'}, not "
                           f"the first tile's {sizes[0][0]}x{sizes[0][1]} of latents "
                           f"{latent_shape[-2]}x{latent_shape[-1]}")
    for block in comp["blocks"]:
        for size in sizes[1:]:
            for variant in dict.fromkeys([None, first]):
                name = tile_variant(variant, size, sizes[0])
                if name not in block.get("variants", {}):
                    raise PackageError(f"{where} tiles: block {block['name']!r} has no variant "
                                       f"{name!r} for the tiles of {size[0]}x{size[1]} latents "
                                       "this package's latent_shape needs")


def _check_wasm_graph(record: dict, listed: set[str], where: str) -> None:
    """A web block's second graph (the wasm path's ONNX graph), where it has one, is one of
    the block's files, so it is verified like the rest."""
    if "wasm" not in record:
        return
    graph = require(require(record, "wasm", dict, where), "graph", str, f"{where} wasm")
    if graph not in listed:
        raise PackageError(f"{where}: wasm graph {graph!r} is not one of the block's files")


WEB_PATHS = ("webgpu", "wasm")  # the paths a web package may hold, in the manifest's order


def _check_web_paths(manifest: dict) -> None:
    """`web.paths` names the paths the page may run (absent: a package from before the wasm
    path, WebGPU alone); each block and variant has what they run: a wasm graph for "wasm",
    and without "webgpu" no launch plan, the wasm graph being its `graph`."""
    if "web" not in manifest:  # the runtimes refuse what they cannot run by its target
        return
    where = f"{MANIFEST} web"
    web = require(manifest, "web", dict, MANIFEST)
    paths = require(web, "paths", list, where) if "paths" in web else ["webgpu"]
    if not paths or len(set(paths)) != len(paths) or any(p not in WEB_PATHS for p in paths):
        raise PackageError(f"{where}: paths {paths!r} must name each of "
                           f"{', '.join(WEB_PATHS)} at most once, at least one")
    for comp in manifest["components"]:
        for block in comp["blocks"]:
            at = f"{MANIFEST} block {comp['name']}/{block['name']}"
            for name, record in [(None, block), *block.get("variants", {}).items()]:
                rat = at if name is None else f"{at} variant {name}"
                if "wasm" in paths and "wasm" not in record:
                    raise PackageError(f"{rat}: no wasm graph, but web.paths has \"wasm\"")
                if "webgpu" not in paths and record["graph"] != record["wasm"]["graph"]:
                    raise PackageError(f"{rat}: graph {record['graph']!r} is not its wasm "
                                       "graph, but web.paths has no \"webgpu\" (no plans)")


def _check_numbers(values: list, what: str) -> None:
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PackageError(f"{what}: value {i} must be a number, got {_json_type(value)}")
        if not math.isfinite(value):
            raise PackageError(f"{what}: value {i} is {value}, must be finite")


def _check_sampler(sampler: dict) -> None:
    where = f"{MANIFEST} sampler"
    for key, value in sampler.items():
        if key == "sigmas" and isinstance(value, list):  # given levels: numbers, each checked
            _check_numbers(value, f"{where}: field 'sigmas'")
            continue
        if not isinstance(value, bool | int | float | str | type(None)):
            raise PackageError(f"{where}: field {key!r} must be a number, got "
                               f"{_json_type(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise PackageError(f"{where}: field {key!r} is {value}, must be finite")
    for key in ("steps", "num_train_timesteps"):
        if key in sampler:
            _count(sampler, key, where, minimum=1)


# CoreML's MLComputeUnits, as the Swift runtime names them
COREML_COMPUTE_UNITS = ("all", "cpuOnly", "cpuAndGPU", "cpuAndNeuralEngine")
# how an iphone package stores a block's variants (`coreml.layout`; absent: "separate"):
# "separate", each variant a program of its own (iOS 17); "multifunction", a block and its
# variants the functions of one program sharing one weight file (iOS 18: a runtime loads a
# function by name, MLModelConfiguration.functionName)
# "coreai", a Core AI model (.aimodel) per block, its variants functions of it (iOS 27)
COREML_LAYOUTS = {"separate": 17, "multifunction": 18, "coreai": 27}  # layout -> least iOS
PROGRAM_SUFFIX = {"separate": ".mlpackage", "multifunction": ".mlpackage",
                  "coreai": ".aimodel"}
_FUNCTIONS = ("multifunction", "coreai")   # layouts whose programs hold named functions
_IOS = re.compile(r"iOS(\d+)")
_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_functions(block: dict, variants: dict, layout: str, at: str) -> None:
    """Which program (and which function of it) a block and each of its variants run.
    Separate: no `function`, and a variant never the block's own program (it would run the
    block's graph). Multifunction: a block with variants names its function, and each variant
    names another function of the block's program."""
    records = [(at, block)] + [(f"{at} variant {n}", v) for n, v in variants.items()]
    for place, record in records:
        if "function" not in record:
            continue
        function = require(record, "function", str, place)
        if layout not in _FUNCTIONS:
            raise PackageError(f"{place}: function {function!r} in a {layout!r} layout (only "
                               "a multifunction program has functions to choose from)")
        if not _FUNCTION.fullmatch(function):
            raise PackageError(f"{place}: function {function!r} is not a function name")
    if not variants:
        return
    if layout == "separate":
        for name, record in variants.items():
            if record["model"] == block["model"]:
                raise PackageError(f"{at} variant {name}: model {record['model']!r} is the "
                                   "block's own program; in the separate layout each variant "
                                   "is a program of its own")
        return
    if "function" not in block:
        raise PackageError(f"{at}: a block with variants in the {layout} layout must name "
                           "its function of the shared program (field 'function')")
    seen = {block["function"]: "the block"}
    for name, record in variants.items():
        place = f"{at} variant {name}"
        if record["model"] != block["model"]:
            raise PackageError(f"{place}: model {record['model']!r} is not the block's "
                               f"{block['model']!r}; in the {layout} layout a variant is "
                               "a function of its block's program")
        if "function" not in record:
            raise PackageError(f"{place}: missing field 'function' (which function of "
                               f"{block['model']} it runs)")
        if record["function"] in seen:
            raise PackageError(f"{place}: function {record['function']!r} is also "
                               f"{seen[record['function']]}'s")
        seen[record["function"]] = f"variant {name}"


def is_coreai(manifest: dict) -> bool:
    """An iphone package in the Core AI layout (`--min-ios 27`), whose programs the Python
    runtime runs through Core AI's runtime."""
    return (manifest.get("target") == "iphone"
            and manifest.get("coreml", {}).get("layout") == "coreai")


def _check_coreml(manifest: dict) -> None:
    """An iphone package: its `coreml` settings, and every block's (and variant's) program
    is a listed `.mlpackage` folder holding the block's graph and weights files, with the
    function it runs where the layout has functions."""
    where = f"{MANIFEST} coreml"
    coreml = require(manifest, "coreml", dict, MANIFEST)
    units = require(coreml, "compute_units", str, where)
    if units not in COREML_COMPUTE_UNITS:
        raise PackageError(f"{where}: compute_units {units!r}; known: "
                           f"{', '.join(COREML_COMPUTE_UNITS)}")
    target = require(coreml, "minimum_deployment_target", str, where)
    ios = _IOS.fullmatch(target)
    if not ios:
        raise PackageError(f"{where}: minimum_deployment_target {target!r} is not iOS<n>")
    layout = require(coreml, "layout", str, where) if "layout" in coreml else "separate"
    if layout not in COREML_LAYOUTS:
        raise PackageError(f"{where}: layout {layout!r}; known: {', '.join(COREML_LAYOUTS)}")
    if int(ios.group(1)) < COREML_LAYOUTS[layout]:
        raise PackageError(f"{where}: layout {layout!r} needs iOS{COREML_LAYOUTS[layout]} or "
                           f"later, but minimum_deployment_target is {target!r}")
    require(coreml, "output_prefix", str, where)
    for comp in manifest["components"]:
        for block in comp["blocks"]:
            at = f"{MANIFEST} block {comp['name']}/{block['name']}"
            listed = {f["path"] for f in block["files"]}
            variants = require(block, "variants", dict, at) if "variants" in block else {}
            records = [(at, block)] + [(f"{at} variant {n}", v) for n, v in variants.items()]
            for place, record in records:
                model = require(record, "model", str, place)
                suffix = PROGRAM_SUFFIX[layout]
                if not model.endswith(suffix):
                    raise PackageError(f"{place}: model {model!r} is not an {suffix} (layout "
                                       f"{layout!r})")
                for field in ("graph", "weights"):
                    path = record[field]["path"] if field == "weights" else record[field]
                    if not (path.startswith(model + "/") and path in listed):
                        raise PackageError(f"{place}: {field} {path!r} is not a listed file "
                                           f"inside {model}")
            _check_functions(block, variants, layout, at)


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's content without its own digest field, in canonical JSON: the
    manifest's guard against damage, as the file records are the files'."""
    body = {k: v for k, v in manifest.items() if k != DIGEST_FIELD}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


# how the learned null caption is masked: every token ("all", tiny-sora), or as the prompt
# of its guidance pair is ("prompt", Open-Sora: its y_embedding under the prompt's mask)
NULL_CAPTION_MASKS = ("all", "prompt")


def check_manifest(manifest: Any) -> dict[str, dict]:
    """Raise PackageError for the first structural problem; returns path -> file record of
    every listed file."""
    if not isinstance(manifest, dict):
        raise PackageError(f"{MANIFEST}: must be a JSON object, got {_json_type(manifest)}")
    if require(manifest, "format", str, MANIFEST) != FORMAT:
        raise PackageError(f"{MANIFEST}: field 'format' is {manifest['format']!r}, "
                           f"expected {FORMAT!r}")
    version = require(manifest, "format_version", int, MANIFEST)
    if version != FORMAT_VERSION:
        newer = " (written by a newer edge; upgrade edge)" if version > FORMAT_VERSION else ""
        raise PackageError(f"{MANIFEST}: unknown format_version {version}{newer}; this edge "
                           f"reads version {FORMAT_VERSION}")
    if DIGEST_FIELD in manifest:  # optional in version 1; every edge exporter writes it
        digest = require(manifest, DIGEST_FIELD, str, MANIFEST)
        try:
            content = manifest_digest(manifest)
        except ValueError:  # json.loads reads NaN and Infinity, which JSON does not have
            raise PackageError(f"{MANIFEST}: holds NaN or Infinity, which JSON cannot "
                               "(the manifest was altered or is corrupt)") from None
        if digest != content:
            raise PackageError(f"{MANIFEST}: content differs from its {DIGEST_FIELD} (the "
                               "manifest was altered or is corrupt)")
    for key in ("producer", "model"):
        require(manifest, key, str, MANIFEST)
    if "noise" in manifest:  # the seed's definition (edge.core.noise); absent in older packages
        require(manifest, "noise", str, MANIFEST)
    target = require(manifest, "target", str, MANIFEST)
    if target not in TARGETS:
        raise PackageError(f"{MANIFEST}: unknown target {target!r}; known: {', '.join(TARGETS)}")
    _check_sampler(require(manifest, "sampler", dict, MANIFEST))
    tok = require(manifest, "tokenizer", dict, MANIFEST)
    if not _items(tok, "files", f"{MANIFEST} tokenizer"):
        raise PackageError(f"{MANIFEST} tokenizer: field 'files' is empty")
    _count(tok, "max_tokens", f"{MANIFEST} tokenizer", minimum=1)
    if "embedding_rows" in tok:  # absent in packages from before it was written
        _count(tok, "embedding_rows", f"{MANIFEST} tokenizer", minimum=1)
    if "null_caption_mask" in manifest:  # absent: the null caption attends to every token
        mode = require(manifest, "null_caption_mask", str, MANIFEST)
        if mode not in NULL_CAPTION_MASKS:
            raise PackageError(f"{MANIFEST}: field 'null_caption_mask' is {mode!r}; known: "
                               f"{', '.join(NULL_CAPTION_MASKS)}")
    if "latent_shape" in manifest:
        shape = require(manifest, "latent_shape", list, MANIFEST)
        if len(shape) != 4 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                      for d in shape):
            raise PackageError(f"{MANIFEST}: field 'latent_shape' {shape!r} must be four "
                               "positive sizes [channels, frames, height, width]")
    files = _check_files(manifest)
    components = _items(manifest, "components", MANIFEST)
    if not components:
        raise PackageError(f"{MANIFEST}: field 'components' is empty; a package holds its "
                           "model's components")
    seen_components: set[str] = set()
    for comp in components:
        cname = comp["name"]
        if cname in seen_components:
            raise PackageError(f"{MANIFEST}: component {cname!r} appears twice")
        seen_components.add(cname)
        if not comp["blocks"]:
            raise PackageError(f"{MANIFEST} component {cname}: field 'blocks' is empty; a "
                               "component runs as one block at least")
        seen_blocks: set[str] = set()
        for block in comp["blocks"]:
            where = f"{MANIFEST} block {cname}/{block['name']}"
            if block["name"] in seen_blocks:
                raise PackageError(f"{where}: block id {cname}/{block['name']} appears twice")
            seen_blocks.add(block["name"])
            _check_block(block, files, where)
        if "chunked" in comp:
            _check_chunked(comp, f"{MANIFEST} component {cname}")
        else:
            check_chain(cname, comp["blocks"])
        if "tiles" in comp:
            _check_tiles(comp, f"{MANIFEST} component {cname}", manifest.get("latent_shape"))
    if target == "iphone":
        _check_coreml(manifest)
    if target == "web":
        _check_web_paths(manifest)
    return files
