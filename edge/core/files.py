"""Files edge writes for a user (videos, plots, JSON figures, package folders): each
destination is checked before any work starts, and each file is written atomically (a
temporary file beside it, renamed into place), so a failure leaves the earlier file untouched
and no partial file behind. Also: what a path is, in words, for error messages.

Imports only the standard library: the runtimes use it too.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class EdgeNotice(UserWarning):
    """Something worth saying that stops nothing (files a package does not list, the
    leftovers of a killed export cleaned up): the command line prints it as a note; a
    program embedding edge sees a warning."""


class OutputError(RuntimeError):
    """A destination edge cannot write, or a write that failed; nothing the user had at the
    destination was changed. The message names the option (where given) and the path."""


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISREG, "a file"))


def kind_of(path: Path) -> str:
    """What is at `path`, in words: "missing", "a file", "a folder", "a FIFO (named pipe)",
    "a symbolic link loop", "a broken symbolic link", "unreadable (reason)"..."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.islink(path) else "missing"
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symbolic link loop"
        if err.errno == errno.ENOTDIR:  # a parent is a file: nothing can be there
            return "missing"
        return f"unreadable ({err.strerror})"
    return next((name for test, name in _KINDS if test(st.st_mode)), "not a file or folder")


class InputError(ValueError):
    """A file named to be read that cannot be: the message names the option and the path."""


def check_input_file(path: Path, option: str) -> None:
    """A file the user names to be read is a regular file: a FIFO or a device would block the
    read for ever or never end; refused with what is there instead (OutputError's sibling:
    the message names the option and the path)."""
    kind = kind_of(Path(path))
    if kind != "a file":
        raise InputError(f"{option} {path}: is {kind}; name a file to read"
                         if kind != "missing" else f"{option} {path}: no such file")


def current_umask() -> int:
    """The process's umask, read without changing it where the system tells it (Linux
    /proc); elsewhere set and restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_usual_mode(path: Path) -> None:
    """The mode a plain open() or mkdir() would have given (mkstemp and mkdtemp make
    owner-only files and folders): a web server or another user can read an export."""
    base = 0o777 if path.is_dir() else 0o666
    os.chmod(path, base & ~current_umask())


def give_usual_modes(tree: Path) -> None:
    """Every file and folder under `tree` (links left alone) gets the mode a plain open() or
    mkdir() would have given, execute bits kept: libraries that write owner-only files
    (safetensors' writer makes them 0600) leave none in what edge publishes."""
    mask = current_umask()
    for folder, dirs, files in os.walk(tree):
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o777 & ~mask)
        for name in files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                os.chmod(path, (0o666 | (st.st_mode & 0o111)) & ~mask)


def _named(path: Path, option: str | None) -> str:
    return f"{option} {path}" if option else str(path)


def _first_existing(path: Path) -> Path:
    """The nearest ancestor of `path` (itself excluded) that exists."""
    parent = path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    return parent


def _probe_writable(folder: Path, what: str) -> None:
    """Create and remove a file in `folder`: the one test of writability that is true for
    root, read-only mounts, /proc and quotas alike."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".edge-probe-", dir=folder)
    except OSError as err:
        raise OutputError(f"{what}: cannot write in {folder} ({err.strerror or err})"
                          ) from None
    os.close(fd)
    os.unlink(probe)


def check_writable_parent(path: Path, option: str | None = None) -> None:
    """`path`'s folder exists and can be written, or can be created: its nearest existing
    ancestor is a folder edge can write in. Nothing is left behind."""
    what = _named(path, option)
    parent = path.parent
    if os.path.lexists(parent) and not parent.is_dir():
        raise OutputError(f"{what}: {parent} is {kind_of(parent)}, not a folder")
    ancestor = parent if parent.is_dir() else _first_existing(parent)
    if not ancestor.is_dir():
        raise OutputError(f"{what}: {ancestor} is {kind_of(ancestor)}, not a folder")
    _probe_writable(ancestor, what)


def check_name_length(path: Path, option: str | None = None) -> None:
    """`path`'s last part fits its file system's limit on a name (NAME_MAX, 255 bytes on
    most): refused before the work, not when the result is written."""
    ancestor = path.parent if path.parent.is_dir() else _first_existing(path.parent)
    try:
        most = os.pathconf(ancestor, "PC_NAME_MAX")
    except (OSError, ValueError):
        return  # the system does not say: the write itself will
    size = len(os.fsencode(path.name))
    if size > most:
        raise OutputError(f"{_named(path, option)}: the name {path.name[:40]}... is {size} "
                          f"bytes; the file system at {ancestor} allows at most {most}")


def check_output_file(path: Path, option: str | None = None) -> None:
    """Before any work: `path` can be written as a file. It may exist only as a regular
    file (which the write will replace); a folder, FIFO or device there is refused, and so is
    a name too long for its file system and a folder that cannot be written or created."""
    path = Path(path)
    what = _named(path, option)
    if os.path.lexists(path):
        kind = kind_of(path)
        if kind != "a file":
            raise OutputError(f"{what}: is {kind}; name a file to write")
    check_name_length(path, option)
    check_writable_parent(path, option)


# A temporary file's name: `.NAME.RANDOM.partial.SUFFIX`, NAME cut so that the whole fits
# every file system's 255 bytes whatever the destination's own length.
_TEMP_NAME_PART = 120


def _temp_prefix(path: Path) -> str:
    name = os.fsencode(path.name)[:_TEMP_NAME_PART].decode(errors="ignore")
    return f".{name}."


def _hold(fd: int) -> None:
    """Mark an open temporary file as being written: an exclusive lock the system drops
    however its writer ends (SIGKILL included), so a file nobody holds is a leftover."""
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def hold(path: Path) -> int:
    """Open `path` (a file or folder) and hold it (`_hold`): the descriptor, whose closing
    releases the hold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _hold(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_held(path: Path) -> bool:
    """Whether a process holds `path` (a temporary file or folder a writer locks while it
    works); one that cannot be opened is not ours to judge, and counts as held."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return True  # not ours to judge: leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


@contextmanager
def held_temporary_folder(prefix: str) -> Iterator[Path]:
    """A new folder in the system's temporary folder, named `PREFIX...`, held (a lock the
    system drops however its process ends) while in use and removed after. Those that a
    process killed outright left (SIGKILL, power loss: no cleanup ran) are removed here, by
    the next use of the same prefix."""
    remove_unheld_temporary_folders(prefix)
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        fd = hold(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        yield tmp
    finally:
        os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)


def remove_unheld_temporary_folders(prefix: str) -> list[Path]:
    """The `PREFIX*` folders in the system's temporary folder that no process holds,
    removed (held_temporary_folder); what was removed."""
    removed = []
    for p in Path(tempfile.gettempdir()).glob(f"{glob.escape(prefix)}*"):
        if p.is_dir() and not p.is_symlink() and not is_held(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def remove_leftover_temps(path: Path) -> list[Path]:
    """Remove the temporary files that writers of `path` killed outright (SIGKILL, power
    loss) left beside it: those no running writer holds. Returns what was removed."""
    removed = []
    prefix, suffix = _temp_prefix(path), f".partial{path.suffix}"
    for p in path.parent.glob(f"{glob.escape(prefix)}*{glob.escape(suffix)}"):
        if p.is_file() and not p.is_symlink() and not is_held(p):
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


@contextmanager
def atomic_file(path: Path, option: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `path` (with the same suffix, for writers that pick a
    format by extension); once the body returns it replaces `path` in one rename. On any
    error, Ctrl-C included, the temporary file is removed and `path` is as it was; an
    OSError of the destination (a full disk, no permission) becomes an OutputError."""
    path = Path(path)
    check_output_file(path, option)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_leftover_temps(path)
        fd, name = tempfile.mkstemp(prefix=_temp_prefix(path),
                                    suffix=f".partial{path.suffix}", dir=path.parent)
        _hold(fd)
    except OSError as err:
        raise OutputError(f"{_named(path, option)}: cannot write ({err.strerror or err}); "
                          "nothing was written") from err
    tmp = Path(name)
    try:
        yield tmp
        give_usual_mode(tmp)
        with open(tmp, "rb") as f:  # on disk before the rename: a crash leaves old or new
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{_named(path, option)}: cannot write ({err.strerror or err}); "
                          "nothing was written and an earlier file there is untouched"
                          ) from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)  # releases the hold


# bidirectional overrides and isolates: they reorder what a terminal shows (Trojan Source)
_INVISIBLE = {*range(0x202A, 0x202F), *range(0x2066, 0x206A)}


def printable(text: str) -> str:
    """`text` with control characters escaped (\\x1b, \\x07, \\u202e...), newlines and
    tabs kept: names and values read from files cannot retitle a terminal, move its cursor
    or hide what follows."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in "\n\t":
            out.append(ch)
        elif code < 0x20 or 0x7F <= code < 0xA0:
            out.append(f"\\x{code:02x}")
        elif code in _INVISIBLE:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)
