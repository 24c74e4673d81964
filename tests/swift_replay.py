"""Replay fixtures for the Swift runtime's tests (runtimes/swift/Tests/EdgeRuntimeTests).

The Python runtime runs tiny-sora's ONNX package on a few settings while every block call it
makes is recorded: the block's loader key (with `#tdtm` where a TDTM variant ran), the inputs
the runtime fed it and the outputs it got. The Swift pipeline then runs the iphone package of
the same model with a backend that answers each call from the recording, after checking
that Swift asked for the same block with the same inputs (<= 1e-5): the Swift text encoding,
sampler, guidance, leap, TDTM switch, step cache and decoding must reproduce the Python
runtime's calls and frames. Both packages are cut the same way (edge/families/tiny_sora/family.py);
only their batch axes differ, and the calls use one prompt.

Layout of the folder `write(...)` fills:

    package/            the iphone package (a copy: the Swift tests may not change it)
    replay/cases.json   [{"name", "prompt", "settings", "latents", "frames", "trace",
                          "calls": [{"key", "inputs": {name: ref}, "outputs": {name: ref}}]}]
                        ref = {"dtype", "shape", "offset": bytes into tensors.bin}
    replay/tensors.bin  every referenced array, little-endian (edge/core/bundle.py TensorFile)
    bad_manifests.json  [{"name", "manifest", "python_error", "names"}]: manifests the
                        Python side refuses, with its message and the words the Swift error
                        must contain too
    wan/                with `wan=`: the tiny Wan's iphone package and `edge record` bundles
                        of it (write_wan), which the Swift pipeline replays
    families/<family>/  with `families=`: CogVideoX's and LTX-Video's iphone packages,
                        bundles of them (write_package_bundles), replayed the same way, and their
                        bad_manifests.json
    coreai/             with `coreai=`: tiny-sora's Core AI package (--min-ios 27) and bundles
                        recorded from its executed programs (write_coreai)
    tiled/              with `tiled=`: the tiny Wan's Core AI package with its decoder in
                        tiles, and bundles recorded alike
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import numpy as np

from edge.commands.record import Recorder
from edge.core.bundle import TensorFile
from edge.core.package import MANIFEST, PackageError, read_package, write_manifest
from edge.core.sampler import initial_noise
from edge.runtimes.python.package_checks import check_runnable
from edge.runtimes.python.pipeline import Pipeline

STEPS = 8
# (name, prompt, seed, sampler overrides); the Swift tests run them in this order through
# one pipeline (two prompts: a loader and pipeline reused across generations)
CASES = [
    ("baseline", "a red circle moving left", 0, {}),
    ("leap", "a red circle moving left", 0,
     {"leap": True, "leap_after": None, "leap_min_steps": 3, "leap_patience": 1,
      "leap_tol": 0.05}),
    ("leap_tail", "a red circle moving left", 0, {"leap": True, "leap_after": 2,
                                                  "leap_steps": 3}),
    ("merge", "a red circle moving left", 0, {"merge_steps": 4}),
    ("step_cache", "a red circle moving left", 0, {"cache_threshold": 0.3}),
    ("second_prompt", "The blue box slides up!", 1, {"leap": True, "leap_after": 5,
                                                      "leap_steps": 1, "merge_steps": 2}),
]


def record_cases(onnx_package: Path, tensors: TensorFile) -> list[dict]:
    pipe = Pipeline.load(onnx_package)
    recorder = Recorder(pipe)
    cases = []
    for name, prompt, seed, overrides in CASES:
        recorder.calls = []
        latents = initial_noise(tuple(pipe.latent_shape), [seed])
        settings = {"steps": STEPS, **overrides}
        video = pipe.generate(prompt, latents=latents, **settings)
        trace = pipe.last_run["sampler"]
        calls = [{"key": c["key"],
                  "inputs": {n: tensors.ref(a) for n, a in c["inputs"].items()},
                  "outputs": {n: tensors.ref(a) for n, a in c["outputs"].items()}}
                 for c in recorder.calls]
        cases.append({"name": name, "prompt": prompt, "settings": settings,
                      "latents": tensors.ref(latents),
                      "frames": tensors.ref(video[0].astype(np.float32)),  # (T, H, W, 3)
                      "trace": {"calls": trace["calls"],
                                "transformer_calls": pipe.last_run["transformer_calls"],
                                "leap_at": trace["leap_at"], "merged_calls": trace["merged_calls"]},
                      "calls": calls})
    pipe.close()
    return cases


def _block(m: dict, comp: str, index: int) -> dict:
    return next(c for c in m["components"] if c["name"] == comp)["blocks"][index]


# (name, change of the manifest, words the Swift error must contain besides Python's)
BAD_MANIFESTS = [
    ("format", lambda m: m.update(format="other-package"), ["format"]),
    ("version", lambda m: m.update(format_version=2), ["format_version", "2"]),
    ("target", lambda m: m.update(target="web"), ["target", "web"]),
    ("path_escape", lambda m: _block(m, "transformer", 1)["files"][0].update(
        path="../outside/model.mlmodel"), ["../outside/model.mlmodel", "escapes"]),
    ("absolute_path", lambda m: m["tokenizer"]["files"][0].update(path="/etc/passwd"),
     ["/etc/passwd", "escapes"]),
    ("no_component", lambda m: m.update(components=[c for c in m["components"]
                                                    if c["name"] != "vae_decoder"]),
     ["vae_decoder"]),
    ("unknown_sampler_key", lambda m: m["sampler"].update(warp=True), ["warp"]),
    ("bad_steps", lambda m: m["sampler"].update(steps=0), ["steps"]),
    ("bad_leap_after", lambda m: m["sampler"].update(leap_after=0), ["leap_after"]),
    ("bad_leap_steps", lambda m: m["sampler"].update(leap_steps=0), ["leap_steps"]),
    ("bad_scheduler", lambda m: m["sampler"].update(scheduler="ddim"), ["scheduler", "ddim"]),
    ("missing_field", lambda m: m.pop("latent_shape"), ["latent_shape"]),
    ("null_caption_mask", lambda m: m.update(null_caption_mask="half"),
     ["null_caption_mask", "half"]),
    # the multifunction layout (iOS 18): which program and function each variant runs
    ("layout", lambda m: m["coreml"].update(layout="fused"), ["layout", "fused"]),
    ("multifunction_on_ios17", lambda m: m["coreml"].update(minimum_deployment_target="iOS17"),
     ["multifunction", "iOS17"]),
    ("variant_without_function", lambda m: _block(m, "transformer", 1)["variants"]["tdtm"]
     .pop("function"), ["tdtm", "function"]),
    ("variant_of_another_program", lambda m: _block(m, "transformer", 1)["variants"]["tdtm"]
     .update(model=_block(m, "transformer", 2)["model"]), ["tdtm", "pair_1.mlpackage"]),
    ("function_twice", lambda m: _block(m, "transformer", 1)["variants"]["tdtm"]
     .update(function="main"), ["tdtm", "main"]),
    ("function_in_separate", lambda m: m["coreml"].update(layout="separate"),
     ["function", "separate"]),
]


def python_refusal(folder: Path, manifest: dict) -> str | None:
    """What the Python side says of a package folder: its package check, then the runtime's
    (check_runnable: components, sampler settings, conditioning), or None if it accepts it.
    The Python runtime runs onnx packages, so but for the target it is asked about the same
    manifest with the onnx target."""
    try:
        read_package(folder)
        check_runnable(manifest if manifest["target"] not in ("iphone", "onnx")
                       else {**manifest, "target": "onnx"})
    except PackageError as err:
        return str(err)
    return None


def bad_manifests(package: Path, scratch: Path, edits: list | None = None) -> list[dict]:
    """Each edit (default: BAD_MANIFESTS) of the good manifest of `package`, with the error
    the Python side raises for it (in a hard-linked copy of the package, so only the
    manifest differs)."""
    manifest = json.loads((package / MANIFEST).read_text())
    cases = []
    for name, change, words in edits or BAD_MANIFESTS:
        m = copy.deepcopy(manifest)
        change(m)
        folder = scratch / name
        shutil.copytree(package, folder, copy_function=os.link)
        (folder / MANIFEST).unlink()  # a hard link: writing through it would edit `package`
        write_manifest(folder, m)
        message = python_refusal(folder, m)
        if message is None:
            raise AssertionError(f"bad manifest {name}: the Python side accepted it")
        cases.append({"name": name, "manifest": m, "names": words,
                      "python_error": message.replace(str(folder), "PACKAGE")})
    return cases


# Wan bundles (edge record on the tiny Wan iphone package): name -> (prompt, options)
WAN_BUNDLES = {
    "seed": ("a red circle moving left", {}),
    "negative_merge_leap": ("The blue box slides up!  Twice &amp; more", {
        "negative_prompt": "blurry, static", "overrides": {"merge_steps": 3, "leap": True,
                                                           "leap_after": 5, "leap_steps": 2}}),
    "step_cache": ("a café's crème square, slowly", {"seed": 5,
                                                     "overrides": {"cache_threshold": 0.3}}),
    # guidance for the first 2 calls, then the caption's half alone (the package's
    # `unguided` functions; merged calls `tdtm_unguided` on the TDTM pairs), the step cache
    # across the cutoff
    "guidance_cutoff": ("a red circle moving left", {
        "seed": 2, "overrides": {"guidance_steps": 2, "merge_steps": 6,
                                 "cache_threshold": 0.3}}),
}

# Manifests of the Wan package the Python side refuses (as BAD_MANIFESTS)
WAN_BAD_MANIFESTS = [
    ("no_unconditional", lambda m: m.pop("negative_prompt"), ["negative_prompt"]),
    ("layout", lambda m: m.update(latent_layout="tiles"), ["latent_layout", "tiles"]),
    ("clean", lambda m: m["tokenizer"].update(clean="ftfy"), ["clean", "ftfy"]),
    ("first_variant", lambda m: next(c for c in m["components"] if "chunked" in c)["chunked"]
     .update(first_variant="start"), ["start"]),
    ("state_without_first_variant", lambda m: next(c for c in m["components"]
                                                   if "chunked" in c)["chunked"]
     .pop("first_variant"), ["state", "first_variant"]),
]


def write_bad_manifests(folder: Path, edits: list | None = None) -> None:
    """folder/bad_manifests.json: `edits` (default BAD_MANIFESTS) of folder/package's
    manifest with the Python side's refusals (bad_manifests)."""
    bad = bad_manifests(folder / "package", folder / "scratch", edits)
    shutil.rmtree(folder / "scratch")
    (folder / "bad_manifests.json").write_text(json.dumps(bad, indent=1))


def write_package_bundles(folder: Path, iphone_package: Path, model_folder: Path,
                          bundles: dict[str, tuple[str, dict]], bad_edits: list) -> None:
    """folder/package: an iphone package (a copy); folder/bundles/<name>: `edge record`
    bundles of it ({name: (prompt, options)}); folder/bad_manifests.json: `bad_edits`."""
    from edge.commands.record import record_bundle as record

    folder.mkdir(parents=True)
    shutil.copytree(iphone_package, folder / "package")
    for name, (prompt, options) in bundles.items():
        record(folder / "package", prompt, folder / "bundles" / name, model_folder=model_folder,
               **options)
    write_bad_manifests(folder, bad_edits)


def write_wan(folder: Path, wan_iphone: Path, wan_folder: Path, tiny_sora_iphone: Path
              ) -> None:
    """The tiny Wan iphone package with its WAN_BUNDLES and WAN_BAD_MANIFESTS
    (write_package_bundles), and folder/tiny_sora_bundle: a bundle of tiny-sora's iphone
    package (another package: the Swift side refuses it for this one, and replays it on its
    own package)."""
    from edge.commands.record import record_bundle as record

    write_package_bundles(folder, wan_iphone, wan_folder, WAN_BUNDLES, WAN_BAD_MANIFESTS)
    record(tiny_sora_iphone, "a red circle moving left", folder / "tiny_sora_bundle",
           overrides={"steps": 6, "merge_steps": 2})


# Bundles of the other families' iphone packages: family -> {name: (prompt, options)}.
# CogVideoX: DDIM with v-prediction and dynamic guidance, joint text+video blocks, the decoder
# by CogVideoX's frame batches; LTX-Video: flow-match Euler with LTX's shift, the decoder
# conditioned on a timestep (its decode noise the seed's second draw); Open-Sora 1.2: RFLOW,
# the learned null caption under the prompt's mask, STDiT3's spatial-temporal pairs (the step
# cache's threshold large: the random weights move block 0's input far from step to step).
FAMILY_BUNDLES = {
    "cogvideox": {
        "seed": ("a red circle moving left", {}),
        "negative_merge_leap": ("The blue box slides up!", {
            "negative_prompt": "blurry, static", "seed": 3,
            "overrides": {"merge_steps": 2, "leap": True, "leap_after": 4}}),
        "step_cache": ("a red circle moving left", {"seed": 5,
                                                    "overrides": {"cache_threshold": 0.3}}),
    },
    "ltx": {
        "seed": ("a red circle moving left", {}),
        "negative_merge_leap": ("The blue box slides up!", {
            "negative_prompt": "blurry, static", "seed": 3,
            "overrides": {"merge_steps": 2, "leap": True, "leap_after": 2, "leap_steps": 1}}),
        "step_cache": ("a red circle moving left", {
            "seed": 5, "overrides": {"steps": 8, "cache_threshold": 0.3}}),
        # a distilled model's given noise levels, shifted and stretched as LTX's schedule
        "given_levels": ("a red circle moving left", {
            "seed": 7, "overrides": {"sigmas": [1.0, 0.95, 0.8, 0.5]}}),
    },
    "opensora": {
        "seed": ("a red circle moving left", {}),
        "negative_merge_leap": ("The blue box slides up!", {
            "negative_prompt": "blurry, static", "seed": 3,
            "overrides": {"steps": 6, "merge_steps": 2, "leap": True, "leap_after": 3,
                          "leap_steps": 2}}),
        "step_cache": ("a red circle moving left", {
            "seed": 5, "overrides": {"steps": 8, "cache_threshold": 1.0}}),
    },
}


# Manifests of those packages the Python side refuses (as BAD_MANIFESTS): decode settings
# and a decoder that does not go together
FAMILY_BAD_MANIFESTS = {
    "cogvideox": [("decode_without_its_inputs", lambda m: m.update(
        decode={"timestep": 0.05, "noise_scale": None}), ["decode", "decode_noise"])],
    "ltx": [("no_decode", lambda m: m.pop("decode"), ["decode_t", "'decode'"]),
            ("decode_on_frames", lambda m: m.update(latent_layout="frames"),
             ["decode", "'video'"])],
    "opensora": [("null_caption_mask", lambda m: m.update(null_caption_mask="half"),
                  ["null_caption_mask", "half"])],
}


# Bundles of tiny-sora's Core AI package (`--min-ios 27`), recorded from its executed
# programs: merged first steps (the pairs' tdtm functions), then a guidance cutoff (the
# caption-half functions, unguided and tdtm_unguided)
COREAI_BUNDLES = {
    "merge_cutoff": ("a red circle moving left", {
        "seed": 4, "overrides": {"steps": 4, "merge_steps": 2, "guidance_steps": 1}}),
}


# Bundles of the tiny Wan whose VAE tiles (conftest's wan_tiled), as a Core AI package: the
# decoder's tiles through their sizes' functions (`tile_4x2`, `first_tile_4x2`)
TILED_BUNDLES = {
    "tiles": ("a red circle moving left", {"seed": 2, "overrides": {"steps": 2}}),
}


def _decoder(manifest: dict) -> dict:
    return next(c for c in manifest["components"] if c["name"] == "vae_decoder")


# Manifests of the tiled package the Python side refuses: a tile size's program missing, the
# tiles not those the programs were traced for
TILED_BAD_MANIFESTS = [
    ("tile_program_missing", lambda m: _decoder(m)["blocks"][2]["variants"].pop(
        "first_tile_4x2"), ["up_1", "first_tile_4x2", "4x2"]),
    ("tile_size", lambda m: _decoder(m)["tiles"].update(latent_size=[4, 3]),
     ["head", "4x4", "4x3"]),
]


def write_coreai(folder: Path, coreai_package: Path,
                 bundles: dict[str, tuple[str, dict]] = COREAI_BUNDLES,
                 bad_edits: list | None = None) -> None:
    """folder/package: a Core AI iphone package (a copy); folder/bundles/<name>: its
    `bundles`, recorded by `edge record` from the programs Core AI executed; with
    `bad_edits`, folder/bad_manifests.json."""
    from edge.commands.record import record_bundle as record

    folder.mkdir(parents=True)
    shutil.copytree(coreai_package, folder / "package")
    for name, (prompt, options) in bundles.items():
        record(folder / "package", prompt, folder / "bundles" / name, **options)
    if bad_edits:
        write_bad_manifests(folder, bad_edits)


def write(folder: Path, onnx_package: Path, iphone_package: Path,
          wan: tuple[Path, Path] | None = None,
          families: dict[str, tuple[Path, Path]] | None = None,
          coreai: Path | None = None, tiled: Path | None = None) -> Path:
    """Fill `folder` (see the module docstring); returns it. `wan`: (the tiny Wan's iphone
    package, its model folder), written under folder/wan (write_wan); `families`: {family:
    (its iphone package, its model folder)}, each under folder/families/<family> with its
    FAMILY_BUNDLES (write_package_bundles); `coreai`: tiny-sora's Core AI package, under
    folder/coreai with its COREAI_BUNDLES (write_coreai); `tiled`: the tiled Wan's Core AI
    package, under folder/tiled with its TILED_BUNDLES and TILED_BAD_MANIFESTS."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(iphone_package, folder / "package")
    replay = folder / "replay"
    replay.mkdir()
    tensors = TensorFile()
    cases = record_cases(onnx_package, tensors)
    tensors.write(replay / "tensors.bin")
    (replay / "cases.json").write_text(json.dumps(cases))
    write_bad_manifests(folder)
    if wan is not None:
        write_wan(folder / "wan", *wan, iphone_package)
    for family, (package, model_folder) in (families or {}).items():
        write_package_bundles(folder / "families" / family, package, model_folder,
                              FAMILY_BUNDLES[family], FAMILY_BAD_MANIFESTS[family])
    if coreai is not None:
        write_coreai(folder / "coreai", coreai)
    if tiled is not None:
        write_coreai(folder / "tiled", tiled, TILED_BUNDLES, TILED_BAD_MANIFESTS)
    return folder
