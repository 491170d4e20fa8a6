"""Llama / Mistral / Qwen2 / Qwen3 / Gemma 3 decoder on MLX in small modules (mlx-lm style), batch 1.

Our own modules rather than mlx-lm's model classes: the prefill methods need two things those
classes do not expose. H2O replaces each layer's prefill attention with its two-phase chunked
mode (a `PrefillAttention` passed down to every layer; projection, attention and output are
also callable one by one), and speculative prefill feeds explicit non-contiguous per-token
positions while cache slots stay contiguous (mlx-lm derives the position from `cache.offset`)
and runs only the first K layers as its "self:K" speculator. Parameter names follow Hugging
Face (and so mlx-lm), so the same weight dictionaries load into either.

Family differences come from ModelArgs: which projections carry a bias (`biased_projections`:
q/k/v for Qwen2, q/k/v/o for Llama and Qwen3 with `attention_bias`), RMSNorm per head on q and k
before RoPE (Qwen3, Gemma 3), each layer's sliding window and RoPE base (`layer_window`,
`local_rope`: Mistral, Gemma 3), and Gemma 3's scaled embeddings, norms after attention and
around the MLP (`sandwich_norms`) and GELU-tanh MLP.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specfill.core.models import ModelArgs
from specfill.core.ops import PrefillAttention, checkpoint, installed, last_rows

from .cache import LayerKVCache
from .rope import Positions, RoPE

# One layer's attention of a step: (q [1, H, T, D], every cached k/v [1, Hkv, S, D]) -> [1, H, T, D]
LayerAttention = Callable[[mx.array, mx.array, mx.array], mx.array]
LAYERWISE_MIN_TOKENS = 32  # steps this long (prefill steps) are evaluated layer by layer under a cancel check


def layer_boundary(h: mx.array) -> None:
    """Before a layer, with hidden states h [1, T, hidden]: a cancelled request stops here
    (core/ops.py `checkpoint`). MLX is lazy (the whole step's graph runs when the step is settled), so
    under an installed check a step of LAYERWISE_MIN_TOKENS or more is evaluated up to this layer
    first, and the check then sees the time the work took; decode and verify steps (a few tokens,
    milliseconds) keep their pipelined evaluation and are checked between tokens by the caller.
    Without a check (library, CLI) nothing is evaluated here: the graph stays whole."""
    if installed():
        if h.shape[1] >= LAYERWISE_MIN_TOKENS:
            mx.eval(h)
        checkpoint()


def causal_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float) -> mx.array:
    """q [1, H, T, D] against k/v [1, Hkv, S, D] (S >= T, the queries are the last T slots);
    grouped-query heads are handled by the kernel. Returns [1, H, T, D]."""
    mask = "causal" if queries.shape[2] > 1 else None
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)


def windowed_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    window: int,
    q_positions: np.ndarray,
    key_positions: np.ndarray,
) -> mx.array:
    """Causal attention inside a sliding window: query t (position q_positions[t], [T], host)
    sees the cached slot s (position key_positions[s], [S], host) iff 0 <= q_pos - k_pos < window.
    Positions, not slots: speculative prefill keeps tokens at their original positions in
    consecutive slots. Where the window covers every pair it is plain causal attention."""
    if int(q_positions.max()) - int(key_positions.min()) < window:
        return causal_attention(queries, keys, values, scale)
    distance = mx.array(q_positions[:, None] - key_positions[None, :])  # [T, S]
    mask = (distance >= 0) & (distance < window)
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)


TERMS_QUERY_BLOCK = 256  # query rows per block of `terms_attention`: its logits stay [Hq, 256, S]


def terms_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    terms: Any,
    q_positions: np.ndarray,
    key_positions: np.ndarray,
    window: int | None = None,
) -> mx.array:
    """Attention of a layer with terms (core/stages.AttentionTerms: a logit soft-cap, per-head
    sinks), which mx.fast's kernel does not take together: q [1, Hq, T, D] against k/v
    [1, Hkv, S, D]; query t (position q_positions[t], host) sees slot s (key_positions[s]) iff
    0 <= q_pos - k_pos (< window). Explicit float32 logits per block of query rows, scaled,
    soft-capped, masked, each row's sink in the softmax's denominator (gpt_oss, gemma2 as mlx-lm
    computes them). Returns [1, Hq, T, D] in q's dtype."""
    from .kernels.state import sink_weights, soft_cap

    _, n_heads, steps, dim = queries.shape
    n_kv = keys.shape[1]
    group = n_heads // n_kv
    keys_t, vals = keys[0].astype(mx.float32)[:, None].swapaxes(-1, -2), values[0].astype(mx.float32)[:, None]
    sinks = None if terms.sinks is None else terms.sinks.reshape(n_kv, group, 1)
    blocks = []
    for lo in range(0, steps, TERMS_QUERY_BLOCK):
        hi = min(lo + TERMS_QUERY_BLOCK, steps)
        q = queries[0, :, lo:hi].astype(mx.float32).reshape(n_kv, group, hi - lo, dim)
        logits = soft_cap((q @ keys_t) * scale, terms.softcap)  # [Hkv, G, rows, S]
        distance = mx.array(q_positions[lo:hi, None] - key_positions[None, :])
        visible = distance >= 0 if window is None else (distance >= 0) & (distance < window)
        logits = mx.where(visible, logits, -mx.inf)  # every row keeps its own slot
        weights = mx.softmax(logits, axis=-1) if sinks is None else sink_weights(logits, logits.max(axis=-1), sinks)
        blocks.append(weights @ vals)
    out = blocks[0] if len(blocks) == 1 else mx.concatenate(blocks, axis=2)
    return out.reshape(1, n_heads, steps, values.shape[-1]).astype(queries.dtype)  # Dv: latent attention's


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        dim, head_dim = args.hidden_size, args.head_dim
        self.n_heads, self.n_kv_heads = args.num_attention_heads, args.num_key_value_heads
        self.scale = args.attention_scale
        self.window = args.layer_window(layer)
        biased = args.biased_projections
        self.q_proj = nn.Linear(dim, self.n_heads * head_dim, bias="q_proj" in biased)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * head_dim, bias="k_proj" in biased)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * head_dim, bias="v_proj" in biased)
        self.o_proj = nn.Linear(self.n_heads * head_dim, dim, bias="o_proj" in biased)
        self.qk_norm = args.qk_norm
        if args.qk_norm:
            self.q_norm = nn.RMSNorm(head_dim, eps=args.rms_norm_eps)
            self.k_norm = nn.RMSNorm(head_dim, eps=args.rms_norm_eps)

    def project(self, x: mx.array, rope: RoPE, positions: Positions) -> tuple[mx.array, mx.array, mx.array]:
        """x [1, T, hidden] -> q [1, H, T, D], k and v [1, Hkv, T, D], RoPE applied to q, k."""
        _, steps, _ = x.shape
        q = self.q_proj(x).reshape(1, steps, self.n_heads, -1)
        k = self.k_proj(x).reshape(1, steps, self.n_kv_heads, -1)
        v = self.v_proj(x).reshape(1, steps, self.n_kv_heads, -1).swapaxes(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return rope(q, positions), rope(k, positions), v

    def output(self, attended: mx.array) -> mx.array:
        """[1, H, T, D] -> [1, T, hidden]."""
        _, _, steps, _ = attended.shape
        return self.o_proj(attended.swapaxes(1, 2).reshape(1, steps, -1))

    def __call__(
        self,
        x: mx.array,
        rope: RoPE,
        positions: Positions,
        cache: LayerKVCache | None,
        attend: LayerAttention | None = None,
        rows_from: int = 0,
    ) -> mx.array:
        """x [1, T, hidden] -> [1, T - rows_from, hidden]: every row's keys and values cached, the
        queries from row `rows_from` on attended (core/ops.last_rows); `attend` (H2O, the
        speculator's capture) replaces causal attention and applies the layer's window itself;
        without a cache the step's tokens are the whole sequence."""
        q, k, v = self.project(x, rope, positions)
        keys_at = step = None
        if self.window is not None:  # every step records its positions, whoever attends
            step = (
                np.arange(positions, positions + x.shape[1])
                if isinstance(positions, (int, np.integer))
                else np.array(positions)
            )
            keys_at = step
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
            keys_at = cache.slot_positions(step) if step is not None else None
        if rows_from:
            if rows_from == x.shape[1]:  # only the keys and values were wanted
                return mx.zeros((1, 0, x.shape[2]), dtype=x.dtype)
            q = q[:, :, rows_from:]
            step = None if step is None else step[rows_from:]
        if attend is not None:
            attended = attend(q, k, v)
        elif self.window is not None:
            attended = windowed_attention(q, k, v, self.scale, self.window, step, keys_at)
        else:
            attended = causal_attention(q, k, v, self.scale)
        return self.output(attended)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), or Gemma's GeGLU with GELU-tanh in place of silu."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.activation = nn.gelu_approx if args.mlp_activation == "gelu_tanh" else nn.silu
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))


class TransformerBlock(nn.Module):
    """Pre-norm residual block (HF names); with sandwich norms (Gemma 3) post_attention_layernorm
    normalises the attention output and pre/post_feedforward_layernorm wrap the MLP."""

    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.local_rope = args.local_rope(layer)
        self.sandwich = args.sandwich_norms
        self.self_attn = Attention(args, layer)
        self.mlp = MLP(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        if self.sandwich:
            self.pre_feedforward_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
            self.post_feedforward_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(
        self,
        x: mx.array,
        ropes: dict[bool, RoPE],
        positions: Positions,
        cache: LayerKVCache | None,
        attend: LayerAttention | None = None,
        rows_from: int = 0,
    ) -> mx.array:
        """ropes: the RoPE by `local_rope` (False: global, True: the sliding layers' base);
        rows_from: the output's first row (Attention.__call__), [1, T, hidden] -> [1, T - rows_from, hidden]."""
        out = self.self_attn(self.input_layernorm(x), ropes[self.local_rope], positions, cache, attend, rows_from)
        x = x[:, rows_from:]
        if not self.sandwich:
            h = x + out
            return h + self.mlp(self.post_attention_layernorm(h))
        h = x + self.post_attention_layernorm(out)
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Transformer(nn.Module):
    """Embedding, blocks and final norm: token ids -> normalised hidden states."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embedding_scale = args.embedding_scale
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [TransformerBlock(args, i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.rope = RoPE(args)
        self.rope_local = RoPE(args, local=True) if args.rope_local_theta is not None else self.rope

    def __call__(
        self,
        ids: mx.array,
        positions: Positions,
        cache: Sequence[LayerKVCache] | None,
        attend: PrefillAttention | None = None,
        n_layers: int | None = None,
        rows_from: int = 0,
    ) -> mx.array:
        """n_layers: run only the first n blocks (then the final norm): the "self:K" speculator.
        rows_from: the rows read afterwards (Model.hidden)."""
        return self.norm(self.blocks(self.embed(ids), positions, cache, attend, 0, n_layers, rows_from))

    def embed(self, ids: mx.array) -> mx.array:
        """ids [1, T] -> the first block's input [1, T, hidden]."""
        h = self.embed_tokens(ids)
        if self.embedding_scale is not None:  # rounded to the activation dtype, as HF does
            h = h * mx.array(self.embedding_scale, dtype=h.dtype)
        return h

    def blocks(
        self,
        h: mx.array,
        positions: Positions,
        cache: Sequence[LayerKVCache] | None,
        attend: PrefillAttention | None,
        first: int = 0,
        n_layers: int | None = None,
        rows_from: int = 0,
    ) -> mx.array:
        """Blocks first..n_layers - 1 (None: every block) over h, their input; the last computes
        only the rows read from rows_from on (0: every row): its output, before the final norm."""
        end = len(self.layers) if n_layers is None else n_layers
        caches = cache if cache is not None else [None] * len(self.layers)
        ropes = {False: self.rope, True: self.rope_local}
        steps, rows = h.shape[1], 0
        for index in range(first, end):
            layer, layer_cache = self.layers[index], caches[index]
            layer_boundary(h)
            if index == end - 1 and rows_from:  # its rows nothing reads are not computed
                filled = steps + (0 if layer_cache is None else layer_cache.offset)
                rows = last_rows(steps, rows_from, attend, index, filled)
            h = layer(h, ropes, positions, layer_cache, None if attend is None else partial(attend, index), rows)
        return h


class Model(nn.Module):
    """The causal LM: `hidden` runs the blocks, `logits` the LM head (only where needed)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Transformer(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    @property
    def layers(self) -> list[TransformerBlock]:
        return self.model.layers

    def hidden(
        self,
        ids: mx.array,
        positions: Positions = 0,
        cache: Sequence[LayerKVCache] | None = None,
        attend: PrefillAttention | None = None,
        n_layers: int | None = None,
        rows_from: int = 0,
    ) -> mx.array:
        """ids [1, T] at RoPE `positions` (first of consecutive ones, or [T]) appended to
        `cache` (None: no cache, the ids are the whole sequence) -> hidden [1, T - r, hidden] of
        rows r.. (r = 0 unless rows_from > 0: the rows from rows_from on are read, T none; the last
        block then computes rows from r = core/ops.last_rows, at most rows_from, past every row's
        keys and values). `attend` replaces causal attention; `n_layers` runs only the first blocks."""
        return self.model(ids, positions, cache, attend, n_layers, rows_from)

    def states(
        self, ids: mx.array, positions: Positions, cache: Sequence[LayerKVCache], attend=None, n_layers=None
    ) -> mx.array:
        """ids [1, T] through the first n_layers blocks (None: every one), every row: the last
        one's output [1, T, hidden] before the final norm (a nested speculator's deeper layers read
        it: core/methods/speculator_depth.py)."""
        return self.model.blocks(self.model.embed(ids), positions, cache, attend, 0, n_layers)

    def from_layer(
        self, first: int, h: mx.array, positions: Positions, cache: Sequence[LayerKVCache], attend=None, rows_from=0
    ) -> mx.array:
        """hidden as from block `first` on: h [1, T, hidden] is its input."""
        return self.model.norm(self.model.blocks(h, positions, cache, attend, first, None, rows_from))

    def logits(self, hidden: mx.array) -> mx.array:
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(hidden)
        return self.lm_head(hidden)

    def __call__(
        self, ids: mx.array, positions: Positions = 0, cache: Sequence[LayerKVCache] | None = None
    ) -> mx.array:
        """Logits [1, T, vocab] for every position."""
        return self.logits(self.hidden(ids, positions, cache))

    def first_layers(self, n_layers: int) -> LayerView:
        """This model's first n blocks with its embedding, final norm and LM head, all shared
        (no copies): the "self:K" speculator."""
        if not 1 <= n_layers <= len(self.layers):
            raise ValueError(f"first_layers takes 1..{len(self.layers)} layers, got {n_layers}")
        return LayerView(self, n_layers, replace(self.args, num_hidden_layers=n_layers))


@dataclass(frozen=True)
class LayerView:
    """A Model run through its first `n_layers` blocks only (same interface as Model)."""

    model: Model
    n_layers: int
    args: ModelArgs

    def hidden(self, ids: mx.array, positions: Positions = 0, cache=None, attend=None, rows_from: int = 0) -> mx.array:
        """Model.hidden through the first n_layers blocks."""
        return self.model.hidden(ids, positions, cache, attend, self.n_layers, rows_from)

    def states(self, ids: mx.array, positions: Positions, cache, attend=None) -> mx.array:
        """Model.states through the first n_layers blocks."""
        return self.model.states(ids, positions, cache, attend, self.n_layers)

    def logits(self, hidden: mx.array) -> mx.array:
        return self.model.logits(hidden)
