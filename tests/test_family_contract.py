"""The family contract: the same checks on every family's model and package (tiny-sora,
Wan 2.1 and 2.2, CogVideoX 2B and 5B, LTX-Video with both decoders), as diffusers'
`PipelineTesterMixin` runs one set of checks on every pipeline. Each case is a session
fixture of tests/conftest.py, fetched only by the tests that run it: a family's own file
(test_wan.py, test_cogvideox.py, test_ltx.py, test_wan22.py) keeps what only it does."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import FAMILY_SIZE, LTX_OPTIONS, TEST_CHUNK_ROWS, WAN22_SIZE, WAN_SIZE
from graph_shapes import attention_ops, softmax_rows

from edge.commands.common import frame_size
from edge.core.video_metrics import psnr, snr
from edge.families import (
    FAMILIES,
    SIZE_OPTIONS,
    FamilyError,
    export_options,
    exported_options,
    family_module,
    load_model,
)
from edge.families.pipeline_run import Accepted

# case -> (models fixture, packages fixture, key): a dict fixture's key, or None for a
# fixture of one model or package
CASES = {
    "tiny-sora": ("tiny_sora", "exported_package", None),
    "wan-unipc": ("wan_models", "wan_packages", "unipc"),
    "wan-euler": ("wan_models", "wan_packages", "euler"),
    "wan22": ("wan22", "wan22_package", None),
    "cogvideox-2b": ("cog_models", "cog_packages", "2b"),
    "cogvideox-5b": ("cog_models", "cog_packages", "5b"),
    "ltx-plain": ("ltx_models", "ltx_packages", "plain"),
    "ltx-timestep": ("ltx_models", "ltx_packages", "timestep"),
}
DIFFUSERS = [c for c in CASES if c != "tiny-sora"]
# case -> (folder fixture, key, the tests' size, the options its models were loaded with)
FOLDERS = {
    "wan-euler": ("wan_folders", "euler", WAN_SIZE, {}),
    "wan22": ("wan22_folder", None, WAN22_SIZE, {}),
    "cogvideox-2b": ("cog_folders", "2b", FAMILY_SIZE, {}),
    "ltx-plain": ("ltx_folders", "plain", FAMILY_SIZE, LTX_OPTIONS["plain"]),
    "ltx-timestep": ("ltx_folders", "timestep", FAMILY_SIZE, LTX_OPTIONS["timestep"]),
}
SCHEDULERS = {"wan-unipc": "flow_unipc", "wan-euler": "flow_euler", "wan22": "flow_unipc",
              "cogvideox-2b": "cogvideox_ddim", "cogvideox-5b": "cogvideox_ddim",
              "ltx-plain": "ltx_flow_euler", "ltx-timestep": "ltx_flow_euler"}
PROMPT = "a red circle moving  left"  # two spaces: a cleaner (Wan's) must do as diffusers'


def _fixture(request, name: str, key: str | None):
    value = request.getfixturevalue(name)
    return value if key is None else value[key]


def model_of(request, case: str):
    models, _, key = CASES[case]
    return _fixture(request, models, key)


def package_of(request, case: str) -> tuple:
    _, packages, key = CASES[case]
    return _fixture(request, packages, key)


def folder_of(request, case: str):
    name, key, _, _ = FOLDERS[case]
    return _fixture(request, name, key)


def _run(root, *calls: dict, **load) -> list[np.ndarray]:
    from edge.runtimes.python import Pipeline

    runtime = Pipeline.load(root, **load)
    try:
        return [runtime.generate(PROMPT, **kwargs) for kwargs in calls]
    finally:
        runtime.close()


def _latents(model, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, *model.latent_shape),
                                                       dtype=np.float32)


# ---- what a family takes, before anything loads ---------------------------------------------

@pytest.mark.parametrize("case", FOLDERS)
def test_accepts_says_what_the_model_is_built_from(request, case):
    """`accepts` reads the folder's JSON files and returns one result type for every family:
    the size, the sampler and the family's own settings, which the loaded model holds."""
    model = model_of(request, case)
    _, _, size, options = FOLDERS[case]
    accepted = family_module(model.family).accepts(
        folder_of(request, case), steps=model.sampler.steps, **size, **options)
    assert isinstance(accepted, Accepted)
    assert accepted.size == size and accepted.sampler == model.sampler
    assert all(getattr(model, k) == v for k, v in accepted.own.items())


@pytest.mark.parametrize("case,size,message", [
    ("wan-euler", {"frames": 8}, "--frames 8: Wan needs 4k \\+ 1"),
    ("wan-euler", {"height": 40}, "--height 40: Wan needs a positive multiple of 16"),
    ("wan-euler", {"width": 0}, "--width 0"),
    ("wan22", {"height": 48}, "--height 48: .*multiple of 32"),
    ("wan22", {"frames": 8}, "--frames 8: .*4k \\+ 1"),
    ("cogvideox-2b", {"height": 40}, "--height 40: .*multiple of 16"),
    ("cogvideox-2b", {"frames": 8}, "--frames 8: .*4k \\+ 1"),
    ("ltx-plain", {"height": 48}, "--height 48: .*multiple of 32"),
    ("ltx-plain", {"width": 40}, "--width 40: .*multiple of 32"),
    ("ltx-plain", {"frames": 16}, "--frames 16: .*4k \\+ 1"),
])
def test_sizes_the_family_cannot_take_are_refused(request, case, size, message):
    with pytest.raises(FamilyError, match=message):
        load_model(folder_of(request, case), **(FOLDERS[case][2] | size))


# an option some families declare -> (a value on the command line, the families taking it)
OWN_OPTIONS = {"frame_rate": ("24", "ltx, opensora"), "decode_timestep": ("0.05", "ltx"),
               "decode_noise_scale": ("0.025", "ltx"),
               "out_of_core": (None, "cogvideox, ltx, wan"),
               "lora": ("adapter.safetensors", "cogvideox, ltx, wan")}
PIPELINES = {"tiny-sora": None, "wan": "WanPipeline", "cogvideox": "CogVideoXPipeline",
             "ltx": "LTXPipeline", "opensora": None}


@pytest.mark.parametrize("family,option", [
    (f, o) for f in FAMILIES for o in [*OWN_OPTIONS, *SIZE_OPTIONS]
    if o not in export_options(f)])
def test_cli_refuses_options_the_family_does_not_take(tmp_path, family, option):
    """Refused naming the option before anything loads (the family is read from
    model_index.json alone, so an index is folder enough): an option of other families
    names them; tiny-sora's size and sampler come with its weights."""
    from typer.testing import CliRunner

    from edge.commands import app

    model = []
    if PIPELINES[family] is not None:
        folder = tmp_path / family
        folder.mkdir()
        (folder / "model_index.json").write_text(json.dumps({"_class_name": PIPELINES[family]}))
        model = ["--model", str(folder)]
    elif family == "opensora":  # no index: its transformer's config names it
        folder = tmp_path / family / "transformer"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"model_type": "STDiT3"}))
        model = ["--model", str(folder.parent)]
    flag = f"--{option.replace('_', '-')}"
    value, takers = OWN_OPTIONS.get(option, ("32", None))
    out = tmp_path / "pkg"
    res = CliRunner().invoke(app, ["export", *model, "-o", str(out), flag,
                                   *([] if value is None else [value])])
    assert res.exit_code != 0
    want = (f"{flag}: {family} models do not take it (an export option of {takers} models)"
            if takers else f"{flag}: for diffusers pipeline folders")
    assert want in res.output, res.output
    assert not out.exists()


# ---- the package ------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_the_package_is_the_same_bytes_as_recorded(request, case):
    """Every family's package is what the code made when its digest was recorded: graphs,
    weights, tokenizer, conditioning and manifest byte for byte (less what an export
    measures), so a move of code that changes a package fails here (tests/package_digest.py
    says how to record them again where a change is meant to)."""
    from package_digest import package_digest, record, recorded, recording, tool_versions

    root, _ = package_of(request, case)
    digest = package_digest(root)
    if recording():
        record(case, digest)
        return
    book = recorded()
    if book["tools"] != tool_versions():
        pytest.skip(f"the digests were recorded with {book['tools']}; this install has "
                    f"{tool_versions()}, whose graphs may differ in bytes")
    assert book["packages"].get(case) == digest, (
        f"{case}: the package's bytes changed (digest {digest}); if the change is meant to "
        "change packages, record them again (tests/package_digest.py)")


@pytest.mark.parametrize("case", CASES)
def test_package_fields_are_the_models(request, case):
    """The manifest carries the model's latents, sampler and tokenizer; a diffusers
    family's also its video size, the layout, the negative prompt, a conditioned decoder's
    decode settings; what `video` records loads the model again at its shapes (`edge
    record`); every block within 1e-4 of PyTorch."""
    model = model_of(request, case)
    _, manifest = package_of(request, case)
    assert manifest["family"] == model.family
    assert manifest["latent_shape"] == list(model.latent_shape)
    assert manifest["sampler"]["scheduler"] == model.sampler.scheduler
    assert manifest["tokenizer"]["files"]
    if case == "tiny-sora":
        assert exported_options(manifest) == {}
        return
    assert manifest["sampler"]["scheduler"] == SCHEDULERS[case]
    assert manifest["latent_layout"] == "video" and manifest["negative_prompt"] == ""
    assert manifest["tokenizer"]["max_tokens"] == model.text_tokens
    decode = getattr(model, "decode", None)
    assert manifest.get("decode") == (None if decode is None else decode.to_dict())
    size = {"height": model.height, "width": model.width, "frames": model.frames}
    assert {k: manifest["video"][k] for k in size} == size
    assert exported_options(manifest) == manifest["video"]
    assert max(b["validation"]["max_abs_error"] for c in manifest["components"]
               for b in c["blocks"]) <= 1e-4


@pytest.mark.parametrize("case", DIFFUSERS)
def test_no_graph_holds_a_whole_attention_score_matrix(request, case):
    """The shared test exports trace attention in chunks of TEST_CHUNK_ROWS query rows
    (conftest.py): every softmax of every graph takes at most that many rows, every
    transformer block attends (fused or chunked), and the package reproduces its pipeline
    all the same (test_package_reproduces_the_pipeline, on these very packages)."""
    root, manifest = package_of(request, case)
    graphs = sorted(root.glob("graphs/**/*.onnx"))
    rows = [r for g in graphs for r in softmax_rows(g)]
    assert max(rows, default=0) <= TEST_CHUNK_ROWS, case
    blocks = [root / b["graph"] for c in manifest["components"] if c["name"] == "transformer"
              for b in c["blocks"] if b["name"].startswith("block")]
    assert blocks and all(attention_ops(g) for g in blocks), case


# the steps each family's package is checked against its pipeline at
STEPS = {"wan-unipc": 8, "wan-euler": 8, "wan22": 6, "cogvideox-2b": 6, "cogvideox-5b": 6,
         "ltx-plain": 4, "ltx-timestep": 4}


def _given_latents(model, manifest: dict, kwargs: dict) -> tuple[dict, dict]:
    """The runtime's and the pipeline's arguments for one video from given latents. A
    conditioned decoder's noise is what the pipeline draws from its generator: the reference
    gets a seed, the runtime that seed's draw (given latents, the generator draws the decode
    noise first)."""
    runtime_kwargs = kwargs | {"latents": _latents(model, 7)}
    reference_kwargs = dict(runtime_kwargs)
    if "decode" in manifest:
        reference_kwargs["seed"] = 5
        runtime_kwargs["decode_noise"] = torch.randn(
            (1, *model.latent_shape), generator=torch.Generator().manual_seed(5)).numpy()
    return runtime_kwargs, reference_kwargs


@pytest.mark.parametrize("case", DIFFUSERS)
def test_package_reproduces_the_pipeline(request, case):
    """The Python runtime given diffusers' prompt, negative prompt, latents (the package's
    layout), steps and guidance makes the pipeline's video (PSNR, and SNR against the
    video's own spread); another noise does not, and another negative prompt changes it. A
    conditioned decoder's noise is what the pipeline draws from its generator: the
    reference gets a seed, the runtime that seed's draw."""
    model = model_of(request, case)
    root, manifest = package_of(request, case)
    kwargs = {"negative_prompt": "blue dog", "steps": STEPS[case], "guidance": 4.0}
    runtime_kwargs, reference_kwargs = _given_latents(model, manifest, kwargs)
    got, other_noise, other_negative = _run(
        root, runtime_kwargs, runtime_kwargs | {"latents": _latents(model, 8)},
        runtime_kwargs | {"negative_prompt": "green square"})
    want = model.reference(PROMPT, **reference_kwargs)
    assert got.shape == want.shape == (1, model.frames, model.height, model.width, 3)
    assert frame_size(manifest) == (model.height, model.width)  # what --scale is checked on
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0, (psnr(got, want),
                                                                snr(got, want))
    assert snr(other_noise, want) < 15.0, snr(other_noise, want)
    # random weights barely listen to text, so only "not the same" is asked
    assert not np.array_equal(other_negative, got)
    print(f"{case}: PSNR {psnr(got, want):.1f} dB, SNR {snr(got, want):.1f} dB; another "
          f"noise: SNR {snr(other_noise, want):.1f} dB")


@pytest.mark.parametrize("case", ["wan-unipc", "cogvideox-2b", "ltx-timestep"])
def test_guidance_one_is_the_pipelines_unguided_video(request, case):
    """At a guidance scale of 1 diffusers runs no unconditional pass (its
    do_classifier_free_guidance is a scale over 1), and neither does the runtime: every
    transformer call is the caption's half alone, and the video is the pipeline's."""
    model = model_of(request, case)
    root, manifest = package_of(request, case)
    kwargs = {"steps": STEPS[case], "guidance": 1.0}
    runtime_kwargs, reference_kwargs = _given_latents(model, manifest, kwargs)
    from edge.runtimes.python import Pipeline

    runtime = Pipeline.load(root)
    try:
        got = runtime.generate(PROMPT, **runtime_kwargs)
        assert runtime.last_run["sampler"]["guided_calls"] == 0
        assert runtime.last_run["unguided_batch"] == 1
    finally:
        runtime.close()
    want = model.reference(PROMPT, **reference_kwargs)
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0, (psnr(got, want),
                                                                snr(got, want))


# levels a distilled model might be trained for: most of the way at high noise
GIVEN_LEVELS = (1.0, 0.96, 0.85, 0.6, 0.3)


@pytest.mark.parametrize("case", ["wan-unipc", "wan-euler", "ltx-timestep"])
def test_given_levels_are_the_pipelines_with_that_list(request, case):
    """A generation through given noise levels (`sigmas`) is the pipeline's whose scheduler
    was set to the same list (set_timesteps(sigmas=...)), and not the video of the
    schedule's own spacing at as many steps."""
    model = model_of(request, case)
    root, manifest = package_of(request, case)
    kwargs = {"guidance": 4.0, "sigmas": list(GIVEN_LEVELS)}
    runtime_kwargs, reference_kwargs = _given_latents(model, manifest, kwargs)
    reference_kwargs |= {"steps": len(GIVEN_LEVELS), "sigmas": GIVEN_LEVELS}
    (got,) = _run(root, runtime_kwargs)
    want = model.reference(PROMPT, **reference_kwargs)
    own = model.reference(PROMPT, **(reference_kwargs | {"sigmas": None}))
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0, (psnr(got, want),
                                                                snr(got, want))
    assert snr(own, want) < snr(got, want) - 10, (snr(own, want), snr(got, want))
    print(f"{case}: given levels SNR {snr(got, want):.1f} dB; the own spacing's video "
          f"{snr(own, want):.1f} dB")


def test_a_ddim_package_refuses_given_levels(request):
    """CogVideoX's DDIM takes no list (neither does CogVideoXDDIMScheduler): refused naming
    the setting before any block runs."""
    with pytest.raises(ValueError, match="sigmas=.*cogvideox_ddim takes no given levels"):
        _run(package_of(request, "cogvideox-2b")[0], {"sigmas": [0.9, 0.5]})


@pytest.mark.parametrize("case,seed,steps", [("wan-unipc", 42, 8), ("cogvideox-2b", 11, 4)])
def test_a_seed_gives_the_pipelines_video_for_its_generator(request, case, seed, steps):
    """`generate(seed=s)` with no latents reproduces the pipeline given
    `generator=torch.Generator().manual_seed(s)`: the same noise, so the same video (PSNR,
    and SNR against the video's own spread, which another seed's video fails). LTX-Video's
    seed, which also draws the decode noise: test_ltx.py."""
    model = model_of(request, case)
    got, other = _run(package_of(request, case)[0], {"seed": seed, "steps": steps},
                      {"seed": seed + 1, "steps": steps})
    want = model.generate(PROMPT, seed=seed, steps=steps)
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0, (psnr(got, want),
                                                                snr(got, want))
    assert snr(other, want) < 15.0, snr(other, want)


# case -> (steps, the leap's options, where it leaps, the transformer calls it makes)
LEAPS = {"wan-unipc": (12, {"leap_after": 3, "leap_steps": 4}, 3, 7),
         "wan22": (12, {"leap_after": 4, "leap_steps": 3}, 4, 7),
         "cogvideox-5b": (12, {"leap_after": 6}, 6, 7),  # DDIM: one jump
         "ltx-plain": (10, {"leap_after": 4, "leap_steps": 2}, 4, 6)}


@pytest.mark.parametrize("case", LEAPS)
def test_leap_step_cache_and_tdtm_run(request, case):
    """The techniques on every family: a fixed leap (into a re-planned tail where the
    scheduler has one: the first tail step on the velocity the leap was decided on), the
    step cache skipping transformer calls (block 0's modulated input from the prologue),
    TDTM's merged variant of every transformer block for the first steps; each a finite
    video other than the plain one."""
    from edge.runtimes.python import Pipeline

    root, manifest = package_of(request, case)
    transformer = next(c for c in manifest["components"] if c["name"] == "transformer")
    assert all("tdtm" in b["variants"] for b in transformer["blocks"][1:-1])
    steps, leap, leap_at, calls = LEAPS[case]
    runtime = Pipeline.load(root)
    try:
        base = runtime.generate("a cat", steps=steps)
        assert runtime.last_run["sampler"]["transformer_calls"] == steps
        runs = {}
        for name, options in {"leap": {"leap": True, **leap}, "cache": {"cache_threshold": 0.3},
                              "tdtm": {"merge_steps": 4}}.items():
            runs[name] = (runtime.generate("a cat", steps=steps, **options),
                          runtime.last_run["sampler"])
    finally:
        runtime.close()
    assert runs["leap"][1]["leap_at"] == leap_at and runs["leap"][1]["calls"] == calls
    assert runs["cache"][1]["transformer_calls"] < steps
    assert runs["tdtm"][1]["merged_calls"] == 4
    for video, _ in runs.values():
        assert video.shape == base.shape and np.isfinite(video).all()
        assert not np.array_equal(video, base)


@pytest.mark.parametrize("case,kwargs", [("wan-unipc", {"steps": 4}),
                                         ("cogvideox-2b", {"steps": 4}),
                                         ("ltx-timestep", {"seed": 3, "steps": 3})])
def test_streamed_under_a_budget_equals_resident(request, case, kwargs):
    """At the largest block's budget the loader streams every block (a chunked decoder's
    pieces, a conditioned decoder's decode inputs through the loader's schedule) and makes
    the resident runtime's video."""
    from edge.runtimes.python import Pipeline

    root, manifest = package_of(request, case)
    largest = max(f["bytes"] for c in manifest["components"] for b in c["blocks"]
                  for f in b["files"] if f["path"] == b["weights"]["path"])
    resident, streamed = Pipeline.load(root), Pipeline.load(root, memory_budget=largest)
    try:
        whole_batch = resident.generate("a red dog", **kwargs)
        # under a budget the runtime runs the guidance halves as calls of their own; the
        # resident runtime does the same here, so any difference would be the streaming's
        resident.split_batches = True
        want = resident.generate("a red dog", **kwargs)
        got = streamed.generate("a red dog", **kwargs)
        assert streamed.last_run["bytes_read"] > resident.last_run["bytes_read"]
        assert streamed.last_run["peak_held_bytes"] <= largest
    finally:
        resident.close()
        streamed.close()
    np.testing.assert_array_equal(got, want)
    # a batch of one and of two round differently in onnxruntime's kernels (float32 last
    # bits): a pixel may move by one level, no more, and the videos are the same video
    assert np.abs(got.astype(int) - whole_batch.astype(int)).max() <= 1
    error = ((got.astype(float) - whole_batch) ** 2).mean()
    assert 10 * np.log10(whole_batch.astype(float).var() / max(error, 1e-12)) > 40


# ---- the iPhone -------------------------------------------------------------------------------

# case -> (the session's CoreML package fixture, the most a block may differ from fp32 with
# its stored fp16 weights, absolute)
IPHONE = {"wan22": ("wan22_iphone_package", 5e-3),
          # CogVideoX's decoder's later stages reach 5.5e-3 on their larger activations
          "cogvideox-5b": ("cog_iphone_package", 1e-2),
          "ltx-plain": ("ltx_plain_iphone_package", 5e-3),
          "ltx-timestep": ("ltx_iphone_package", 5e-3)}


@pytest.mark.slow  # a CoreML export per case (20 to 40 s) and its end-to-end check
@pytest.mark.parametrize("case", IPHONE)
def test_exports_to_the_iphone_and_holds_the_end_to_end_check(request, case):
    """The family's graph-friendly rewrites are what CoreML takes: every block converts,
    within its bound of fp32 with its stored fp16 weights, and the pipeline with those
    weights stays >= 35 dB PSNR, >= 20 dB SNR from fp32 end to end."""
    from edge.core.package import read_package

    fixture, bound = IPHONE[case]
    root, manifest = request.getfixturevalue(fixture)
    assert read_package(root) == manifest
    errors = {f"{c['name']}/{b['name']}": b["validation"]["max_abs_error"]
              for c in manifest["components"] for b in c["blocks"]}
    assert max(errors.values()) <= bound, errors
    check = manifest["validation"]
    assert check["identical"] or (check["psnr_db"] >= 35 and check["snr_db"] >= 20), check
    print(f"{case}: worst block {max(errors, key=errors.get)} {max(errors.values()):.2g}; "
          f"end to end PSNR {check['psnr_db']} dB, SNR {check['snr_db']} dB")
