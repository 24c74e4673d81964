"""`edge serve`: a static HTTP server for one package folder, for browsers and devices on
the same machine (the web runtime fetches a package's files over HTTP; browsers refuse
WebAssembly and module scripts from file:// URLs).

Only regular files inside the folder are served: a request path is decoded once and refused
if any segment is `..`, `.`, empty, hidden (starts with a dot) or holds a slash, backslash or
NUL once decoded; the file it names must resolve (symlinks followed) to a regular file inside
the folder. Folders are never listed. It binds 127.0.0.1 unless another host is asked for.
"""

from __future__ import annotations

import ipaddress
import mimetypes
import os
import re
import stat
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# Fixed types for what packages and the web runtime hold: the system's mime.types differs
# between machines, and a browser refuses streaming WebAssembly compilation and module
# scripts served with another type.
CONTENT_TYPES = {
    ".wasm": "application/wasm",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".wgsl": "text/wgsl; charset=utf-8",
    ".bin": "application/octet-stream",
    ".onnx": "application/octet-stream",
    ".npy": "application/octet-stream",
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}
# Cross-origin isolation lets pages served from the package use SharedArrayBuffer (threaded
# WebAssembly); nosniff makes browsers keep the declared types.
HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-cache",
}
COPY_CHUNK = 1 << 20
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def content_type(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in CONTENT_TYPES:
        return CONTENT_TYPES[suffix]
    guessed, _ = mimetypes.guess_type(path.name)
    return guessed or "application/octet-stream"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Refused(Exception):
    """A request path that names nothing servable; carries the HTTP status to answer."""

    def __init__(self, status: HTTPStatus) -> None:
        super().__init__(status.phrase)
        self.status = status


def request_segments(target: str) -> list[str]:
    """The decoded path segments of a request target (`/a/b.json?x` -> ["a", "b.json"]);
    raises Refused for anything that could name a file outside the folder."""
    raw = urlsplit(target).path
    if not raw.startswith("/"):
        raise Refused(HTTPStatus.BAD_REQUEST)
    parts = raw[1:].split("/")
    if parts and parts[-1] == "":  # a trailing slash asks for a folder
        parts = parts[:-1]
    segments = []
    for part in parts:
        try:
            name = unquote(part, errors="strict")
        except UnicodeDecodeError:
            raise Refused(HTTPStatus.BAD_REQUEST) from None
        # decoded once: "%2e%2e" is "..", "%2f" a slash inside one segment; both refused
        if (name in ("", ".", "..") or name.startswith(".")
                or any(c in name for c in "/\\\0")):
            raise Refused(HTTPStatus.NOT_FOUND)
        segments.append(name)
    return segments


def resolve_request(root: Path, target: str) -> Path:
    """The regular file inside `root` (already resolved) that `target` names, or Refused."""
    path = root.joinpath(*request_segments(target))
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, unreadable, a symlink loop
        raise Refused(HTTPStatus.NOT_FOUND) from None
    if not real.is_relative_to(root):  # a symlink leading out of the folder
        raise Refused(HTTPStatus.NOT_FOUND)
    if real.is_dir():
        real = real / "index.html"  # a folder's own page if it has one; never a listing
    try:
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise Refused(HTTPStatus.NOT_FOUND)
    except OSError:
        raise Refused(HTTPStatus.NOT_FOUND) from None
    return real


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a single `bytes=` range; None to send the whole file (no header,
    several ranges, or a form not understood, as RFC 9110 allows). Raises Refused (416) for
    a range that lies outside the file."""
    if not header:
        return None
    m = _RANGE.fullmatch(header.strip())
    if not m or (not m.group(1) and not m.group(2)):
        return None
    if m.group(1):
        first = int(m.group(1))
        last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
        if first >= size or last < first:
            raise Refused(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
    else:  # the last N bytes
        n = int(m.group(2))
        if n == 0 or size == 0:
            raise Refused(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
        first, last = max(0, size - n), size - 1
    return first, last


class PackageRequestHandler(BaseHTTPRequestHandler):
    """GET and HEAD of files inside `server.root`; every other method is answered 501."""

    server: PackageServer
    server_version = "edge-serve"

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, send_body: bool) -> None:
        try:
            path = resolve_request(self.server.root, self.path)
            where = urlsplit(self.path).path
            if path.name == "index.html" and not where.endswith(("/", "index.html")):
                # a folder asked for without its slash: relative links in its page need it
                self._refuse(HTTPStatus.MOVED_PERMANENTLY, {"Location": where + "/"})
                return
            f = open(path, "rb")  # noqa: SIM115  (closed below, after the copy)
        except Refused as refused:
            self._refuse(refused.status)
            return
        except OSError:
            self._refuse(HTTPStatus.NOT_FOUND)
            return
        with f:
            size = os.fstat(f.fileno()).st_size
            try:
                span = parse_range(self.headers.get("Range"), size)
            except Refused as refused:
                self._refuse(refused.status, {"Content-Range": f"bytes */{size}"})
                return
            first, last = span or (0, size - 1)
            self.send_response(HTTPStatus.PARTIAL_CONTENT if span else HTTPStatus.OK)
            self.send_header("Content-Type", content_type(path))
            self.send_header("Content-Length", str(last - first + 1))
            self.send_header("Accept-Ranges", "bytes")
            if span:
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.send_header("Last-Modified", self.date_time_string(int(os.fstat(
                f.fileno()).st_mtime)))
            for k, v in HEADERS.items():
                self.send_header(k, v)
            self.end_headers()
            if send_body and last >= first:
                f.seek(first)
                _copy(f, self.wfile, last - first + 1)

    def _refuse(self, status: HTTPStatus, headers: dict[str, str] | None = None) -> None:
        body = f"{status.value} {status.phrase}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        for k, v in HEADERS.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002  (the base's signature)
        if not self.server.quiet:
            super().log_message(format, *args)


def _copy(src, dst, length: int) -> None:
    while length > 0:
        chunk = src.read(min(COPY_CHUNK, length))
        if not chunk:
            break
        dst.write(chunk)
        length -= len(chunk)


class PackageServer(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never keeps the process alive at exit

    def __init__(self, root: str | Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 quiet: bool = False) -> None:
        root = Path(root)
        if not root.is_dir():
            raise NotADirectoryError(f"{root}: not a folder; give an edge package folder")
        self.root = root.resolve()
        self.quiet = quiet
        super().__init__((host, port), PackageRequestHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}/"


def make_server(root: str | Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                quiet: bool = False) -> PackageServer:
    """A server for `root` bound to `host:port` (port 0: any free port); call
    `serve_forever()` on it. A host other than loopback is warned about on stderr: it exposes
    the package to the network."""
    if not is_loopback(host):
        print(f"warning: serving on {host}: other machines on the network can read "
              f"{root}; use --host 127.0.0.1 to keep it on this machine", file=sys.stderr)
    return PackageServer(root, host, port, quiet)
