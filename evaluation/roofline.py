"""A roofline model of time to first token per method: what a GPU user should expect.

Every pass is priced as max(FLOPs / rate, bytes / bandwidth) per part: the linear layers (GEMMs
over the prompt's tokens; weights read once per prefill step), attention (4 * head_dim FLOPs per
visible query-key pair per head: QK^T and PV; K/V read once per 128-query block), a decode step
(weights + KV cache read once) and SpecPrefill's scoring (its n_q queries against every prompt
key). Methods: full (causal over every pair), H2O (core.methods.h2o.h2o_dot_products: causal
inside each chunk + one memory set per later chunk + the dense tail), SpecPrefill (the
speculator's full prefill + look-ahead decode + scoring, then the main model's prefill of the
kept tokens). Norms, RoPE, softmax element-wise work and kernel launch gaps are not priced, so on
vendor peaks the figures are lower bounds; the speed-ups vs full are ratios of such bounds.

Peaks are vendor datasheet figures (DEVICES, sources in each entry); `Rates` measured on the
machine itself (evaluation/rates.py) make the same formula a prediction to check against bench.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specfill.core.config import H2OConfig
from specfill.core.methods.h2o import full_dot_products, h2o_dot_products
from specfill.core.models import ModelArgs


@dataclass(frozen=True)
class Shape:
    """A decoder's sizes: layers, hidden d, query / KV heads, head dim, FFN width, vocabulary."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    @classmethod
    def from_args(cls, name: str, args: ModelArgs) -> "Shape":
        return cls(
            name,
            args.num_hidden_layers,
            args.hidden_size,
            args.num_attention_heads,
            args.num_key_value_heads,
            args.head_dim,
            args.intermediate_size,
            args.vocab_size,
        )

    def layer_params(self) -> int:
        """q, k, v, o projections and the gated FFN's three matrices of one layer."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attn + 3 * self.hidden * self.ffn

    def first_layers(self, k: int) -> "Shape":
        return Shape(
            f"{self.name} self:{k}", k, self.hidden, self.heads, self.kv_heads, self.head_dim, self.ffn, self.vocab
        )


@dataclass(frozen=True)
class Rates:
    """Sustained GEMM and attention FLOP/s and memory bandwidth (bytes/s) of one device."""

    name: str
    gemm: float
    attention: float
    bandwidth: float
    source: str


# Dense (no sparsity) 16-bit tensor-core peaks with fp32 accumulation, and DRAM bandwidth.
DEVICES: dict[str, Rates] = {
    "h100": Rates(
        "H100 SXM5",
        989.4e12,
        989.4e12,
        3.35e12,
        "NVIDIA H100 Tensor Core GPU datasheet: BF16 1,979 TFLOPS with sparsity (989.4 dense), HBM3 3.35 TB/s",
    ),
    "h200": Rates(
        "H200 SXM",
        989.4e12,
        989.4e12,
        4.8e12,
        "NVIDIA H200 Tensor Core GPU datasheet: BF16 1,979 TFLOPS with sparsity (989.4 dense, the H100's "
        "tensor cores), HBM3e 4.8 TB/s",
    ),
    "rtx4090": Rates(
        "RTX 4090",
        165.2e12,
        165.2e12,
        1008e9,
        "NVIDIA Ada Lovelace GPU architecture whitepaper, appendix A: peak BF16 tensor TFLOPS "
        "with FP32 accumulate 165.2 (330.4 sparse); 1008 GB/s GDDR6X",
    ),
    "orin": Rates(
        "Jetson AGX Orin 64GB",
        42.5e12,
        42.5e12,
        204.8e9,
        "NVIDIA Jetson AGX Orin series datasheet: GPU 170 sparse INT8 TOPS -> 85 dense INT8 -> "
        "42.5 dense FP16 TFLOPS (half INT8's rate on Ampere tensor cores); LPDDR5 204.8 GB/s",
    ),
    "rtx3090": Rates(
        "RTX 3090",
        71e12,
        71e12,
        936e9,
        "NVIDIA Ampere GA102 GPU architecture whitepaper, table 9: peak BF16 tensor TFLOPS with "
        "FP32 accumulate 71 (142 sparse); 936 GB/s GDDR6X",
    ),
}

KV_BLOCK = 128  # queries that share one read of their keys / values (a flash-attention tile)


def _part(flops: float, nbytes: float, rate: float, rates: Rates) -> float:
    return max(flops / rate, nbytes / rates.bandwidth)


def prefill_seconds(
    shape: Shape, rates: Rates, n_tokens: int, pairs: int, width: int, step: int = 2048, logits: bool = True
) -> dict[str, float]:
    """{"linear", "attention"} seconds of prefilling n_tokens whose attention visits `pairs`
    query-key pairs per head per layer, weights and cache `width` bytes per value."""
    if n_tokens == 0:
        return {"linear": 0.0, "attention": 0.0}
    weights = shape.layer_params() * shape.layers * width
    linear = _part(
        2 * n_tokens * shape.layer_params() * shape.layers, weights * math.ceil(n_tokens / step), rates.gemm, rates
    )
    if logits:  # the last token's logits only
        linear += _part(2 * shape.hidden * shape.vocab, shape.hidden * shape.vocab * width, rates.gemm, rates)
    kv_reads = 2 * shape.kv_heads * shape.head_dim * width * pairs / KV_BLOCK * shape.layers
    attention = _part(4 * shape.head_dim * shape.heads * pairs * shape.layers, kv_reads, rates.attention, rates)
    return {"linear": linear, "attention": attention}


def decode_seconds(shape: Shape, rates: Rates, context: int, width: int) -> float:
    """One token: every weight and the whole KV cache read once."""
    params = shape.layer_params() * shape.layers + shape.hidden * shape.vocab
    cache = 2 * shape.layers * shape.kv_heads * shape.head_dim * context * width
    return _part(
        2 * params + 4 * shape.head_dim * shape.heads * context * shape.layers,
        params * width + cache,
        rates.gemm,
        rates,
    )


@dataclass(frozen=True)
class Method:
    """full, h2o (with its config) or specprefill (speculator shape, keep ratio, look-ahead;
    kept_tokens: the main model's prefill length when it is known, as in a bench row)."""

    name: str
    h2o: H2OConfig = H2OConfig()
    speculator: Shape | None = None
    keep: float = 0.1
    lookahead: int = 8
    kept_tokens: int | None = None


def h2o_pairs(config: H2OConfig, n_tokens: int, n_layers: int) -> float:
    """Query-key pairs per head per layer of an H2O prefill, averaged over the layers: the layers
    config.layers names walk H2O (with the memory set the prompt's length gives, for_prompt), the
    others attend to every key (the default runs H2O in the first third only)."""
    config = config.for_prompt(n_tokens)
    full = full_dot_products(n_tokens)
    if n_tokens <= config.chunk_size:
        return full
    sparse = h2o_dot_products(n_tokens, config.chunk_size, config.local + config.heavy, config.dense_tail)
    walked = len(config.layer_indices(n_layers))
    return (walked * sparse + (n_layers - walked) * full) / n_layers


def predict(
    shape: Shape, rates: Rates, n_tokens: int, method: Method, width: int = 2, step: int = 2048
) -> dict[str, float]:
    """Seconds per part and "ttft" (their sum) of one method on one prompt length."""
    if method.name == "full":
        parts = prefill_seconds(shape, rates, n_tokens, full_dot_products(n_tokens), width, step)
    elif method.name == "h2o":
        parts = prefill_seconds(shape, rates, n_tokens, h2o_pairs(method.h2o, n_tokens, shape.layers), width, step)
    elif method.name == "specprefill":
        spec = method.speculator or shape
        drafted = prefill_seconds(spec, rates, n_tokens, full_dot_products(n_tokens), width, step)
        kept = (
            method.kept_tokens
            if method.kept_tokens is not None
            else min(n_tokens, math.ceil(method.keep * n_tokens) + 1)
        )  # + the forced last token
        main = prefill_seconds(shape, rates, kept, full_dot_products(kept), width, step)
        queries = method.lookahead + 1
        scoring = _part(
            4 * spec.head_dim * spec.heads * queries * n_tokens * spec.layers,
            spec.kv_heads * spec.head_dim * n_tokens * width * spec.layers,
            rates.attention,
            rates,
        )
        parts = {
            "speculator": drafted["linear"] + drafted["attention"],
            "lookahead": method.lookahead * decode_seconds(spec, rates, n_tokens, width),
            "scoring": scoring,
            "main_linear": main["linear"],
            "main_attention": main["attention"],
        }
    else:
        raise ValueError(f"unknown method {method.name!r} (full, h2o, specprefill)")
    return {**parts, "ttft": sum(parts.values())}


def predict_bench_rows(
    shape: Shape,
    rates: Rates,
    rows: list[dict],
    speculator: str,
    width: int,
    h2o: H2OConfig = H2OConfig(),
    lookahead: int = 8,
) -> list[dict]:
    """`specfill bench` rows (method, prompt_tokens, ttft_s, kept_tokens) with the formula's TTFT
    beside the measured one: {"method", "prompt_tokens", "measured_s", "predicted_s", "error"
    (predicted / measured - 1), "parts"}. SpecPrefill is priced with the row's kept tokens and a
    "self:K" speculator (the first K layers); a separate speculator model's rows are left out
    (its shape is not known here)."""
    layers = int(speculator[5:]) if speculator.startswith("self:") else None
    out = []
    for row in rows:
        if row["method"] == "specprefill" and layers is None:
            continue
        method = Method(
            row["method"],
            h2o=h2o,
            lookahead=lookahead,
            speculator=shape.first_layers(layers) if layers else None,
            kept_tokens=row["kept_tokens"] if row["method"] == "specprefill" else None,
        )
        parts = predict(shape, rates, row["prompt_tokens"], method, width=width)
        out.append(
            {
                "method": row["method"],
                "prompt_tokens": row["prompt_tokens"],
                "measured_s": row["ttft_s"],
                "predicted_s": parts["ttft"],
                "error": parts["ttft"] / row["ttft_s"] - 1,
                "parts": parts,
            }
        )
    return out
