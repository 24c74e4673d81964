"""The `--quantize` settings of the iphone target: how each block's weights are stored in its
program (fp16, int8, palettized, int4 blocks), the rules a family words for itself, and the
end-to-end floor each setting is checked against. The exporter (coreml.py) applies them and
the check (coreml/check.py) reads them back; neither imports the other for them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch

from edge.core.budget import parse_size
from edge.exporters.iphone.coreml.weights import import_coremltools
from edge.graph.family_model import FamilyModel, StorageRule

WEIGHT_THRESHOLD = 2048       # coremltools' default: smaller tensors are not compressed


@dataclass(frozen=True)
class Storage:
    """How one block's weights are stored: a coremltools compression (or fp16) and the
    manifest's record of it."""

    record: dict                      # e.g. {"method": "palettize_kmeans", "nbits": 4, ...}
    bits: float                       # per weight, for size estimates (scales counted,
                                      # lookup tables left out: a few KB per tensor)
    op_config: Callable[[], object] | None = None   # a coremltools OpConfig; None: fp16
    min_ios: int = 17                 # the iOS whose constexpr ops decompress it


@dataclass(frozen=True)
class Compression:
    """One `--quantize` setting: the storage of each block (the first rule whose pattern
    matches the block key, fnmatch-style, e.g. "text_encoder/layer_*"), and the end-to-end
    check's floor."""

    setting: str
    rules: tuple[tuple[str, Storage], ...]
    psnr_floor_db: float
    note: str = ""                    # why the rules are what they are
    # (block pattern, tensor pattern, storage): tensors a block stores in another form
    # (StorageRule.tensors)
    tensor_rules: tuple[tuple[str, str, Storage], ...] = ()

    @property
    def min_ios(self) -> int:
        """The iOS whose ops decompress every stored form of the setting."""
        return max(storage.min_ios for *_, storage in (*self.rules, *self.tensor_rules))

    def storage(self, block_key: str) -> Storage:
        """The block's stored form (but the tensors `tensor_storage` names otherwise)."""
        return next(s for pattern, s in self.rules if fnmatch(block_key, pattern))

    def tensor_storage(self, block_key: str, tensor: str) -> Storage:
        """The stored form of one tensor of a block, by its name in the block or in the
        converted program."""
        return next((s for blocks, tensors, s in self.tensor_rules
                     if fnmatch(block_key, blocks) and fnmatch(tensor, tensors)),
                    self.storage(block_key))

    def compressor(self, block_key: str, weights: list[str] = ()):
        """The `coremltools.optimize.coreml` pass that stores one converted block (a function
        of its MLModel; None: fp16 throughout): the block's storage for every weight but
        those of `weights` (the program's weight names) a tensor rule gives another, each set
        by name. One pass applies it, so the forms a block mixes must be one method (linear
        quantization or palettization), fp16 aside."""
        own = self.storage(block_key)
        others = {name: storage for name in weights
                  if (storage := self.tensor_storage(block_key, name)) is not own}
        kinds = {_kind(s) for s in (own, *others.values())} - {"fp16"}
        if not kinds:
            return None
        if len(kinds) > 1:
            raise ValueError(f"--quantize {self.setting}: block {block_key} mixes "
                             f"{' and '.join(sorted(kinds))} storage; one block takes one "
                             "method (its tensor rules may change the bits, not the method)")
        import_coremltools()
        import coremltools.optimize.coreml as cto

        config = cto.OptimizationConfig(
            global_config=own.op_config() if own.op_config is not None else None)
        for name, storage in others.items():  # None: this weight stays fp16
            config.set_op_name(name, storage.op_config() if storage.op_config else None)
        run = cto.linear_quantize_weights if kinds == {"linear"} else cto.palettize_weights
        return lambda model: run(model, config)

    def record(self) -> dict:
        """The manifest's coreml.compression."""
        out = {"setting": self.setting, "weight_threshold": WEIGHT_THRESHOLD}
        if len(self.rules) == 1 and not self.tensor_rules:   # one storage for every block
            out |= self.rules[0][1].record
        else:
            out["rules"] = [{"blocks": pattern, **storage.record}
                            for pattern, storage in self.rules]
        if self.tensor_rules:
            out["tensor_rules"] = [{"blocks": blocks, "tensors": tensors, **storage.record}
                                   for blocks, tensors, storage in self.tensor_rules]
        return out | ({"note": self.note} if self.note else {})


def _kind(storage: Storage) -> str:
    """The compression pass a stored form needs ("fp16" for none)."""
    return storage.record["method"].split("_")[0] if storage.op_config else "fp16"


def _linear8():
    import coremltools.optimize.coreml as cto

    return cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8",
                                       granularity="per_channel",
                                       weight_threshold=WEIGHT_THRESHOLD)


def palettized(nbits: int, group_size: int | None = None) -> Storage:
    """k-means palettization: one lookup table per tensor (what iOS 17 runs), or with
    `group_size` one per group of that many output channels (iOS 18)."""
    granularity = "per_tensor" if group_size is None else "per_grouped_channel"

    def config():
        import coremltools.optimize.coreml as cto

        return cto.OpPalettizerConfig(mode="kmeans", nbits=nbits, granularity=granularity,
                                      group_size=group_size or 32,   # ignored per tensor
                                      weight_threshold=WEIGHT_THRESHOLD)

    record = {"method": "palettize_kmeans", "nbits": nbits, "granularity": granularity}
    if group_size is not None:
        record["group_size"] = group_size
    return Storage(record, nbits, config, min_ios=17 if group_size is None else 18)


def linear4(block_size: int) -> Storage:
    """int4 linear quantization with a scale per block of `block_size` input values (iOS 18)."""
    def config():
        import coremltools.optimize.coreml as cto

        return cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int4",
                                           granularity="per_block", block_size=block_size,
                                           weight_threshold=WEIGHT_THRESHOLD)

    # an fp16 scale per block: 4.5 bits a weight at 32
    return Storage({"method": "linear_symmetric", "dtype": "int4", "granularity": "per_block",
                    "block_size": block_size}, 4 + 16 / block_size, config, min_ios=18)


FP16 = Storage({"method": "none", "weights": "float16"}, 16)
INT8 = Storage({"method": "linear_symmetric", "dtype": "int8", "granularity": "per_channel"},
               8, _linear8)
# the stored forms a family's own setting may name (edge.families.StorageRule)
STORAGES = {"fp16": FP16, "int8": INT8, "lut6": palettized(6), "lut4": palettized(4),
            "lut3": palettized(3), "lut6-g16": palettized(6, 16), "lut4-g16": palettized(4, 16),
            "int4-b32": linear4(32)}

# Settings that store every block alike, and the end-to-end check's floor for each: it guards
# against a broken export (benchmarks/coreml_quantize.py measures what a setting costs).
UNIFORM = {c.setting: c for c in (
    Compression("fp16", (("*", FP16),), psnr_floor_db=40.0),
    Compression("8", (("*", INT8),), psnr_floor_db=30.0),
    Compression("6", (("*", palettized(6)),), psnr_floor_db=20.0),
)}
# Settings each family words itself (FamilyModel.device_storage): where 4 bits cost the video
# depends on which of its blocks' errors compound and where its bytes are.
BY_FAMILY = ("4",)
# Chosen at export by measurement (exporters/iphone/coreml/recipe.py): "auto" or "auto:TARGET"
AUTO = "auto"
QUANTIZE = (*UNIFORM, *BY_FAMILY, AUTO)
DEFAULT_AUTO_PSNR_DB = 38.0


@dataclass(frozen=True)
class AutoTarget:
    """What `--quantize auto[:TARGET]` aims at: the worst measurement video's PSNR against
    fp32 (auto:38dB, the default), or the blocks' weight files at most a size (auto:14MB) or
    this many times smaller than the fp32 tensors (auto:7x)."""

    text: str
    min_psnr_db: float | None = None
    max_weight_bytes: int | None = None
    smaller_than_fp32: float | None = None

    def weight_bytes(self, fp32_bytes: int) -> int | None:
        """The weight files' limit for blocks of `fp32_bytes` (None: a PSNR target)."""
        if self.smaller_than_fp32 is not None:
            return int(fp32_bytes / self.smaller_than_fp32)
        return self.max_weight_bytes


def auto_target(quantize: str) -> AutoTarget | None:
    """The target of an "auto" setting (None for any other); a ValueError naming the value
    where the target is not a PSNR (38dB), a size (14MB) or a ratio (7x)."""
    name, colon, spec = quantize.partition(":")
    if name != AUTO:
        return None
    if not colon:
        return AutoTarget(f"{DEFAULT_AUTO_PSNR_DB:g}dB", min_psnr_db=DEFAULT_AUTO_PSNR_DB)
    text = spec.strip()
    lower = text.lower()
    if lower.endswith("db"):
        value = _finite(lower[:-2])
        if value is not None and value > 0:
            return AutoTarget(text, min_psnr_db=value)
    elif lower.endswith("x"):
        value = _finite(lower[:-1])
        if value is not None and value > 1:
            return AutoTarget(text, smaller_than_fp32=value)
    elif text[:1].isdigit():
        return AutoTarget(text, max_weight_bytes=parse_size(text, f"--quantize {quantize}"))
    raise ValueError(f"--quantize {quantize!r}: the target after 'auto:' is a worst-video "
                     "PSNR (38dB), a size of the weight files (14MB) or how many times "
                     "smaller than fp32 they are (7x, above 1)")


def _finite(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def check_setting(quantize: str) -> None:
    """A ValueError naming the known settings if `quantize` is none of them."""
    if auto_target(quantize) is None and quantize not in QUANTIZE:
        raise ValueError(f"--quantize {quantize!r} not understood; use one of "
                         f"{', '.join(QUANTIZE)} (auto: or auto:38dB, auto:14MB, auto:7x)")


def compression(quantize: str | Compression, model: FamilyModel | None = None) -> Compression:
    """The setting named `quantize` for `model`'s blocks (a ValueError naming the known
    settings, or the family without a rule for it); `model` is needed for the settings each
    family words itself. A Compression is its own setting (benchmarks try rules that are
    none of the named ones)."""
    if isinstance(quantize, Compression):
        return quantize
    check_setting(quantize)
    if auto_target(quantize) is not None:
        raise ValueError(f"--quantize {quantize} is chosen by measurement at export "
                         "(exporters/iphone/coreml/recipe.py chosen_setting gives its setting)")
    if quantize in UNIFORM:
        return UNIFORM[quantize]
    if model is None:
        raise ValueError(f"--quantize {quantize} is worded by each family: give the model")
    rule = model.device_storage.get(quantize)
    if rule is None:
        raise ValueError(f"--quantize {quantize} has no storage rule for {model.family} models "
                         f"yet; use one of {', '.join(UNIFORM)}")
    return from_rule(quantize, rule, f"{model.family}'s --quantize {quantize}")


def partition_setting(quantize: str | Compression, model: FamilyModel) -> Compression:
    """The setting a memory budget's partition counts a block's bytes at: `quantize`'s, but
    fp16 for "auto", whose forms are chosen after the cut (on the blocks the partition made;
    fp16 is the most any of its forms stores, so the cut holds for the chosen ones)."""
    if isinstance(quantize, str) and auto_target(quantize) is not None:
        return UNIFORM["fp16"]
    return compression(quantize, model)


def from_rule(setting: str, rule: StorageRule, who: str) -> Compression:
    """The setting a rule words by stored-form names (a family's, or a benchmark's trial),
    or a ValueError saying which name `who` gave that STORAGES lacks."""
    unknown = [name for *_, name in (*rule.rules, *rule.tensors) if name not in STORAGES]
    if unknown:
        raise ValueError(f"{who} names stored form {unknown[0]!r}; the exporter has "
                         f"{', '.join(STORAGES)}")
    return Compression(setting, tuple((pattern, STORAGES[name]) for pattern, name
                                      in rule.rules), rule.psnr_floor_db, rule.note,
                       tuple((blocks, tensors, STORAGES[name])
                             for blocks, tensors, name in rule.tensors))
