"""The web runtime as an ES module package: `edge-video-runtime` (runtimes/web/package.json),
versioned with edge and named, through an import map, by the demo page and the docs' page
as an app that installs it names it; exported packages carry it whole under runtime/."""

from __future__ import annotations

import json
import re
from pathlib import Path

import edge
from edge.core.manifest_schema import FORMAT_VERSION

REPO = Path(__file__).resolve().parents[1]
RUNTIME = REPO / "runtimes" / "web"
PACKAGE = json.loads((RUNTIME / "package.json").read_text())


def import_map(html: str) -> dict:
    found = re.findall(r'<script type="importmap">(.*?)</script>', html, re.S)
    assert len(found) == 1, found
    return json.loads(found[0])["imports"]


def test_the_runtime_is_a_module_package_versioned_with_edge():
    assert PACKAGE["name"] == "edge-video-runtime" and PACKAGE["type"] == "module"
    assert PACKAGE["version"] == edge.__version__
    entry = PACKAGE["exports"]["."]
    assert (RUNTIME / entry).is_file()
    # the package format it reads is the one edge writes, as manifest.js checks it
    assert PACKAGE["edge"]["packageFormat"] == FORMAT_VERSION
    manifest_js = (RUNTIME / "manifest.js").read_text()
    assert re.search(rf"^export const FORMAT_VERSION = {FORMAT_VERSION};$", manifest_js, re.M)
    # what its entry point exports includes the sizes the demo page prints
    pipeline_js = (RUNTIME / entry).read_text()
    assert 'export { formatSize, parseSize } from "./sizes.js";' in pipeline_js


def test_the_pages_import_the_runtime_by_its_package_name():
    entry = "./runtime/" + PACKAGE["exports"]["."].removeprefix("./")
    demo = (REPO / "web_demo" / "index.html").read_text()
    assert import_map(demo) == {PACKAGE["name"]: entry}
    # the import map comes before the module that uses it
    assert demo.index('type="importmap"') < demo.index('<script type="module"')
    app = (REPO / "web_demo" / "app.js").read_text()
    sources = set(re.findall(r'from "([^"]+)";', app))
    assert sources == {PACKAGE["name"]}, sources
    docs = (REPO / "docs" / "web.md").read_text()
    page = docs.split("## Embedding the model in a page", 1)[1].split("```html\n", 1)[1]
    page = page.split("```", 1)[0]
    assert import_map(page) == {PACKAGE["name"]: entry}
    assert f'import {{ Pipeline }} from "{PACKAGE["name"]}";' in page


def test_an_exported_package_carries_the_runtime_package(tmp_path):
    from edge.exporters.web.package import copy_site

    copied = {f["path"] for f in copy_site(tmp_path)}
    assert "runtime/package.json" in copied and "index.html" in copied
    assert json.loads((tmp_path / "runtime" / "package.json").read_text()) == PACKAGE
