"""`edge record`: one generation of a package, every block call written down (edge/core/bundle.py),
for another runtime to check itself against.

An onnx package runs in the Python runtime. An iphone package cannot run here (CoreML
predicts on Apple platforms only), so its blocks run in PyTorch with the weights read back
out of its programs, at its static shapes, as the exporter's validation runs them; the
calls around the blocks (tokenizing, one caption per text-encoder call, guidance, the
sampler, the decoder piece by piece) are the Python runtime's, the same the Swift runtime
makes. The model the package was exported from is needed for that (its family's code
builds the blocks): the shipped tiny-sora by default, or `model_folder`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer

import edge
from edge.commands import common
from edge.commands.declared import with_options
from edge.core.bundle import TensorFile, identify_bundle, write_bundle
from edge.core.console import echo, fail
from edge.core.manifest_schema import MANIFEST, is_coreai
from edge.core.noise import MAX_SEED, check_noise, torch_randn_draws
from edge.core.options import decode_values, with_overrides
from edge.core.package import PackageError, atomic_directory, read_package
from edge.core.sampler import SamplerSettings, initial_noise

if TYPE_CHECKING:  # torch and onnxruntime load when a recording runs, not with the CLI
    from edge.graph.blocks import TorchBlockSession
    from edge.runtimes.python.pipeline import Pipeline

RECORDED_WITH = {"onnx": "onnxruntime",
                 "iphone": "pytorch (the package's stored weights, fp32)"}
# an iphone package of the Core AI layout runs its own programs
RECORDED_WITH_CORE_AI = "coreai (the package's programs, executed by Core AI's runtime)"


class RecordError(ValueError):
    """A recording refused before anything ran; the message names the file or value."""


class Recorder:
    """Wraps a pipeline's block sessions so each block call is kept, in order, under the
    loader's key ("component/block", "#variant" where a variant's graph ran)."""

    def __init__(self, pipe: Pipeline) -> None:
        self.calls: list[dict] = []
        for comp in pipe.components.values():
            records = dict(zip(comp.keys(), comp.blocks, strict=True))
            for key, session in comp.sessions.items():
                self._wrap(session, key, records[key])
            for (key, variant), session in comp.variants.items():
                self._wrap(session, f"{key}#{variant}", comp.variant_records[key, variant])

    def _wrap(self, session, key: str, record: dict) -> None:
        run, names = session.run, [s["name"] for s in record["inputs"]]

        def recorded(output_names, feeds, *args, **kwargs):
            outputs = run(output_names, feeds, *args, **kwargs)
            self.calls.append({
                "key": key, "inputs": {n: feeds[n] for n in names},
                "outputs": {n.removeprefix("out:"): o
                            for n, o in zip(output_names, outputs, strict=True)}})
            return outputs

        session.run = recorded


@contextmanager
def stored_weight_blocks(package: Path, manifest: dict, model_folder: str | Path | None
                         ) -> Iterator[Callable[[str, dict], TorchBlockSession]]:
    """`Pipeline.load`'s `open_block` for an iphone package: its blocks in PyTorch with the
    weights stored in its programs, for the duration of the `with` block. The stored weights
    are written into the family's model in place and undone after: a loaded model may share
    parameters with others in this process (tiny-sora's text encoder is loaded once)."""
    from edge.exporters.iphone.coreml.check import stored_weights_in_place
    from edge.exporters.iphone.coreml.package import device_blocks
    from edge.families import FamilyError, exported_options, family_of, load_model
    from edge.families.hub import HubModelError, model_folder_of
    from edge.graph.blocks import torch_block_opener
    from edge.planning.plan import READ_UNIT

    source = model_folder or "the shipped tiny-sora"
    try:
        folder = model_folder_of(model_folder, check_pipeline=family_of)  # a Hub id: fetched
        family = family_of(folder)
        if family != manifest.get("family"):
            raise FamilyError(f"{package}: exported from a {manifest.get('family')} model; "
                              f"{source} is a {family} model: pass the folder it was "
                              "exported from with --model")
        # the size exported at, and the family's own options (LTX-Video's frame rate: its
        # RoPE positions) as the package wrote them
        model = load_model(folder, **exported_options(manifest))
    except (FamilyError, HubModelError) as err:
        raise RecordError(str(err)) from None
    if model.latent_shape != tuple(manifest["latent_shape"]):
        raise RecordError(
            f"{package}: latents {manifest['latent_shape']}; {source} makes "
            f"{list(model.latent_shape)}: pass the folder it was exported from with --model")
    # the blocks as exported (re-cut as for the budget the package was exported for), with
    # the stored weights written into this model of our own
    plan = manifest.get("plan") or {}
    components = device_blocks(model, manifest["coreml"]["compression"]["setting"],
                               plan.get("memory_budget_bytes"),
                               plan.get("read_unit_bytes", READ_UNIT)).components
    blocks = {b.key: b for bs in components.values() for b in bs}
    exported = {f"{c['name']}/{b['name']}" for c in manifest["components"] for b in c["blocks"]}
    if exported != set(blocks):
        raise RecordError(f"{package}: its blocks ({', '.join(sorted(exported - set(blocks)))}) "
                          f"are not the ones {source} cuts for its plan: pass the folder it "
                          "was exported from with --model")

    with stored_weights_in_place(components, package, manifest):
        yield torch_block_opener(blocks)


def decode_noise_scale(manifest: dict) -> float:
    """How much decode noise a timestep-conditioned decoder mixes in by the package's
    defaults (its `decode`: the noise scale, else the timestep); 0 without `decode`. At 0 the
    runtimes feed zeros, so a bundle then needs no seed's draw."""
    return decode_values(manifest.get("decode"))[1]


def record_bundle(package: Path, prompt: str, dest: Path, seed: int = 0,
           latents: np.ndarray | None = None, negative_prompt: str | None = None,
           overrides: dict | None = None, model_folder: str | Path | None = None) -> dict:
    """Run one generation of `package` and write its bundle to `dest` (atomically); returns
    the bundle's description (bundle.json without the calls)."""
    package = Path(package)
    try:
        manifest = read_package(package)
    except PackageError as err:
        raise RecordError(str(err)) from None
    target = manifest["target"]
    if target not in RECORDED_WITH:
        raise RecordError(f"{package}: a {target} package; edge record runs "
                          f"{' and '.join(RECORDED_WITH)} packages")
    coreai = is_coreai(manifest)
    if model_folder is not None and (target != "iphone" or coreai):
        raise RecordError(f"--model {model_folder}: only a CoreML iphone package needs the "
                          "model it was exported from (its blocks run in PyTorch; a Core AI "
                          "package's programs run themselves)")
    want = (1, *manifest["latent_shape"])
    if latents is not None and (latents.shape != want or latents.dtype.kind != "f"):
        raise RecordError(f"latents {latents.dtype} {tuple(latents.shape)}: {package} takes "
                          f"float latents of shape {want} (batch, channels, frames, height, "
                          "width; diffusers' layout)")
    try:
        settings = with_overrides(SamplerSettings.from_dict(manifest["sampler"]),
                                  overrides or {}).to_dict()
    except (TypeError, ValueError) as err:
        raise RecordError(str(err)) from None
    if latents is None:
        try:
            check_noise(manifest, str(package / MANIFEST))
        except ValueError as err:
            raise RecordError(str(err)) from None
    elif decode_noise_scale(manifest):
        raise RecordError(f"--latents: {package}'s decoder is conditioned on a timestep and "
                          "its decode noise is the seed's second draw: record from a seed")
    from edge.runtimes.python.pipeline import Pipeline

    with ExitStack() as stack:
        open_block = (stack.enter_context(stored_weight_blocks(package, manifest, model_folder))
                      if target == "iphone" and not coreai else None)
        try:
            pipe = Pipeline.load(package, open_block=open_block)
        except PackageError as err:
            raise RecordError(str(err)) from None
        stack.callback(pipe.close)
        # the seed's noise made here and handed to the run: the bundle holds what ran
        noise = latents if latents is not None else initial_noise(pipe.latent_shape, [seed])
        recorder = Recorder(pipe)
        extra = {} if negative_prompt is None else {"negative_prompt": negative_prompt}
        if decode_noise_scale(manifest):  # what the seed's generator draws after the latents
            extra["decode_noise"] = torch_randn_draws([tuple(pipe.latent_shape)] * 2,
                                                      seed)[1][None]
        video = pipe.generate(prompt, latents=noise, **extra, **(overrides or {}))
        trace = pipe.last_run["sampler"]
        negative = (negative_prompt if negative_prompt is not None
                    else None if pipe.null_caption is not None else pipe.negative_prompt)
    tensors = TensorFile()
    fields = {
        "producer": f"edge {edge.__version__}",
        "package": {"target": target, "model": manifest.get("model"),
                    "manifest_sha256": manifest["manifest_sha256"]},
        "recorded_with": RECORDED_WITH_CORE_AI if coreai else RECORDED_WITH[target],
        "prompt": prompt, "negative_prompt": negative,
        "seed": None if latents is not None else seed, "settings": settings,
        "latents": tensors.ref(np.asarray(noise, np.float32)),
        "frames": tensors.ref(video[0]),
        "trace": {k: trace[k] for k in ("calls", "transformer_calls", "leap_at",
                                        "merged_calls")},
    }
    calls = [{"key": c["key"],
              "inputs": {n: tensors.ref(a) for n, a in c["inputs"].items()},
              "outputs": {n: tensors.ref(a) for n, a in c["outputs"].items()}}
             for c in recorder.calls]
    with atomic_directory(dest, identify=identify_bundle) as tmp:
        write_bundle(tmp, {**fields, "calls": calls}, tensors)
    return {**fields, "call_count": len(calls), "tensor_bytes": tensors.size}


def _record(
    package: Annotated[Path, typer.Argument(help="An exported package folder (onnx or iphone).")],
    prompt: Annotated[str, typer.Argument(help='What to draw, e.g. "a red circle moving left".')],
    output: Annotated[Path, typer.Option(
        "-o", "--output", help="Bundle folder to write (replaces only a bundle, with --force).")],
    seed: Annotated[int | None, typer.Option(
        min=0, max=MAX_SEED, help="Seed of the initial noise [default: 0].")] = None,
    latents: Annotated[Path | None, typer.Option(
        help="Initial noise from a .npy file, (1, C, T, h, w) in diffusers' layout, instead "
             "of the seed's.")] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Denoising steps [default: the "
                                              "package's].")] = None,
    guidance: Annotated[float | None, typer.Option(
        help="Classifier-free guidance scale [default: the package's].")] = None,
    negative_prompt: Annotated[str | None, typer.Option(
        help="What the unconditional pass is told [default: the package's learned null "
             "caption or negative prompt].")] = None,
    model: Annotated[str | None, typer.Option(
        metavar="FOLDER|ORG/NAME",
        help="An iphone package's source model: its folder or a diffusers pipeline's Hub id "
             "(ORG/NAME[@REVISION], as edge export takes it), whose family builds the blocks "
             "its stored weights run in [default: the shipped tiny-sora].")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace a bundle written before (never another folder).")] = False,
    **sampler,
) -> None:
    """Record one generation of a package, every block call's inputs and outputs, as a
    conformance bundle another runtime checks itself against (the Swift runtime's
    `edge-sample --bundle`). An onnx package runs in the Python runtime; an iphone package's
    blocks run in PyTorch with the weights stored in its programs, at its static shapes."""
    import numpy as np

    from edge.core.bundle import identify_bundle
    from edge.core.package import PackageWriteError

    if seed is not None and latents is not None:
        fail("--seed and --latents: give one (the latents are the initial noise)")
    common.check_destination(output, force, identify_bundle)
    noise = None
    if latents is not None:
        from edge.core.files import InputError, check_input_file

        try:
            check_input_file(latents, "--latents")
            # mapped, not read: a file of any size costs nothing until its shape is checked
            noise = np.load(latents, mmap_mode="r", allow_pickle=False)
        except InputError as err:
            fail(str(err))
        except (OSError, ValueError, EOFError) as err:
            fail(f"--latents {latents}: not a NumPy array file ({err})")
    overrides = common.sampler_overrides(steps=steps, guidance=guidance, **sampler)
    # the manifest alone (no file hashed yet) says what the options must fit
    manifest = common.manifest_before_loading(package, output)
    common.check_texts(prompt, negative_prompt)
    common.checked_settings(common.package_sampler(manifest), overrides)
    started = time.perf_counter()
    try:
        info = record_bundle(package, prompt, output, seed=seed or 0, latents=noise,
                             negative_prompt=negative_prompt, overrides=overrides,
                             model_folder=model)
    except (RecordError, PackageWriteError, ValueError, FloatingPointError) as err:
        fail(str(err))
    from edge.core.budget import format_size

    echo(f"wrote {output} in {time.perf_counter() - started:.1f} s: {info['call_count']} "
         f"block calls, {format_size(info['tensor_bytes'])} of arrays, recorded with "
         f"{info['recorded_with']}")


# its options, then the sampler's (declared once: edge/commands/common.py)
record = with_options(_record, common.SAMPLER_OPTIONS)
