"""ModelArgs: one description of the Llama, Qwen2 and Qwen3 families for both backends.

Read from a Hugging Face config.json or from GGUF metadata (plain Python values; a backend that
gets 0-d arrays, like mx.load, converts them with `.item()` first).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import checks
from .errors import ModelLoadError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                     "Qwen3ForCausalLM": "qwen3", "MistralForCausalLM": "llama"}


@dataclass(frozen=True)
class ModelArgs:
    """Shape and numerics of a decoder-only model.

    architecture: "llama" | "qwen2" (q/k/v bias) | "qwen3" (per-head q/k RMSNorm).
    rope_scaling: None or the checkpoint's dict (e.g. {"rope_type": "llama3", "factor": 8, ...}).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        """Every path (GGUF metadata, config.json, mlx-lm directories, random shapes) ends here, so
        a checkpoint whose numbers would load "fine" and compute NaN is refused here, once."""
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(f"unsupported architecture {self.architecture!r} "
                                 f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")
        for name in sizes:
            checks.integer(getattr(self, name), f"model size {name}", minimum=1)
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ModelLoadError(f"{self.num_attention_heads} attention heads are not a multiple of "
                                 f"{self.num_key_value_heads} KV heads")
        if self.head_dim % 2:
            raise ModelLoadError(f"head_dim {self.head_dim} is odd: RoPE rotates pairs of dimensions")
        if not checks.positive_float(self.rms_norm_eps, "RMSNorm epsilon (rms_norm_eps)") <= 1.0:
            raise ModelLoadError(f"RMSNorm epsilon (rms_norm_eps) must be at most 1, got {self.rms_norm_eps:g} "
                                 f"(it is added to a mean square: a large one flattens every activation)")
        if not checks.positive_float(self.rope_theta, "RoPE base (rope_theta)") >= 1.0:
            raise ModelLoadError(f"RoPE base (rope_theta) must be at least 1, got {self.rope_theta:g} (a base below 1 "
                                 f"gives frequencies that overflow float32)")
        checks.check_rope_scaling(self.rope_scaling, self.architecture)
        for token in ((self.bos_token_id,) if self.bos_token_id is not None else ()) + self.eos_token_ids:
            checks.integer(token, "special token id")

    @property
    def gqa_group(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def biased_projections(self) -> tuple[str, ...]:
        """The attention projections that carry a bias, as Hugging Face builds each family:
        Llama's and Qwen3's `attention_bias` covers q, k, v and o; Qwen2 biases q, k, v only.
        Both backends' model builders and weight loaders read this, never the flag itself."""
        if not self.attention_bias:
            return ()
        return ("q_proj", "k_proj", "v_proj") + (("o_proj",) if self.architecture != "qwen2" else ())

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "ModelArgs":
        """From a transformers config.json dictionary; every value it reads is type-checked."""
        arch = _hf_architecture(config)

        def size(key: str, default: int | None = None) -> int:
            value = config.get(key)
            if value is None and default is None:
                raise ModelLoadError(f"config.json lacks {key!r}")
            return checks.integer(default if value is None else value, f"config.json {key}", minimum=1)

        def boolean(key: str, default: bool) -> bool:
            return checks.flag(config.get(key, default), f"config.json {key}")

        theta, scaling = _hf_rope(config)
        heads, hidden = size("num_attention_heads"), size("hidden_size")
        eos = config.get("eos_token_id")
        eos_ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        return cls(
            architecture=arch, vocab_size=size("vocab_size"), hidden_size=hidden,
            intermediate_size=size("intermediate_size"), num_hidden_layers=size("num_hidden_layers"),
            num_attention_heads=heads, num_key_value_heads=size("num_key_value_heads", heads),
            head_dim=size("head_dim", max(1, hidden // heads)),
            rms_norm_eps=checks.positive_float(config.get("rms_norm_eps", 1e-6), "config.json rms_norm_eps"),
            rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=size("max_position_embeddings", 4096),
            tie_word_embeddings=boolean("tie_word_embeddings", False),
            attention_bias=boolean("attention_bias", arch == "qwen2"), qk_norm=arch == "qwen3",
            bos_token_id=None if config.get("bos_token_id") is None else
            checks.integer(config["bos_token_id"], "config.json bos_token_id"),
            eos_token_ids=tuple(checks.integer(e, "config.json eos_token_id") for e in eos_ids),
        )

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], has_output_weight: bool) -> "ModelArgs":
        """From GGUF key/values (llama.cpp names, e.g. `llama.block_count`), type-checked."""
        if "general.architecture" not in meta:
            raise ModelLoadError("GGUF metadata lacks general.architecture")
        arch = checks.text(meta["general.architecture"], "GGUF general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(f"unsupported architecture {arch!r} "
                                 f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

        def size(key: str, default: int | None = None, minimum: int = 1) -> int:
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
            return checks.integer(value, f"GGUF {arch}.{key}", minimum=minimum)

        def number(key: str, default: float) -> float:
            return checks.positive_float(meta.get(f"{arch}.{key}", default), f"GGUF {arch}.{key}")

        heads, hidden = size("attention.head_count"), size("embedding_length")
        tokens = meta.get("tokenizer.ggml.tokens")
        scaling = None
        kind = meta.get(f"{arch}.rope.scaling.type")
        if kind not in (None, "none"):
            scaling = {"rope_type": checks.text(kind, f"GGUF {arch}.rope.scaling.type"),
                       "factor": number("rope.scaling.factor", 1.0),
                       "original_max_position_embeddings": size("rope.scaling.original_context_length", 0, 0)}
        bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
        return cls(
            architecture=arch,
            vocab_size=size("vocab_size", len(tokens) if isinstance(tokens, list) else None),
            hidden_size=hidden, intermediate_size=size("feed_forward_length"),
            num_hidden_layers=size("block_count"), num_attention_heads=heads,
            num_key_value_heads=size("attention.head_count_kv", heads),
            head_dim=size("attention.key_length", max(1, hidden // heads)),
            rms_norm_eps=number("attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=number("rope.freq_base", 10000.0), rope_scaling=scaling,
            max_position_embeddings=size("context_length", 4096),
            tie_word_embeddings=not has_output_weight, attention_bias=arch == "qwen2", qk_norm=arch == "qwen3",
            bos_token_id=None if bos is None else checks.integer(bos, "GGUF tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (checks.integer(eos, "GGUF tokenizer.ggml.eos_token_id"),),
        )


def expected_tensor_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of `args` holds, by Hugging Face name, with its shape."""
    hidden, q_rows = args.hidden_size, args.num_attention_heads * args.head_dim
    kv_rows, ffn = args.num_key_value_heads * args.head_dim, args.intermediate_size
    bias_rows = {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows, "o_proj": hidden}
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (args.vocab_size, hidden),
                                          "model.norm.weight": (hidden,)}
    if not args.tie_word_embeddings:
        shapes["lm_head.weight"] = (args.vocab_size, hidden)
    for i in range(args.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (q_rows, hidden),
            p + "self_attn.k_proj.weight": (kv_rows, hidden),
            p + "self_attn.v_proj.weight": (kv_rows, hidden),
            p + "self_attn.o_proj.weight": (hidden, q_rows),
            p + "mlp.gate_proj.weight": (ffn, hidden),
            p + "mlp.up_proj.weight": (ffn, hidden),
            p + "mlp.down_proj.weight": (hidden, ffn),
        })
        shapes.update({f"{p}self_attn.{proj}.bias": (bias_rows[proj],) for proj in args.biased_projections})
        if args.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (args.head_dim,),
                           p + "self_attn.k_norm.weight": (args.head_dim,)})
    return shapes


def _hf_architecture(config: Mapping[str, Any]) -> str:
    """model_type when present (it must be a known one: mistral reads as llama), else the first
    known class in `architectures`."""
    model_type = config.get("model_type")
    if model_type is not None:
        arch = "llama" if model_type == "mistral" else model_type
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(f"unsupported architecture {model_type!r} in config.json "
                                 f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        return str(arch)
    names = config.get("architectures")
    names = names if isinstance(names, list) else []
    arch = next((_HF_ARCHITECTURES[n] for n in names if isinstance(n, str) and n in _HF_ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(f"config.json names no supported architecture (model_type or architectures: "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)})")
    return arch


def _hf_rope(config: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from transformers <5 keys (rope_theta, rope_scaling) or 5's
    rope_parameters; scaling is None for default RoPE and always keyed by "rope_type"."""
    for key in ("rope_parameters", "rope_scaling"):
        if config.get(key) is not None and not isinstance(config[key], Mapping):
            raise ModelLoadError(f"config.json {key} must be an object, got {config[key]!r:.40}")
    params = dict(config.get("rope_parameters") or {})
    theta = checks.positive_float(config.get("rope_theta", params.pop("rope_theta", 10000.0)),
                                  "config.json rope_theta")
    params.pop("rope_theta", None)
    scaling = dict(config.get("rope_scaling") or params)
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if scaling.get("rope_type", "default") == "default":
        return theta, None
    return theta, scaling
