"""ModelArgs: one description of the Llama (and Mistral), Qwen2, Qwen3 and Gemma 3 families for
both backends.

Read from a Hugging Face config.json or from GGUF metadata (plain Python values; a backend that
gets 0-d arrays, like mx.load, converts them with `.item()` first); the reading of family details
is in core/model_config.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from . import checks
from .errors import ModelLoadError
from .model_config import SUPPORTED_ARCHITECTURES, gguf_family_fields, hf_architecture, hf_family_fields, hf_rope

# ModelArgs' sizes and where each format keeps them: (field, config.json key, GGUF key after "ARCH.")
SIZE_KEYS = (
    ("vocab_size", "vocab_size", "vocab_size"),
    ("hidden_size", "hidden_size", "embedding_length"),
    ("intermediate_size", "intermediate_size", "feed_forward_length"),
    ("num_hidden_layers", "num_hidden_layers", "block_count"),
    ("num_attention_heads", "num_attention_heads", "attention.head_count"),
    ("num_key_value_heads", "num_key_value_heads", "attention.head_count_kv"),
    ("head_dim", "head_dim", "attention.key_length"),
    ("max_position_embeddings", "max_position_embeddings", "context_length"),
)


def read_sizes(size: Callable[[str, int | None], int], gguf: bool, vocab: int | None = None) -> dict[str, int]:
    """ModelArgs' sizes, each read by `size` (a format's checked reader: key, default or None when
    required) under its config.json key, or its GGUF key with `gguf`. Defaults: `vocab` for the
    vocabulary, the query heads for the key-value heads, hidden / heads for head_dim, 4096 positions."""
    keys = {name: gguf_key if gguf else hf_key for name, hf_key, gguf_key in SIZE_KEYS}
    heads, hidden = size(keys["num_attention_heads"], None), size(keys["hidden_size"], None)
    defaults = {
        "vocab_size": vocab,
        "num_key_value_heads": heads,
        "head_dim": max(1, hidden // heads),
        "max_position_embeddings": 4096,
    }
    return {name: size(key, defaults.get(name)) for name, key in keys.items()}


@dataclass(frozen=True)
class ModelArgs:
    """Shape and numerics of a decoder-only model.

    architecture: "llama" | "qwen2" (q/k/v bias) | "qwen3" (per-head q/k RMSNorm) | "gemma3"
    (per-head q/k RMSNorm, four norms per layer, GELU-tanh MLP, embeddings scaled by
    sqrt(hidden), tied LM head; its RMSNorm weights are held as the multiplier 1 + w, as llama.cpp
    stores them, so every family's norm is x / rms(x) * weight).
    rope_scaling: None or the checkpoint's dict (e.g. {"rope_type": "llama3", "factor": 8, ...}).
    sliding_window: w, or None: in a sliding layer the query at position p sees only keys at
    positions q with p - w < q <= p (HF's convention; positions, not cache slots).
    global_every: 0 = every layer slides (Mistral) when sliding_window is set; n = layer i is
    global iff (i + 1) % n == 0 (Gemma 3: n = 6).
    rope_local_theta: RoPE base of the sliding layers (None: rope_theta; Gemma 3: 10000).
    query_pre_attn_scalar: attention scale 1 / sqrt(this) (None: 1 / sqrt(head_dim)).
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
    sliding_window: int | None = None
    global_every: int = 0
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None

    def __post_init__(self) -> None:
        """Every path (GGUF metadata, config.json, mlx-lm directories, random shapes) ends here, so
        a checkpoint whose numbers would load "fine" and compute NaN is refused here, once."""
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {self.architecture!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        sizes = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        )
        for name in sizes:
            checks.integer(getattr(self, name), f"model size {name}", minimum=1)
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ModelLoadError(
                f"{self.num_attention_heads} attention heads are not a multiple of {self.num_key_value_heads} KV heads"
            )
        if self.head_dim % 2:
            raise ModelLoadError(f"head_dim {self.head_dim} is odd: RoPE rotates pairs of dimensions")
        if not checks.positive_float(self.rms_norm_eps, "RMSNorm epsilon (rms_norm_eps)") <= 1.0:
            raise ModelLoadError(
                f"RMSNorm epsilon (rms_norm_eps) must be at most 1, got {self.rms_norm_eps:g} "
                f"(it is added to a mean square: a large one flattens every activation)"
            )
        if not checks.positive_float(self.rope_theta, "RoPE base (rope_theta)") >= 1.0:
            raise ModelLoadError(
                f"RoPE base (rope_theta) must be at least 1, got {self.rope_theta:g} (a base below 1 "
                f"gives frequencies that overflow float32)"
            )
        checks.check_rope_scaling(self.rope_scaling, self.architecture)
        if self.sliding_window is not None:
            checks.integer(self.sliding_window, "sliding window", minimum=1)
        checks.integer(self.global_every, "global layer period (global_every)")
        for name in ("rope_local_theta", "query_pre_attn_scalar"):
            if getattr(self, name) is not None:
                checks.positive_float(getattr(self, name), name)
        for token in ((self.bos_token_id,) if self.bos_token_id is not None else ()) + self.eos_token_ids:
            checks.integer(token, "special token id")

    @property
    def attention_scale(self) -> float:
        """Softmax scale of q.k: 1 / sqrt(query_pre_attn_scalar or head_dim)."""
        return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def layer_window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window w (None: global attention over every earlier key)."""
        if self.sliding_window is None or (self.global_every and (layer + 1) % self.global_every == 0):
            return None
        return self.sliding_window

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """layer_window of every layer, in order."""
        return tuple(self.layer_window(i) for i in range(self.num_hidden_layers))

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers with keys, which the methods run: every layer (the own families have no recurrent ones)."""
        return tuple(range(self.num_hidden_layers))

    @property
    def layer_terms(self) -> tuple[None, ...]:
        """Each layer's attention terms (core/stages.AttentionTerms): none in the own families'
        model files (core/model_config.py refuses a GGUF whose attention soft-caps its logits)."""
        return (None,) * self.num_hidden_layers

    def local_rope(self, layer: int) -> bool:
        """Whether layer `layer` rotates with the sliding layers' own RoPE base (rope_local_theta)."""
        return self.layer_window(layer) is not None and self.rope_local_theta is not None

    @property
    def sandwich_norms(self) -> bool:
        """Gemma 3: RMSNorm after attention and around the MLP too (four norms per layer)."""
        return self.architecture == "gemma3"

    @property
    def embedding_scale(self) -> float | None:
        """Gemma 3 multiplies embeddings by sqrt(hidden) (rounded to the activation dtype first)."""
        return self.hidden_size**0.5 if self.architecture == "gemma3" else None

    @property
    def mlp_activation(self) -> str:
        """ "silu" (SwiGLU) or "gelu_tanh" (Gemma 3's GeGLU, tanh approximation)."""
        return "gelu_tanh" if self.architecture == "gemma3" else "silu"

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
        arch = hf_architecture(config)

        def size(key: str, default: int | None = None) -> int:
            value = config.get(key)
            if value is None and default is None:
                raise ModelLoadError(f"config.json lacks {key!r}")
            return checks.integer(default if value is None else value, f"config.json {key}", minimum=1)

        def boolean(key: str, default: bool) -> bool:
            return checks.flag(config.get(key, default), f"config.json {key}")

        theta, scaling = hf_rope(config)
        eos = config.get("eos_token_id")
        eos_ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        return cls(
            architecture=arch,
            **read_sizes(size, gguf=False),
            rms_norm_eps=checks.positive_float(config.get("rms_norm_eps", 1e-6), "config.json rms_norm_eps"),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=boolean("tie_word_embeddings", arch == "gemma3"),
            attention_bias=boolean("attention_bias", arch == "qwen2"),
            qk_norm=arch in ("qwen3", "gemma3"),
            bos_token_id=None
            if config.get("bos_token_id") is None
            else checks.integer(config["bos_token_id"], "config.json bos_token_id"),
            eos_token_ids=tuple(checks.integer(e, "config.json eos_token_id") for e in eos_ids),
            **hf_family_fields(config, arch),
        )

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], has_output_weight: bool) -> "ModelArgs":
        """From GGUF key/values (llama.cpp names, e.g. `llama.block_count`), type-checked."""
        if "general.architecture" not in meta:
            raise ModelLoadError("GGUF metadata lacks general.architecture")
        arch = checks.text(meta["general.architecture"], "GGUF general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

        def size(key: str, default: int | None = None, minimum: int = 1) -> int:
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
            return checks.integer(value, f"GGUF {arch}.{key}", minimum=minimum)

        def number(key: str, default: float) -> float:
            return checks.positive_float(meta.get(f"{arch}.{key}", default), f"GGUF {arch}.{key}")

        tokens = meta.get("tokenizer.ggml.tokens")
        sizes = read_sizes(size, gguf=True, vocab=len(tokens) if isinstance(tokens, list) else None)
        scaling = None
        kind = meta.get(f"{arch}.rope.scaling.type")
        if kind not in (None, "none"):
            scaling = {
                "rope_type": checks.text(kind, f"GGUF {arch}.rope.scaling.type"),
                "factor": number("rope.scaling.factor", 1.0),
                "original_max_position_embeddings": size("rope.scaling.original_context_length", 0, 0),
            }
        bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
        return cls(
            architecture=arch,
            **sizes,
            rms_norm_eps=number("attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=number("rope.freq_base", 10000.0),
            rope_scaling=scaling,
            tie_word_embeddings=not has_output_weight,
            attention_bias=arch == "qwen2",
            qk_norm=arch in ("qwen3", "gemma3"),
            bos_token_id=None if bos is None else checks.integer(bos, "GGUF tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (checks.integer(eos, "GGUF tokenizer.ggml.eos_token_id"),),
            **gguf_family_fields(meta, arch, sizes["head_dim"]),
        )


def expected_tensor_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of `args` holds, by Hugging Face name, with its shape."""
    hidden, q_rows = args.hidden_size, args.num_attention_heads * args.head_dim
    kv_rows, ffn = args.num_key_value_heads * args.head_dim, args.intermediate_size
    bias_rows = {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows, "o_proj": hidden}
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (args.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not args.tie_word_embeddings:
        shapes["lm_head.weight"] = (args.vocab_size, hidden)
    for i in range(args.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (q_rows, hidden),
                p + "self_attn.k_proj.weight": (kv_rows, hidden),
                p + "self_attn.v_proj.weight": (kv_rows, hidden),
                p + "self_attn.o_proj.weight": (hidden, q_rows),
                p + "mlp.gate_proj.weight": (ffn, hidden),
                p + "mlp.up_proj.weight": (ffn, hidden),
                p + "mlp.down_proj.weight": (hidden, ffn),
            }
        )
        shapes.update({f"{p}self_attn.{proj}.bias": (bias_rows[proj],) for proj in args.biased_projections})
        if args.qk_norm:
            shapes.update(
                {p + "self_attn.q_norm.weight": (args.head_dim,), p + "self_attn.k_norm.weight": (args.head_dim,)}
            )
        if args.sandwich_norms:
            shapes.update(
                {p + "pre_feedforward_layernorm.weight": (hidden,), p + "post_feedforward_layernorm.weight": (hidden,)}
            )
    return shapes
