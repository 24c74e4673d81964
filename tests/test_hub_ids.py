"""`--model ORG/NAME[@REVISION]`: a diffusers pipeline by its Hub id, read through
huggingface_hub's cache. Offline throughout: the cache is laid out here as huggingface_hub
lays it out (blobs, snapshots linking to them, refs naming commits), and its errors are the
library's own, each turned into one line."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge.families.hub import (
    VARIANTS_LEFT,
    HubId,
    HubModelError,
    component_patterns,
    hub_id,
    model_folder_of,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cached_repo(cache: Path, repo: str, folder: Path, refs: tuple[str, ...] = ("main",)
                ) -> Path:
    """`folder`'s files as huggingface_hub caches a repository: each file's bytes once under
    blobs/ (named by digest), snapshots/COMMIT/ linking to them, refs/REF naming COMMIT for
    each of `refs` (a branch or tag)."""
    storage = cache / f"models--{repo.replace('/', '--')}"
    snapshot = storage / "snapshots" / COMMIT
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (storage / "refs" / ref).write_text(COMMIT)
    return snapshot


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, offline, for this process (huggingface_hub reads its
    constants at import)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_id_is_told_from_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub_id("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") == HubId("Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    assert hub_id("Lightricks/LTX-Video@v0.9.1") == HubId("Lightricks/LTX-Video", "v0.9.1")
    assert str(hub_id(f"a/b@{COMMIT}")) == f"a/b@{COMMIT}" and hub_id("a/b").name == "b"
    # a path that exists is a folder, whatever it looks like; others not of the form either
    (tmp_path / "models" / "wan").mkdir(parents=True)
    assert hub_id("models/wan") is None
    for value in ("wan", "./x/y", "/abs/path", "a/b/c", "a/b@", "~/m"):
        assert hub_id(value) is None, value
    assert model_folder_of("models/wan") == Path("models/wan") and model_folder_of(None) is None


def test_only_the_pipelines_components_are_fetched():
    """The patterns keep each component's configs, safetensors and tokenizer files and
    leave other formats, half-precision variants, single-file checkpoints and other files
    (applied by huggingface_hub's own filter, as snapshot_download applies them)."""
    from huggingface_hub.utils import filter_repo_objects

    index = {"_class_name": "WanPipeline", "_diffusers_version": "0.35.0",
             "text_encoder": ["transformers", "UMT5EncoderModel"],
             "tokenizer": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "WanTransformer3DModel"],
             "transformer_2": [None, None], "vae": ["diffusers", "AutoencoderKLWan"],
             "scheduler": ["diffusers", "UniPCMultistepScheduler"]}
    listing = [
        "model_index.json", "README.md", ".gitattributes", "assets/logo.png",
        "Wan2.1_VAE.pth", "diffusion_pytorch_model.safetensors",           # the original layout
        "scheduler/scheduler_config.json",
        "text_encoder/config.json", "text_encoder/model.safetensors.index.json",
        "text_encoder/model-00001-of-00002.safetensors",
        "text_encoder/model-00002-of-00002.safetensors",
        "tokenizer/spiece.model", "tokenizer/tokenizer.json", "tokenizer/special_tokens_map.json",
        "tokenizer/tokenizer_config.json",
        "transformer/config.json", "transformer/diffusion_pytorch_model.safetensors",
        "transformer/diffusion_pytorch_model.fp16.safetensors",
        "transformer_2/config.json",
        "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
        "vae/diffusion_pytorch_model.bin",
    ]
    kept = set(filter_repo_objects(listing, allow_patterns=component_patterns(index),
                                   ignore_patterns=list(VARIANTS_LEFT)))
    assert kept == {
        "model_index.json", "scheduler/scheduler_config.json", "text_encoder/config.json",
        "text_encoder/model.safetensors.index.json",
        "text_encoder/model-00001-of-00002.safetensors",
        "text_encoder/model-00002-of-00002.safetensors", "tokenizer/spiece.model",
        "tokenizer/tokenizer.json", "tokenizer/special_tokens_map.json",
        "tokenizer/tokenizer_config.json", "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors", "vae/config.json",
        "vae/diffusion_pytorch_model.safetensors"}


def test_a_cached_model_is_read_offline_at_a_branch_tag_or_commit(offline_cache, wan_folder):
    from edge.families import family_of

    snapshot = cached_repo(offline_cache, "org/tiny-wan", wan_folder, refs=("main", "v1"))
    seen = []
    for value in ("org/tiny-wan", "org/tiny-wan@v1", f"org/tiny-wan@{COMMIT}"):
        folder = model_folder_of(value, check_pipeline=lambda f: seen.append(family_of(f)))
        assert folder == snapshot and family_of(folder) == "wan", value
    assert seen == ["wan"] * 3  # the pipeline checked on model_index.json, before its weights


def test_a_model_not_cached_while_offline_is_one_line(offline_cache):
    with pytest.raises(HubModelError) as err:
        model_folder_of("org/absent")
    assert str(err.value).startswith("org/absent: not in the Hugging Face cache (")
    assert "HF_HUB_OFFLINE is set" in str(err.value) and str(offline_cache) in str(err.value)


def test_a_revision_the_cache_lacks_offline_is_one_line(offline_cache, wan_folder):
    cached_repo(offline_cache, "org/tiny-wan", wan_folder)
    with pytest.raises(HubModelError, match=r"^org/tiny-wan@v9: not in the Hugging Face cache"):
        model_folder_of("org/tiny-wan@v9")


def test_a_repository_without_model_index_is_refused_by_name(offline_cache, tmp_path):
    plain = tmp_path / "plain"
    (plain / "transformer").mkdir(parents=True)
    (plain / "transformer" / "config.json").write_text('{"model_type": "STDiT3"}')
    cached_repo(offline_cache, "org/opensora", plain)
    with pytest.raises(HubModelError, match=r"^org/opensora: no model_index.json .*local folder"):
        model_folder_of("org/opensora")


def _http_error(kind: str, status: int):
    """huggingface_hub's error of `kind` as the Hub's answer of `status` makes it."""
    import httpx2  # huggingface_hub's HTTP client
    from huggingface_hub import errors

    request = httpx2.Request("GET", "https://huggingface.co/api/models/org/m")
    return getattr(errors, kind)("answered", response=httpx2.Response(status, request=request))


@pytest.mark.parametrize("kind, status, value, line", [
    ("GatedRepoError", 403, "org/m",
     "org/m: a gated model: accept its terms at https://huggingface.co/org/m and give a token"),
    ("RepositoryNotFoundError", 404, "org/m", "org/m: no such model on the Hub (a private one"),
    ("RevisionNotFoundError", 404, "org/m@nope",
     "org/m@nope: the Hub has no revision 'nope' of org/m"),
])
def test_the_hubs_refusals_are_one_line_each(monkeypatch, kind, status, value, line):
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise _http_error(kind, status)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(HubModelError) as err:
        model_folder_of(value)
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_no_network_is_one_line(monkeypatch, tmp_path):
    """Online, unreachable, not cached: huggingface_hub's LocalEntryNotFoundError."""
    import huggingface_hub
    from huggingface_hub import constants, errors

    def unreachable(*args, **kwargs):
        raise errors.LocalEntryNotFoundError("An error happened while trying to locate ...")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(HubModelError, match=r"^org/m: the Hub cannot be reached and the model "
                                            r"is not in the Hugging Face cache"):
        model_folder_of("org/m")


def edge(args: list[str], cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", "from edge.commands import main; main()",
                           *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=600)


@pytest.mark.slow  # loads the tiny Wan in a fresh process
def test_edge_export_takes_a_hub_id_offline(tmp_path, wan_folder):
    """`edge export --model ORG/NAME` plans the cached model, the package named after the
    repository; an id the cache lacks is one line, and no package is begun."""
    cache = tmp_path / "cache"
    cached_repo(cache, "org/tiny-wan", wan_folder)
    planned = edge(["export", "--model", "org/tiny-wan", "--dry-run", "--height", "32",
                    "--width", "32", "--frames", "1"], tmp_path, cache)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "transformer" in planned.stdout

    missing = edge(["export", "--model", "org/other"], tmp_path, cache)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr
    assert missing.stderr.strip().splitlines()[-1].startswith(
        "error: org/other: not in the Hugging Face cache")
    assert not (tmp_path / "dist").exists()


def test_the_default_package_is_named_after_the_repository(tmp_path):
    from edge.commands.export import model_name

    assert model_name("Wan-AI/Wan2.1-T2V-1.3B-Diffusers@main") == "Wan2.1-T2V-1.3B-Diffusers"
    (tmp_path / "wan").mkdir()
    assert model_name(str(tmp_path / "wan")) == "wan" and model_name(None) == "tiny-sora"


def test_the_snapshot_is_read_in_place(offline_cache, wan_folder):
    """The snapshot is huggingface_hub's own folder in the user's cache: read in place,
    never copied (a 1.3B model is 17 GB there)."""
    snapshot = cached_repo(offline_cache, "org/tiny-wan", wan_folder)
    before = sorted(p.name for p in offline_cache.rglob("*"))
    assert model_folder_of("org/tiny-wan") == snapshot
    assert sorted(p.name for p in offline_cache.rglob("*")) == before
    shutil.rmtree(snapshot)
    with pytest.raises(HubModelError):
        model_folder_of("org/tiny-wan@" + COMMIT)
