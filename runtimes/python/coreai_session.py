"""Blocks of an iphone package in the Core AI layout (`--min-ios 27`), run through Core AI's
runtime: the operating system's on macOS 27, on Linux the bundled reference interpreter
(slow: a check of what the phone runs, not a way to generate fast).

Each `.aimodel` is opened once (`AIModelAsset.executable()` lowers it to the runtime's form
in a temporary folder and maps its weights) and each block or variant is a function of it.
Core AI's API is asynchronous; the pipeline is not, so one event loop (`asyncio.Runner`)
serves every call, on a thread of its own: `Runner.run` refuses to start where the calling
thread already runs an event loop (a notebook's, Playwright's synchronous API), and the
pipeline may be called from such a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from edge.core.mlir_bytecode import FramingError, check_framing
from edge.core.package import PackageError, resolve_inside

LAYOUT = "coreai"
DTYPES = {"float32": np.float32, "int32": np.int32}
INTERPRETER_NOTE = ("Core AI's Linux runtime is a reference interpreter: it checks what the "
                    "phone runs, slowly (float16 programs about 100x slower than float32)")
# Why every program stays open: on Linux a closed program keeps its weights mapped for the
# process's life (coreai-core 1.0.0b3 lowers each .aimodel to a temporary file, deletes it on
# close and never unmaps it: a 193 MB program opened, run and closed three times held 576 MB),
# so dropping and reopening programs under a budget would grow memory, not bound it
BUDGET_NOTE = ("the memory budget is checked against the package's programs, but it does not "
               "bound what they hold: each Core AI program maps its own weights and stays "
               "open (the loader reads none of them)")


def coreai_notice(budget: int | None) -> str | None:
    """What `Pipeline.load` says about running a Core AI package here, if anything."""
    notes = ([INTERPRETER_NOTE] if sys.platform != "darwin" else []) + \
        ([BUDGET_NOTE] if budget is not None else [])
    return "; ".join(notes) or None


def _coreai():
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        from coreai.authoring import AIModelAsset
        from coreai.runtime import NDArray
    return AIModelAsset, NDArray


@contextlib.contextmanager
def native_stderr_quiet():
    """Core AI's runtime logs every function it loads ("ODIE [default]: Loading function
    'main'") from native code to the process's stderr, dozens a package: kept out of the
    command's output for the moment a program opens."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_program(asset: Path, record: dict, where: str) -> None:
    """Refuse a program Core AI's native code would abort the process on (SIGABRT, nothing
    said: a truncated main.mlirb did) before it reads it: main.hash, the sha256 Core AI wrote
    beside the bytecode, must be the manifest's digest of it (which verification compared
    with the file), and the bytecode's sections must cover it exactly."""
    bytecode, hash_file = asset / "main.mlirb", asset / "main.hash"
    listed = next((f["sha256"] for f in record.get("files", [])
                   if f["path"] == f"{record['model']}/main.mlirb"), None)
    try:
        written = hash_file.read_bytes().hex()
    except OSError as err:
        raise PackageError(f"{hash_file}: Core AI's digest of the program cannot be read "
                           f"({where}): {err.strerror or err}") from None
    if listed is not None and written != listed:
        raise PackageError(f"{bytecode}: its sha256 in the manifest is not the one Core AI "
                           f"wrote beside it in main.hash ({where}): the program was changed "
                           "after it was made; export the package again")
    try:
        check_framing(bytecode)
    except FramingError as err:
        raise PackageError(f"{bytecode}: not a whole Core AI program ({where}): the bytecode "
                           f"{err}; export the package again") from None


class CoreAIPrograms:
    """The package's open Core AI models, by path, on one event loop; `close` lets them go."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.AIModelAsset, self.NDArray = _coreai()
        self.runner = asyncio.Runner()
        self.loop_thread = ThreadPoolExecutor(1, thread_name_prefix="coreai-loop")
        self.stack = contextlib.AsyncExitStack()
        self.models: dict[str, object] = {}

    def _run(self, coroutine):
        """Run `coroutine` to its end on the runner's own thread."""
        return self.loop_thread.submit(self.runner.run, coroutine).result()

    def function(self, record: dict, where: str):
        relative = record["model"]
        if relative not in self.models:
            path = resolve_inside(self.root, relative, where)
            check_program(path, record, where)
            try:
                asset = self.AIModelAsset.load(path)
                with native_stderr_quiet():
                    self.models[relative] = self._run(
                        self.stack.enter_async_context(asset.executable()))
            except Exception as err:  # Core AI's own exception types
                raise PackageError(f"{path}: not a Core AI model its runtime can load "
                                   f"({where}): {str(err)[:200]}") from None
        try:
            with native_stderr_quiet():
                return self.models[relative].load_function(record.get("function", "main"))
        except KeyError:
            raise PackageError(f"{self.root / relative}: no function "
                               f"{record.get('function')!r} ({where})") from None

    def call(self, function, feeds: dict) -> dict:
        return self._run(function(feeds))

    def close(self) -> None:
        if self.runner is None:
            return
        try:
            self._run(self.stack.aclose())
            self.loop_thread.submit(self.runner.close).result()
        finally:
            self.loop_thread.shutdown()
            self.runner = None


class CoreAIBlockSession:
    """One block (or variant) as a function of its Core AI model, answering the pipeline's
    `BlockSession.run`: inputs cast to the manifest's dtypes (token ids travel as int32);
    the loader's weight feeds are ignored (a Core AI model holds its own weights)."""

    def __init__(self, programs: CoreAIPrograms, record: dict, where: str) -> None:
        self.programs = programs
        self.inputs = {s["name"]: DTYPES[s["dtype"]] for s in record["inputs"]}
        self.function = programs.function(record, where)

    def run(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        wrap = self.programs.NDArray
        given = {n: wrap(np.ascontiguousarray(feeds[n], dtype=dtype))
                 for n, dtype in self.inputs.items()}
        out = self.programs.call(self.function, given)
        return [np.array(out[n.removeprefix("out:")].numpy(), copy=True)
                for n in output_names]


def coreai_opener(root: Path):
    """`Pipeline.load`'s `open_block` for a Core AI package, and the programs to close."""
    programs = CoreAIPrograms(root)

    def open_block(key: str, record: dict) -> CoreAIBlockSession:
        base, _, variant = key.partition("#")
        where = f"block {base}" + (f" variant {variant}" if variant else "")
        return CoreAIBlockSession(programs, record, where)

    return open_block, programs
