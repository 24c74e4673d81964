"""A package's blocks as onnxruntime sessions (or another runner's), and how a block call is
fed: its weights from the loader, a dynamic batch in pieces, a chunk's state handed on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import onnxruntime as ort

from edge.core.manifest_schema import MANIFEST, as_variant
from edge.core.package import PackageError, resolve_inside
from edge.core.tiles import Tiling
from edge.runtimes.python.graph_check import BATCH, check_block_graph
from edge.runtimes.python.loader import BlockWeights


@dataclass
class Component:
    name: str
    blocks: list[dict]
    chunked: dict | None = None   # run piece by piece, state carried (manifest "chunked")
    tiles: Tiling | None = None   # decoded in spatial tiles (manifest "tiles")
    sessions: dict[str, ort.InferenceSession] = field(default_factory=dict)
    # (block key, variant name) -> session of that variant's graph; the weights are the
    # base block's (same names), so the loader holds one copy whichever graph runs
    variants: dict[tuple[str, str], ort.InferenceSession] = field(default_factory=dict)
    # (block key, variant name) -> the block's record as that variant runs (its signature)
    variant_records: dict[tuple[str, str], dict] = field(default_factory=dict)

    def keys(self) -> list[str]:
        return [f"{self.name}/{b['name']}" for b in self.blocks]

    def tile_base(self) -> tuple[int, int] | None:
        """The tile size a tiled component's programs were traced at, where they take one
        size (a static package's: its other tile sizes are `tile_RxC` variants); None where
        they take any tile's height and width (ONNX) or the component is not tiled."""
        if self.tiles is None:
            return None
        shape = next(s["shape"] for s in self.blocks[0]["inputs"] if len(s["shape"]) == 5)
        return None if any(isinstance(d, str) for d in shape[-2:]) else tuple(shape[-2:])



class BlockSession(Protocol):
    """What the pipeline calls to run a block: onnxruntime's `run`, given output names as
    "out:<name>" and the feeds (inputs and the loader's weights) by name."""

    def run(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        ...


# (loader key, e.g. "transformer/block_0" or "transformer/block_0#tdtm"; the block's
# manifest record as that graph runs) -> its session
OpenBlock = Callable[[str, dict], BlockSession]


def block_weights(root: Path, key: str, block: dict, identities: dict,
                  where: str, held_by_program: bool = False) -> BlockWeights:
    """Where the loader reads a block's weights: its file, or a web package's shards.
    `held_by_program`: the block's program maps the file itself (Core AI): never read."""
    path = resolve_inside(root, block["weights"]["path"], where)
    shards = tuple((p, p.stat().st_size, identities.get(p)) for p in (
        resolve_inside(root, s, where) for s in block["weights"].get("shards", [])))
    return BlockWeights.of_block(key, path, block, identities.get(path),
                                 shards if len(shards) > 1 else (), held_by_program)


def session_options(threads: int | None = None, spinning: bool = False) -> ort.SessionOptions:
    """How the runtime's onnxruntime sessions run a block (`threads`: intra-op threads;
    `spinning`: let idle intra-op threads spin, onnxruntime's own default)."""
    options = ort.SessionOptions()
    # onnxruntime's arena would keep the largest per-run buffers (e.g. transposed copies
    # of streamed weights) for the life of the session, outside the loader's budget
    options.enable_cpu_mem_arena = False
    # nor its memory pattern, which after a first run allocates every intermediate of a run
    # in one block: a 480p decoder tile's up_3 peaked at +1.22 GB with it, +0.84 GB without
    # it (buffers freed as they die), at the same speed
    options.enable_mem_pattern = False
    if threads:
        options.intra_op_num_threads = threads
    # onnxruntime's idle threads spin between ops by default: beside other busy processes
    # they take cores the work needs (tiny-sora's 10 steps 3.3x slower beside two, and
    # 2.3x slower even alone on 2 cores, where the loader's threads share them;
    # benchmarks/contention.py, docs/benchmarks.md)
    options.add_session_config_entry("session.intra_op.allow_spinning",
                                     "1" if spinning else "0")
    return options


def open_session(root: Path, graph: str, options: ort.SessionOptions, where: str,
             block: dict) -> ort.InferenceSession:
    """A session of a verified graph file, refused unless it is a graph whose inputs and
    outputs are what the manifest declares for the block."""
    path = resolve_inside(root, graph, where)
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own exception types, e.g. InvalidProtobuf
        raise PackageError(f"{path}: not a graph onnxruntime can load ({where}): "
                           f"{str(err)[:200]}") from None
    check_block_graph(f"{MANIFEST} {where}", block, session)
    return session


def run_in_batch_pieces(session: BlockSession, block: dict, inputs: dict[str, np.ndarray],
                        weights: dict[str, np.ndarray], piece: int | None) -> list[np.ndarray]:
    """The block's outputs, its graph run on `piece` rows of the batch at a time where its
    batch is dynamic (the signature's "batch"), the pieces' batched outputs joined and an
    unbatched output taken from the first piece (all compute it alike). A call's
    activations are then one piece's: the guidance batch's caption and null halves as two
    calls (as diffusers' Wan pipeline runs them), one video of a batch through the decoder."""
    names = [f"out:{s['name']}" for s in block["outputs"]]
    batched = {s["name"] for s in block["inputs"] if s["shape"][0] == BATCH}
    whole = next((inputs[n].shape[0] for n in batched), 0)
    if piece is None or whole <= piece:
        return session.run(names, inputs | weights)
    runs = [session.run(names, {n: v[start:start + piece] if n in batched else v
                                for n, v in inputs.items()} | weights)
            for start in range(0, whole, piece)]
    return [np.concatenate([r[i] for r in runs]) if s["shape"][0] == BATCH else runs[0][i]
            for i, s in enumerate(block["outputs"])]


def handed_over(feeds: dict[str, np.ndarray], state: dict[str, np.ndarray],
                extra: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`feeds | state | extra`, `state` emptied: the result is then the only reference to
    the state's arrays, and a block that returns an array of the same name frees it."""
    merged = feeds | state | extra
    state.clear()
    return merged


def open_components(root: Path, manifest: dict, options: ort.SessionOptions,
                    identities: dict, open_block: OpenBlock | None = None,
                    held_by_program: bool = False
                    ) -> tuple[dict[str, Component], dict[str, BlockWeights]]:
    """Every component with a session for each block and block variant (onnxruntime's on
    the verified graph, or `open_block`'s), and where the loader reads each block's
    weights (`held_by_program`: the programs hold them, as `block_weights` says)."""
    components, weights = {}, {}
    for comp in manifest["components"]:
        c = Component(comp["name"], comp["blocks"], comp.get("chunked"),
                      Tiling.from_dict(comp["tiles"]) if "tiles" in comp else None)
        for block, key in zip(c.blocks, c.keys(), strict=True):
            where = f"block {key}"
            c.sessions[key] = (open_block(key, block) if open_block else
                               open_session(root, block["graph"], options, where, block))
            for variant in block.get("variants", {}):
                record = as_variant(block, variant)
                c.variant_records[key, variant] = record
                c.variants[key, variant] = (
                    open_block(f"{key}#{variant}", record) if open_block else
                    open_session(root, record["graph"], options, f"{where} variant {variant}",
                                 record))
            weights[key] = block_weights(root, key, block, identities, where, held_by_program)
        components[c.name] = c
    return components, weights
