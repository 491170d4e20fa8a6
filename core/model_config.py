"""Reading a checkpoint's configuration into ModelArgs fields: the family name, RoPE and the
per-family attention details (sliding windows, Gemma 3's local RoPE base and query scale).

Kept apart from core/models.py (the ModelArgs type itself) so that each file reads in one go.
Every value read is type-checked; an unsupported variant is one ModelLoadError naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from . import checks
from .errors import ModelLoadError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
# config.json model_type -> family: Mistral is Llama's math plus a sliding window on every layer
_HF_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}
_HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "llama",
    "Gemma3ForCausalLM": "gemma3",
}
GEMMA3_GLOBAL_EVERY = 6  # Gemma 3: layers 5, 11, 17, ... are global, the others sliding
GEMMA3_LOCAL_THETA = 10000.0  # Gemma 3's RoPE base on sliding layers (HF's default, llama.cpp's too)


def _supported() -> str:
    return ", ".join(SUPPORTED_ARCHITECTURES) + " (mistral reads as llama with its sliding window)"


def hf_architecture(config: Mapping[str, Any]) -> str:
    """model_type when present (it must be a known one), else the first known class in
    `architectures`."""
    model_type = config.get("model_type")
    if model_type is not None:
        if not isinstance(model_type, str) or model_type not in _HF_MODEL_TYPES:
            hint = (
                " (Gemma 3's multimodal config: use its text-only Gemma3ForCausalLM checkpoint)"
                if model_type == "gemma3"
                else ""
            )
            raise ModelLoadError(
                f"unsupported architecture {model_type!r:.40} in config.json{hint} (supported: {_supported()})"
            )
        return _HF_MODEL_TYPES[model_type]
    names = config.get("architectures")
    names = names if isinstance(names, list) else []
    arch = next((_HF_ARCHITECTURES[n] for n in names if isinstance(n, str) and n in _HF_ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(
            f"config.json names no supported architecture (model_type or architectures: {_supported()})"
        )
    return arch


def hf_rope(config: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from transformers <5 keys (rope_theta, rope_scaling) or 5's
    rope_parameters; scaling is None for default RoPE and always keyed by "rope_type". Gemma 3's
    per-layer-type rope_parameters give the global layers' values here (see hf_family_fields)."""
    for key in ("rope_parameters", "rope_scaling"):
        if config.get(key) is not None and not isinstance(config[key], Mapping):
            raise ModelLoadError(f"config.json {key} must be an object, got {config[key]!r:.40}")
    params = dict(config.get("rope_parameters") or {})
    if isinstance(params.get("full_attention"), Mapping):
        params = dict(params["full_attention"])
    theta = checks.positive_float(config.get("rope_theta", params.pop("rope_theta", 10000.0)), "config.json rope_theta")
    params.pop("rope_theta", None)
    scaling = dict(config.get("rope_scaling") or params)
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if scaling.get("rope_type", "default") == "default":
        return theta, None
    return theta, scaling


def _window(value: Any, what: str) -> int | None:
    return None if value is None else checks.integer(value, what, minimum=1)


def hf_family_fields(config: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """The ModelArgs fields beyond Llama's: sliding_window, global_every, rope_local_theta,
    query_pre_attn_scalar (config.json names). A variant these fields cannot express is refused."""
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key) is not None:
            raise ModelLoadError(f"config.json {key} = {config[key]!r}: logit soft-capping is not supported")
    if config.get("use_sliding_window"):  # Qwen2's per-layer window switch
        raise ModelLoadError("config.json use_sliding_window: Qwen2's sliding window is not supported")
    if config.get("model_type") == "mistral":
        return {"sliding_window": _window(config.get("sliding_window"), "config.json sliding_window")}
    if arch != "gemma3":
        return {}
    if config.get("use_bidirectional_attention"):
        raise ModelLoadError("config.json use_bidirectional_attention: only causal Gemma 3 is supported")
    if config.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ModelLoadError(
            f"config.json hidden_activation {config['hidden_activation']!r:.40}: Gemma 3 takes gelu_pytorch_tanh only"
        )
    n_layers = checks.integer(config.get("num_hidden_layers", 1), "config.json num_hidden_layers", minimum=1)
    every = checks.integer(
        config.get("sliding_window_pattern", GEMMA3_GLOBAL_EVERY), "config.json sliding_window_pattern", minimum=1
    )
    types = config.get("layer_types")
    if types is not None:  # transformers 5 writes the list; the period is where the first global is
        types = checks.typed_list(types, str, "config.json layer_types")
        every = types.index("full_attention") + 1 if "full_attention" in types else n_layers + 1
        want = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n_layers)]
        if types != want:
            raise ModelLoadError(
                "config.json layer_types is not one global layer every n layers (the only Gemma 3 pattern supported)"
            )
    params = config.get("rope_parameters") or {}
    for kind in ("sliding_attention", "full_attention"):
        if isinstance(params, Mapping) and not isinstance(params.get(kind, {}), Mapping):
            raise ModelLoadError(f"config.json rope_parameters.{kind} must be an object")
    local = params.get("sliding_attention") or {} if isinstance(params, Mapping) else {}
    local_theta = config.get("rope_local_base_freq", local.get("rope_theta", GEMMA3_LOCAL_THETA))
    if local.get("rope_type", "default") != "default":
        raise ModelLoadError("config.json: scaled RoPE on Gemma 3's sliding layers is not supported")
    return {
        "sliding_window": _window(config.get("sliding_window", 4096), "config.json sliding_window"),
        "global_every": every,
        "rope_local_theta": checks.positive_float(local_theta, "config.json rope_local_base_freq"),
        "query_pre_attn_scalar": checks.positive_float(
            config.get("query_pre_attn_scalar", 256), "config.json query_pre_attn_scalar"
        ),
    }


def gguf_family_fields(meta: Mapping[str, Any], arch: str, head_dim: int) -> dict[str, Any]:
    """The same fields from GGUF metadata, as llama.cpp reads them: gemma3's window
    (`gemma3.attention.sliding_window`), one global layer in 6, local base
    `gemma3.rope.freq_base_swa` (default 10000) and the query scale 1/sqrt(head_dim)
    (llama.cpp's rule for every Gemma 3 but the 27B, whose 62 layers use hidden / heads)."""
    if arch != "gemma3":
        window = meta.get(f"{arch}.attention.sliding_window")
        if window is not None:
            raise ModelLoadError(
                f"GGUF {arch}.attention.sliding_window: a sliding window on a {arch} GGUF is not supported"
            )
        return {}
    window = meta.get("gemma3.attention.sliding_window")
    if window is None:
        raise ModelLoadError("GGUF metadata lacks gemma3.attention.sliding_window")
    scalar = float(head_dim)
    if meta.get("gemma3.block_count") == 62:
        hidden, heads = meta.get("gemma3.embedding_length"), meta.get("gemma3.attention.head_count")
        scalar = checks.integer(hidden, "GGUF gemma3.embedding_length", minimum=1) / checks.integer(
            heads, "GGUF gemma3.attention.head_count", minimum=1
        )
    return {
        "sliding_window": _window(window, "GGUF gemma3.attention.sliding_window"),
        "global_every": GEMMA3_GLOBAL_EVERY,
        "rope_local_theta": checks.positive_float(
            meta.get("gemma3.rope.freq_base_swa", GEMMA3_LOCAL_THETA), "GGUF gemma3.rope.freq_base_swa"
        ),
        "query_pre_attn_scalar": scalar,
    }


def foreign_model_type(path: str | Path) -> str | None:
    """The model_type of a directory whose config.json names an architecture specfill has no model
    file for (a backend then asks its library, mlx-lm or transformers, whether it knows it); None
    for anything else: not a directory, no readable config.json, one of specfill's own families
    (their loader names any problem)."""
    try:
        config_path = Path(path) / "config.json"
        if not config_path.is_file():  # a FIFO or device would block the read
            return None
        config = json.loads(config_path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or model_type in _HF_MODEL_TYPES or not model_type.isidentifier():
        return None
    return model_type


def foreign_gguf_architecture(metadata: Mapping[str, Any]) -> str | None:
    """general.architecture of a GGUF file's metadata when it names a family specfill has no model
    file for (a backend may hand the file to its library); None for specfill's own families."""
    architecture = metadata.get("general.architecture")
    return architecture if isinstance(architecture, str) and architecture not in SUPPORTED_ARCHITECTURES else None
