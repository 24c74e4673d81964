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
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple
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
# at most 18 digits a position (no file is larger); a longer one is a form not understood
_RANGE = re.compile(r"bytes=(\d{0,18})-(\d{0,18})")
# A client that sends nothing (or reads nothing) for this long is dropped, and at most this
# many are answered at once (others are closed at once): half-open requests cannot hold
# threads for ever.
IDLE_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 64


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


def _contained_file(root: Path, path: Path) -> Path:
    """`path` resolved (symlinks followed), if it is a regular file inside `root`; else
    Refused (404)."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, unreadable, a symlink loop
        raise Refused(HTTPStatus.NOT_FOUND) from None
    if not real.is_relative_to(root):  # a symlink leading out of the folder
        raise Refused(HTTPStatus.NOT_FOUND)
    try:
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise Refused(HTTPStatus.NOT_FOUND)
    except OSError:
        raise Refused(HTTPStatus.NOT_FOUND) from None
    return real


class Resolved(NamedTuple):
    file: Path      # the regular file to send, inside the root
    folder: bool    # the target named a folder, and `file` is its index.html


def resolve_request(root: Path, target: str) -> Resolved:
    """The regular file inside `root` (already resolved) that `target` names, or Refused.
    A folder's page is its index.html, itself resolved and held inside `root` as any other
    file (a link named index.html leads nowhere outside); a folder is never listed."""
    path = root.joinpath(*request_segments(target))
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise Refused(HTTPStatus.NOT_FOUND) from None
    if not real.is_relative_to(root):
        raise Refused(HTTPStatus.NOT_FOUND)
    if real.is_dir():
        return Resolved(_contained_file(root, real / "index.html"), folder=True)
    return Resolved(_contained_file(root, real), folder=False)


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
    timeout = IDLE_TIMEOUT_S  # every read and write of the connection

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, send_body: bool) -> None:
        try:
            path, folder = resolve_request(self.server.root, self.path)
            where = urlsplit(self.path).path
            if folder and not where.endswith("/"):
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
    max_connections = MAX_CONNECTIONS

    def __init__(self, root: str | Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 quiet: bool = False) -> None:
        root = Path(root)
        if not root.is_dir():
            raise NotADirectoryError(f"{root}: not a folder; give an edge package folder")
        self.root = root.resolve()
        self.quiet = quiet
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().__init__((host, port), PackageRequestHandler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):  # busy: close rather than queue threads
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        """A client that went away (an aborted download, a reset, a timeout) is routine: one
        line unless quiet, never a traceback. Anything else keeps the default report."""
        err = sys.exc_info()[1]
        if isinstance(err, (ConnectionError, TimeoutError)):
            if not self.quiet:
                print(f"{client_address[0]}: connection ended early ({type(err).__name__})",
                      file=sys.stderr)
            return
        super().handle_error(request, client_address)

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
