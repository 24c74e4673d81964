"""What a seed means: the initial latents for `seed` are PyTorch's
`torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)`,
which is what diffusers' pipelines draw when given that generator. So a seed found with
diffusers gives the same video from an edge package, and every runtime (Python, JavaScript,
Swift) draws the same noise for a seed.

Drawn here without torch (the runtime does not depend on it), in NumPy:
- the engine is the 32-bit Mersenne Twister, seeded as `std::mt19937` is with the seed's low
  32 bits (PyTorch's `manual_seed`); NumPy's legacy seeding is that same initialisation and its
  MT19937 bit generator yields the same words, so the C code is NumPy's, not ours;
- a float32 uniform is the low 24 bits of one word times 2^-24;
- 16 values or more (PyTorch's `normal_fill`): every value gets a uniform first, then each group
  of 16 becomes 8 Box-Muller pairs (u1 = 1 - data[j], u2 = data[j + 8]; data[j] = r cos,
  data[j + 8] = r sin), all in float32; when the size is not a multiple of 16 the last 16
  values are drawn again from 16 new words and transformed the same way;
- fewer than 16 values: one float64 normal per value from two 53-bit uniforms (two words
  each, high word first), Box-Muller with log1p, the sine half kept for the next value.

PyTorch computes the large path with SIMD log/sin/cos, so values agree to about 1e-6, not
bit for bit (tests/test_noise.py measures it against torch over many seeds and shapes).
"""

from __future__ import annotations

import math

import numpy as np

# The manifest's `noise` field: the definition a package's seeds follow. A package written
# before it (no field) drew NumPy PCG64 noise; runtimes refuse a seed for it.
NOISE = "torch.randn/cpu/float32"
LEGACY_NOISE = "numpy.pcg64"
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed

_FILL = 16  # PyTorch's vectorised normal_fill works on groups of 16 values
_CHUNK = 1 << 16  # values drawn and transformed at a time (a multiple of _FILL)
_UNIFORM24 = np.float32(2.0**-24)


def check_seed(seed: object, name: str = "seed") -> int:
    """The seed as an int, or ValueError naming it: an integer from 0 to 2^63 - 1."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(f"{name} {seed!r} must be a whole number from 0 to 2^63 - 1")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{name} {seed} is out of range: a seed is from 0 to 2^63 - 1")
    return int(seed)


def _engine(seed: int) -> np.random.MT19937:
    """NumPy's MT19937 in the state `std::mt19937(seed)` starts in (low 32 bits, as PyTorch)."""
    _, key, pos, *_ = np.random.RandomState(seed & 0xFFFFFFFF).get_state()
    engine = np.random.MT19937()
    engine.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": pos}}
    return engine


def _uniform24(words: np.ndarray) -> np.ndarray:
    """float32 uniforms from the engine's words (uint64 holding 32 bits each): the low 24
    bits times 2^-24. The low half of each little-endian uint64 is the word itself."""
    low = words.view(np.uint32)[::2] if np.little_endian else words.astype(np.uint32)
    u = (low & np.uint32(0xFFFFFF)).astype(np.float32)
    u *= _UNIFORM24
    return u


def _box_muller_16(u: np.ndarray) -> np.ndarray:
    """Groups of 16 uniforms -> 16 normals each, as PyTorch's normal_fill_16, in float32,
    written over `u` (every uniform is read before its place is written)."""
    groups = u.reshape(-1, 2, 8)
    radius = np.subtract(np.float32(1.0), groups[:, 0])
    np.log(radius, out=radius)
    radius *= np.float32(-2.0)
    np.sqrt(radius, out=radius)
    theta = groups[:, 1] * np.float32(2.0 * math.pi)
    np.cos(theta, out=groups[:, 0])
    groups[:, 0] *= radius
    np.sin(theta, out=groups[:, 1])
    groups[:, 1] *= radius
    return u


def _few_normals(engine: np.random.MT19937, n: int) -> np.ndarray:
    """PyTorch's path under 16 values: at::normal_distribution<double>, one pair per two
    values (the sine half cached by the generator)."""
    words = [int(w) for w in engine.random_raw(2 * 2 * ((n + 1) // 2))]
    mask53 = (1 << 53) - 1
    values: list[float] = []
    for i in range(0, len(words), 4):
        u1 = (((words[i] << 32) | words[i + 1]) & mask53) * 2.0**-53
        u2 = (((words[i + 2] << 32) | words[i + 3]) & mask53) * 2.0**-53
        radius = math.sqrt(-2.0 * math.log1p(-u2))
        theta = 2.0 * math.pi * u1
        values += [radius * math.cos(theta), radius * math.sin(theta)]
    return np.array(values[:n], dtype=np.float32)


def torch_randn(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """`torch.randn(shape, generator=torch.Generator().manual_seed(seed))` as float32."""
    return _randn(_engine(check_seed(seed)), shape)


def torch_randn_draws(shapes: list[tuple[int, ...]], seed: int) -> list[np.ndarray]:
    """Consecutive `torch.randn(shape, generator=g)` of one generator `g` seeded with `seed`,
    one per shape: what a pipeline draws when it takes more noise from its generator after
    the initial latents (LTX-Video's decode noise). Each draw reads the words the one before
    left; a draw under 16 values before another is refused, since PyTorch keeps half of its
    last pair for the next draw, which is not mirrored here."""
    engine = _engine(check_seed(seed))
    if any(math.prod(shape) < _FILL for shape in shapes[:-1]):
        raise ValueError(f"noise draws {shapes}: only the last may hold under {_FILL} values")
    return [_randn(engine, shape) for shape in shapes]


def _randn(engine: np.random.MT19937, shape: tuple[int, ...]) -> np.ndarray:
    n = math.prod(shape)
    if n < _FILL:
        return _few_normals(engine, n).reshape(shape)
    out = np.empty(n, dtype=np.float32)
    whole = n - n % _FILL
    for start in range(0, n, _CHUNK):  # a piece at a time stays in cache: about 1.5x faster
        piece = out[start:start + _CHUNK]
        piece[:] = _uniform24(engine.random_raw(piece.size))
        _box_muller_16(piece[:max(0, whole - start)])
    if whole != n:  # PyTorch redraws the last 16 values from 16 fresh words
        out[n - _FILL:] = _box_muller_16(_uniform24(engine.random_raw(_FILL)))
    return out.reshape(shape)


def check_noise(manifest: dict, where: str = "manifest.json") -> None:
    """Refuse to draw a seed for a package whose seeds were defined otherwise (written before
    the `noise` field, they meant NumPy PCG64 noise): the same seed would give another video
    than the one the package's author saw. Given latents need no definition."""
    noise = manifest.get("noise", LEGACY_NOISE)
    if noise != NOISE:
        raise ValueError(f"{where}: noise {noise!r}: this runtime draws a seed as {NOISE!r}, so "
                         "the seed would give another video than the package's; re-export "
                         "the package or pass the initial latents")
