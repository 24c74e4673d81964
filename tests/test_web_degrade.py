"""The demo page where onnxruntime-web cannot be had (no network to its CDN, a firewall, a
file that fails its digest): it runs on WebGPU where there is an adapter and says why the wasm
path is missing; with neither path it stops naming both reasons; `?path=wasm` is refused
with the way to WebGPU.

tiny-sora is exported with `--target web` once per module, its onnxruntime-web location
(`--ort-url`) on a loopback port; every request there is answered by the test (refused, or
bytes that fail the digest), so nothing depends on what listens on that port and nothing
leaves the machine. Debian's chromium through Playwright, as tests/test_web_browser.py; the
skips say why (no chromium, no WebGPU adapter). One page compiles kernels (SwiftShader: tens
of seconds); the others stop before any."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm", reason="apache-tvm (test extra) is not installed")
playwright_api = pytest.importorskip("playwright.sync_api",
                                     reason="playwright (test extra) is not installed")

from browser import PAGE_READY_MS, serving, skip_without_webgpu  # noqa: E402  (after the skips)

pytestmark = pytest.mark.slow  # headless Chromium: tens of seconds for the page that runs

ORT_URL = "http://127.0.0.1:9/ort/"  # where the export says onnxruntime-web is
ENTRY_URL = ORT_URL + "ort.wasm.min.mjs"  # the first file the page fetches from there
STEPS = 2  # a short generation: SwiftShader runs a transformer pair in seconds
NO_WEBGPU = "delete Navigator.prototype.gpu;"
READY = "window.edgeDemo && window.edgeDemo.ready !== undefined"
NO_GPU_REASON = "this browser has no WebGPU (navigator.gpu is missing)"  # paths.js findAdapter

# generate() as the Generate button calls it: the run's figures, or the error
GENERATE = """async () => { try { return await window.edgeDemo.generate(); }
  catch (err) { return { error: err.message }; } }"""
# the last video's frames: their shape, and a few figures over their bytes
FRAMES = """() => { const f = window.edgeDemo.lastFrames; if (!f) return null;
  let lo = 255, hi = 0; for (const v of f.frames) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  return { shape: f.shape, length: f.frames.length, lo, hi }; }"""
SOFTWARE_ADAPTER = """async () => { const { isSoftwareAdapter } = await import('/runtime/paths.js');
  return isSoftwareAdapter(await navigator.gpu.requestAdapter()); }"""


@pytest.fixture(scope="module")
def web_package(tmp_path_factory, tiny_sora):
    """(root, manifest): tiny-sora for the web, onnxruntime-web expected at ORT_URL; without
    the TDTM variants and the export's replays (tests/test_web_browser.py checks those)."""
    from shared_builds import package_once

    from edge.exporters.web.package import export_web

    root, manifest = package_once(tmp_path_factory, "tiny-sora-web-ort-url",
                                  lambda dest: export_web(tiny_sora, dest, variants=False,
                                                          check=False, ort_url=ORT_URL))
    assert manifest["web"]["ort"]["base"] == ORT_URL and "wasm" in manifest["web"]["paths"]
    return root, manifest


@pytest.fixture(scope="module")
def served(web_package):
    with serving(web_package[0]) as url:
        yield url


def refused(route) -> None:
    """The ORT host out of reach: the connection is refused (as offline or behind a firewall)."""
    route.abort("connectionrefused")


def tampered(manifest: dict):
    """A route answering each onnxruntime-web file with zeros of its listed size: served, but
    failing its SHA-256 (a changed or damaged copy)."""
    sizes = {f["name"]: f["bytes"] for f in manifest["web"]["ort"]["files"]}

    def answer(route) -> None:
        route.fulfill(body=b"\0" * sizes[route.request.url.rsplit("/", 1)[-1]])
    return answer


def open_page(browser, served: str, ort_route, query: str = "", webgpu: bool = True):
    """A new context whose requests to ORT_URL go to `ort_route`, on the demo page once it is
    ready or has stopped; -> (context, page, URLs requested under ORT_URL). Skips where the
    page should have WebGPU and chromium gives no adapter. A page that does neither within
    PAGE_READY_MS fails the test with its script errors (a broken module never says ready)."""
    context = browser.new_context()
    if not webgpu:
        context.add_init_script(NO_WEBGPU)
    context.route(ORT_URL + "**", ort_route)
    pg = context.new_page()
    ort_requests: list[str] = []
    page_errors: list[str] = []
    pg.on("request", lambda r: r.url.startswith(ORT_URL) and ort_requests.append(r.url))
    pg.on("pageerror", lambda err: page_errors.append(str(err)))
    if webgpu:
        pg.goto(served + "manifest.json")
        skip_without_webgpu(context, pg)
    pg.goto(served + "index.html" + query)
    try:
        pg.wait_for_function(READY, timeout=PAGE_READY_MS)
    except playwright_api.TimeoutError:
        context.close()
        pytest.fail(f"the page neither became ready nor stopped in {PAGE_READY_MS // 1000} s; "
                    f"script errors: {page_errors or 'none'}")
    return context, pg, ort_requests


def test_page_runs_on_webgpu_when_onnxruntime_web_is_out_of_reach(browser, served):
    """onnxruntime-web's host refuses connections: the page becomes ready on WebGPU and
    generates frames. On a software adapter (SwiftShader here: the only kind that fetches
    onnxruntime-web, to time the wasm path against WebGPU) the status says the wasm path is
    missing, naming the URL and what failed, as does window.edgeDemo.unavailable; a hardware
    adapter runs WebGPU without fetching onnxruntime-web at all."""
    # kernels compile on this page: SwiftShader takes ~30 s, more on a busy machine
    context, pg, ort_requests = open_page(browser, served, refused)
    try:
        assert pg.evaluate("window.edgeDemo.ready"), pg.evaluate("window.edgeDemo.error")
        assert pg.evaluate("window.edgeDemo.pipe.path.name") == "webgpu"
        assert pg.is_hidden("#error") and pg.is_hidden("#gpu-missing")
        assert pg.is_enabled("#generate")
        missing = pg.evaluate("window.edgeDemo.unavailable")
        if pg.evaluate(SOFTWARE_ADAPTER):
            assert ENTRY_URL in ort_requests
            note = pg.inner_text("#wasm-missing")
            assert pg.is_visible("#wasm-missing")
            assert note.startswith(f"The wasm path is missing: onnxruntime-web 1.30.0 could not "
                                   f"be loaded from {ORT_URL} ({ENTRY_URL}: the download was "
                                   "interrupted 3 times"), note
            assert "ERR_CONNECTION_REFUSED" in note or "Failed to fetch" in note, note
            assert "could not be loaded" in pg.inner_text("#path")
            assert missing["webgpu"] is None
            assert missing["wasm"]["url"] == ENTRY_URL and missing["wasm"]["base"] == ORT_URL
            assert missing["wasm"]["detail"] in note
        else:
            assert ort_requests == [] and pg.is_hidden("#wasm-missing")
            assert missing == {"webgpu": None, "wasm": None}

        pg.fill("#steps", str(STEPS))
        run = pg.evaluate(GENERATE)
        assert "error" not in run, run
        assert run["transformer_calls"] == STEPS
        frames = pg.evaluate(FRAMES)
        assert frames["length"] == int(np.prod(frames["shape"])) > 0
        assert frames["hi"] > frames["lo"]  # a picture, not a blank canvas
        assert pg.is_hidden("#error")
    finally:
        context.close()


@pytest.mark.parametrize("case", ["refused", "tampered"])
def test_page_without_either_path_stops_naming_both_reasons(browser, served, web_package, case):
    """No WebGPU in the browser and onnxruntime-web out of reach, or served with bytes that
    fail its digest: the page stops, its error naming onnxruntime-web's URL and failure and
    why WebGPU cannot stand in; Generate stays disabled."""
    route = refused if case == "refused" else tampered(web_package[1])
    context, pg, ort_requests = open_page(browser, served, route, webgpu=False)
    try:
        assert pg.evaluate("window.edgeDemo.ready") is False
        assert pg.is_disabled("#generate")
        assert pg.is_visible("#error")
        error = pg.inner_text("#error")
        assert error.startswith(f"onnxruntime-web 1.30.0 could not be loaded from {ORT_URL} "
                                f"({ENTRY_URL}: "), error
        failed = ("the download was interrupted 3 times" if case == "refused"
                  else "the downloaded file does not match the manifest")
        assert failed in error, error
        assert error.endswith(f"nothing was run. The WebGPU path cannot run instead: "
                              f"{NO_GPU_REASON}."), error
        assert pg.evaluate("window.edgeDemo.error") == error
        missing = pg.evaluate("window.edgeDemo.unavailable")
        assert missing["webgpu"] == NO_GPU_REASON
        assert missing["wasm"]["url"] == ENTRY_URL and failed in missing["wasm"]["detail"]
        assert ort_requests and set(ort_requests) == {ENTRY_URL}  # stopped at the first file
    finally:
        context.close()


def test_asked_wasm_path_without_onnxruntime_web_is_refused(browser, served):
    """?path=wasm with onnxruntime-web out of reach: refused (the address asked to see the
    wasm path; running WebGPU instead would answer another question), the error naming the URL
    and the failure and saying how to run on WebGPU; Generate stays disabled."""
    context, pg, _ = open_page(browser, served, refused, query="?path=wasm")
    try:
        assert pg.evaluate("window.edgeDemo.ready") is False
        assert pg.is_disabled("#generate")
        error = pg.inner_text("#error")
        assert error.startswith(f"?path=wasm asks for the wasm path, but onnxruntime-web 1.30.0 "
                                f"could not be loaded from {ORT_URL} ({ENTRY_URL}: the download "
                                "was interrupted 3 times"), error
        assert error.endswith("nothing was run: open the page without ?path=wasm to run on "
                              "WebGPU."), error
        missing = pg.evaluate("window.edgeDemo.unavailable")
        assert missing["webgpu"] is None and missing["wasm"]["url"] == ENTRY_URL
    finally:
        context.close()
