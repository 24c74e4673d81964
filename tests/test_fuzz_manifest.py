"""Fuzzing of the manifest reader (hypothesis): random bytes, random JSON and mutations of the
exported tiny-sora manifest (values replaced, types changed, fields deleted or inserted, list
items swapped or duplicated, numbers and strings nudged). The reader answers PackageError and
nothing else, and whatever it accepts runs.

Bounded for CI: derandomised (the same examples every run) with fixed example counts.
EDGE_FUZZ_SCALE=N runs N times the examples, randomised, for a longer hunt.
"""
import copy
import json
import os
import shutil
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.core.manifest_schema import DIGEST_FIELD, check_manifest, manifest_digest
from edge.core.package import MANIFEST, PackageError, read_manifest

SCALE = int(os.environ.get("EDGE_FUZZ_SCALE", "1"))


def fuzz_settings(examples: int) -> settings:
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=SCALE == 1,
                    database=None, suppress_health_check=list(HealthCheck))


NAMES = ["", ".", "..", "../x", "/etc/passwd", "C:/x", "a\\b", "\0", "batch", "float32",
         "int64", "tensor(float)", "out:x", "x", "hidden", "latent", "é", "🎬", "a" * 300,
         "format", "format_version", "onnx", "web", "tdtm", "graph", "files", "path", "bytes",
         "sha256", "0" * 64, "f" * 64]
scalars = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70)
           | st.sampled_from([0, 1, -1, 2, 16, 64, 4096, 2 ** 31, 2 ** 63, 10 ** 30])
           | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(NAMES)
           | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=6),
                                             inner, max_size=4), max_leaves=12)


def node_paths(node, prefix=()):
    """Every place in a JSON tree, as a tuple of keys and indices."""
    yield prefix
    items = node.items() if isinstance(node, dict) else (
        enumerate(node) if isinstance(node, list) else ())
    for key, child in items:
        yield from node_paths(child, (*prefix, key))


def nudged(value, draw):
    """A value near `value`: the kind of change a careless edit or a bit of rot makes."""
    if isinstance(value, bool):
        return draw(st.sampled_from([not value, int(value), str(value).lower(), None]))
    if isinstance(value, int):
        return draw(st.sampled_from([value + 1, value - 1, -value, 0, value * 2, value + 0.5,
                                     float(value), str(value), 2 ** 63, [value]]))
    if isinstance(value, float):
        return draw(st.sampled_from([value * 2, -value, 0.0, 1e308, int(value), str(value)]))
    if isinstance(value, str):
        return draw(st.sampled_from([value + "x", value[:-1], "", value.upper(), "../" + value,
                                     "/" + value, value + "/", value.replace("/", "//"),
                                     value + "\0", 0, [value]]))
    if isinstance(value, list):
        return draw(st.sampled_from([[], value[:-1], value + value[-1:], value[::-1], {}]))
    if isinstance(value, dict):
        return draw(st.sampled_from([{}, list(value.values()), None, []]))
    return draw(json_values)


class Mutated(tuple):
    """(manifest, edits); shown as its edits only: a whole manifest is ~60 kB."""

    def __repr__(self) -> str:
        return f"Mutated(edits={self[1]!r})"


@st.composite
def mutation(draw, original: dict, paths: list, shallow: list):
    """Mutated((mutated copy, what was done)): one to three edits at random places."""
    m = copy.deepcopy(original)
    done = []
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths) | st.sampled_from(shallow))
        try:
            parent = m
            for key in path[:-1]:
                parent = parent[key]
            value = parent[path[-1]] if path else m
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed this place
        op = draw(st.sampled_from(["replace", "nudge", "delete", "insert", "swap"]))
        if not path:
            op = "insert"
        if op == "replace":
            parent[path[-1]] = draw(json_values)
        elif op == "nudge":
            parent[path[-1]] = nudged(value, draw)
        elif op == "delete":
            del parent[path[-1]]
        elif op == "insert" and isinstance(value, dict):
            value[draw(st.sampled_from(NAMES) | st.text(max_size=6))] = draw(json_values)
        elif op == "insert" and isinstance(value, list):
            value.insert(draw(st.integers(0, len(value))), draw(json_values))
        elif op == "swap" and isinstance(value, list) and len(value) > 1:
            i, j = draw(st.integers(0, len(value) - 1)), draw(st.integers(0, len(value) - 1))
            value[i], value[j] = value[j], value[i]
        else:
            parent[path[-1]] = draw(json_values)
            op = "replace"
        done.append((op, path))
    return Mutated((m, done))


@pytest.fixture(scope="module")
def original(exported_package):
    return copy.deepcopy(exported_package[1])


@pytest.fixture(scope="module")
def places(original):
    paths = [p for p in node_paths(original) if p]
    return paths, [p for p in paths if len(p) <= 3]


def test_random_bytes_and_random_json_are_refused(tmp_path, original):
    text = json.dumps(original, indent=1)
    tried = Counter()
    inputs = (st.binary(max_size=3000).map(lambda b: ("bytes", b))
              | json_values.map(lambda v: ("json", json.dumps(v).encode()))
              | st.integers(0, len(text) - 1).map(lambda n: ("truncated", text[:n].encode()))
              | st.tuples(st.integers(0, len(text) - 1), st.integers(0, 7)).map(
                  lambda p: ("flipped", bytes_flipped(text.encode(), *p))))

    @fuzz_settings(400)
    @given(inputs)
    def run(case):
        kind, data = case
        (tmp_path / MANIFEST).write_bytes(data)
        tried[kind] += 1
        try:
            read_manifest(tmp_path)
        except PackageError as err:
            assert MANIFEST in str(err)
            return
        # accepted: only a flip that leaves the JSON content as it was (e.g. in whitespace)
        assert kind == "flipped" and json.loads(data) == original, case

    run()
    print(f"manifest bytes fuzzed: {sum(tried.values())} {dict(tried)}")
    assert sum(tried.values()) >= 400 * SCALE * 0.9


def bytes_flipped(data: bytes, at: int, bit: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 1 << bit
    return bytes(out)


def test_mutated_manifest_is_refused_by_its_digest(original, places):
    """Every edit that changes the content is refused, whatever it is: the manifest carries
    its own sha256."""
    tried = Counter()

    @fuzz_settings(300)
    @given(mutation(original, *places))
    def run(case):
        m, done = case
        if DIGEST_FIELD not in m:  # edits without the digest: the next test
            return
        tried["examples"] += 1
        try:
            check_manifest(m)
        except PackageError:
            tried["refused"] += 1
            return
        assert manifest_digest(m) == original[DIGEST_FIELD], done
        tried["no change"] += 1

    run()
    print(f"mutations with the digest kept: {dict(tried)}")
    assert tried["refused"] >= 0.9 * tried["examples"] >= 0.9 * 300 * SCALE * 0.9


@pytest.fixture(scope="module")
def package_copy(exported_package, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz") / "pkg"
    shutil.copytree(exported_package[0], root)
    return root


@pytest.fixture
def cached_sessions(monkeypatch):
    """Sessions made once per graph file: only the manifest changes between examples, and
    creating ~20 sessions would dominate each one. The graph checks still run on each."""
    import edge.runtimes.python.sessions as sessions

    real, cache = sessions.ort.InferenceSession, {}

    def session(path, *args, **kwargs):
        if path not in cache:
            cache[path] = real(path, *args, **kwargs)
        return cache[path]

    monkeypatch.setattr(sessions.ort, "InferenceSession", session)


# edits of these fields never reach a computation (metadata, or ignored unknown fields)
METADATA = {"producer", "model", "validation", "weight_bytes"}


def touches_only_metadata(original: dict, done: list) -> bool:
    for _, path in done:
        known = original
        for key in path:
            if isinstance(key, str) and key in METADATA:
                break
            try:
                known = known[key]
            except (KeyError, IndexError, TypeError):
                if isinstance(known, dict):
                    break  # a field edge does not know: ignored
                return False
        else:
            return False
    return True


# what generate may refuse in a package the loader accepted
GENERATE_REFUSALS = ("sampler setting", "merge_steps", "the seed would give another video")


def test_mutated_manifest_without_digest_is_refused_or_runs(original, places, package_copy,
                                                             cached_sessions):
    """The digest removed (version 1 makes it optional), so each edit meets the structural,
    file and graph checks: the loader refuses with PackageError, or what it accepted runs."""
    from edge.runtimes.python import Pipeline

    tried = Counter()

    @fuzz_settings(80)
    @given(mutation(original, *places))
    def run(case):
        m, done = case
        if isinstance(m, dict):
            m.pop(DIGEST_FIELD, None)
        (package_copy / MANIFEST).write_text(json.dumps(m))
        tried["examples"] += 1
        try:
            pipe = Pipeline.load(package_copy)
        except PackageError:
            tried["refused"] += 1
            return
        try:
            if touches_only_metadata(original, done):
                tried["accepted, metadata only"] += 1
                return
            try:
                video = pipe.generate("a red circle", steps=1)
            except ValueError as err:  # a sampler default the request contradicts, or a
                # seed asked of a package whose seeds meant other noise (noise field removed)
                assert any(reason in str(err) for reason in GENERATE_REFUSALS), (done, str(err))
                tried["accepted, generate refused the settings"] += 1
                return
            assert video.dtype.name == "uint8" and video.ndim == 5
            tried["accepted and ran"] += 1
        finally:
            pipe.close()

    run()
    print(f"mutations without the digest: {dict(tried)}")
    assert tried["examples"] >= 80 * SCALE * 0.9
