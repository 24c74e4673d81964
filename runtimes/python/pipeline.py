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

import functools
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edge.core.budget import parse_size
from edge.core.files import EdgeNotice
from edge.core.manifest_schema import (
    MANIFEST,
    block_variant,
    call_variant,
    is_coreai,
    tile_variant,
)
from edge.core.noise import check_noise
from edge.core.options import check_prompts, check_seeds, with_overrides
from edge.core.package import PackageError, check_still_verified, read_package, resolve_inside
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
from edge.core.tokenizer import clean_prompt, load_tokenizer, tokenize
from edge.runtimes.python.generation_inputs import checked_latents, decode_conditioning
from edge.runtimes.python.graph_check import BATCH, check_runtime_feeds
from edge.runtimes.python.loader import BlockLoader
from edge.runtimes.python.package_checks import check_runnable, check_vocabulary
from edge.runtimes.python.phase_clock import PhaseClock
from edge.runtimes.python.process_memory import (
    io_read_bytes,
    peak_rss_bytes,
    return_freed_activations_to_the_system,
)
from edge.runtimes.python.sessions import (
    Component,
    OpenBlock,
    handed_over,
    open_components,
    run_in_batch_pieces,
    session_options,
)

# what generate gives back: the video, the video before rounding, the denoised latents
OUTPUT_TYPES = ("uint8", "float", "latent")


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
            components, weights = open_components(
                root, manifest, session_options(threads, spinning), identities, open_block,
                held_by_program=programs is not None)
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
                       batch_piece: int | None = None,
                       as_tile: Callable[[str | None], str | None] = lambda v: v) -> dict:
        """`as_tile`: the variant each call runs for the one it would run untiled (a tile's
        programs in a package of static shapes)."""
        comp = self.components[name]
        if comp.chunked is not None:
            return self._run_chunked(comp, feeds, batch_piece, as_tile)
        runs = self.loader.run(comp.keys())
        try:
            return self._run_blocks(comp, runs, feeds, variant=as_tile(None),
                                    batch_piece=batch_piece)
        finally:
            runs.close()

    def _run_chunked(self, comp: Component, feeds: dict[str, np.ndarray],
                     batch_piece: int | None = None,
                     as_tile: Callable[[str | None], str | None] = lambda v: v) -> dict:
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
                                       variant=as_tile(spec.get("first_variant")
                                                       if i == 0 else None),
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
        `decode_conditioning`)."""
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
                 else checked_latents(latents, (len(prompts), *self.latent_shape)))
        conditioning = decode_conditioning(
            self.manifest.get("decode"), self.root, self.latent_shape,
            seeds if latents is None else None, len(prompts), decode_timestep,
            decode_noise_scale, decode_noise)
        settings = with_overrides(self.sampler, sampler_overrides)
        stats_before = self.loader.stats.as_dict()
        io_before = io_read_bytes()
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

    def _decode(self, latents: np.ndarray, conditioning: dict | None = None) -> np.ndarray:
        """latents (B, C, T, h, w) -> video (B, T', H, W, 3) in [0, 1]; `conditioning`: a
        timestep-conditioned decoder's inputs (`decode_conditioning`)."""
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
        base = self.components["vae_decoder"].tile_base()
        # blended as they come: only the strips later tiles blend with are kept
        blended = BlendedTiles(tiles, h, w)
        for a, i in enumerate(rows):
            for b, j in enumerate(cols):
                tile = latents[..., i:i + th, j:j + tw]
                size = tile.shape[-2:]
                blended.add(a, b, self._run_component(
                    "vae_decoder", {"z": tile}, batch_piece=self._piece(1),
                    as_tile=lambda v, size=size: v if base is None else
                    tile_variant(v, size, base))["frames"])
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
        io_after = io_read_bytes()
        figures["storage_read_bytes"] = (io_after - io_before) if io_before is not None else None
        figures["compute_s"] = self._compute_s
        figures["denoise"] = denoise
        streamed = any(k not in self.loader.pinned for k in self.components["transformer"].keys())
        figures["overlap_efficiency"] = (
            max(0.0, 1.0 - denoise["io_wait_s"] / denoise["read_s"])
            if streamed and denoise["read_s"] > 0 else None)
        figures["peak_held_bytes"] = self.loader.stats.peak_held_bytes
        figures["peak_rss_bytes"] = peak_rss_bytes()
        return figures

    @_one_at_a_time
    def close(self) -> None:
        """Stop the loader's reader and let the blocks go; a second call does nothing."""
        if not self._closed:
            self.loader.close()
            if self._programs is not None:
                self._programs.close()
            self._closed = True
