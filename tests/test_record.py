"""`edge record`: conformance bundles of one generation, every block call written down
(edge/core/bundle.py). An iphone package's blocks run in PyTorch with its stored weights; an onnx
package in the Python runtime. Bad input is refused in one line with nothing written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from edge.commands import app
from edge.core.bundle import BUNDLE_JSON, TENSORS, Bundle, BundleError
from edge.core.sampler import initial_noise
from edge.core.video_metrics import psnr, snr

PROMPT = "a red circle moving left"
runner = CliRunner()


def _record(*args: str):
    return runner.invoke(app, ["record", *map(str, args)])


@pytest.fixture(scope="module")
def wan_bundle(wan_iphone_package, wan_folder, tmp_path_factory):
    root, manifest = wan_iphone_package
    dest = tmp_path_factory.mktemp("bundles") / "wan"
    result = _record(root, PROMPT, "--model", wan_folder, "--merge-steps", "3", "-o", dest)
    assert result.exit_code == 0, result.output
    return dest, manifest


@pytest.mark.slow
def test_an_iphone_bundle_holds_every_call_in_the_devices_order(wan_bundle):
    dest, manifest = wan_bundle
    bundle = Bundle(dest)
    info = bundle.info
    assert info["package"]["manifest_sha256"] == manifest["manifest_sha256"]
    assert info["recorded_with"].startswith("pytorch")
    assert info["negative_prompt"] == manifest["negative_prompt"] and info["seed"] == 0
    keys = [c["key"] for c in bundle.calls]
    text = [f"text_encoder/{b['name']}" for b in manifest["components"][0]["blocks"]]
    # one caption per call on the device: the prompt, then the negative prompt
    assert keys[:2 * len(text)] == text * 2
    dit = [k for k in keys if k.startswith("transformer/")]
    steps = info["settings"]["steps"]
    assert len(dit) == 4 * steps
    merged = [k for k in dit if k.endswith("#tdtm")]
    assert len(merged) == 2 * 3 and info["trace"]["merged_calls"] == 3  # 2 pairs x 3 steps
    vae = [k for k in keys if k.startswith("vae_decoder/")]
    latent_frames = manifest["latent_shape"][1]
    assert len(vae) == 6 * latent_frames
    assert all(k.endswith("#first") for k in vae[:6]) and not any("#" in k for k in vae[6:])
    # a block's inputs are what the block before gave: the chain is whole
    first = bundle.calls[0]
    assert bundle.array(first["inputs"]["input_ids"]).dtype == np.int32
    latents = bundle.array(info["latents"])
    assert np.array_equal(latents, initial_noise(tuple(manifest["latent_shape"]), [0]))
    frames = bundle.frames
    assert frames.dtype == np.uint8 and frames.shape == (9, 32, 48, 3)


@pytest.mark.slow
def test_a_bundle_without_merging_reproduces_wan_pipeline(wan_iphone_package, wan_folder,
                                                          wan_model, tmp_path):
    root, manifest = wan_iphone_package
    latents = initial_noise(tuple(manifest["latent_shape"]), [3])
    np.save(tmp_path / "z.npy", latents)
    result = _record(root, PROMPT, "--model", wan_folder, "--latents", tmp_path / "z.npy",
                     "-o", tmp_path / "b")
    assert result.exit_code == 0, result.output
    bundle = Bundle(tmp_path / "b")
    assert bundle.info["seed"] is None
    assert np.array_equal(bundle.array(bundle.info["latents"]), latents)
    want = wan_model.reference(PROMPT, latents)[0]
    got = bundle.frames
    assert psnr(got, want) >= 35 and snr(got, want) >= 20, (psnr(got, want), snr(got, want))
    # and not the video of other noise: the check can tell
    other = wan_model.reference(PROMPT, initial_noise(tuple(manifest["latent_shape"]), [4]))[0]
    assert snr(got, other) < snr(got, want) - 10


@pytest.mark.slow  # the session's LTX-Video CoreML export
def test_a_conditioned_decoders_bundle_holds_the_seeds_decode_noise(ltx_iphone_package,
                                                                    ltx_folders, ltx_models,
                                                                    tmp_path):
    """LTX-Video's timestep-conditioned decoder: its call is fed the manifest's decode
    timestep and noise scale and, as decode noise, the seed's second draw (what LTXPipeline
    draws from its generator after the latents), and the frames are LTXPipeline's for the
    seed; given latents are refused (the decode noise comes from the seed)."""
    from edge.core.noise import torch_randn_draws

    root, manifest = ltx_iphone_package
    folder, model = ltx_folders["timestep"], ltx_models["timestep"]
    result = _record(root, PROMPT, "--model", folder, "--seed", "4", "-o", tmp_path / "b")
    assert result.exit_code == 0, result.output
    bundle = Bundle(tmp_path / "b")
    head = next(c for c in bundle.calls if c["key"].startswith("vae_decoder/"))
    shape = tuple(manifest["latent_shape"])
    np.testing.assert_array_equal(bundle.array(head["inputs"]["decode_noise"])[0],
                                  torch_randn_draws([shape, shape], 4)[1])
    assert bundle.array(head["inputs"]["decode_t"]).tolist() == [np.float32(0.05)]
    assert bundle.array(head["inputs"]["decode_noise_scale"]).tolist() == [np.float32(0.025)]
    want, other = model.generate(PROMPT, seed=4)[0], model.generate(PROMPT, seed=5)[0]
    got = bundle.frames
    assert psnr(got, want) >= 35 and snr(got, want) >= 20, (psnr(got, want), snr(got, want))
    assert snr(got, other) < snr(got, want) - 10
    np.save(tmp_path / "z.npy", bundle.array(bundle.info["latents"]))
    given = _record(root, PROMPT, "--model", folder, "--latents", tmp_path / "z.npy", "-o",
                    tmp_path / "c")
    assert given.exit_code != 0 and "record from a seed" in given.output
    assert not (tmp_path / "c").exists()


@pytest.mark.slow  # the session's LTX-Video CoreML export
def test_a_conditioned_decoder_without_decode_noise_records_zeros(ltx_iphone_package,
                                                                  ltx_folders, tmp_path):
    """A package whose decode noise scale is 0 mixes no noise in: its decoder is fed zeros
    (what the runtimes feed then), and given latents are taken."""
    import os

    from edge.core.package import write_manifest

    root, manifest = ltx_iphone_package
    quiet = tmp_path / "pkg"
    shutil.copytree(root, quiet, copy_function=os.link)
    (quiet / "manifest.json").unlink()  # a hard link: writing through it would edit `root`
    write_manifest(quiet, {**manifest, "decode": {"timestep": 0.05, "noise_scale": 0.0}})
    np.save(tmp_path / "z.npy", initial_noise(tuple(manifest["latent_shape"]), [2]))
    for i, args in enumerate((["--seed", "4"], ["--latents", tmp_path / "z.npy"])):
        out = tmp_path / f"bundle-{i}"
        result = _record(quiet, PROMPT, "--model", ltx_folders["timestep"], *args, "-o", out)
        assert result.exit_code == 0, result.output
        head = next(c for c in Bundle(out).calls if c["key"].startswith("vae_decoder/"))
        assert not Bundle(out).array(head["inputs"]["decode_noise"]).any()


def test_an_onnx_bundle_is_the_python_runtimes_run(exported_package, tmp_path):
    from edge.runtimes.python import Pipeline

    root, manifest = exported_package
    result = _record(root, PROMPT, "--steps", "4", "--seed", "2", "-o", tmp_path / "b")
    assert result.exit_code == 0, result.output
    bundle = Bundle(tmp_path / "b")
    pipe = Pipeline.load(root)
    video = pipe.generate(PROMPT, seed=2, steps=4)
    pipe.close()
    assert np.array_equal(bundle.frames, video[0])
    assert bundle.info["recorded_with"] == "onnxruntime"
    assert bundle.info["negative_prompt"] is None  # tiny-sora's learned null caption
    # every call's outputs are what its block makes of its inputs
    call = next(c for c in bundle.calls if c["key"].startswith("transformer/"))
    assert set(call["inputs"]) >= {"latent", "t"}
    # the text encoder once (the null caption is learned), 4 steps, the decoder once
    blocks = {c["name"]: len(c["blocks"]) for c in manifest["components"]}
    assert len(bundle.calls) == (blocks["text_encoder"] + 4 * blocks["transformer"]
                                 + blocks["vae_decoder"])


def test_a_truncated_or_changed_bundle_is_refused(exported_package, tmp_path):
    root, _ = exported_package
    assert _record(root, PROMPT, "--steps", "2", "-o", tmp_path / "b").exit_code == 0
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "b", cut)
    data = (cut / TENSORS).read_bytes()
    (cut / TENSORS).write_bytes(data[:-4])
    with pytest.raises(BundleError, match=f"{TENSORS}.*truncated"):
        Bundle(cut)
    (cut / TENSORS).write_bytes(data[:-4] + b"\0\0\0\1")
    with pytest.raises(BundleError, match="sha256"):
        Bundle(cut)
    info = json.loads((tmp_path / "b" / BUNDLE_JSON).read_text())
    info["calls"][0]["inputs"]["input_ids"]["offset"] = len(data)
    (cut / TENSORS).write_bytes(data)
    (cut / BUNDLE_JSON).write_text(json.dumps(info))
    with pytest.raises(BundleError, match=r"call 0 \(text_encoder/.*input_ids.*outside"):
        Bundle(cut)


@pytest.mark.parametrize("args, words", [
    (["--steps", "2", "--warp", "3"], "No such option"),
    (["--steps", "2", "--seed", "1", "--latents", "LATENTS"], "--seed and --latents"),
    (["--steps", "2", "--latents", "LATENTS"], "latents float32 (1, 2, 3)"),
    (["--steps", "2", "--leap-after", "0"], "leap-after"),
])
def test_bad_options_are_refused_and_nothing_is_written(exported_package, tmp_path, args,
                                                        words):
    root, _ = exported_package
    np.save(tmp_path / "z.npy", np.zeros((1, 2, 3), np.float32))
    args = [str(tmp_path / "z.npy") if a == "LATENTS" else a for a in args]
    result = _record(root, PROMPT, *args, "-o", tmp_path / "b")
    assert result.exit_code != 0 and words in result.output, result.output
    assert not (tmp_path / "b").exists()


def test_a_folder_that_is_not_a_package_is_refused(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "notes.txt").write_text("x")
    result = _record(tmp_path / "pkg", PROMPT, "-o", tmp_path / "b")
    assert result.exit_code == 2 and "manifest.json" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_a_bundle_replaces_only_a_bundle(exported_package, tmp_path):
    root, _ = exported_package
    other = tmp_path / "other"
    other.mkdir()
    (other / "photo.jpg").write_bytes(b"\xff\xd8")
    result = _record(root, PROMPT, "--steps", "2", "-o", other, "--force")
    assert result.exit_code == 2 and "not an edge bundle" in result.output, result.output
    assert (other / "photo.jpg").read_bytes() == b"\xff\xd8"
    dest = tmp_path / "b"
    assert _record(root, PROMPT, "--steps", "2", "-o", dest).exit_code == 0
    again = _record(root, PROMPT, "--steps", "2", "-o", dest)
    assert again.exit_code == 2 and "--force" in again.output
    assert _record(root, PROMPT, "--steps", "2", "-o", dest, "--force").exit_code == 0


def test_an_iphone_package_needs_its_source_model(coreml_package, wan_folder, tmp_path):
    root, _ = coreml_package  # tiny-sora's: the shipped tiny-sora is its source, not a Wan
    result = _record(root, PROMPT, "--steps", "2", "--model", wan_folder, "-o", tmp_path / "b")
    assert result.exit_code == 2 and "--model" in result.output and "tiny-sora" in result.output
    assert not (tmp_path / "b").exists()
