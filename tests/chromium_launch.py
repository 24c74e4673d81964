"""How edge's browser tests and benchmarks start chromium: Debian's `chromium` (never a
downloaded browser), headless through Playwright, with WebGPU allowed (SwiftShader where there
is no GPU) and chromium's own network chatter off, so a page fetches only what it is served.

Test infrastructure, not part of the library: tests/browser.py launches it for the tests, and
benchmarks/web_page.py, web_blocks.py and noise.py import it with tests/ on sys.path. It
imports neither pytest nor Playwright, so a benchmark that never opens a page needs neither."""

from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
