"""Helpers of the MLX model-level method tests: tiny models, greedy runs and NumPy oracles.

Tolerance: our model runs in float32 (MLX CPU), the NumPy reference in float64, so logits agree
to float32 rounding accumulated over two layers: observed max |diff| <= 5e-7 * max|logit| on
these models. `assert_logits_close` allows 1e-5 * max|logit| (20x margin). H2O's own effect on
the logits is ~0.4 * max|logit| here, and a decode at the wrong position moves them by more than
1e-2 * max|logit|, so the tolerance cannot hide either.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from specfill.backends.mlx import load
from specfill.backends.mlx.causal_lm import MLXCausalLM
from specfill.backends.mlx.model import Model
from specfill.core.config import H2OConfig
from specfill.core.models import ModelArgs
from specfill.core.reference import REFERENCE, h2o
from specfill.core.reference.model import ReferenceModel
from specfill.core.runtime import PrefillInfo, PrefillMethod, SamplingConfig
from specfill.core.weights import load_weights

RELATIVE_TOLERANCE = 1e-5


@dataclass
class Tiny:
    model: MLXCausalLM
    ref: ReferenceModel
    args: ModelArgs
    path: Path


def load_tiny(path: Path) -> Tiny:
    model, _ = load(path, dtype="float32", device="cpu")
    args, weights = load_weights(path)
    return Tiny(model, ReferenceModel(args, dict(weights)), args, path)


def variant(model: MLXCausalLM, *, n_layers: int | None = None, context: int | None = None,
            prefill_step_size: int | None = None) -> MLXCausalLM:
    """A model with `model`'s weights: its first n_layers blocks, another context length or
    prefill step (a separately loaded speculator in the tests)."""
    args = model.args
    args = replace(args, num_hidden_layers=n_layers or args.num_hidden_layers,
                   max_position_embeddings=context or args.max_position_embeddings)
    dropped = tuple(f"model.layers.{i}." for i in range(args.num_hidden_layers, model.args.num_hidden_layers))
    weights = [(name, w) for name, w in tree_flatten(model.model.parameters()) if not name.startswith(dropped)]
    built = Model(args)
    built.load_weights(weights, strict=True)
    mx.eval(built.parameters())
    return MLXCausalLM(built, device=model.device, quantized=False,
                       prefill_step_size=prefill_step_size or model.prefill_step_size)


def prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    """Random ids that avoid the special tokens 0..3 (bos / eos of the tiny vocabulary)."""
    return np.random.default_rng(seed).integers(4, vocab, size=n).tolist()


def greedy(model: Any, ids: Sequence[int], max_tokens: int, method: PrefillMethod = PrefillMethod(),
           info: PrefillInfo | None = None, stop_ids: frozenset[int] = frozenset(),
           progress: Any = None) -> list[int]:
    return list(model.generate_step(ids, max_tokens=max_tokens, sampling=SamplingConfig(), stop_ids=stop_ids,
                                    method=method, info=info if info is not None else PrefillInfo(),
                                    progress=progress))


def tolerance(want: np.ndarray) -> float:
    return RELATIVE_TOLERANCE * max(1.0, float(np.abs(want).max()))


def assert_logits_close(ours: Any, want: np.ndarray, what: str) -> None:
    ours = np.asarray(ours.astype(mx.float32) if isinstance(ours, mx.array) else ours)
    assert ours.shape == want.shape, f"{what}: shape {ours.shape} vs {want.shape}"
    err = float(np.abs(ours - want).max())
    assert err <= tolerance(want), f"{what}: max |diff| {err} > {tolerance(want)}"


def _decode_reference(ref: ReferenceModel, keys: list[np.ndarray], values: list[np.ndarray], token: int,
                      position: int) -> np.ndarray:
    """One decode step with full attention over every cached key; appends to keys/values."""
    hidden = ref.w["model.embed_tokens.weight"][[token]]
    for layer in range(ref.args.num_hidden_layers):
        q, k, v = ref.qkv(layer, hidden, np.array([position]))
        keys[layer] = np.concatenate([keys[layer], k], axis=1)
        values[layer] = np.concatenate([values[layer], v], axis=1)
        attn = h2o.inter_attention(q, keys[layer], values[layer], ref.scale).state.o  # no mask
        hidden = ref.finish_layer(layer, hidden, attn)
    return ref.logits(hidden)[-1]


def reference_h2o_greedy(ref: ReferenceModel, ids: list[int], config: H2OConfig, max_tokens: int) -> list[int]:
    """Greedy tokens after an H2O prefill done layer-major by the core's NumPy H2O layer, then
    full-attention decoding over every prompt position."""
    hidden = ref.w["model.embed_tokens.weight"][np.asarray(ids)]
    keys, values = [], []
    for layer in range(ref.args.num_hidden_layers):
        q, k, v = ref.qkv(layer, hidden, np.arange(len(ids)))
        keys.append(k)
        values.append(v)
        hidden = ref.finish_layer(layer, hidden, REFERENCE.attention_layer(q, k, v, config, ref.scale).output)
    tokens = [int(ref.logits(hidden[-1:])[-1].argmax())]
    while len(tokens) < max_tokens:
        logits = _decode_reference(ref, keys, values, tokens[-1], len(ids) + len(tokens) - 1)
        tokens.append(int(logits.argmax()))
    return tokens


def reference_speculator(ref: ReferenceModel, ids: list[int], n_layers: int, lookahead: int,
                         stop_ids: frozenset[int] = frozenset()) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The first `n_layers` of the reference model as speculator, recomputed from scratch for each
    look-ahead step: (queries [n_l, 1 + N', Hq, D], prompt keys [n_l, Hkv, P, D], fed tokens)."""
    fed: list[int] = []
    while True:
        seq = ids + fed
        hidden = ref.w["model.embed_tokens.weight"][np.asarray(seq)]
        qs, ks = [], []
        for layer in range(n_layers):
            q, k, v = ref.qkv(layer, hidden, np.arange(len(seq)))
            qs.append(q)
            ks.append(k)
            hidden = ref.finish_layer(layer, hidden, h2o.causal_attention(q, k, v, ref.scale).o)
        token = int(ref.logits(hidden[-1:])[-1].argmax())
        if len(fed) == lookahead or token in stop_ids:
            break
        fed.append(token)
    queries = np.stack([q[:, len(ids) - 1:].transpose(1, 0, 2) for q in qs])
    keys = np.stack([k[:, :len(ids)] for k in ks])
    return queries, keys, fed


def h2o_method(n_chunk: int, n_batch: int, local: int, heavy: int) -> PrefillMethod:
    return PrefillMethod("h2o", h2o=H2OConfig(chunk_size=n_chunk, batch_size=n_batch, local=local, heavy=heavy))
