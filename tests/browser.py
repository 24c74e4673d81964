"""What the browser tests share: a folder served over local HTTP (edge serve's server) and
Debian's headless chromium (edge/chromium.py), skipped with the reason where it is missing."""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from edge.chromium import CHROMIUM, CHROMIUM_ARGS
from edge.video_metrics import psnr, snr

# onnxruntime-web's dist, served from the package (--bundle-ort): tests never reach a CDN
ORT_DIST = Path(os.environ.get("EDGE_ORT_WEB_DIST", Path(__file__).resolve().parents[2]
                               / "shared" / "vendor" / "onnxruntime-web-1.30"))
# a page's video against the Python runtime's for the same settings
PSNR_LIMIT_DB = 40.0
SNR_LIMIT_DB = 25.0   # the error against the reference video's own variance


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
    from edge.serve import make_server

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


def skip_without_webgpu(context, pg) -> None:
    """Skip (closing `context`) where chromium gives the page no WebGPU adapter."""
    adapter = pg.evaluate("async () => navigator.gpu ? !!(await navigator.gpu.requestAdapter()) "
                          ": 'no navigator.gpu'")
    if adapter is not True:
        context.close()
        pytest.skip(f"chromium gives no WebGPU adapter here ({adapter or 'requestAdapter null'})")
