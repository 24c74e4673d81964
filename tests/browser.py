"""What the browser tests share: a folder served over local HTTP (edge serve's server) and
Debian's headless chromium (launched as tests/chromium_launch.py says), skipped with the reason
where it is missing."""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from chromium_launch import CHROMIUM, CHROMIUM_ARGS
from shared_builds import package_once

from edge.core.video_metrics import psnr, snr

# onnxruntime-web's dist, served from the package (--bundle-ort): tests never reach a CDN
ORT_DIST = Path(os.environ.get("EDGE_ORT_WEB_DIST", Path(__file__).resolve().parents[2]
                               / "shared" / "vendor" / "onnxruntime-web-1.30"))
# a page's video against the Python runtime's for the same settings
PSNR_LIMIT_DB = 40.0
SNR_LIMIT_DB = 25.0   # the error against the reference video's own variance
# How long a page may take to say it is ready (or that it failed). Loading compiles every
# WGSL kernel on SwiftShader (70-80 s for the tests' CogVideoX package on a quick machine), so
# on a machine a few times slower a tight wait fails a page that works: a slow machine
# should make the suite slower, never red. A broken page still fails, by its error.
PAGE_READY_MS = 900_000


def assert_same_video(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    p, s = psnr(got, want), snr(got, want)
    assert p >= PSNR_LIMIT_DB and s >= SNR_LIMIT_DB, f"PSNR {p:.1f} dB, SNR {s:.1f} dB"


def b64(a: np.ndarray) -> str:
    """An array's bytes as base64, to hand to a page."""
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def from_b64(text: str, dtype, shape) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype).reshape(shape)


@contextmanager
def serving(folder: Path) -> Iterator[str]:
    """`folder` served on a free local port; yields its URL, ending in "/"."""
    from edge.core.serve import make_server

    server = make_server(folder, port=0, quiet=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.url.rstrip("/") + "/"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def chromium():
    """A headless chromium (a Playwright Browser); skips the test without one. Playwright's
    sync API runs one at a time: tests take the session's (conftest.py `browser`)."""
    playwright_api = pytest.importorskip("playwright.sync_api",
                                         reason="playwright (test extra) is not installed")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (Debian package `chromium`; .ci/run installs it)")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


# what generate() gave ({frames, shape}, or {latents, shape} for output_type "latent") as
# base64 of its array's bytes, and reading it back here
VIDEO_B64 = """(v) => { const a = v.frames ?? v.latents;
  const u = new Uint8Array(a.buffer, a.byteOffset, a.byteLength); let t = '';
  for (let j = 0; j < u.length; j += 8192) t += String.fromCharCode(...u.subarray(j, j + 8192));
  return { data: btoa(t), shape: v.shape, type: a.constructor.name }; }"""
DTYPES = {"Uint8Array": np.uint8, "Float32Array": np.float32}


@contextmanager
def served_page(browser, root: Path) -> Iterator[tuple]:
    """A page (in a browser context of its own) of the package at `root` served locally, its
    manifest open: (page, the package's URL); the context is closed after."""
    with serving(root) as url:
        ctx = browser.new_context()
        try:
            pg = ctx.new_page()
            pg.goto(url + "manifest.json")
            yield pg, url
        finally:
            ctx.close()


def read_video(got: dict, kind: str = "Uint8Array") -> np.ndarray:
    """The array of VIDEO_B64's record, checked to be of the `kind` asked for."""
    assert got["type"] == kind, got["type"]
    return from_b64(got["data"], DTYPES[kind], got["shape"])


# On a page of a served package: Pipeline.load(url, {path}) kept as window.pipes[path]
# (runtime/pipeline.js imported on first use); returns the path it runs
LOAD_PIPE = """async ([url, path]) => {
  window.Pipeline = window.Pipeline
    || (await import(new URL('runtime/pipeline.js', url).href)).Pipeline;
  window.pipes = window.pipes || {};
  window.pipes[path] = await window.Pipeline.load(url, { path });
  return window.pipes[path].path.name; }"""

# generate(prompt, options) on a loaded path, latents as base64 float32 bytes (or null):
# the video, or the error's message
GENERATE_ON = """async ([path, prompt, options, latents, decodeNoise]) => {
  const from64 = (t) => { const s = atob(t), u = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) u[i] = s.charCodeAt(i); return u.buffer; };
  if (latents !== null) options = { ...options, latents: new Float32Array(from64(latents)) };
  if (decodeNoise) options = { ...options, decode_noise: new Float32Array(from64(decodeNoise)) };
  try { return (""" + VIDEO_B64 + """)(await window.pipes[path].generate(prompt, options)); }
  catch (err) { return { error: err.message }; } }"""


def page_generate(pg, path: str, prompt: str, options: dict,
                  latents: np.ndarray | None, decode_noise: np.ndarray | None = None
                  ) -> np.ndarray | str:
    """The video (T, H, W, 3) the page's pipeline of `path` (LOAD_PIPE) generates, or the
    message of what it threw. `decode_noise`: a conditioned decoder's noise (float32).
    `options["output_type"]` "float" or "latent": a float32 video, or the latents."""
    got = pg.evaluate(GENERATE_ON, [path, prompt, options,
                                    None if latents is None else b64(latents),
                                    None if decode_noise is None else b64(decode_noise)])
    if "error" in got:
        return got["error"]
    return read_video(got, "Uint8Array" if options.get("output_type", "uint8") == "uint8"
                      else "Float32Array")


def bundled_web_export(model, root: Path, **options) -> dict:
    """`model` exported for the web with onnxruntime-web bundled (skipped without its dist)
    and every attention chunked as the tests chunk it (conftest.py): the manifest. `options`:
    export_web's own (form, variants, check)."""
    from conftest import chunked_attention_for_tests

    from edge.exporters.web.package import export_web

    if not (ORT_DIST / "ort.wasm.min.mjs").is_file():
        pytest.skip(f"no onnxruntime-web dist at {ORT_DIST} (EDGE_ORT_WEB_DIST) to bundle")
    with chunked_attention_for_tests():
        return export_web(model, root, bundle_ort=ORT_DIST, **options)


def bundled_web_package(tmp_path_factory, name: str, model, **options):
    """bundled_web_export built once a run, whichever workers' modules ask (a web export
    is a minute or more): (root, manifest). Tests only read it; one that damages a file
    answers that file through the page's route instead (test_web_browser.py)."""
    return package_once(tmp_path_factory, name,
                        lambda root: bundled_web_export(model, root, **options))


def skip_without_webgpu(context, pg) -> None:
    """Skip (closing `context`) where chromium gives the page no WebGPU adapter."""
    adapter = pg.evaluate("async () => navigator.gpu ? !!(await navigator.gpu.requestAdapter()) "
                          ": 'no navigator.gpu'")
    if adapter is not True:
        context.close()
        pytest.skip(f"chromium gives no WebGPU adapter here ({adapter or 'requestAdapter null'})")
