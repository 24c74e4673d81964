"""Models by their Hub id: `--model ORG/NAME[@REVISION]` read through huggingface_hub.

A value that names an existing path is a local folder, as before. Otherwise one of the form
ORG/NAME or ORG/NAME@REVISION (a branch, tag or commit) is a diffusers pipeline repository
on the Hugging Face Hub, resolved by huggingface_hub into its cache, so the user's cache,
`HF_HUB_CACHE`/`HF_HOME`, `HF_HUB_OFFLINE` and `HF_TOKEN` all work as they do for diffusers'
`from_pretrained`. Only what a family reads is fetched: model_index.json first (an
unsupported pipeline is refused before any weights move), then each of the pipeline's
components' configs, safetensors weights and tokenizer files; other weight formats, half-
precision variants and a repository's single-file checkpoints stay on the Hub.

huggingface_hub's own errors become one line each (`HubModelError`): gated, no such model,
no such revision, not cached while offline, no network.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")
# what diffusers reads of a component; weights in other formats or precisions are left
WEIGHT_PATTERNS = ("*.json", "*.safetensors")
TOKENIZER_PATTERNS = ("*",)  # a tokenizer's files are small and their names vary
VARIANTS_LEFT = ("*.fp16.*", "*.bf16.*", "*.fp8.*", "*.bin", "*.pt", "*.pth", "*.ckpt",
                 "*.msgpack", "*.onnx", "*.onnx_data", "*.gguf")


class HubModelError(ValueError):
    """A Hub id edge cannot read; the message names the id and says what to do."""


@dataclass(frozen=True)
class HubId:
    repo: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "")

    @property
    def name(self) -> str:
        """The repository's name: what a package made from it is called."""
        return self.repo.split("/")[1]


def hub_id(value: str) -> HubId | None:
    """`value` as a Hub id, or None where it is a local path (an existing one always is) or
    not of the form ORG/NAME[@REVISION]."""
    if Path(value).expanduser().exists():
        return None
    found = HUB_ID.match(value)
    return HubId(found["repo"], found["revision"]) if found else None


def component_patterns(model_index: dict) -> list[str]:
    """The files of the pipeline's components (model_index.json's entries that name a
    library and class; a `[null, null]` entry is a component the pipeline goes without)."""
    patterns = ["model_index.json"]
    for name, value in sorted(model_index.items()):
        if name.startswith("_") or not isinstance(value, list) or None in value[:2]:
            continue
        kinds = TOKENIZER_PATTERNS if "tokenizer" in name else WEIGHT_PATTERNS
        patterns += [f"{name}/{p}" for p in kinds]
    return patterns


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _one_line(model: HubId, err: Exception) -> HubModelError:
    """huggingface_hub's error for `model` as the line edge prints."""
    from huggingface_hub import errors

    where = f"https://huggingface.co/{model.repo}"
    if isinstance(err, errors.GatedRepoError):
        return HubModelError(f"{model}: a gated model: accept its terms at {where} and give a "
                             "token of that account (HF_TOKEN, or `hf auth login`)")
    if isinstance(err, errors.RevisionNotFoundError):
        return HubModelError(f"{model}: the Hub has no revision {model.revision!r} of "
                             f"{model.repo} (a branch, tag or commit; see {where})")
    if isinstance(err, errors.RepositoryNotFoundError):
        return HubModelError(f"{model}: no such model on the Hub (a private one needs a token "
                             "with access: HF_TOKEN, or `hf auth login`)")
    if isinstance(err, errors.HFValidationError):
        return HubModelError(f"{model}: not a Hub id ({err})")
    if isinstance(err, errors.LocalEntryNotFoundError | errors.IncompleteSnapshotError):
        cache = _cache_folder()
        if _offline():
            return HubModelError(f"{model}: not in the Hugging Face cache ({cache}) and "
                                 "HF_HUB_OFFLINE is set: fetch it once with the network, or "
                                 "give its local folder")
        return HubModelError(f"{model}: the Hub cannot be reached and the model is not in the "
                             f"Hugging Face cache ({cache}): check the network, or give its "
                             "local folder")
    return HubModelError(f"{model}: the Hub answered {type(err).__name__}: {err}")


def _cache_folder() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _snapshot(model: HubId, allow: list[str], ignore: tuple[str, ...] = ()) -> Path:
    """The repository's snapshot in the cache with the `allow` files, fetched if missing."""
    from huggingface_hub import errors, snapshot_download

    try:
        return Path(snapshot_download(model.repo, revision=model.revision,
                                      allow_patterns=allow, ignore_patterns=list(ignore)))
    except (errors.HfHubHTTPError, errors.LocalEntryNotFoundError, errors.HFValidationError,
            errors.IncompleteSnapshotError) as err:
        raise _one_line(model, err) from None
    except OSError as err:  # a network failure below huggingface_hub's own errors
        raise _one_line(model, errors.LocalEntryNotFoundError(str(err))) from None


def fetch_pipeline(model: HubId, check_pipeline=None) -> Path:
    """The local folder of `model`'s pipeline: model_index.json, then (after
    `check_pipeline(folder)` accepts it, e.g. `family_of`) its components' files."""
    folder = _snapshot(model, ["model_index.json"])
    index = folder / "model_index.json"
    if not index.is_file():
        raise HubModelError(f"{model}: no model_index.json in the repository: edge takes "
                            "diffusers pipeline repositories by id (Open-Sora 1.2's "
                            "checkpoints and tiny-sora weights: a local folder)")
    if check_pipeline is not None:
        check_pipeline(folder)
    model_index = json.loads(index.read_text())
    return _snapshot(model, component_patterns(model_index), VARIANTS_LEFT)


def model_folder_of(value: str | os.PathLike | None, check_pipeline=None) -> Path | None:
    """The local folder `--model VALUE` names: None (the shipped tiny-sora), a path, or a
    Hub id's snapshot (`fetch_pipeline`)."""
    if value is None:
        return None
    found = hub_id(str(value))
    if found is None:
        return Path(value).expanduser()
    return fetch_pipeline(found, check_pipeline)
