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
) -> None:
    """Serve a package folder over HTTP for the web runtime: its files only, never a listing,
    with the content types browsers require (.wasm, .js, .mjs, .json, .wgsl)."""
    from edge.core.serve import make_server

    try:
        server = make_server(package, host, port, quiet=quiet)
    except OSError as err:
        fail(f"cannot serve {package} on {host}:{port}: {err.strerror or err}")
    echo(f"serving {package} at {server.url} (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
