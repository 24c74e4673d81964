"""tiny-sora's web package at `edge export --target web --quantize 4` in headless chromium:
its rule stores the embedding table as int4 (a scale per 32 inputs), the transformer and the
text encoder's layers as int8 (a scale per row), the rest as half, so the one package holds
every stored form. The WebGPU path decodes each stored tensor on the GPU to exactly the
exporter's float32 (runtimes/web/decode.js), the wasm path's graphs decode in themselves, and
both paths generate the video of the float32 model within the setting's floor. (The default
form, fp16, is what every other browser test's package stores.)"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

pytest.importorskip("playwright.sync_api", reason="playwright (test extra) is not installed")

from browser import (  # noqa: E402  (after the skip)
    LOAD_PIPE,
    bundled_web_package,
    page_generate,
    served_page,
    skip_without_webgpu,
)

from edge.core.video_metrics import psnr, snr  # noqa: E402

pytestmark = pytest.mark.slow  # headless Chromium: tens of seconds per page

PROMPT, SEED, STEPS = "a red circle moving left", 3, 2
# "4" against the float32 model's video (the Python runtime's, ONNX package; 2 steps, seed 3):
# measured 43.8 dB PSNR and 18.4 dB SNR on WebGPU and on wasm alike (a video from other noise
# is under 5 dB SNR)
Q4_PSNR_FLOOR_DB, Q4_SNR_FLOOR_DB = 38.0, 16.0
BLOCKS = ("text_encoder/embeddings", "transformer/pair_1")  # int4, int8


@pytest.fixture(scope="module")
def q4_package(tmp_path_factory, tiny_sora):
    return bundled_web_package(tmp_path_factory, "tiny-sora-web-4", tiny_sora, form="4",
                               variants=False, check=False)


@pytest.fixture(scope="module")
def float32_video(exported_package):
    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(exported_package[0])
    try:
        return pipe.generate(PROMPT, seed=SEED, steps=STEPS)[0]
    finally:
        pipe.close()


# the block's weights as the WebGPU path uploads them, read back: {name: SHA-256 of the float32
# bytes} (the embedding table decodes to 48 MB: its digest crosses to Python, not its bytes),
# and the upload's figures. chunk: the pieces written and decoded (null: the page's own)
DECODED = """async ([key, chunk]) => {
  const pipe = window.pipes.webgpu, ex = pipe.executor, block = pipe.blocks.get(key);
  const tensors = block.record.weights.tensors, d = ex.weightDecoder();
  const saved = [d.chunkBytes, d.inFlightBytes], before = { ...d.stats };
  if (chunk) [d.chunkBytes, d.inFlightBytes] = [chunk, 2 * chunk];
  d.stats.peak_in_flight_bytes = 0;
  let got;
  try {
    got = await ex.uploadWeights(await pipe.weights.source.get(key), tensors, key);
  } finally {
    [d.chunkBytes, d.inFlightBytes] = saved;
  }
  pipe.weights.source.done(key);
  const out = {};
  for (const t of tensors) {
    if (!got[t.name]) continue;
    const bytes = await ex.read(got[t.name], 4 * t.shape.reduce((a, b) => a * b, 1));
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
    out[t.name] = [...digest].map((b) => b.toString(16).padStart(2, "0")).join("");
    got[t.name].destroy();
  }
  return { digests: out, pieces: d.stats.pieces - before.pieces,
           queue_waits: d.stats.queue_waits - before.queue_waits,
           peak_in_flight_bytes: d.stats.peak_in_flight_bytes }; }"""
# pieces of an odd number of words (16 387 for the 6 MB embedding table, 1 027 for the pair's
# tensors of tens of kB): they start inside int4 groups, int8 rows and a tensor's halves
SMALL_CHUNK = {"text_encoder/embeddings": 65_548, "transformer/pair_1": 4_108}


def test_webgpu_decodes_stored_weights_to_the_exporters_float32(browser, q4_package,
                                                               tiny_sora):
    """Every weight of the embedding table (int4 with a scale per group) and of a transformer
    pair (int8 matrices with row scales, half vectors) read back from the GPU after decoding
    is bit for bit the exporter's decoding; scales are consumed, not uploaded as weights."""
    from edge.exporters.web.package import web_blocks
    from edge.exporters.web.storage import stored_weights, web_storage

    root, manifest = q4_package
    storage = web_storage("4", tiny_sora)
    blocks = {b.key: b for bs in web_blocks(tiny_sora).values() for b in bs}
    records = {f"{c['name']}/{b['name']}": b for c in manifest["components"]
               for b in c["blocks"]}
    dtypes = {t["dtype"] for key in BLOCKS for t in records[key]["weights"]["tensors"]}
    assert dtypes == {"int4", "int8", "float16", "float32"}  # float32: the scales
    with served_page(browser, root) as (pg, url):
        skip_without_webgpu(pg.context, pg)
        assert pg.evaluate(LOAD_PIPE, [url, "webgpu"]) == "webgpu"
        for key in BLOCKS:
            stored = {t.name: t for t in stored_weights(blocks[key], storage)}
            want = {name: hashlib.sha256(np.ascontiguousarray(t.decoded, dtype="<f4")
                                         .tobytes()).hexdigest() for name, t in stored.items()}
            chunk = SMALL_CHUNK[key]
            for asked in (None, chunk):
                got = pg.evaluate(DECODED, [key, asked])
                assert got["digests"] == want, (key, asked)
            # every tensor (scales too) was written in pieces of the small size, the queue
            # waited for to keep at most two pieces' bytes in flight
            tensors = records[key]["weights"]["tensors"]
            assert got["pieces"] == sum(-(-t["bytes"] // chunk) for t in tensors) > len(tensors)
            assert got["queue_waits"] > 0 and got["peak_in_flight_bytes"] <= 2 * chunk


@pytest.mark.parametrize("path", ["webgpu", "wasm"])
def test_q4_package_generates_the_float32_video_within_its_floor(browser, q4_package,
                                                                float32_video, path):
    root, _ = q4_package
    with served_page(browser, root) as (pg, url):
        if path == "webgpu":
            skip_without_webgpu(pg.context, pg)
        assert pg.evaluate(LOAD_PIPE, [url, path]) == path
        got = page_generate(pg, path, PROMPT, {"seed": SEED, "steps": STEPS}, None)
    assert not isinstance(got, str), got
    p, s = psnr(got, float32_video), snr(got, float32_video)
    print(f"{path}, 4 against float32: PSNR {p:.1f} dB, SNR {s:.1f} dB")
    assert p >= Q4_PSNR_FLOOR_DB and s >= Q4_SNR_FLOOR_DB, (p, s)


def test_the_python_runtime_runs_the_q4_package_within_its_floor(q4_package, float32_video):
    """The Python runtime on the same package (the wasm graphs, int4 tensors fed as their
    packed bytes by the loader's views) gives the float32 video within the same floor."""
    from edge.runtimes.python import Pipeline
    from edge.runtimes.python.web_package import wasm_graph_opener

    root, _ = q4_package
    pipe = Pipeline.load(root, open_block=wasm_graph_opener(root))
    try:
        got = pipe.generate(PROMPT, seed=SEED, steps=STEPS)[0]
    finally:
        pipe.close()
    p, s = psnr(got, float32_video), snr(got, float32_video)
    assert p >= Q4_PSNR_FLOOR_DB and s >= Q4_SNR_FLOOR_DB, (p, s)
