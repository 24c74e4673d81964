"""`edge serve`: only files inside the package folder, with the right types, on loopback
unless asked otherwise. Requests are sent raw (http.client) so no client normalises them."""
import http.client
import os
import signal
import subprocess
import sys
import threading

import pytest
from conftest import sigint_as_at_a_terminal

from edge.core.serve import make_server, parse_range, request_segments

SECRET = b"outside the package"


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A package folder with one file of each served kind, a secret beside it, symlinks in
    and out of the folder, and a hidden file (read only by the tests)."""
    tmp_path = tmp_path_factory.mktemp("serve")
    root = tmp_path / "pkg"
    (root / "weights" / "transformer").mkdir(parents=True)
    (root / "web").mkdir()
    (root / "manifest.json").write_text('{"format": "edge-package"}')
    (root / "weights" / "transformer" / "pair_0.bin").write_bytes(bytes(range(256)) * 16)
    (root / "web" / "runtime.wasm").write_bytes(b"\0asm\1\0\0\0")
    (root / "web" / "index.js").write_text("export {};")
    (root / "web" / "worker.mjs").write_text("export {};")
    (root / "web" / "blocks.wgsl").write_text("@compute fn main() {}")
    (root / "web" / "index.html").write_text("<!doctype html>")
    (root / "name with space%.json").write_text("{}")
    (root / ".hidden").write_text("hidden")
    (tmp_path / "secret.txt").write_bytes(SECRET)
    (tmp_path / "secret_dir").mkdir()
    (tmp_path / "secret_dir" / "s.txt").write_bytes(SECRET)
    os.symlink(tmp_path / "secret.txt", root / "leak.txt")
    os.symlink(tmp_path / "secret_dir", root / "leakdir")
    os.symlink("manifest.json", root / "alias.json")
    return root


@pytest.fixture(scope="module")
def server(tree):
    srv = make_server(tree, port=0, quiet=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def get(server, target, method="GET", headers=None):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, target, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_binds_loopback_by_default(tree):
    srv = make_server(tree, port=0, quiet=True)
    try:
        assert srv.server_address[0] == "127.0.0.1"
    finally:
        srv.server_close()


def test_other_host_only_when_asked_and_with_a_warning(tree, capsys):
    srv = make_server(tree, host="0.0.0.0", port=0, quiet=True)
    try:
        assert srv.server_address[0] == "0.0.0.0"
    finally:
        srv.server_close()
    assert "warning: serving on 0.0.0.0" in capsys.readouterr().err
    make_server(tree, host="localhost", port=0, quiet=True).server_close()
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("path, ctype", [
    ("/manifest.json", "application/json"),
    ("/web/runtime.wasm", "application/wasm"),
    ("/web/index.js", "text/javascript; charset=utf-8"),
    ("/web/worker.mjs", "text/javascript; charset=utf-8"),
    ("/web/blocks.wgsl", "text/wgsl; charset=utf-8"),
    ("/weights/transformer/pair_0.bin", "application/octet-stream"),
    ("/web/", "text/html; charset=utf-8"),
    ("/name%20with%20space%25.json", "application/json"),
    ("/alias.json", "application/json"),  # a symlink that stays inside is followed
    ("/manifest.json?v=1#x", "application/json"),
])
def test_serves_files_with_their_content_type(server, tree, path, ctype):
    status, headers, body = get(server, path)
    assert status == 200
    assert headers["Content-Type"] == ctype
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert int(headers["Content-Length"]) == len(body) > 0


def test_head_sends_headers_only(server):
    status, headers, body = get(server, "/weights/transformer/pair_0.bin", method="HEAD")
    assert (status, headers["Content-Length"], body) == (200, "4096", b"")


@pytest.mark.parametrize("target", [
    "/../secret.txt", "/web/../../secret.txt", "/%2e%2e/secret.txt", "/%2E%2E/secret.txt",
    "/web/%2e%2e/%2e%2e/secret.txt", "/..%2fsecret.txt", "/..%2Fsecret.txt",
    "/%2e%2e%2fsecret.txt", "/..%5csecret.txt", "/..\\secret.txt", "/%252e%252e/secret.txt",
    "//secret.txt", "/./manifest.json", "/%2e/manifest.json", "/leak.txt", "/leakdir/s.txt",
    "/manifest.json%00.txt", "/.hidden", "/%2ehidden", "/nonexistent",
    "/" + str(os.path.abspath("/etc/passwd")).lstrip("/"),
])
def test_nothing_outside_the_folder_is_served(server, target):
    status, _, body = get(server, target)
    assert status in (400, 404)
    assert SECRET not in body and b"root:" not in body


@pytest.mark.parametrize("target", ["/etc/passwd", "http://evil/../secret.txt", "secret.txt",
                                    "/%ff%fe"])
def test_absolute_and_malformed_targets_are_refused(server, target):
    status, _, body = get(server, target)
    assert status in (400, 404, 421)  # 421: http.client sends the absolute form's host, evil
    assert SECRET not in body and b"root:" not in body


def test_no_directory_listing(server):
    for target in ("/", "/weights/", "/weights/transformer/"):
        status, _, body = get(server, target)
        assert status == 404, target
        assert b"pair_0" not in body and b"manifest" not in body


def test_folder_without_slash_redirects_to_its_page(server):
    status, headers, _ = get(server, "/web")
    assert (status, headers["Location"]) == (301, "/web/")


def test_only_get_and_head(server):
    assert get(server, "/manifest.json", method="POST")[0] == 501
    assert get(server, "/manifest.json", method="PUT")[0] == 501


@pytest.mark.parametrize("header, status, want", [
    ("bytes=0-9", 206, (0, 9)), ("bytes=4090-", 206, (4090, 4095)),
    ("bytes=-6", 206, (4090, 4095)), ("bytes=4000-99999", 206, (4000, 4095)),
    ("bytes=4096-", 416, None), ("bytes=9-3", 416, None), ("bytes=0-1,5-6", 200, None),
    ("items=0-1", 200, None),
])
def test_range_requests(server, header, status, want):
    got, headers, body = get(server, "/weights/transformer/pair_0.bin", headers={"Range": header})
    assert got == status
    full = bytes(range(256)) * 16
    if want:
        assert body == full[want[0]:want[1] + 1]
        assert headers["Content-Range"] == f"bytes {want[0]}-{want[1]}/4096"
    elif status == 200:
        assert body == full
    else:
        assert headers["Content-Range"] == "bytes */4096"


def test_range_parsing():
    assert parse_range(None, 10) is None
    assert parse_range("bytes=-20", 10) == (0, 9)
    assert parse_range("bytes=-", 10) is None


def test_request_segments_decode_once():
    assert request_segments("/a/b%20c.json?x=1") == ["a", "b c.json"]
    assert request_segments("/a/%252e%252e") == ["a", "%2e%2e"]  # a literal name, not ".."


def test_missing_folder_is_refused(tmp_path):
    with pytest.raises(NotADirectoryError, match="not a folder"):
        make_server(tmp_path / "nope", port=0)


def test_cli_serves_until_interrupted(tree):
    proc = subprocess.Popen([sys.executable, "-c", "from edge.commands import main; main()",
                             "serve", str(tree), "--port", "0", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_at_a_terminal)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"serving {tree} at http://127.0.0.1:"), line
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/web/runtime.wasm")
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("Content-Type")) == (200, "application/wasm")
        conn.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


# --- defects of the second probe: an appended index.html, aborted downloads, idle clients ---

@pytest.fixture
def own_server(tmp_path, monkeypatch):
    """A server over a folder of the test's own making: start(root) -> the running server."""
    servers = []

    def start(root, **kwargs):
        srv = make_server(root, port=0, **kwargs)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_a_folder_page_linked_outside_is_not_served(tmp_path, own_server):
    """The index.html a folder's URL appends is held inside the folder like any file: a link
    named index.html that leads out is refused, through the folder's URL and by name."""
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "secret.txt").write_bytes(SECRET)
    os.symlink(tmp_path / "secret.txt", root / "sub" / "index.html")
    (root / "ok").mkdir()
    (root / "ok" / "page.html").write_text("<!doctype html>")
    os.symlink("page.html", root / "ok" / "index.html")  # a link inside is fine
    srv = own_server(root, quiet=True)
    for target in ("/sub/", "/sub", "/sub/index.html"):
        status, _, body = get(srv, target)
        assert status == 404 and SECRET not in body, target
    assert get(srv, "/ok/")[:1] == (200,)
    assert get(srv, "/ok")[0] == 301


def test_aborted_downloads_and_huge_ranges_print_no_traceback(tmp_path, own_server, capfd):
    import socket
    import time

    root = tmp_path / "pkg"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(16 << 20))
    srv = own_server(root, quiet=False)
    host, port = srv.server_address[:2]
    for _ in range(3):  # ask for 16 MiB, read a little, hang up
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            s.recv(1024)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")  # RST
    status, _, body = get(srv, "/big.bin", headers={"Range": "bytes=" + "9" * 5000 + "-"})
    assert status == 200 and len(body) == 16 << 20  # a form not understood: the whole file
    time.sleep(1.0)  # the aborted handlers finish writing
    err = capfd.readouterr().err
    assert "Traceback" not in err and "connection ended early" in err


def test_idle_clients_are_dropped_and_connections_bounded(tmp_path, own_server, monkeypatch):
    """Every slot taken by half-sent requests: a new client gets in by closing the one that
    waited longest; the rest are dropped after the idle timeout, unanswered."""
    import socket
    import time

    from edge.core.serve import PackageRequestHandler, PackageServer

    monkeypatch.setattr(PackageRequestHandler, "timeout", 0.5)
    monkeypatch.setattr(PackageServer, "max_connections", 2)
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.json").write_text("{}")
    srv = own_server(root, quiet=True)
    host, port = srv.server_address[:2]
    held = [socket.create_connection((host, port), timeout=5) for _ in range(2)]
    for s in held:
        s.sendall(b"GET /a.json HTTP/1.1\r\n")  # half a request, then nothing
        time.sleep(0.05)
    with socket.create_connection((host, port), timeout=5) as third:  # over the bound
        third.sendall(b"GET /a.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert third.recv(1024).startswith(b"HTTP/1.0 200")
    assert held[0].recv(1024) == b""  # the longest waiting made room, unanswered
    started = time.monotonic()
    assert held[1].recv(1024) == b""  # the other is dropped after the timeout
    assert time.monotonic() - started < 5
    for s in held:
        s.close()
    time.sleep(0.2)
    assert get(srv, "/a.json")[0] == 200  # their slots are free again


# --- defects of the third probe: hidden files behind links, DNS rebinding, slow clients, IPv6

def test_a_visible_link_to_a_hidden_file_is_not_served(tmp_path, own_server):
    root = tmp_path / "pkg"
    (root / ".private").mkdir(parents=True)
    (root / ".secret").write_bytes(SECRET)
    (root / ".private" / "key.txt").write_bytes(SECRET)
    os.symlink(".secret", root / "open.txt")
    os.symlink(".private", root / "open")
    (root / "fine.txt").write_text("fine")
    srv = own_server(root, quiet=True)
    for target in ("/open.txt", "/open/key.txt"):
        status, _, body = get(srv, target)
        assert status == 404 and SECRET not in body, target
    assert get(srv, "/fine.txt")[0] == 200


@pytest.mark.parametrize("host, status", [
    ("attacker.example", 421), ("attacker.example:8000", 421), ("127.0.0.1.nip.io", 421),
    ("127.0.0.1:8000", 200), ("[::1]:8000", 200), ("localhost:8000", 200),
    ("app.localhost", 200), ("studio.lan", 200), ("STUDIO.LAN:8000", 200)])
def test_only_requests_addressed_to_this_machine_are_answered(tmp_path, own_server, host,
                                                              status):
    """A DNS-rebinding page reaches 127.0.0.1 under its own name, which the browser sends as
    `Host`: such a request is refused (421), naming the option that would allow it."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "manifest.json").write_bytes(SECRET)
    srv = own_server(root, quiet=True, allow_hosts=("studio.lan",))
    got, _, body = get(srv, "/manifest.json", headers={"Host": host})
    assert got == status and (SECRET in body) == (status == 200), body
    if status == 421:
        assert b"--allow-host" in body


def test_clients_trickling_their_requests_cannot_lock_others_out(tmp_path, own_server,
                                                                 monkeypatch):
    """Slowloris: each connection sends a byte often enough that no read times out. The
    request deadline ends them all; while they last, a new client still gets in."""
    import socket
    import time

    from edge.core.serve import PackageServer

    monkeypatch.setattr(PackageServer, "max_connections", 4)
    monkeypatch.setattr(PackageServer, "request_deadline_s", 1.5)
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.json").write_text("{}")
    srv = own_server(root, quiet=True)
    host, port = srv.server_address[:2]
    slow = [socket.create_connection((host, port), timeout=5) for _ in range(4)]
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.1):
            for s in slow:
                try:
                    s.send(b"X")
                except OSError:
                    pass

    threading.Thread(target=trickle, daemon=True).start()
    try:
        time.sleep(0.3)
        started = time.monotonic()
        assert get(srv, "/a.json")[0] == 200
        assert time.monotonic() - started < 3
        for s in slow:  # each dropped by the deadline, never answered
            s.settimeout(5)
            try:
                assert s.recv(1024) == b""
            except ConnectionResetError:
                pass
    finally:
        stop.set()
        for s in slow:
            s.close()


def test_serves_on_ipv6_loopback(tmp_path, own_server):
    import socket

    if not socket.has_ipv6:
        pytest.skip("this Python was built without IPv6")
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.json").write_text("{}")
    try:
        srv = own_server(root, host="::1", quiet=True)
    except OSError as err:
        pytest.skip(f"this machine has no IPv6 loopback to bind ({err})")
    assert srv.url.startswith("http://[::1]:")
    assert get(srv, "/a.json")[0] == 200


def test_a_host_holding_escape_characters_is_printed_escaped(tmp_path):
    from typer.testing import CliRunner

    from edge.commands import app

    res = CliRunner().invoke(app, ["serve", str(tmp_path), "--host", "\x1b]0;owned\x07bad"])
    assert res.exit_code == 2 and "\x1b" not in res.output and "\a" not in res.output
    assert "\\x1b]0;owned\\x07bad" in res.output, res.output


@pytest.mark.parametrize("manifest, said", [
    (None, "has no manifest.json: not an edge package"),
    ({"format": "edge-package", "target": "onnx"},
     "is a --target onnx package: the page runs --target web packages"),
    ({"format": "edge-package", "target": "web"}, None),
])
def test_serve_says_what_a_folder_that_is_no_web_package_is(tmp_path, manifest, said):
    """A browser asking an ONNX package for its page got a bare 404: the command says up
    front what it serves, and serves it all the same."""
    import json

    from edge.commands.serve import _what_is_served

    if manifest is not None:
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    note = _what_is_served(tmp_path)
    assert (note is None) if said is None else (said in note and str(tmp_path) in note), note
