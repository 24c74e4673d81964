"""The edge package: a folder with `manifest.json` and the files it lists.

One format for every target (ONNX, CoreML, WebGPU); docs/package-format.md is its reference.
This module reads and verifies a package (before anything runs) and writes one atomically.
It imports neither torch nor onnx, so runtimes can use it.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from edge.core.files import (
    EdgeNotice,
    give_usual_mode,
    give_usual_modes,
    hold,
    is_held,
    kind_of,
)
from edge.core.manifest_schema import (  # noqa: F401  (re-exported: the package's public names)
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    TENSOR_ALIGN,  # tensors start 64-byte aligned: NumPy views stay SIMD-friendly
    PackageError,
    check_manifest,
    iter_file_records,
    manifest_digest,
)

FILE_ALIGN = 4096          # weight files are whole pages: O_DIRECT needs aligned lengths
READ_CHUNK = 8 << 20
MAX_MANIFEST_BYTES = 64 << 20   # far above any real manifest; bounds what a bad one costs
# Files that operating systems and archivers drop into folders; never listed, never read,
# and not worth a note when a package is loaded.
OS_NOISE = (".DS_Store", "Thumbs.db", "desktop.ini", ".directory")
OS_NOISE_DIRS = ("__MACOSX", ".Spotlight-V100", ".Trashes", ".fseventsd")
# What `--force` may delete besides the files a package lists: only what no person writes
# (a desktop's folder cache). __MACOSX/, ._NAME or desktop.ini may hold someone's work.
DISPOSABLE = (".DS_Store",)


def align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def weights_layout(sizes: dict[str, int]) -> tuple[dict[str, int], int]:
    """Offsets of tensors of the given byte sizes packed into one weights file, and the
    file's size: the flash layout every target shares."""
    offsets, offset = {}, 0
    for name, n in sizes.items():
        offsets[name] = offset
        offset = align(offset + n, TENSOR_ALIGN)
    return offsets, align(max(offset, 1), FILE_ALIGN)


def write_weights_file(path: Path, arrays: dict) -> dict[str, int]:
    """NumPy arrays (C-ordered) written into one weights file in the flash layout; returns
    each one's offset."""
    offsets, size = weights_layout({n: a.nbytes for n, a in arrays.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for name, a in arrays.items():
            f.write(b"\0" * (offsets[name] - f.tell()))
            f.write(memoryview(a.reshape(-1)).cast("B"))  # no copy: a block may be GBs
        f.write(b"\0" * (size - f.tell()))
    return offsets


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def folder_bytes(root: Path) -> int:
    """Bytes of every file under `root` (a package on disk, a program's folder)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def file_entry(root: Path, path: Path) -> dict:
    """The manifest record of one file: package-relative POSIX path, byte size, sha256."""
    return {"path": path.relative_to(root).as_posix(), "bytes": path.stat().st_size,
            "sha256": sha256_of(path)}


def write_null_caption(root: Path, null, raw: bool = False) -> dict:
    """A learned null caption (tokens x width, float32) written as the package's
    `conditioning/null_caption.npy`, and with `raw` a little-endian float32 copy (`.f32`, which
    Swift reads without an .npy parser); the manifest's `conditioning` records."""
    import numpy as np

    null = np.asarray(null, dtype="<f4")
    npy = root / "conditioning" / "null_caption.npy"
    npy.parent.mkdir(parents=True)
    np.save(npy, null)
    records = {"null_caption": file_entry(root, npy)}
    if raw:
        npy.with_suffix(".f32").write_bytes(null.tobytes())
        records["null_caption_f32"] = file_entry(root, npy.with_suffix(".f32"))
    return records


def resolve_inside(root: Path, relative: str, where: str) -> Path:
    """`root/relative`, refusing absolute paths and any path that escapes `root`."""
    rel = PurePosixPath(relative)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise PackageError(f"{where}: file path {relative!r} escapes the package folder")
    try:
        path = (root / rel).resolve()
    except (RuntimeError, OSError):  # Python 3.11 raises RuntimeError on a link loop
        raise PackageError(f"{where}: {root / rel} is {kind_of(root / rel)}") from None
    if not path.is_relative_to(root.resolve()):
        raise PackageError(f"{where}: file path {relative!r} escapes the package folder")
    return path


def write_manifest(root: Path, manifest: dict) -> None:
    """Write `root/manifest.json`, stamped with the digest of its own content."""
    manifest.pop("manifest_sha256", None)
    manifest["manifest_sha256"] = manifest_digest(manifest)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


@dataclass(frozen=True)
class FileIdentity:
    """What a file was when it was verified; compared again (fstat) whenever it is read
    later, so a file changed or replaced on disk after verification is detected."""

    size: int
    mtime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def check_unchanged(path: Path, st: os.stat_result, expected: FileIdentity | None) -> None:
    """Refuse a file whose size, mtime or inode differ from when it was verified."""
    if expected is not None and FileIdentity.of(st) != expected:
        raise PackageError(f"{path}: changed on disk since the package was verified (size, "
                           "modification time or inode differ); load the package again")


def check_still_verified(path: Path, expected: FileIdentity | None) -> None:
    """`path` is still the file verified (check_unchanged); one removed, moved or made
    unreadable since is the same PackageError, never a bare OSError."""
    try:
        st = os.stat(path)
    except OSError as err:
        what = "removed or moved" if isinstance(err, FileNotFoundError) else \
            f"unreadable ({err.strerror})"
        raise PackageError(f"{path}: {what} since the package was verified; load the package "
                           "again") from None
    check_unchanged(path, st, expected)


def _listed_file(root: Path, where: str, record: dict) -> tuple[Path, os.stat_result]:
    path = resolve_inside(root, record["path"], where)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise PackageError(f"{path}: missing (listed in {where})") from None
    except OSError as err:
        raise PackageError(f"{path}: cannot be read ({err.strerror}; listed in {where})") from None
    if not stat.S_ISREG(st.st_mode):
        raise PackageError(f"{path}: is {kind_of(path)}, not a regular file (listed in "
                           f"{where})")
    if st.st_size != record["bytes"]:
        raise PackageError(f"{path}: {st.st_size} bytes, manifest says {record['bytes']} "
                           "(truncated or altered)")
    return path, st


def verify_files(root: Path, manifest: dict, check_hashes: bool = True
                 ) -> dict[Path, FileIdentity]:
    """Every listed file exists inside the package with the listed size and sha256; returns
    each file's identity at verification."""
    identities: dict[Path, FileIdentity] = {}
    for where, f in iter_file_records(manifest):
        path, st = _listed_file(root, where, f)
        if check_hashes:
            with open(path, "rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
                after = os.fstat(fh.fileno())
            if digest != f["sha256"]:
                raise PackageError(f"{path}: sha256 differs from the manifest (altered or "
                                   "corrupt)")
            if FileIdentity.of(after) != FileIdentity.of(st):
                raise PackageError(f"{path}: changed on disk while it was being verified")
        identities[path] = FileIdentity.of(st)
    return identities


def _is_noise(name: str) -> bool:
    return name in OS_NOISE or name.startswith("._")  # ._*: macOS AppleDouble files


def unlisted_files(root: Path, manifest: dict, for_replacing: bool = False) -> list[str]:
    """Package-relative paths present in the folder but listed nowhere in the manifest.
    Operating-system noise (.DS_Store, __MACOSX/, ...) is left out when reading; when the
    folder is to be replaced (`for_replacing`), only what DISPOSABLE names is."""
    listed = {MANIFEST} | {f["path"] for _, f in iter_file_records(manifest)}
    prefixes = {p.rsplit("/", i)[0] for p in listed for i in range(1, p.count("/") + 1)}
    extra = []
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root).as_posix()
        rel = "" if rel == "." else rel + "/"
        if not for_replacing:
            dirs[:] = [d for d in dirs if d not in OS_NOISE_DIRS]
        for d in dirs:  # a symlinked folder is not walked into: it must be on a listed path
            if os.path.islink(os.path.join(folder, d)) and rel + d not in prefixes:
                extra.append(rel + d)
        ignored = (lambda n: n in DISPOSABLE) if for_replacing else _is_noise
        extra += [rel + n for n in files if rel + n not in listed and not ignored(n)]
    return sorted(extra)


def _listing(paths: list[str], most: int) -> str:
    return ", ".join(paths[:most]) + (f" and {len(paths) - most} more" if len(paths) > most
                                      else "")


def _strict_json(text: str, path: Path):
    """json.loads that refuses NaN/Infinity and keys given twice in one object."""

    def constant(name: str):
        raise PackageError(f"{path}: {name} is not a JSON number")

    def unique(pairs: list[tuple[str, object]]) -> dict:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            dup = next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))
            raise PackageError(f"{path}: key {dup!r} appears twice in one object")
        return obj

    return json.loads(text, parse_constant=constant, object_pairs_hook=unique)


def read_manifest(root: Path) -> dict:
    """Parse and structurally check `root/manifest.json` (no other file is opened)."""
    path = root / MANIFEST
    kind = kind_of(path)
    if kind not in ("a file", "missing"):  # a FIFO would block the read; a loop is no file
        raise PackageError(f"{path}: is {kind}, not a file; is {root} an edge package?")
    if kind == "missing":
        hint = ""
        earlier = sorted(root.parent.glob(f".{glob.escape(root.name)}.old-*"))
        if earlier:
            hint = (f"; an interrupted export left the earlier package at {earlier[0]}: the "
                    "next export to this destination puts it back, or rename it yourself")
        raise PackageError(f"{path}: not found; is {root} an edge package?{hint}")
    resolve_inside(root, MANIFEST, MANIFEST)
    size = path.stat().st_size
    if size > MAX_MANIFEST_BYTES:
        raise PackageError(f"{path}: {size} bytes, more than any manifest needs "
                           f"({MAX_MANIFEST_BYTES} at most)")
    try:
        manifest = _strict_json(path.read_bytes().decode("utf-8"), path)
    except PackageError:
        raise
    except UnicodeDecodeError as err:
        raise PackageError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except (ValueError, RecursionError) as err:  # JSONDecodeError, huge ints, deep nesting
        raise PackageError(f"{path}: not valid JSON ({str(err) or type(err).__name__})"
                           ) from None
    check_manifest(manifest)
    return manifest


def read_package(root: str | Path, check_hashes: bool = True,
                 identities: dict[Path, FileIdentity] | None = None) -> dict:
    """Load and fully verify a package: the manifest's structure, every listed file's path,
    size and sha256. Files the manifest does not list are neither checked nor used: they are
    named in an EdgeNotice (a README someone added does not stop a package). Returns the
    manifest; fills `identities` (when given) with each verified file's identity, for checks
    at later reads."""
    root = Path(root)
    manifest = read_manifest(root)
    for where, f in iter_file_records(manifest):  # paths that leave the folder first: never opened
        resolve_inside(root, f["path"], where)
    extra = unlisted_files(root, manifest)
    if extra:
        warnings.warn(EdgeNotice(f"{root}: files not listed in {MANIFEST}: "
                                 f"{_listing(extra, 5)}; they are not checked and not used"),
                      stacklevel=2)
    found = verify_files(root, manifest, check_hashes)
    if identities is not None:
        identities.update(found)
    return manifest


class PackageWriteError(RuntimeError):
    """A package could not be written; nothing was left behind and an earlier package at the
    destination is untouched."""


# errors of the destination rather than of the exporter's own work
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS,
                 errno.EFBIG, errno.ENAMETOOLONG, errno.ENOTDIR, errno.EEXIST, errno.EBUSY,
                 errno.EXDEV}


_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\]|Os \{ code: (\d+)")


def os_error_within(err: BaseException) -> OSError | None:
    """The operating-system error behind `err`: itself when it is one with an errno, else
    the errno in the text libraries wrap it in (shutil.Error's list of failed copies,
    safetensors' Rust `Os { code: N }`): a full disk is a full disk whoever writes."""
    if isinstance(err, OSError) and err.errno is not None:
        return err
    found = _ERRNO_IN_TEXT.search(str(err))
    if found is None:
        return None
    code = int(found.group(1) or found.group(2))
    return OSError(code, os.strerror(code))


def write_error_within(err: BaseException) -> OSError | None:
    """The operating-system error behind `err` when it is one of writing (a full, read-only
    or unwritable disk, a destination the rename cannot take), else None."""
    cause = os_error_within(err)
    return cause if cause is not None and cause.errno in _WRITE_ERRNOS else None


def _write_error(dest: Path, err: OSError) -> PackageWriteError:
    what = errno.errorcode.get(err.errno or 0, "")
    where = f" ({err.filename})" if err.filename else ""
    return PackageWriteError(
        f"{dest}: cannot write the package: {err.strerror or err} [{what}]{where}; nothing "
        "was written and any earlier package there is untouched")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


_PARTIAL = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+\.partial")


def _other_writer(dest: Path, mine: Path) -> int | None:
    """The pid of another live writer of `dest` (its held temporary folder beside `dest`),
    if any. Both of two writers starting at once may see the other: both are refused, and
    nothing is lost."""
    for p in dest.parent.glob(f".{glob.escape(dest.name)}.*.partial"):
        match = _PARTIAL.fullmatch(p.name)
        if (match and match["name"] == dest.name and p != mine and p.is_dir()
                and not p.is_symlink() and is_held(p)):
            return int(match["pid"])
    return None


def recover_interrupted(dest: Path) -> list[Path]:
    """Undo what killed writers left in `dest`'s folder: an earlier package that a crash
    between the two renames of the fallback commit left at `.NAME.old-PID` goes back to
    `dest`; temporary `.NAME.PID.XXXX.partial` folders that no writer holds any more (of
    this destination or any other in the folder) are removed. Returns what was removed."""
    name = re.escape(dest.name)
    removed = []
    for p in sorted(dest.parent.glob(".*.partial")):
        if _PARTIAL.fullmatch(p.name) and p.is_dir() and not p.is_symlink() \
                and not is_held(p):
            _remove(p)
            removed.append(p)
    for p in dest.parent.glob(f".{glob.escape(dest.name)}.old-*"):
        old = re.fullmatch(rf"\.{name}\.old-(\d+)", p.name)
        if old is None or _pid_alive(int(old.group(1))):
            continue
        if not dest.exists():
            os.rename(p, dest)
        else:
            _remove(p)
            removed.append(p)
    return removed


_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def _renameat2(a: Path, b: Path, flag: int) -> bool:
    """Linux renameat2 with `flag` (the standard library has no binding): True once done;
    False where the system or file system cannot; any other failure an OSError (EEXIST, for
    RENAME_NOREPLACE onto an existing path, is FileExistsError)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flag) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step; False where the system or file system cannot."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file system object is at `path` (device, inode); None where nothing is."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_dev, st.st_ino


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """Rename unless `dst` exists, in one step (renameat2 RENAME_NOREPLACE): False where
    `dst` appeared. Where the system cannot, a check, then a rename that replaces at most an
    empty folder (rename(2) refuses a folder that holds anything)."""
    try:
        if _renameat2(src, dst, _RENAME_NOREPLACE):
            return True
    except FileExistsError:
        return False
    if os.path.lexists(dst):
        return False
    os.rename(src, dst)
    return True


class DestinationChanged(PackageWriteError):
    """The destination changed while the package was written (a folder made there, another
    writer's result): it is left as it is, and the finished package kept beside it."""


def _keep_beside(tmp: Path, dest: Path, why: str) -> DestinationChanged:
    """Move the finished `tmp` to the first free `DEST-2`, `DEST-3`...: the error to raise."""
    for n in range(2, 1000):
        kept = dest.with_name(f"{dest.name}-{n}")
        if _rename_noreplace(tmp, kept):
            return DestinationChanged(f"{dest}: {why} while this write ran; it was left as it "
                                      f"is, and what this write made is at {kept}")
    return DestinationChanged(f"{dest}: {why} while this write ran; it was left as it is, "
                              "and no free name beside it could keep this write's result")


def _commit(tmp: Path, dest: Path, before: tuple[int, int] | None,
            identify: Callable[[Path], str]) -> None:
    """Put the finished `tmp` at `dest`, provided `dest` is what it was when the write began
    (`before`, its identity then) and still replaceable: a folder that appeared there
    meanwhile, or one now holding other files, is left alone and the result kept beside it.
    An existing `dest` is swapped out atomically where the system can; else renamed aside
    first and renamed back if the second rename fails."""
    now = _identity(dest)
    if now is not None and now != before and _remove_empty(dest):
        now = None  # an empty folder made meanwhile: nothing there to lose
    if now is None:
        if not _rename_noreplace(tmp, dest):
            raise _keep_beside(tmp, dest, f"{kind_of(dest)} appeared there")
        return
    if before is None:
        raise _keep_beside(tmp, dest, f"{kind_of(dest)} appeared there")
    if now != before:
        raise _keep_beside(tmp, dest, f"{kind_of(dest)} replaced what was there")
    try:
        check_replaceable(dest, force=True, identify=identify)
    except PackageWriteError as err:
        raise _keep_beside(tmp, dest, f"what is there changed ({err})") from None
    if _exchange(tmp, dest):
        _remove(tmp)  # tmp now holds the earlier package
        return
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    os.rename(dest, old)  # a crash here: recover_interrupted puts `old` back
    try:
        os.rename(tmp, dest)
    except BaseException:
        os.rename(old, dest)
        raise
    _remove(old)


def _remove_empty(folder: Path) -> bool:
    """Remove `folder` if it is an empty folder (not a link to one): whether it was."""
    if os.path.islink(folder) or not os.path.isdir(folder):
        return False
    try:
        os.rmdir(folder)
    except OSError:
        return False
    return True


@contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so the cleanup runs on both; an
    application's own SIGTERM handler is left alone."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def interrupt(signum: int, frame) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while the package is put in place; they arrive right after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def not_edges(dest: Path, why: str) -> PackageWriteError:
    """The refusal to replace a folder edge did not write, with the reason."""
    return PackageWriteError(f"{dest}: {why}; edge replaces only folders it wrote, with or "
                             "without --force: choose another destination, or move the "
                             "folder away yourself (nothing was changed)")


def identify_package(dest: Path) -> str:
    """What the edge package at `dest` is ("the edge package MODEL (TARGET)"); anything else
    (no manifest, a manifest that does not say it is edge's, files the manifest does not
    list) is refused with the reason."""
    path = dest / MANIFEST
    kind = kind_of(path)
    if kind != "a file":
        raise not_edges(dest, f"holds files but no edge manifest ({MANIFEST} is {kind})")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise not_edges(dest, f"its {MANIFEST} is larger than any edge manifest")
    try:
        manifest = json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise not_edges(dest, f'its {MANIFEST} is not an edge manifest (no "format": '
                              f'"{FORMAT}")')
    try:
        extra = unlisted_files(dest, manifest, for_replacing=True)
    except (PackageError, TypeError, KeyError, AttributeError) as err:
        raise not_edges(dest, f"its {MANIFEST} says edge but is damaged ({err})") from None
    if extra:
        raise not_edges(dest, f"an edge package, but it also holds files its manifest does "
                              f"not list ({_listing(extra, 3)})")
    return (f"the edge package {manifest.get('model', '?')!s:.80} "
            f"({manifest.get('target', '?')!s:.20})")


def check_replaceable(dest: Path, force: bool,
                      identify: Callable[[Path], str] = identify_package) -> str | None:
    """May a write replace `dest`? Nothing there, or an empty folder: yes (None). A folder
    edge wrote, as `identify` recognises it: only with `force`, and the description of what
    is replaced is returned for the caller to say. Anything else is refused whatever `force`
    says: a file, a link, a folder of other files."""
    if not os.path.lexists(dest):
        return None
    if dest.is_symlink() or not dest.is_dir():
        raise PackageWriteError(f"{dest}: exists and is {kind_of(dest)}, not a folder edge "
                                "wrote; choose another destination (nothing was changed)")
    if os.path.ismount(dest):
        # a package is written beside its destination and renamed into place, and nothing
        # can be renamed onto a mount point (EBUSY): say so now, not after the work
        raise PackageWriteError(f"{dest}: is a mount point; edge writes a package beside its "
                                "destination and renames it into place, which a mount point "
                                f"cannot take: write to a folder inside it, e.g. "
                                f"{dest / 'package'} (nothing was changed)")
    if not any(dest.iterdir()):
        return None
    what = identify(dest)
    if not force:
        raise PackageWriteError(f"{dest}: {what} is already there; pass --force to replace "
                                "it (nothing was changed)")
    return what


@contextmanager
def atomic_directory(dest: str | Path, identify: Callable[[Path], str] = identify_package
                     ) -> Iterator[Path]:
    """Yield a temporary folder beside `dest`; on success it replaces `dest` atomically.
    An existing `dest` is replaced only when it is empty or `identify` recognises it as a
    folder edge wrote (by default an edge package): never a folder of other files, whoever
    the caller. The folder gets the usual mode (0755 under umask 022).

    On any error, Ctrl-C or SIGTERM the temporary folder is removed and an existing `dest` is
    left untouched; a destination that cannot be written raises PackageWriteError. A writer
    killed outright (SIGKILL, power loss) leaves only hidden folders beside `dest`, which the
    next write to `dest` clears (recover_interrupted)."""
    dest = Path(dest).resolve()
    check_replaceable(dest, force=True, identify=identify)
    before = _identity(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        for stale in recover_interrupted(dest):
            warnings.warn(EdgeNotice(f"removed {stale}, left by an earlier write that was "
                                     "killed before it finished"), stacklevel=3)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{os.getpid()}.", suffix=".partial",
                                    dir=dest.parent))
        give_usual_mode(tmp)  # mkdtemp's 0700 would keep web servers and other users out
        # held while written: what a killed writer left, nobody holds (recover_interrupted)
        held = hold(tmp)
    except OSError as err:
        raise _write_error(dest, err) from err
    other = _other_writer(dest, tmp)
    if other is not None:
        _remove(tmp)
        os.close(held)
        raise PackageWriteError(f"{dest}: another edge process (pid {other}) is writing there; "
                                "wait for it to finish or choose another destination "
                                "(nothing was changed)")
    try:
        with _signals_as_interrupt():
            yield tmp
            give_usual_modes(tmp)
            with _signals_deferred():
                _commit(tmp, dest, before, identify)
    except Exception as err:  # noqa: BLE001  (a library's wrapped OSError too)
        _remove(tmp)
        cause = write_error_within(err)
        if cause is not None:
            raise _write_error(dest, cause) from err
        raise
    except BaseException:
        _remove(tmp)
        raise
    finally:
        os.close(held)

