"""ModelArgs: one description of the Llama, Qwen2 and Qwen3 families for both backends.

Read from a Hugging Face config.json or from GGUF metadata (plain Python values; a backend that
gets 0-d arrays, like mx.load, converts them with `.item()` first).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

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
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim")
        bad = [f"{name}={getattr(self, name)}" for name in sizes if not getattr(self, name) > 0]
        if bad:
            raise ModelLoadError(f"model sizes must be positive: {', '.join(bad)}")
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(f"unsupported architecture {self.architecture!r} "
                                 f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ModelLoadError(f"{self.num_attention_heads} attention heads are not a multiple of "
                                 f"{self.num_key_value_heads} KV heads")

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
        """From a transformers config.json dictionary."""
        arch = config.get("model_type")
        if arch not in SUPPORTED_ARCHITECTURES:
            names = config.get("architectures") or []
            arch = next((_HF_ARCHITECTURES[n] for n in names if n in _HF_ARCHITECTURES), arch)
        if arch == "mistral":
            arch = "llama"
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(f"unsupported architecture {arch!r} in config.json "
                                 f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        try:
            theta, scaling = _hf_rope(config)
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            eos = config.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
            return cls(
                architecture=str(arch),
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(config["intermediate_size"]),
                num_hidden_layers=int(config["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling=scaling,
                max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                attention_bias=bool(config.get("attention_bias", arch == "qwen2")),
                qk_norm=arch == "qwen3",
                bos_token_id=config.get("bos_token_id"),
                eos_token_ids=tuple(int(e) for e in eos_ids),
            )
        except KeyError as missing:
            raise ModelLoadError(f"config.json lacks {missing.args[0]!r}") from None
        except (TypeError, ValueError, ZeroDivisionError) as err:
            raise ModelLoadError(f"config.json has an invalid value: {err}") from None

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], has_output_weight: bool) -> "ModelArgs":
        """From GGUF key/values (llama.cpp names), e.g. `llama.block_count`."""
        arch = meta.get("general.architecture")
        if arch is None:
            raise ModelLoadError("GGUF metadata lacks general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(f"unsupported architecture {arch!r} "
                                 f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

        def get(key: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
            return value

        try:
            return cls._from_gguf(meta, arch, get, has_output_weight)
        except (TypeError, ValueError, ZeroDivisionError) as err:
            raise ModelLoadError(f"GGUF metadata has an invalid value: {err}") from None

    @classmethod
    def _from_gguf(cls, meta: Mapping[str, Any], arch: str, get: Any,
                   has_output_weight: bool) -> "ModelArgs":
        heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab = meta.get(f"{arch}.vocab_size", len(tokens) if tokens is not None else None)
        if vocab is None:
            raise ModelLoadError("GGUF metadata gives no vocabulary size")
        scaling = None
        if meta.get(f"{arch}.rope.scaling.type") not in (None, "none"):
            scaling = {"rope_type": meta[f"{arch}.rope.scaling.type"],
                       "factor": float(meta.get(f"{arch}.rope.scaling.factor", 1.0)),
                       "original_max_position_embeddings":
                           int(meta.get(f"{arch}.rope.scaling.original_context_length", 0))}
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(
            architecture=arch,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_hidden_layers=int(get("block_count")),
            num_attention_heads=heads,
            num_key_value_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=int(meta.get(f"{arch}.context_length", 4096)),
            tie_word_embeddings=not has_output_weight,
            attention_bias=arch == "qwen2",
            qk_norm=arch == "qwen3",
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=(int(eos),) if eos is not None else (),
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


def _hf_rope(config: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from transformers <5 keys (rope_theta, rope_scaling) or 5's
    rope_parameters; scaling is None for default RoPE and always keyed by "rope_type"."""
    params = dict(config.get("rope_parameters") or {})
    theta = float(config.get("rope_theta", params.pop("rope_theta", 10000.0)))
    params.pop("rope_theta", None)
    scaling = dict(config.get("rope_scaling") or params)
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if scaling.get("rope_type", "default") == "default":
        return theta, None
    return theta, scaling
