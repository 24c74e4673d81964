"""`edge serve`: a static HTTP server for one package folder, for browsers and devices on
the same machine (the web runtime fetches a package's files over HTTP; browsers refuse
WebAssembly and module scripts from file:// URLs).

Only regular files inside the folder are served: a request path is decoded once and refused
if any segment is `..`, `.`, empty, hidden (starts with a dot) or holds a slash, backslash or
NUL once decoded; the file it names must resolve (symlinks followed) to a regular file inside
the folder, through no hidden segment. Folders are never listed. It binds 127.0.0.1 unless
another host is asked for (IPv4 or IPv6), and answers only requests addressed to this machine
(the `Host` header: an IP address, localhost, this machine's name, or a name allowed), so a
page on another site cannot read the folder by pointing its own name at 127.0.0.1 (DNS
rebinding). A client gets REQUEST_DEADLINE_S to send its request's headers, however slowly
it trickles them, and when every connection is taken the one waiting longest for its request
is closed to let a new one in: slow clients cannot lock others out.
"""

from __future__ import annotations

import ipaddress
import mimetypes
import os
import re
import socket
import stat
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from edge.core.files import printable

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
# From a connection's start (or its previous answer) to the end of its request's headers,
# however slowly they come: a trickle of one byte every 29 s no longer holds a connection.
REQUEST_DEADLINE_S = 10.0


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


def _inside(root: Path, path: Path) -> Path:
    """`path` resolved (symlinks followed), if it lies inside `root` through no hidden segment
    (a visible link to `.secret` is as hidden as `.secret`); else Refused (404)."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, unreadable, a symlink loop
        raise Refused(HTTPStatus.NOT_FOUND) from None
    if not real.is_relative_to(root):  # a symlink leading out of the folder
        raise Refused(HTTPStatus.NOT_FOUND)
    if any(part.startswith(".") for part in real.relative_to(root).parts):
        raise Refused(HTTPStatus.NOT_FOUND)
    return real


def _contained_file(root: Path, path: Path) -> Path:
    """`path` resolved (symlinks followed), if it is a regular file inside `root` (_inside);
    else Refused (404)."""
    real = _inside(root, path)
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
    real = _inside(root, root.joinpath(*request_segments(target)))
    if real.is_dir():
        return Resolved(_contained_file(root, real / "index.html"), folder=True)
    return Resolved(_contained_file(root, real), folder=False)


def host_name(header: str) -> str:
    """The name in a `Host` header, without its port or an IPv6 literal's brackets,
    lowercased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def addressed_here(header: str | None, allowed: frozenset[str]) -> bool:
    """Is a request with this `Host` header addressed to this server? An IP address (which
    no one can rebind), localhost, or a name in `allowed`; no header (HTTP/1.0): yes."""
    if header is None:
        return True
    name = host_name(header)
    if name == "localhost" or name.endswith(".localhost") or name in allowed:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


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

    def handle_one_request(self) -> None:
        self.server.awaiting_request(self)
        try:
            super().handle_one_request()
        finally:
            self.server.request_read(self)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.server.request_read(self)  # its headers are in: the deadline is met
        return ok

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, send_body: bool) -> None:
        if not addressed_here(self.headers.get("Host"), self.server.allowed_hosts):
            self._refuse(HTTPStatus.MISDIRECTED_REQUEST, note=(
                f"edge serve answers requests addressed to this machine, not to "
                f"{printable(self.headers.get('Host', ''))[:100]}: open it by its address or "
                "localhost, or start it with --allow-host NAME"))
            return
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

    def _refuse(self, status: HTTPStatus, headers: dict[str, str] | None = None,
                note: str = "") -> None:
        body = (f"{status.value} {status.phrase}\n" + (f"{note}\n" if note else "")).encode()
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
    request_deadline_s = REQUEST_DEADLINE_S

    def __init__(self, root: str | Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 quiet: bool = False, allow_hosts: tuple[str, ...] = ()) -> None:
        root = Path(root)
        if not root.is_dir():
            raise NotADirectoryError(f"{root}: not a folder; give an edge package folder")
        self.root = root.resolve()
        self.quiet = quiet
        self.allowed_hosts = frozenset(
            name.lower() for name in (*allow_hosts, host, socket.gethostname(),
                                      f"{socket.gethostname()}.local"))
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._awaiting: dict[PackageRequestHandler, float] = {}  # -> when it began waiting
        self._awaiting_lock = threading.Lock()
        self._closed = threading.Event()
        self.address_family = address_family(host, port)
        super().__init__((host, port), PackageRequestHandler)
        threading.Thread(target=self._drop_late_requests, daemon=True,
                         name="edge-serve-deadline").start()

    def awaiting_request(self, handler: PackageRequestHandler) -> None:
        with self._awaiting_lock:
            self._awaiting[handler] = time.monotonic()

    def request_read(self, handler: PackageRequestHandler) -> None:
        with self._awaiting_lock:
            self._awaiting.pop(handler, None)

    def _drop(self, handler: PackageRequestHandler) -> None:
        """End a connection still sending its request: its thread's read returns at once."""
        self.request_read(handler)
        try:
            handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone

    def _drop_late_requests(self) -> None:
        while not self._closed.wait(min(1.0, self.request_deadline_s / 4)):
            now = time.monotonic()
            with self._awaiting_lock:
                late = [h for h, began in self._awaiting.items()
                        if now - began > self.request_deadline_s]
            for handler in late:
                self._drop(handler)

    def _drop_longest_waiting(self) -> bool:
        with self._awaiting_lock:
            if not self._awaiting:
                return False
            handler = min(self._awaiting, key=self._awaiting.__getitem__)
        self._drop(handler)
        return True

    def process_request(self, request, client_address) -> None:
        # every slot taken: make room by closing the connection that has waited longest
        # for its request, else close the new one rather than queue threads
        if not self._slots.acquire(blocking=False) and not (
                self._drop_longest_waiting() and self._slots.acquire(timeout=2.0)):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()

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


def address_family(host: str, port: int) -> socket.AddressFamily:
    """IPv6 for an IPv6 address (`::1`, `::`) or a name that resolves only to one; else
    IPv4 (http.server's own default)."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        pass
    try:
        families = {info[0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError):
        return socket.AF_INET  # binding names the failure
    return socket.AF_INET if socket.AF_INET in families or not families else socket.AF_INET6


def make_server(root: str | Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                quiet: bool = False, allow_hosts: tuple[str, ...] = ()) -> PackageServer:
    """A server for `root` bound to `host:port` (port 0: any free port); call
    `serve_forever()` on it. A host other than loopback is warned about on stderr: it exposes
    the package to the network. `allow_hosts`: names besides this machine's own that
    requests may be addressed to."""
    if not is_loopback(host):
        print(f"warning: serving on {printable(host)}: other machines on the network can read "
              f"{printable(str(root))}; use --host 127.0.0.1 to keep it on this machine",
              file=sys.stderr)
    return PackageServer(root, host, port, quiet, allow_hosts)
