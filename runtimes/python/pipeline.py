"""The embeddable Python runtime: runs an edge package with onnxruntime; no torch needed.

    pipe = Pipeline.load("dist/tiny-sora-onnx", memory_budget="64MB")
    video = pipe.generate("a red circle moving left", seed=0)     # uint8 (1, T, H, W, 3)
    print(pipe.last_run)                                           # figures of that run

A package says what this runtime needs to know of its model as data (docs/package-format.md):
the sampler (scheduler kind, shift, guidance), how prompts are cleaned and tokenized, whether
the unconditional pass takes a learned null caption or an encoded negative prompt, and
whether the VAE decoder takes latents frame by frame or as a whole video.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import resource
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from edge.core.budget import parse_size
from edge.core.files import EdgeNotice
from edge.core.manifest_schema import (
    MANIFEST,
    as_variant,
    block_variant,
    call_variant,
    check_chain,
    is_coreai,
)
from edge.core.noise import check_noise, torch_randn_draws
from edge.core.options import (
    check_prompts,
    check_seeds,
    check_settings,
    decode_values,
    with_overrides,
)
from edge.core.package import (
    PackageError,
    check_still_verified,
    read_package,
    resolve_inside,
)
from edge.core.pieces import piece_bounds
from edge.core.sampler import (
    SamplerSettings,
    Step,
    Trace,
    guided_call,
    initial_noise,
    max_calls,
    run_pairs,
    sample,
)
from edge.core.tiles import BlendedTiles, Tiling
from edge.core.tokenizer import CLEANERS, clean_prompt, load_tokenizer, tokenize
from edge.runtimes.python.graph_check import BATCH, check_block_graph, check_runtime_feeds
from edge.runtimes.python.loader import BlockLoader, BlockWeights


def _io_read_bytes() -> int | None:
    """Bytes this process caused to be read from storage (Linux /proc/self/io)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


# glibc's mallopt parameter: allocations at least this large are mapped on their own
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 << 10


def return_freed_activations_to_the_system() -> bool:
    """Fix glibc's mmap threshold at its default (128 KiB), so every activation buffer
    onnxruntime and NumPy free goes back to the system at once. Left alone, glibc raises the
    threshold to the size of each large buffer freed (up to 32 MiB), after which such
    buffers come from the heap, whose freed middle the process keeps: measured on Wan at
    17x128x128, 0.84 GB more RSS between generations than the loader held, 0.19 GB with the
    threshold fixed (docs/benchmarks.md). Process-wide, as the allocator is; False where the
    C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


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


RUNTIME_TARGET = "onnx"
# what this runtime feeds each component and what it takes from it (see docs/package-format.md)
# a decoder conditioned on a timestep (the manifest's `decode`) takes these beside z, at the
# batch: the timestep, the scale s of the noise mixed in as (1 - s) z + s noise, the noise
DECODE_INPUTS = {"decode_t", "decode_noise_scale", "decode_noise"}
COMPONENT_INPUTS = {"text_encoder": {"input_ids", "attention_mask"},
                    "transformer": {"latent", "t", "caption", "caption_mask"},  # any of these
                    "vae_decoder": {"z"} | DECODE_INPUTS}
COMPONENT_OUTPUTS = {"text_encoder": {"hidden"}, "transformer": {"velocity"},
                     "vae_decoder": {"frames"}}
# how the VAE decoder takes the latents (B, C, T, h, w): "frames" as B*T images (C, h, w) and
# gives (B*T, 3, H, W); "video" as they are and gives (B, 3, T', H, W) (a causal video VAE)
LATENT_LAYOUTS = ("frames", "video")
# what generate gives back: the video, the video before rounding, the denoised latents
OUTPUT_TYPES = ("uint8", "float", "latent")


def check_runnable(manifest: dict, any_target: bool = False) -> None:
    """Refuse, before any session exists, a well-formed package this runtime cannot run: another
    target (unless `any_target`: its blocks run some other way), a missing component, blocks
    needing inputs the runtime does not give or not making the outputs it takes, sampler
    settings it does not know."""
    if manifest["target"] != RUNTIME_TARGET and not any_target:
        raise PackageError(f"{MANIFEST}: target {manifest['target']!r}; the Python runtime "
                           f"runs {RUNTIME_TARGET!r} packages and iphone packages of the "
                           "Core AI layout (edge export --target iphone --min-ios 27)")
    components = {c["name"]: c["blocks"] for c in manifest["components"]}
    chunking = {c["name"]: c["chunked"] for c in manifest["components"] if "chunked" in c}
    for name, given in COMPONENT_INPUTS.items():
        if name not in components:
            raise PackageError(f"{MANIFEST}: no component {name!r}; the Python runtime needs "
                               f"{', '.join(COMPONENT_INPUTS)}")
        chunked = chunking.get(name)
        if chunked is None:
            check_chain(name, components[name], provided=given)
        else:  # the manifest check saw the chains; here: what this runtime feeds and takes
            if chunked["input"] not in given or chunked["output"] not in COMPONENT_OUTPUTS[name]:
                raise PackageError(f"{MANIFEST} component {name} chunked: pieces of "
                                   f"{chunked['input']!r} giving {chunked['output']!r}; the "
                                   f"Python runtime feeds {', '.join(sorted(given))} and takes "
                                   f"{', '.join(sorted(COMPONENT_OUTPUTS[name]))}")
        made = {s["name"] for b in components[name] for s in b["outputs"]}
        if not COMPONENT_OUTPUTS[name] <= made:
            raise PackageError(f"{MANIFEST}: component {name!r} makes no "
                               f"{', '.join(sorted(COMPONENT_OUTPUTS[name] - made))}")
    if "latent_shape" not in manifest:
        raise PackageError(f"{MANIFEST}: the Python runtime needs 'latent_shape'")
    if ("null_caption" not in manifest["conditioning"]
            and not isinstance(manifest.get("negative_prompt"), str)):
        raise PackageError(f"{MANIFEST}: the unconditional pass needs "
                           "'conditioning.null_caption' or a 'negative_prompt' string")
    check_decode(manifest, components["vae_decoder"], "vae_decoder" in chunking)
    tiled = [c["name"] for c in manifest["components"] if "tiles" in c]
    if tiled and (tiled != ["vae_decoder"] or manifest.get("latent_layout") != "video"
                  or "decode" in manifest):
        raise PackageError(f"{MANIFEST} component {tiled[0]} tiles: the Python runtime tiles "
                           "only a decoder of latents laid out as 'video' without decode "
                           "conditioning")
    if manifest.get("latent_layout", "frames") not in LATENT_LAYOUTS:
        raise PackageError(f"{MANIFEST}: latent_layout {manifest['latent_layout']!r}; known: "
                           f"{', '.join(LATENT_LAYOUTS)}")
    if manifest["tokenizer"].get("clean", "none") not in CLEANERS:
        raise PackageError(f"{MANIFEST} tokenizer: clean {manifest['tokenizer']['clean']!r}; "
                           f"known: {', '.join(CLEANERS)}")
    try:
        check_settings(SamplerSettings.from_dict(manifest["sampler"]))
    except (TypeError, ValueError) as err:
        raise PackageError(f"{MANIFEST} sampler: {err}") from None


def check_decode(manifest: dict, decoder: list[dict], chunked: bool) -> None:
    """A decoder that takes the decode inputs needs the manifest's `decode` settings, and
    runs on whole videos (the noise is one video's latents); a package with them has such a
    decoder."""
    takes = {s["name"] for b in decoder for s in b["inputs"]} & DECODE_INPUTS
    spec = manifest.get("decode")
    if spec is None and not takes:
        return
    if spec is None:
        raise PackageError(f"{MANIFEST}: the vae_decoder takes {', '.join(sorted(takes))} "
                           "but the manifest has no 'decode' settings")
    if takes != DECODE_INPUTS or chunked or manifest.get("latent_layout") != "video":
        raise PackageError(f"{MANIFEST} decode: needs a whole-video vae_decoder (latent_layout "
                           f"'video', not chunked) taking {', '.join(sorted(DECODE_INPUTS))}")
    number = (int, float)
    if not (isinstance(spec, dict) and isinstance(spec.get("timestep"), number)
            and (spec.get("noise_scale") is None or isinstance(spec["noise_scale"], number))
            and not any(isinstance(spec.get(k), bool) for k in ("timestep", "noise_scale"))):
        raise PackageError(f"{MANIFEST} decode: must be {{\"timestep\": number, "
                           f"\"noise_scale\": number or null}}, got {spec!r}")


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


def _session(root: Path, graph: str, options: ort.SessionOptions, where: str,
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


def _one_at_a_time(method: Callable) -> Callable:
    """Calls from several threads run one after another: the loader's budget, its resident
    blocks and the run figures belong to one generation at a time."""

    @functools.wraps(method)
    def serialised(self: Pipeline, *args, **kwargs):
        if self._running_in == threading.get_ident():  # waiting on our own lock: for ever
            raise RuntimeError(f"Pipeline.{method.__name__} called while this thread runs "
                               f"{self._running_in_method} on the same pipeline (from an "
                               "on_step callback?): one generation at a time; call it after "
                               "the running one returns")
        with self._lock:
            self._running_in, self._running_in_method = threading.get_ident(), method.__name__
            try:
                return method(self, *args, **kwargs)
            finally:
                self._running_in = self._running_in_method = None

    return serialised


def check_vocabulary(tokenizer, manifest_tokenizer: dict, path: Path) -> None:
    """Every id the tokenizer can give indexes the text encoder's embedding table (the
    manifest's `embedding_rows`): a larger vocabulary would fail inside onnxruntime's Gather
    on the first prompt that uses a token past the table."""
    rows = manifest_tokenizer.get("embedding_rows")
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if rows is not None and vocab > rows:
        raise PackageError(f"{path}: a vocabulary of {vocab} tokens, but the text encoder's "
                           f"embedding table has {rows} rows ({MANIFEST} tokenizer "
                           "embedding_rows): ids past it index nothing")


class PhaseClock:
    """Wall seconds of a generation's phases, by name in the order they ran, and the whole
    (`total`, from the clock's making to `finish`): `last_run["wall_s"]`."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.wall_s: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.wall_s[name] = time.perf_counter() - began

    def finish(self) -> dict[str, float]:
        self.wall_s["total"] = time.perf_counter() - self.started
        return self.wall_s


class Pipeline:
    def __init__(self, root: Path, manifest: dict, loader: BlockLoader,
                 components: dict[str, Component], lean_decode: bool = False) -> None:
        self.root, self.manifest, self.loader, self.components = root, manifest, loader, components
        self.lean_decode = lean_decode
        self.sampler = SamplerSettings.from_dict(manifest["sampler"])
        tok = manifest["tokenizer"]
        tok_path = resolve_inside(root, tok["files"][0]["path"], "tokenizer")
        try:
            self.tokenizer = load_tokenizer(tok_path, tok["max_tokens"],
                                            tok.get("pad_token", "[PAD]"))
        except Exception as err:  # the tokenizers library raises its own exception types
            raise PackageError(f"{tok_path}: not a tokenizer ({str(err)[:200]})") from None
        check_vocabulary(self.tokenizer, tok, tok_path)
        self.clean = tok.get("clean", "none")
        self.null_caption: np.ndarray | None = None
        if "null_caption" in manifest["conditioning"]:
            null = resolve_inside(root, manifest["conditioning"]["null_caption"]["path"],
                                  "conditioning.null_caption")
            try:
                self.null_caption = np.load(null, allow_pickle=False)
            except (ValueError, OSError, EOFError) as err:
                raise PackageError(f"{null}: not a NumPy array file ({err})") from None
        # the unconditional pass: the learned null caption, else this prompt encoded
        self.negative_prompt: str | None = manifest.get("negative_prompt")
        self.latent_shape = tuple(manifest["latent_shape"])
        self.latent_layout = manifest.get("latent_layout", "frames")
        # captions per text-encoder call where its programs are static (None: any number)
        batch = next((s["shape"][0] for b in components["text_encoder"].blocks
                      for s in b["inputs"] if s["name"] == "input_ids"), BATCH)
        self._text_batch: int | None = batch if isinstance(batch, int) else None
        self.last_run: dict = {}
        self._compute_s = 0.0
        # component -> floating-point operations this generation ran (the blocks' `flops`
        # per row x the rows each call ran); None once a block ran that records none
        self._flops: dict[str, int | None] = {}
        self._lock = threading.Lock()
        self._running_in: int | None = None        # the thread inside generate, if any
        self._running_in_method: str | None = None
        self._closed = False
        self._programs = None   # a Core AI package's models (Pipeline.load opens them)
        # run a dynamic batch in pieces (`run_in_batch_pieces`): the guidance halves, one
        # video a decoder call; Pipeline.load sets it where a memory budget is given
        self.split_batches = False

    @classmethod
    def load(cls, package: str | Path, memory_budget: str | int | None = None,
             prefetch: int = 1, cold_reads: bool = False, threads: int | None = None,
             spinning: bool = False, check_hashes: bool = True, pin: bool = True,
             lean_decode: bool = False, open_block: OpenBlock | None = None) -> Pipeline:
        """Verify the package (sizes, sha256, paths, version) before anything runs, plan the
        loader for `memory_budget` (refused if smaller than the largest block), and create
        one onnxruntime session per block graph (graphs only: weights come from the loader).
        `threads`: onnxruntime's intra-op threads a block call (default: one a core);
        `spinning`: let those threads spin while idle, which is faster only where no other
        process wants the cores (off by default: see `session_options`).
        `lean_decode`: let the pinned blocks go before the VAE decode, so its activations
        take their memory, and read them again on the next generation (peak memory for
        reads: docs/runtime.md). `open_block(key, record)`: run each block (and variant)
        another way than onnxruntime, with what it returns (e.g. `edge record` runs an
        iphone package's blocks in PyTorch with their stored weights); the package may then
        be of any target."""
        budget = parse_size(memory_budget, "memory_budget")  # before anything is read
        root = Path(package)
        return_freed_activations_to_the_system()
        identities: dict = {}
        manifest = read_package(root, check_hashes=check_hashes, identities=identities)
        programs = None   # a Core AI package's open models, closed with the pipeline
        if open_block is None and is_coreai(manifest):
            from edge.runtimes.python.coreai_session import coreai_notice, coreai_opener

            open_block, programs = coreai_opener(root)
            if note := coreai_notice(budget):
                warnings.warn(EdgeNotice(note), stacklevel=2)
        try:
            check_runnable(manifest, any_target=open_block is not None)
            options = session_options(threads, spinning)
            components, weights = {}, {}
            for comp in manifest["components"]:
                c = Component(comp["name"], comp["blocks"], comp.get("chunked"),
                              Tiling.from_dict(comp["tiles"]) if "tiles" in comp else None)
                for block, key in zip(c.blocks, c.keys(), strict=True):
                    where = f"block {key}"
                    c.sessions[key] = (open_block(key, block) if open_block else
                                       _session(root, block["graph"], options, where, block))
                    for variant in block.get("variants", {}):
                        record = as_variant(block, variant)
                        c.variant_records[key, variant] = record
                        c.variants[key, variant] = (
                            open_block(f"{key}#{variant}", record) if open_block else
                            _session(root, record["graph"], options, f"{where} variant {variant}",
                                     record))
                    weights[key] = block_weights(root, key, block, identities, where,
                                                 held_by_program=programs is not None)
                components[c.name] = c
            loader = BlockLoader(weights, budget,
                                 every_step=tuple(components["transformer"].keys()),
                                 prefetch=prefetch, cold_reads=cold_reads, pin=pin)
            pipe = cls(root, manifest, loader, components, lean_decode)
            # under a budget, memory before speed: each call's batch in pieces
            pipe.split_batches = budget is not None
            pipe._programs = programs
            if open_block is None:  # what another runner takes (dtypes, batch) is its business
                check_runtime_feeds(manifest, pipe.null_caption)
            # graphs, tokenizer and null caption were read after verification: still the same?
            for path, identity in identities.items():
                check_still_verified(path, identity)
            return pipe
        except BaseException:  # refused after its Core AI models were opened
            if programs is not None:
                programs.close()
            raise

    def plan(self) -> list[dict]:
        """Per block: bytes and whether it stays resident under the budget."""
        return [{"block": k, "bytes": w.nbytes, "resident": k in self.loader.pinned}
                for k, w in self.loader.blocks.items()]

    def _run_blocks(self, comp: Component, runs, feeds: dict[str, np.ndarray],
                    blocks: list[dict] | None = None, variant: str | None = None,
                    batch_piece: int | None = None) -> dict:
        """Run a component's blocks (default: all) once, in order, taking weights from the
        loader's `runs` and passing each block's outputs on by name. `variant`: run that
        variant's graph where a block has one (e.g. "tdtm"), the base graph elsewhere.
        `batch_piece`: a graph with a dynamic batch runs `batch_piece` rows a call
        (`run_in_batch_pieces`), each block's weights read once for all of them."""
        for block in comp.blocks if blocks is None else blocks:
            key, weights = next(runs)
            runs_as = block_variant(block.get("variants", {}), variant)
            block = comp.variant_records.get((key, runs_as), block)
            inputs = {s["name"]: feeds[s["name"]] for s in block["inputs"]}
            session = comp.variants.get((key, runs_as)) or comp.sessions[key]
            started = time.perf_counter()
            outputs = run_in_batch_pieces(session, block, inputs, weights, batch_piece)
            self._compute_s += time.perf_counter() - started
            self._count_flops(comp.name, block, inputs)
            del weights  # a streamed block's memory is freed once nothing refers to it
            feeds = feeds | dict(zip((s["name"] for s in block["outputs"]), outputs,
                                     strict=True))
        return feeds

    def _count_flops(self, component: str, block: dict, inputs: dict[str, np.ndarray]) -> None:
        """Add one block call's work to its component's count (the manifest's `flops`, per
        row of the batch it ran); a block without the record makes the count unknown."""
        flops = block.get("flops")
        if flops is None or self._flops.get(component, 0) is None:
            self._flops[component] = None
            return
        rows = 1 if flops["rows_input"] is None else len(inputs[flops["rows_input"]])
        self._flops[component] = self._flops.get(component, 0) + flops["per_row"] * rows

    def _run_component(self, name: str, feeds: dict[str, np.ndarray],
                       batch_piece: int | None = None) -> dict:
        comp = self.components[name]
        if comp.chunked is not None:
            return self._run_chunked(comp, feeds, batch_piece)
        runs = self.loader.run(comp.keys())
        try:
            return self._run_blocks(comp, runs, feeds, batch_piece=batch_piece)
        finally:
            runs.close()

    def _run_chunked(self, comp: Component, feeds: dict[str, np.ndarray],
                     batch_piece: int | None = None) -> dict:
        """The component's blocks once per piece of its input, the first piece through the
        first variant, the state handed from each piece to the next; the output's pieces
        joined. One loader schedule covers every piece, so the loader sees the blocks
        recur and keeps them for the run where the budget has room."""
        spec = comp.chunked
        whole, axis = feeds[spec["input"]], spec["axis"]
        try:
            bounds = piece_bounds(whole.shape[axis], spec["size"], spec.get("first_size"))
        except ValueError as err:
            raise ValueError(f"component {comp.name}: {spec['input']} has {whole.shape[axis]} "
                             f"along axis {axis}: {err}") from None
        runs = self.loader.run(comp.keys() * len(bounds), keep_recurring=True)
        pieces, state = [], {}
        try:
            for i, (start, stop) in enumerate(bounds):
                piece = np.take(whole, np.arange(start, stop), axis=axis)
                # the last piece's state is handed over, not kept: each cache is let go as
                # its block returns the next one, and nothing of the last piece's
                # activations outlives it (at 480p they are hundreds of MB a block)
                out = self._run_blocks(comp, runs, handed_over(feeds, state,
                                                               {spec["input"]: piece}),
                                       variant=spec.get("first_variant") if i == 0 else None,
                                       batch_piece=batch_piece)
                pieces.append(out.pop(spec["output"]))
                state = {n: out.pop(n) for n in spec["state"]}
                del out
        finally:
            runs.close()
        return {spec["output"]: np.concatenate(pieces, axis=spec.get("output_axis", axis))}

    def encode_prompts(self, prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Hidden states and masks of `prompts`, in one text-encoder call, or one call per
        caption group where the encoder takes a fixed batch (a device package: one)."""
        ids, mask = tokenize(self.tokenizer, [clean_prompt(p, self.clean) for p in prompts])
        group = self._text_batch or len(prompts)
        hidden = [self._run_component("text_encoder", {"input_ids": ids[i:i + group],
                                                       "attention_mask": mask[i:i + group]})
                  ["hidden"] for i in range(0, len(prompts), group)]
        return np.concatenate(hidden), mask

    def _guidance_captions(self, prompts: list[str], negative_prompt: str | None
                           ) -> tuple[np.ndarray, np.ndarray]:
        """Captions and masks of the guidance batch: the prompts, then as many unconditional
        ones: the learned null caption, or the negative prompt (given, else the package's)
        encoded in the same text-encoder pass as the prompts, so a streamed encoder is read
        once."""
        b = len(prompts)
        if negative_prompt is None and self.null_caption is not None:
            caption, mask = self.encode_prompts(prompts)
            null = np.broadcast_to(self.null_caption, (b, *self.null_caption.shape))
            # the manifest's null_caption_mask: as the prompt's (Open-Sora), else every token
            null_mask = mask if self.manifest.get("null_caption_mask") == "prompt" \
                else np.ones_like(mask)
            return np.concatenate([caption, null]), np.concatenate([mask, null_mask])
        text = negative_prompt if negative_prompt is not None else self.negative_prompt
        return self.encode_prompts(prompts + [text] * b)

    def _check_latents(self, latents: Any, b: int) -> np.ndarray:
        want = (b, *self.latent_shape)
        if not isinstance(latents, np.ndarray) or latents.shape != want:
            got = latents.shape if isinstance(latents, np.ndarray) else type(latents).__name__
            raise ValueError(f"latents must be a NumPy array of shape {want} (batch, channels, "
                             f"frames, height, width; diffusers' layout), got {got}")
        if latents.dtype.kind != "f":  # ints, bools, complex, strings: no silent cast
            raise ValueError(f"latents must hold floating-point numbers (float32 or float64), "
                             f"got {latents.dtype}")
        if not np.isfinite(latents).all():
            raise ValueError("latents hold NaN or infinity")
        return latents.astype(np.float32)

    @_one_at_a_time
    def generate(self, prompts: str | list[str], seed: int | list[int] | None = None,
                 on_step: Callable[[int, int], None] | None = None,
                 negative_prompt: str | None = None, latents: np.ndarray | None = None,
                 decode_timestep: float | None = None,
                 decode_noise_scale: float | None = None,
                 decode_noise: np.ndarray | None = None, output_type: str = "uint8",
                 **sampler_overrides) -> np.ndarray:
        """uint8 video (B, T, H, W, 3); one prompt gives B = 1. Seeds as in the PyTorch
        pipeline (prompt i gets seed + i), so the two produce the same video.
        `output_type`: "uint8" (the video), "float" (the video before rounding, float32 in
        [0, 1]) or "latent" (the denoised latents (B, C, T, h, w) before decoding, as
        diffusers' output_type="latent": nothing is decoded).
        `negative_prompt`: the unconditional pass's text (default: the package's null caption
        or negative prompt). `latents`: initial noise (B, C, T, h, w) in diffusers' layout,
        instead of the seeds' (refused together with a seed). A seed draws what diffusers
        draws for `torch.Generator().manual_seed(seed)` (edge.core.noise); default 0.
        `decode_timestep`, `decode_noise_scale`, `decode_noise`: for a package whose decoder
        is conditioned on a timestep (the manifest's `decode`, whose values they replace; see
        `_decode_conditioning`)."""
        if self._closed:
            raise ValueError(f"the pipeline of {self.root} is closed (close() was called); "
                             "load the package again to generate")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type {output_type!r}: one of {', '.join(OUTPUT_TYPES)}")
        prompts = check_prompts(prompts)
        if seed is not None and latents is not None:
            raise ValueError("seed and latents given together: the latents are the initial "
                             "noise, so give one")
        seeds = check_seeds(0 if seed is None else seed, len(prompts))
        if latents is None:
            check_noise(self.manifest, MANIFEST)
        if negative_prompt is not None:
            if not isinstance(negative_prompt, str):
                raise ValueError("negative_prompt must be one string")
            check_prompts(negative_prompt, "negative prompt")  # valid Unicode
        noise = (initial_noise(self.latent_shape, seeds) if latents is None
                 else self._check_latents(latents, len(prompts)))
        conditioning = self._decode_conditioning(seeds if latents is None else None,
                                                 len(prompts), decode_timestep,
                                                 decode_noise_scale, decode_noise)
        settings = with_overrides(self.sampler, sampler_overrides)
        stats_before = self.loader.stats.as_dict()
        io_before = _io_read_bytes()
        clock = PhaseClock()
        figures: dict = {"wall_s": clock.wall_s}
        self._compute_s = 0.0
        self._flops = {}
        b = len(prompts)
        rows = self._guided_rows(settings, b)
        with clock.phase("text_encoder"):
            captions = self._encode(prompts, negative_prompt, settings, rows)
        with clock.phase("transformer"):
            latents, trace, denoise = self._denoise(noise, captions, settings, rows, on_step)
        with clock.phase("vae_decoder"):
            video = None
            if output_type != "latent":
                if self.lean_decode:  # the decoder's activations get the pinned blocks' memory
                    figures["released_for_decode_bytes"] = self.loader.release_pinned(
                        keep=self.components["vae_decoder"].keys())
                video = self._decode(latents, conditioning)
        clock.finish()
        figures["transformer_calls"] = trace.transformer_calls
        # what the transformer computed (None: a package exported before blocks recorded it)
        figures["transformer_flops"] = self._flops.get("transformer")
        figures["unguided_batch"] = rows(False) // b   # 1: the caption's half alone
        figures["sampler"] = trace.to_dict()
        self.last_run = self._loader_figures(figures, stats_before, io_before, denoise)
        if output_type == "latent":
            return latents
        if output_type == "float":
            return video.astype(np.float32)
        return np.round(video * 255).astype(np.uint8)

    def _encode(self, prompts: list[str], negative_prompt: str | None,
                settings: SamplerSettings, rows: Callable[[bool], int]
                ) -> tuple[np.ndarray, np.ndarray]:
        """The text encoder's captions and masks for the transformer's calls: the prompts',
        then the unconditional ones where any call is guided (or the caption's half is run
        at the guidance batch)."""
        if guided_call(settings, 0) or rows(False) == 2 * len(prompts):
            return self._guidance_captions(prompts, negative_prompt)
        return self.encode_prompts(prompts)  # no call is guided: no unconditional caption

    def _denoise(self, noise: np.ndarray, captions: tuple[np.ndarray, np.ndarray],
                 settings: SamplerSettings, rows: Callable[[bool], int],
                 on_step: Callable[[int, int], None] | None
                 ) -> tuple[np.ndarray, Trace, dict]:
        """The sampler's loop over the transformer: the denoised latents, its trace, and the
        loop's own read, I/O-wait and compute seconds (where streaming happens, and what
        overlap is judged on)."""
        b = len(noise)
        caption2, mask2 = captions
        transformer = self.components["transformer"]
        if settings.merge_steps and not any(v == "tdtm" for _, v in transformer.variants):
            raise ValueError(f"merge_steps={settings.merge_steps}: package {self.root} has no "
                             "'tdtm' transformer variants; export it again with this edge")

        def inputs(x: np.ndarray, t: float, guided: bool) -> dict[str, np.ndarray]:
            """The transformer's inputs of a call: the guidance batch, or the caption's half."""
            n = rows(guided)
            return {"latent": np.concatenate([x, x])[:n], "t": np.full(n, t, np.float32),
                    "caption": caption2[:n], "caption_mask": mask2[:n]}

        trace = Trace()
        if settings.cache_threshold > 0:
            predict, runs = self._cached_predictor(transformer, inputs, b, rows), None
        else:
            # One schedule of steps x blocks, so the loader prefetches across step boundaries
            # too; a leap ends it early (closing it gives back what was read ahead).
            runs = self.loader.run(transformer.keys() * max_calls(settings))

            def predict(x: np.ndarray, t: float, step: Step
                        ) -> tuple[np.ndarray, np.ndarray | None]:
                v = self._run_blocks(transformer, runs, inputs(x, t, step.guided),
                                     variant=self._call_variant(step, rows(step.guided), b),
                                     batch_piece=self._piece(b))["velocity"]
                return v[:b], (v[b:] if step.guided else None)

        loop_start = (self.loader.stats.read_s, self.loader.stats.wait_s, self._compute_s)
        try:
            latents = sample(predict, noise, settings, on_step, trace)
        finally:
            if runs is not None:
                runs.close()
        denoise = {"read_s": self.loader.stats.read_s - loop_start[0],
                   "io_wait_s": self.loader.stats.wait_s - loop_start[1],
                   "compute_s": self._compute_s - loop_start[2]}  # wall: wall_s.transformer
        if not np.isfinite(latents).all():  # never hand back a silently broken video
            raise FloatingPointError(
                f"the denoised latents hold NaN or infinity (package {self.root}, sampler "
                f"settings {settings}); the package's blocks or these settings are broken")
        return latents, trace, denoise

    def _decode_conditioning(self, seeds: list[int] | None, b: int, timestep: float | None,
                             noise_scale: float | None, noise: np.ndarray | None) -> dict:
        """The decoder's decode inputs, where the manifest has `decode` (else none, and
        giving any is refused): the timestep; the noise scale (given, else the manifest's,
        else the timestep's value, as diffusers' decode_noise_scale=None); the noise, given
        (B, *latent_shape), else for each seed the second `torch.randn(latent_shape)` of its
        generator (diffusers draws it from the pipeline's generator after the initial
        latents). Given latents need a given noise unless the scale is 0."""
        spec = self.manifest.get("decode")
        if spec is None:
            if any(v is not None for v in (timestep, noise_scale, noise)):
                raise ValueError(f"package {self.root}: its decoder takes no decode timestep "
                                 "or noise (the manifest has no 'decode')")
            return {}
        for name, value in (("decode_timestep", timestep), ("decode_noise_scale", noise_scale)):
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, int | float)
                                      or not np.isfinite(value)):
                raise ValueError(f"{name} {value!r} must be a finite number")
        t, s = decode_values(spec, timestep, noise_scale)
        shape = (b, *self.latent_shape)
        if noise is not None:
            if not isinstance(noise, np.ndarray) or noise.shape != shape \
                    or noise.dtype.kind != "f" or not np.isfinite(noise).all():
                raise ValueError(f"decode_noise must be a finite NumPy array of shape {shape} "
                                 "holding floating-point numbers")
            noise = noise.astype(np.float32)
        elif s == 0:
            noise = np.zeros(shape, np.float32)  # mixed in with weight 0
        elif seeds is not None:
            noise = np.stack([torch_randn_draws([self.latent_shape] * 2, seed)[1]
                              for seed in seeds])
        else:
            raise ValueError(f"decode noise scale {s} with given latents: pass decode_noise "
                             "too (diffusers draws it from the pipeline's generator), or "
                             "decode_noise_scale=0")
        return {"decode_t": np.full(b, t, np.float32),
                "decode_noise_scale": np.full(b, s, np.float32), "decode_noise": noise}

    def _decode(self, latents: np.ndarray, conditioning: dict | None = None) -> np.ndarray:
        """latents (B, C, T, h, w) -> video (B, T', H, W, 3) in [0, 1]; `conditioning`: a
        timestep-conditioned decoder's inputs (`_decode_conditioning`)."""
        b, c, t, h, w = latents.shape
        tiles = self.components["vae_decoder"].tiles
        if self.latent_layout == "video":
            if tiles is not None and tiles.applies(h, w):
                frames = self._decode_tiles(latents, tiles)
            else:
                # under a budget one video a call: a 480p decoder's activations are gigabytes
                frames = self._run_component("vae_decoder",
                                             {"z": latents} | (conditioning or {}),
                                             batch_piece=self._piece(1))["frames"]
            if tiles is not None:  # a tiled decoder's frames come unclamped, as diffusers'
                frames = np.clip(frames, 0, 1)
            return frames.transpose(0, 2, 3, 4, 1)
        z = latents.transpose(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        frames = self._run_component("vae_decoder", {"z": z})["frames"]
        return frames.reshape(b, t, *frames.shape[1:]).transpose(0, 1, 3, 4, 2)

    def _piece(self, rows: int) -> int | None:
        """The rows of a dynamic batch a call takes: `rows` under a budget, else all."""
        return rows if self.split_batches else None

    def _decode_tiles(self, latents: np.ndarray, tiles: Tiling) -> np.ndarray:
        """(B, C, T, h, w) latents decoded a spatial tile at a time, each tile every latent
        frame (its own caches), then blended (edge/core/tiles.py); (B, 3, T', H, W)."""
        h, w = latents.shape[-2:]
        (rows, cols), (th, tw) = tiles.starts(h, w), tiles.latent_size
        # blended as they come: only the strips later tiles blend with are kept
        blended = BlendedTiles(tiles, h, w)
        for a, i in enumerate(rows):
            for b, j in enumerate(cols):
                blended.add(a, b, self._run_component(
                    "vae_decoder", {"z": latents[..., i:i + th, j:j + tw]},
                    batch_piece=self._piece(1))["frames"])
        return blended.output

    def _guided_rows(self, settings: SamplerSettings, b: int) -> Callable[[bool], int]:
        """The transformer's batch for a guided call (the caption and null halves, 2b) and
        an unguided one: b where the transformer takes any batch or has the caption half's
        programs (`unguided` variants, a web package's); where it takes a fixed batch
        without them (a device package's programs), 2b, the null half run and dropped, and
        said."""
        fixed = self._fixed_batch()
        alone = b if fixed is None or self._unguided_variants(settings) else 2 * b
        if alone != b and not all(guided_call(settings, i) for i in range(settings.steps)):
            warnings.warn(f"package {self.root}: its transformer takes a fixed batch of "
                          f"{fixed} and has no unguided variants, so the unguided steps "
                          f"(guidance {settings.guidance}, guidance_steps "
                          f"{settings.guidance_steps}) run the null caption's half too and "
                          "save no work; export it again with --unguided-variants (--target "
                          "web, or iphone --min-ios 18 or 27), or as an ONNX package, whose "
                          "graphs take a batch of one",
                          stacklevel=4)  # past generate and its one-at-a-time wrapper
        return lambda guided: 2 * b if guided else alone

    def _unguided_variants(self, settings: SamplerSettings) -> bool:
        """Whether every transformer block has the caption half's variant an unguided call
        of these settings runs (`unguided`; `tdtm_unguided` where calls merge and the block
        merges)."""
        calls = [call_variant(False, True)] + (
            [call_variant(True, True)] if settings.merge_steps else [])
        try:
            for block in self.components["transformer"].blocks:
                for call in calls:
                    block_variant(block.get("variants", {}), call)
        except KeyError:
            return False
        return True

    def _fixed_batch(self) -> int | None:
        """The transformer's batch where its graphs take a fixed one (device programs);
        None where they take any (ONNX)."""
        latent = next(s for s in self.components["transformer"].blocks[0]["inputs"]
                      if s["name"] == "latent")
        return None if latent["shape"][0] == BATCH else latent["shape"][0]

    def _call_variant(self, step: Step, rows: int, b: int) -> str | None:
        """The variant a transformer call runs: merged or not, and the caption half's
        program where the call runs b rows on a graph of a fixed batch."""
        return call_variant(step.merged, rows == b and self._fixed_batch() is not None)

    def _cached_predictor(self, comp: Component,
                          inputs: Callable[[np.ndarray, float, bool], dict], b: int,
                          rows: Callable[[bool], int]):
        """A predictor with the step cache (`inputs(x, t, guided)`: the transformer's inputs
        of a call, for `b` videos, `rows(guided)` of them): the prologue runs, the sampler's
        cache decides whether the pairs run, the epilogue runs. Each part is its own loader
        schedule, because whether the pairs are needed is known only after the prologue
        ran."""
        prologue, *pairs, epilogue = comp.blocks
        keys = comp.keys()

        def part(blocks: list[dict], names: list[str], feeds: dict, variant: str | None):
            runs = self.loader.run(names)
            try:
                return self._run_blocks(comp, runs, feeds, blocks, variant,
                                        batch_piece=self._piece(b))
            finally:
                runs.close()

        def predict(x: np.ndarray, t: float, step: Step) -> tuple[np.ndarray, np.ndarray | None]:
            variant = self._call_variant(step, rows(step.guided), b)
            feeds = part([prologue], keys[:1], inputs(x, t, step.guided), variant)
            feeds["x"], _ = run_pairs(
                step, feeds["x"], feeds["t_mod"],
                lambda h: part(pairs, keys[1:-1], feeds | {"x": h}, variant)["x"])
            v = part([epilogue], keys[-1:], feeds, variant)["velocity"]
            return v[:b], (v[b:] if step.guided else None)

        return predict

    def _loader_figures(self, figures: dict, stats_before: dict, io_before: int | None,
                        denoise: dict) -> dict:
        """Add what the loader and the OS counted during this run to `figures`. Overlap
        efficiency is judged on the denoising loop (`denoise`: its read, I/O-wait and compute
        seconds) and only where transformer blocks were streamed: the share of its read
        time hidden behind compute, 1 - io_wait / read (1: compute never waited for a block;
        0: it waited as long as the reads took). Elsewhere (everything resident, reads only
        of first loads) it would describe start-up, not streaming, and is None."""
        after = self.loader.stats.as_dict()
        for k in ("bytes_read", "reads", "read_s", "io_wait_s"):
            figures[k] = after[k] - stats_before[k]
        figures["read_bandwidth_bytes_per_s"] = (figures["bytes_read"] / figures["read_s"]
                                                 if figures["read_s"] else None)
        io_after = _io_read_bytes()
        figures["storage_read_bytes"] = (io_after - io_before) if io_before is not None else None
        figures["compute_s"] = self._compute_s
        figures["denoise"] = denoise
        streamed = any(k not in self.loader.pinned for k in self.components["transformer"].keys())
        figures["overlap_efficiency"] = (
            max(0.0, 1.0 - denoise["io_wait_s"] / denoise["read_s"])
            if streamed and denoise["read_s"] > 0 else None)
        figures["peak_held_bytes"] = self.loader.stats.peak_held_bytes
        figures["peak_rss_bytes"] = _peak_rss_bytes()
        return figures

    @_one_at_a_time
    def close(self) -> None:
        """Stop the loader's reader and let the blocks go; a second call does nothing."""
        if not self._closed:
            self.loader.close()
            if self._programs is not None:
                self._programs.close()
            self._closed = True
