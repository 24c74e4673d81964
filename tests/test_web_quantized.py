"""tiny-sora's web package with int8 weights (`edge export --target web --quantize 8`) in
headless chromium: the WebGPU path decodes each stored tensor on the GPU to exactly the
exporter's float32 (runtimes/web/decode.js), the wasm path's graphs decode in themselves, and
both paths generate the video of the float32 model within the form's floor. (The default
form, fp16, is what every other browser test's package stores.)"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("playwright.sync_api", reason="playwright (test extra) is not installed")

from browser import (  # noqa: E402  (after the skip)
    LOAD_PIPE,
    bundled_web_export,
    from_b64,
    page_generate,
    served_page,
    skip_without_webgpu,
)

from edge.video_metrics import psnr, snr  # noqa: E402

pytestmark = pytest.mark.slow  # headless Chromium: tens of seconds per page

PROMPT, SEED, STEPS = "a red circle moving left", 3, 2
# int8 rows against the float32 model's video (the Python runtime's, ONNX package): measured
# 57.0 dB PSNR and 31.6 / 31.5 dB SNR on WebGPU / wasm
INT8_PSNR_FLOOR_DB, INT8_SNR_FLOOR_DB = 50.0, 27.0
BLOCK = "transformer/pair_1"


@pytest.fixture(scope="module")
def int8_package(tmp_path_factory, tiny_sora):
    root = tmp_path_factory.mktemp("web8") / "tiny-sora-web-8"
    return root, bundled_web_export(tiny_sora, root, form="8", variants=False, check=False)


@pytest.fixture(scope="module")
def float32_video(exported_package):
    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(exported_package[0])
    try:
        return pipe.generate(PROMPT, seed=SEED, steps=STEPS)[0]
    finally:
        pipe.close()


# the block's weights as the WebGPU path uploads them, read back: {name: base64 float32}
DECODED = """async (key) => {
  const pipe = window.pipes.webgpu, ex = pipe.executor, block = pipe.blocks.get(key);
  const tensors = block.record.weights.tensors;
  const got = ex.uploadWeights(await pipe.weights.source.get(key), tensors, key), out = {};
  pipe.weights.source.done(key);
  for (const t of tensors) {
    if (!got[t.name]) continue;
    const u = new Uint8Array(await ex.read(got[t.name], 4 * t.shape.reduce((a, b) => a * b, 1)));
    let s = '';
    for (let j = 0; j < u.length; j += 8192) s += String.fromCharCode(...u.subarray(j, j + 8192));
    out[t.name] = btoa(s);
    got[t.name].destroy();
  }
  return out; }"""


def test_webgpu_decodes_stored_weights_to_the_exporters_float32(browser, int8_package,
                                                               tiny_sora):
    """Every weight of a transformer pair (int8 matrices with row scales, half vectors) read
    back from the GPU after decoding is bit for bit the exporter's decoding; scales are
    consumed, not uploaded as weights."""
    from edge.exporters.web import web_blocks
    from edge.exporters.web_storage import stored_weights

    root, manifest = int8_package
    block = next(b for b in web_blocks(tiny_sora)["transformer"] if b.key == BLOCK)
    stored = {t.name: t for t in stored_weights(block, "8")}
    record = next(b for c in manifest["components"] for b in c["blocks"]
                  if f"{c['name']}/{b['name']}" == BLOCK)
    dtypes = {t["dtype"] for t in record["weights"]["tensors"]}
    assert dtypes == {"int8", "float16", "float32"}  # matrices, vectors, the int8's scales
    with served_page(browser, root) as (pg, url):
        skip_without_webgpu(pg.context, pg)
        assert pg.evaluate(LOAD_PIPE, [url, "webgpu"]) == "webgpu"
        got = pg.evaluate(DECODED, BLOCK)
    assert set(got) == set(stored)
    for name, text in got.items():
        want = stored[name].decoded
        assert np.array_equal(from_b64(text, np.float32, want.shape), want), name


@pytest.mark.parametrize("path", ["webgpu", "wasm"])
def test_int8_package_generates_the_float32_video_within_its_floor(browser, int8_package,
                                                                  float32_video, path):
    root, _ = int8_package
    with served_page(browser, root) as (pg, url):
        if path == "webgpu":
            skip_without_webgpu(pg.context, pg)
        assert pg.evaluate(LOAD_PIPE, [url, path]) == path
        got = page_generate(pg, path, PROMPT, {"seed": SEED, "steps": STEPS}, None)
    assert not isinstance(got, str), got
    p, s = psnr(got, float32_video), snr(got, float32_video)
    print(f"{path}, int8 against float32: PSNR {p:.1f} dB, SNR {s:.1f} dB")
    assert p >= INT8_PSNR_FLOOR_DB and s >= INT8_SNR_FLOOR_DB, (p, s)
