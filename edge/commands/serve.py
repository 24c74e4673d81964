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
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
