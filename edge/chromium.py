"""How edge's browser tests and benchmarks start chromium: Debian's `chromium` (never a
downloaded browser), headless through Playwright, with WebGPU allowed (SwiftShader where there
is no GPU) and chromium's own network chatter off, so a page fetches only what it is served."""

from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
