"""`edge serve`: one package folder over HTTP for the web runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edge.core.console import echo, fail


def serve(
    package: Annotated[Path, typer.Argument(help="The package folder to serve.")],
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = 8000,
    host: Annotated[str, typer.Option(
        help="Address to bind; anything but loopback exposes the package to the network."
    )] = "127.0.0.1",
    quiet: Annotated[bool, typer.Option(help="Do not log requests.")] = False,
    allow_host: Annotated[list[str] | None, typer.Option(
        help="A name requests may be addressed to besides an IP address, localhost and this "
        "machine's name (repeatable); others are refused, so no other site's page can read "
        "the package through DNS rebinding.")] = None,
) -> None:
    """Serve a package folder over HTTP for the web runtime: its files only, never a listing,
    with the content types browsers require (.wasm, .js, .mjs, .json, .wgsl)."""
    from edge.core.files import printable
    from edge.core.serve import make_server

    where = f"{printable(str(package))} on {printable(host)}:{port}"
    try:
        server = make_server(package, host, port, quiet=quiet,
                             allow_hosts=tuple(allow_host or ()))
    except (OSError, UnicodeError) as err:
        fail(f"cannot serve {where}: {printable(getattr(err, 'strerror', None) or str(err))}")
    echo(f"serving {printable(str(package))} at {server.url} (Ctrl-C to stop)")
    if note := _what_is_served(package):
        echo(f"note: {note}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _what_is_served(package: Path) -> str | None:
    """What a browser will not find in the folder, said up front (a page asking for
    index.html of an ONNX package got a bare 404): None for a web package."""
    import json

    from edge.core.files import printable

    name = printable(str(package))
    try:
        target = json.loads((package / "manifest.json").read_text()).get("target")
    except FileNotFoundError:
        return f"{name} has no manifest.json: not an edge package; its files are served as is"
    except (OSError, ValueError, AttributeError):
        return f"{name}/manifest.json is not a manifest edge can read; its files are served as is"
    if target == "web":
        return None
    return (f"{name} is a --target {printable(str(target))} package: the page runs --target web "
            "packages (edge export --target web), so it has no page to open; its files are "
            "served as is")
