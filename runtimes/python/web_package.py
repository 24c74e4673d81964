"""The Python runtime on a web package: each block's wasm-path ONNX graph (the very graphs the
page's onnxruntime-web runs, weights fed in their stored forms and decoded in the graph) run by
onnxruntime, the weights streamed by the loader under the budget as for an ONNX package (a web
package's split weights files read back to back). So the page's figures can stand beside the
Python runtime's on the same package (benchmarks/web_page.py), and the page's video be checked
against the Python runtime's on the same graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from edge.runtimes.python.graph_check import ORT_TYPES
from edge.runtimes.python.sessions import OpenBlock, open_session, session_options

# onnxruntime's input type names -> NumPy's (graph_check's table turned round): what a web
# graph's static inputs take (token ids int32, where the Python runtime makes int64)
_NUMPY = {ort_type: np.dtype(name) for name, ort_type in ORT_TYPES.items()}


class StaticGraphSession:
    """A web block's graph, its feeds cast to the dtypes it declares. The web's shapes are
    static: where the runtime feeds a whole that the graph takes in equal pieces along the
    first axis (tiny-sora's decoder, 4 frames a call on the web), the graph runs piece by
    piece and the outputs are joined, as the page does."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.dtypes = {i.name: _NUMPY[i.type] for i in session.get_inputs()}
        self.lead = {i.name: i.shape[0] if i.shape else None for i in session.get_inputs()}

    def run(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        feeds = {n: np.asarray(v, dtype=self.dtypes[n]) for n, v in feeds.items()
                 if n in self.dtypes}
        split = {n: v.shape[0] // self.lead[n] for n, v in feeds.items()
                 if v.ndim and v.shape[0] != self.lead[n]}
        pieces = set(split.values())
        if not pieces:
            return self.session.run(output_names, feeds)
        if len(pieces) > 1 or any(feeds[n].shape[0] % self.lead[n] for n in split):
            raise ValueError(f"inputs {sorted(split)} do not split into the graph's static "
                             f"first axis ({', '.join(f'{n}: {self.lead[n]}' for n in split)})")
        runs = [self.session.run(output_names, feeds | {
            n: feeds[n][i * self.lead[n]:(i + 1) * self.lead[n]] for n in split})
            for i in range(pieces.pop())]
        return [np.concatenate(parts) for parts in zip(*runs, strict=True)]


def wasm_graph_opener(root: Path | str, threads: int | None = None) -> OpenBlock:
    """`Pipeline.load`'s `open_block` for a web package: its blocks' wasm graphs."""
    options = session_options(threads)
    root = Path(root)  # as Pipeline.load takes it: a str too

    def open_block(key: str, record: dict) -> StaticGraphSession:
        base, _, variant = key.partition("#")
        where = f"block {base}" + (f" variant {variant}" if variant else "")
        return StaticGraphSession(open_session(root, record["wasm"]["graph"], options, where,
                                           record))

    return open_block
