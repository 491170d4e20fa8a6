"""Models by Hugging Face repo id: a `--model` / `load()` argument that is not a local path.

Forms (what mlx-lm and llama.cpp users type):
  owner/repo                a safetensors or mlx-lm repo (config.json + *.safetensors), or a GGUF
                            repo holding exactly one .gguf file
  owner/repo:FILE.gguf      that GGUF file of the repo (llama.cpp's --hf-file)
  owner/repo:QUANT          the one .gguf file whose name holds the quant tag, e.g. :Q4_K_M
                            (llama.cpp's `-hf owner/repo:Q4_K_M`)
The file may also come separately (`--model-file`, `load(..., model_file=)`).

Offline first: the repo is looked up in huggingface_hub's cache (HF_HUB_CACHE, else HF_HOME's);
nothing is fetched unless the caller asks (`--download`, `load(..., download=True)`) and the
environment allows it (HF_HUB_OFFLINE unset). A spec that cannot be resolved is one
ModelLoadError line saying what was looked for and where.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from ..errors import ModelLoadError

_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<file>[^:]+))?$")
# what a safetensors / mlx-lm directory load needs (never *.bin, *.gguf, *.pt, *.onnx)
_DIRECTORY_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]


def parse_repo_spec(spec: str, model_file: str | None = None) -> tuple[str, str | None] | None:
    """(repo id, file or quant tag or None) when `spec` reads as a repo id, else None."""
    match = _REPO_ID.match(spec)
    if match is None:
        return None
    selector = match.group("file")
    if selector and model_file and selector != model_file:
        raise ModelLoadError(f"{spec!r} names the file {selector!r} and --model-file another ({model_file!r})")
    return match.group("repo"), selector or model_file


def downloads_allowed() -> bool:
    """False when HF_HUB_OFFLINE is set to a true value (read now, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("1", "true", "yes", "on")


def _cache_dir() -> str | None:
    return os.environ.get("HF_HUB_CACHE") or None


def _hub():
    try:
        import huggingface_hub
        import huggingface_hub.errors  # noqa: F401 - the exception classes, as hub.errors
    except ImportError:
        raise ModelLoadError("a model given by repo id needs huggingface_hub (pip install huggingface_hub)") from None
    return huggingface_hub


def _pick_gguf(repo: str, names: list[str], selector: str | None, where: str) -> str | None:
    """The repo-relative .gguf file that `selector` (a file name, a quant tag or None) picks among
    `names`; None when there is no .gguf at all and no selector (a directory repo)."""
    ggufs = sorted(n for n in names if n.lower().endswith(".gguf"))
    if selector is not None and selector.lower().endswith(".gguf"):
        exact = [n for n in ggufs if n == selector or n.rsplit("/", 1)[-1] == selector]
        if len(exact) == 1:
            return exact[0]
        raise ModelLoadError(f"{repo} has no file {selector!r} {where}" + _listing(ggufs))
    if selector is not None:
        tagged = [n for n in ggufs if fnmatch.fnmatch(n.lower(), f"*{selector.lower()}*")]
        if len(tagged) == 1:
            return tagged[0]
        what = "no .gguf file" if not tagged else f"{len(tagged)} .gguf files"
        raise ModelLoadError(f"{repo} has {what} matching {selector!r} {where}" + _listing(tagged or ggufs))
    if len(ggufs) > 1:
        raise ModelLoadError(
            f"{repo} holds {len(ggufs)} .gguf files {where}: name one as {repo}:FILE or {repo}:QUANT" + _listing(ggufs)
        )
    return ggufs[0] if ggufs else None


def _listing(names: list[str]) -> str:
    if not names:
        return ""
    return " (" + ", ".join(names[:6]) + (f", +{len(names) - 6} more" if len(names) > 6 else "") + ")"


def _from_cache(repo: str, selector: str | None) -> Path | None:
    """The cached file or snapshot directory, or None when the repo is not cached."""
    hub = _hub()
    try:
        snapshot = Path(hub.snapshot_download(repo, cache_dir=_cache_dir(), local_files_only=True))
    except (FileNotFoundError, ValueError):  # LocalEntryNotFoundError is a FileNotFoundError
        return None
    names = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]
    gguf = _pick_gguf(repo, names, selector, "in the local Hugging Face cache")
    if gguf is not None:
        return snapshot / gguf
    if (snapshot / "config.json").is_file():
        return snapshot
    raise ModelLoadError(f"{repo} in the Hugging Face cache ({snapshot}) holds neither a .gguf file nor config.json")


def _download(repo: str, selector: str | None) -> Path:
    hub = _hub()
    try:
        gguf = _pick_gguf(repo, hub.list_repo_files(repo), selector, "on the Hub")
        if gguf is not None:
            return Path(hub.hf_hub_download(repo, gguf, cache_dir=_cache_dir()))
        return Path(hub.snapshot_download(repo, cache_dir=_cache_dir(), allow_patterns=_DIRECTORY_PATTERNS))
    except (hub.errors.HfHubHTTPError, OSError) as err:  # not found, no network, offline, disk
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(f"cannot download {repo} from the Hugging Face Hub: {first}") from None


def _exists_locally(spec: str) -> bool:
    """Whether spec names something on disk; a name too long, a NUL byte or a link loop is not a
    local path (the loader then says what is wrong with it, in one line)."""
    try:
        os.stat(spec)
    except (OSError, ValueError):
        return False
    return True


def resolve_model(spec: str, model_file: str | None = None, download: bool = False) -> str:
    """A local path for `spec`: unchanged when it exists locally or is not a repo id (the loader
    then reports a missing path), else the cached (or, when asked and allowed, downloaded) GGUF
    file or model directory of the repo."""
    if _exists_locally(spec) and model_file is None:
        return spec
    parsed = parse_repo_spec(spec, model_file)
    if parsed is None:
        if model_file is not None:
            raise ModelLoadError(f"--model-file needs a repo id as --model (owner/repo), got {spec!r}")
        return spec
    repo, selector = parsed
    cached = _from_cache(repo, selector)
    if cached is not None:
        return str(cached)
    if not download:
        raise ModelLoadError(
            f"model {spec!r} is not a local path and {repo} is not in the Hugging Face cache "
            f"({_cache_dir() or 'the default cache'}): pass --download (load(..., download=True)) "
            "to fetch it"
        )
    if not downloads_allowed():
        raise ModelLoadError(f"{repo} is not in the Hugging Face cache and HF_HUB_OFFLINE forbids downloading it")
    return str(_download(repo, selector))
