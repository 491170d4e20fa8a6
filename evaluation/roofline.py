"""A roofline model of time to first token per method: what a GPU user should expect.

Every pass is priced as max(FLOPs / rate, bytes / bandwidth) per part: the linear layers (GEMMs
over the prompt's tokens; weights read once per prefill step), attention (4 * head_dim FLOPs per
visible query-key pair per head: QK^T and PV; K/V read once per 128-query block), a decode step
(weights + KV cache read once) and SpecPrefill's scoring (its n_q queries against every prompt
key). Methods: full (causal over every pair), H2O (core.methods.h2o.h2o_dot_products: causal
inside each chunk + one memory set per later chunk + the dense tail, in the layers
H2OConfig.layers names; the others full), SpecPrefill (the speculator's full prefill + look-ahead
decode + scoring, then the main model's prefill of the kept tokens) and the composition
(Method.speculator_h2o: the speculator's prompt pass priced as H2O, the rest as SpecPrefill).
Norms, RoPE, softmax element-wise work and kernel launch gaps are not priced, so on vendor peaks
the figures are lower bounds; the speed-ups vs full are ratios of such bounds. Every pass prices
its last layer over every row, where the backends' own models compute only the rows read
(core/ops.last_rows, since 2026-11-30): about 1 / n_layers of a pass (3% for an 8B) that the
measured side no longer does, in every method alike.

Peaks are vendor datasheet figures (DEVICES, sources in each entry); `Rates` measured on the
machine itself (evaluation/rates.py) make the same formula a prediction to check against bench.

Over N devices (`Parallel`, priced as mlx-lm's own sharded models run, backends/mlx/distributed.py):
tensor parallelism splits every layer's heads and MLP over the ranks and adds two all-reduces of
the step's hidden states per layer; pipeline parallelism runs the layers rank after rank (no
overlap: mlx-lm all-gathers each step's output) and adds the hand-offs. Communication is not
overlapped with compute (each collective is a dependency of the next layer). The speculator is
replicated (loaded without a group on every rank), so its pass is not split.
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
    "m3ultra": Rates(
        "Mac Studio M3 Ultra (80-core GPU)",
        28.6e12,
        28.6e12,
        819e9,
        "Apple Mac Studio (2025) announcement: M3 Ultra up to 80 GPU cores, 819 GB/s unified memory "
        "(techpowerup.com news, Ars Technica table: 819.2 GB/s); Apple publishes no TFLOPS: 80 cores x 128 "
        "ALUs x 2 FLOP x 1.398 GHz = 28.6 TFLOP/s FP16 = FP32 (no matrix units before M5), the per-core "
        "figure of hmc-tech.com's M3 GPU pages (10-core M3: 3.58 TFLOPS; 60-core M3 Ultra: 21.47)",
    ),
}


@dataclass(frozen=True)
class Link:
    """A device-to-device link: bytes/s each way and seconds of latency per message."""

    name: str
    bandwidth: float
    latency: float
    source: str


LINKS: dict[str, Link] = {
    "tb5": Link(
        "Thunderbolt 5, RDMA (MLX JACCL)",
        10e9,
        50e-6,
        "Intel Thunderbolt 5 announcement (Sept. 2023): 80 Gb/s bidirectional = 10 GB/s each way (the "
        "120 Gb/s Bandwidth Boost is one-way, for displays); latency < 50 us with RDMA over Thunderbolt "
        "(macOS 26.2, Apple TN3205; measured by Jeff Geerling on four M3 Ultra Mac Studios, Dec. 2025; "
        "exo reports ~3 us: 50 us is the cautious figure); MLX docs: JACCL is MLX's RDMA-over-Thunderbolt "
        "back-end, 'necessary for things like tensor parallelism'",
    ),
}


@dataclass(frozen=True)
class Parallel:
    """A model sharded over `ranks` devices joined by `link`: kind "tensor" (mlx-lm's Model.shard:
    each rank a 1/ranks share of the heads and MLP, o_proj and down_proj all-sum) or "pipeline"
    (Model.model.pipeline: each rank a run of layers; mlx-lm hands the hidden state on and
    all-gathers the last one every step, so the ranks do not overlap)."""

    kind: str
    ranks: int
    link: Link

    def __post_init__(self) -> None:
        if self.kind not in ("tensor", "pipeline") or self.ranks < 1:
            raise ValueError(f"parallel kind {self.kind!r} over {self.ranks} ranks (tensor or pipeline, >= 1 rank)")


def all_reduce_seconds(nbytes: float, ranks: int, link: Link) -> float:
    """A ring all-reduce (reduce-scatter + all-gather) of nbytes: 2 (ranks - 1) messages of
    nbytes / ranks each, one after another on every rank."""
    return 0.0 if ranks == 1 else 2 * (ranks - 1) * (nbytes / ranks / link.bandwidth + link.latency)


def all_gather_seconds(nbytes: float, ranks: int, link: Link) -> float:
    """A ring all-gather of nbytes from each rank: ranks - 1 messages of nbytes."""
    return (ranks - 1) * (nbytes / link.bandwidth + link.latency)


def communication_seconds(shape: Shape, n_tokens: int, width: int, parallel: Parallel, step: int = 2048) -> float:
    """Seconds in collectives of a sharded prefill of n_tokens in steps of `step` tokens: tensor,
    two all-reduces of the step's hidden states per layer; pipeline, ranks - 1 hand-offs of them
    and mlx-lm's all-gather of the last rank's output, every step. Not overlapped with compute."""
    if parallel.ranks == 1:
        return 0.0
    total, link, ranks = 0.0, parallel.link, parallel.ranks
    for start in range(0, n_tokens, step):
        hidden = min(step, n_tokens - start) * shape.hidden * width
        if parallel.kind == "tensor":
            total += 2 * shape.layers * all_reduce_seconds(hidden, ranks, link)
        else:
            total += (ranks - 1) * (hidden / link.bandwidth + link.latency) + all_gather_seconds(hidden, ranks, link)
    return total


KV_BLOCK = 128  # queries that share one read of their keys / values (a flash-attention tile)


def _part(flops: float, nbytes: float, rate: float, rates: Rates) -> float:
    return max(flops / rate, nbytes / rates.bandwidth)


def prefill_seconds(
    shape: Shape,
    rates: Rates,
    n_tokens: int,
    pairs: float,
    width: int,
    step: int = 2048,
    logits: bool = True,
    parallel: Parallel | None = None,
) -> dict[str, float]:
    """{"linear", "attention"} seconds of prefilling n_tokens whose attention visits `pairs`
    query-key pairs per head per layer, weights and cache `width` bytes per value; sharded over
    `parallel` (one rank's share of the work, the ranks in step) with "communication" added."""
    if n_tokens == 0:
        return {"linear": 0.0, "attention": 0.0, **({"communication": 0.0} if parallel else {})}
    split = parallel.ranks if parallel is not None and parallel.kind == "tensor" else 1
    if split > 1 and (shape.heads % split or shape.kv_heads % split):
        raise ValueError(f"{shape.name}: {shape.heads} / {shape.kv_heads} heads do not split over {split} ranks")
    weights = shape.layer_params() * shape.layers * width / split
    linear = _part(
        2 * n_tokens * shape.layer_params() * shape.layers / split,
        weights * math.ceil(n_tokens / step),
        rates.gemm,
        rates,
    )
    if logits:  # the last token's logits only (mlx-lm's shard leaves lm_head whole on every rank)
        linear += _part(2 * shape.hidden * shape.vocab, shape.hidden * shape.vocab * width, rates.gemm, rates)
    kv_reads = 2 * shape.kv_heads * shape.head_dim * width * pairs / KV_BLOCK * shape.layers / split
    attention = _part(4 * shape.head_dim * shape.heads * pairs * shape.layers / split, kv_reads, rates.attention, rates)
    parts = {"linear": linear, "attention": attention}
    if parallel is not None:
        parts["communication"] = communication_seconds(shape, n_tokens, width, parallel, step)
    return parts


def dense_pairs(n_tokens: int, prefix: int = 0) -> int:
    """Query-key pairs per head of prefilling n_tokens causally after `prefix` cached tokens
    (a reused prefix: every new query also reads every prefix key)."""
    return n_tokens * prefix + full_dot_products(n_tokens)


def h2o_pairs(n_tokens: int, config: H2OConfig, n_layers: int, prefix: int = 0) -> float:
    """Query-key pairs per head, averaged over the n_layers layers, of an H2O prefill of n_tokens
    (after `prefix` reused tokens: H2O from a reused prefix, docs/methods.md): the layers
    config.layers names visit h2o_dot_products' pairs (memory_share resolved for the whole prompt)
    plus, after a prefix, the first chunk's and the dense tail's reads of every prefix key (the
    first memory set is the whole prefix); the others every causal pair; a new part within one
    chunk, or a memory of 0, is full."""
    config = config.for_prompt(prefix + n_tokens)
    full = dense_pairs(n_tokens, prefix)
    if n_tokens <= config.chunk_size or config.memory_size == 0:
        return float(full)
    sparse = h2o_dot_products(n_tokens, config.chunk_size, config.memory_size, config.dense_tail)
    sparse += (config.chunk_size + min(config.dense_tail, n_tokens)) * prefix
    chosen = len(config.layer_indices(n_layers))
    return (chosen * sparse + (n_layers - chosen) * full) / n_layers


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
    kept_tokens: the main model's prefill length when it is known, as in a bench row;
    speculator_h2o: the composition, the speculator's prompt pass run as H2O with this config)."""

    name: str
    h2o: H2OConfig = H2OConfig()
    speculator: Shape | None = None
    keep: float = 0.1
    lookahead: int = 8
    kept_tokens: int | None = None
    speculator_h2o: H2OConfig | None = None


def predict(
    shape: Shape,
    rates: Rates,
    n_tokens: int,
    method: Method,
    width: int = 2,
    step: int = 2048,
    parallel: Parallel | None = None,
    prefix: int = 0,
) -> dict[str, float]:
    """Seconds per part and "ttft" (their sum) of one method on one prompt length; with `parallel`,
    the main model sharded (the speculator replicated on every rank, run whole). prefix: a reused
    prefix's tokens (an agent's next turn, docs/methods.md): n_tokens is the new part, every model
    (the speculator too, from its own cached KV) prefills only it over the prefix, SpecPrefill keeps
    a share of the new part, its scoring and look-ahead read the whole prompt."""
    if method.name == "full":
        parts = prefill_seconds(shape, rates, n_tokens, dense_pairs(n_tokens, prefix), width, step, parallel=parallel)
    elif method.name == "h2o":
        pairs = h2o_pairs(n_tokens, method.h2o, shape.layers, prefix)
        parts = prefill_seconds(shape, rates, n_tokens, pairs, width, step, parallel=parallel)
    elif method.name == "specprefill":
        spec = method.speculator or shape
        if method.speculator is None and parallel is not None and parallel.ranks > 1:
            raise ValueError("a sharded main model needs a separate speculator (self:K is refused there)")
        spec_pairs = (
            dense_pairs(n_tokens, prefix)
            if method.speculator_h2o is None
            else h2o_pairs(n_tokens, method.speculator_h2o, spec.layers, prefix)
        )
        drafted = prefill_seconds(spec, rates, n_tokens, spec_pairs, width, step)
        kept = (
            method.kept_tokens
            if method.kept_tokens is not None
            else min(n_tokens, math.ceil(method.keep * n_tokens) + 1)
        )  # + the forced last token
        main = prefill_seconds(shape, rates, kept, dense_pairs(kept, prefix), width, step, parallel=parallel)
        queries, keys = method.lookahead + 1, prefix + n_tokens
        scoring = _part(
            4 * spec.head_dim * spec.heads * queries * keys * spec.layers,
            spec.kv_heads * spec.head_dim * keys * width * spec.layers,
            rates.attention,
            rates,
        )
        parts = {
            "speculator": drafted["linear"] + drafted["attention"],
            "lookahead": method.lookahead * decode_seconds(spec, rates, keys, width),
            "scoring": scoring,
            "main_linear": main["linear"],
            "main_attention": main["attention"],
        }
        if parallel is not None:
            parts["communication"] = main["communication"]
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
