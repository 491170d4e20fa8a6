"""Models by repo id (core/io/hub.py), resolved offline against a pre-filled Hugging Face cache.

HF_HUB_CACHE points at a tmp dir laid out as the hub cache (models--owner--repo/refs/main and
snapshots/<commit>/...); HF_HUB_OFFLINE=1 everywhere but where a fake download is injected, so
no test can reach the network.
"""

import shutil
from pathlib import Path

import pytest

from specfill.api import load
from specfill.cli.main import main
from specfill.core import ModelLoadError
from specfill.core.io.hub import parse_repo_spec, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cache_repo(cache: Path, repo: str, files: dict[str, Path]) -> Path:
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    for name, source in files.items():
        shutil.copy(source, snapshot / name)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, tiny_checkpoint):
    cache = tmp_path / "hub"
    gguf = tiny_checkpoint("qwen2", "gguf")
    _cache_repo(cache, "someone/tiny-GGUF", {"tiny-q8_0.gguf": gguf, "tiny-Q4_K_M.gguf": gguf})
    _cache_repo(cache, "someone/one-GGUF", {"only.gguf": gguf})
    directory = tiny_checkpoint("qwen2", "safetensors")
    _cache_repo(cache, "someone/tiny-hf", {p.name: p for p in directory.iterdir() if p.is_file()})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tuple(cache / f"models--someone--{name}" / "snapshots" / COMMIT for name in ("tiny-GGUF", "tiny-hf"))


def test_specs_parse_like_llama_cpp_and_mlx_lm():
    mlx_lm_repo = "mlx-community/Qwen2.5-0.5B-Instruct-4bit"
    assert parse_repo_spec(mlx_lm_repo) == (mlx_lm_repo, None)
    assert parse_repo_spec("o/r:Q4_K_M") == ("o/r", "Q4_K_M")
    assert parse_repo_spec("o/r", "f.gguf") == ("o/r", "f.gguf")
    assert parse_repo_spec("/abs/model.gguf") is None and parse_repo_spec("random:llama-1b") is None
    with pytest.raises(ModelLoadError, match="names the file"):
        parse_repo_spec("o/r:a.gguf", "b.gguf")


def test_gguf_repo_by_file_quant_tag_and_single_file(hub_cache):
    gguf_snapshot, _ = hub_cache
    assert resolve_model("someone/tiny-GGUF:tiny-q8_0.gguf") == str(gguf_snapshot / "tiny-q8_0.gguf")
    assert resolve_model("someone/tiny-GGUF:q4_k_m") == str(gguf_snapshot / "tiny-Q4_K_M.gguf")
    assert resolve_model("someone/tiny-GGUF", model_file="tiny-q8_0.gguf").endswith("tiny-q8_0.gguf")
    assert resolve_model("someone/one-GGUF").endswith("only.gguf")
    with pytest.raises(ModelLoadError, match=r"holds 2 \.gguf files .*someone/tiny-GGUF:QUANT") as err:
        resolve_model("someone/tiny-GGUF")
    assert "\n" not in str(err.value) and "tiny-Q4_K_M.gguf" in str(err.value)
    with pytest.raises(ModelLoadError, match="no .gguf file matching 'Q5_K_S'"):
        resolve_model("someone/tiny-GGUF:Q5_K_S")


def test_safetensors_repo_loads_through_the_torch_backend(hub_cache):
    _, hf_snapshot = hub_cache
    assert resolve_model("someone/tiny-hf") == str(hf_snapshot)
    model, tokenizer = load("someone/tiny-hf", backend="cuda", device="cpu")
    assert model.args.architecture == "qwen2" and tokenizer.vocab_size > 0


def test_local_paths_and_random_models_pass_through(hub_cache, tiny_checkpoint):
    local = str(tiny_checkpoint("qwen2", "gguf"))
    assert resolve_model(local) == local and resolve_model("random:tiny-llama") == "random:tiny-llama"
    assert resolve_model("/no/such/model.gguf") == "/no/such/model.gguf"  # the loader reports it


def test_not_cached_is_one_line_and_offline_forbids_download(hub_cache):
    with pytest.raises(ModelLoadError, match="not in the Hugging Face cache .*pass --download") as err:
        resolve_model("someone/absent")
    assert "\n" not in str(err.value)
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE forbids"):
        resolve_model("someone/absent:Q4_K_M", download=True)


def test_download_when_asked_and_allowed(hub_cache, monkeypatch, tiny_checkpoint, tmp_path):
    """The download path with huggingface_hub's network calls replaced (no network here)."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    fetched = []
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo: ["README.md", "m-Q8_0.gguf", "m-F16.gguf"])

    def fake_download(repo, filename, cache_dir=None):
        fetched.append((repo, filename, cache_dir))
        return str(tiny_checkpoint("qwen2", "gguf"))

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    assert resolve_model("someone/remote:Q8_0", download=True) == str(tiny_checkpoint("qwen2", "gguf"))
    assert fetched == [("someone/remote", "m-Q8_0.gguf", str(hub_cache[0].parents[2]))]


def test_cli_generate_by_repo_id(hub_cache, capsys):
    assert (
        main(
            [
                "generate",
                "--backend",
                "cuda",
                "--device",
                "cpu",
                "--model",
                "someone/tiny-GGUF",
                "--model-file",
                "tiny-q8_0.gguf",
                "--prompt",
                "hello",
                "--max-tokens",
                "2",
                "--ignore-chat-template",
            ]
        )
        == 0
    )
    assert "Generation: " in capsys.readouterr().out
    assert (
        main(["generate", "--backend", "cuda", "--device", "cpu", "--model", "someone/absent", "--max-tokens", "1"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("specfill: error: model 'someone/absent' is not a local path")
