"""A NumPy transformer forward (Llama / Mistral / Qwen2 / Qwen3 / Gemma 3), float64: the
model-level oracle.

`forward` is full causal attention at explicit position ids, inside each layer's sliding window
(a dense mask over positions: query p sees keys q with p - w < q <= p); `forward_h2o_chunk_major` walks the
prompt chunk by chunk through every layer (seed 001, Appendix A's order) using the core's H2O
stages, so a backend's layer-major H2O prefill can be checked against a schedule it does not
share. `speculator_pass` is SpecPrefill's speculator (the model's first layers), its prompt rows
dense or, composed, H2O (core/methods/specprefill.py's run_speculator, written independently:
recomputed from scratch for every look-ahead step). Slow and small-model only: for tests.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from ..config import H2OConfig
from ..models import ModelArgs
from ..rope import rope_inv_freq
from ..stages import KeyWindow, MemorySet
from . import h2o
from .attention import expand_kv_heads, masked_state, merge_states

# one layer's H2O output [Hq, P, D] from q [Hq, P, D], k / v [Hkv, P, D], config, scale, window
H2OLayer = Callable[[np.ndarray, np.ndarray, np.ndarray, H2OConfig, float, "int | None"], np.ndarray]


class NestedPass(NamedTuple):
    """ReferenceModel.nested_speculator_pass's result."""

    queries: np.ndarray  # [split, W + N', Hq, D]: the first layers' window and look-ahead queries
    keys: np.ndarray  # [split, Hkv, P, D]
    fed: list[int]
    subset: np.ndarray  # [S]: the prompt positions the deeper layers read
    deep_queries: np.ndarray  # [n - split, W + N', Hq, D]
    deep_keys: np.ndarray  # [n - split, Hkv, S, D]


class ReferenceModel:
    """Weights with Hugging Face names (as core.io.weights.load_weights returns them)."""

    def __init__(self, args: ModelArgs, weights: dict[str, np.ndarray]) -> None:
        self.args = args
        self.w = {name: np.asarray(value, dtype=np.float64) for name, value in weights.items()}
        self.inv_freq = {local: rope_inv_freq(args, local).astype(np.float64) for local in (False, True)}
        self.scale = args.attention_scale

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.args.rms_norm_eps) * self.w[name]

    def _rope(self, x: np.ndarray, positions: np.ndarray, local: bool) -> np.ndarray:
        """Half-split (rotate-half) RoPE on x [H, T, D] at the given per-token positions."""
        angles = positions[:, None].astype(np.float64) * self.inv_freq[local][None, :]
        cos, sin = np.cos(angles), np.sin(angles)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def qkv(self, layer: int, hidden: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, ...]:
        """Post-RoPE q [Hq, T, D], k/v [Hkv, T, D] of one layer for hidden [T, hidden]."""
        a, p = self.args, f"model.layers.{layer}.self_attn."
        x = self._norm(hidden, f"model.layers.{layer}.input_layernorm.weight")

        def project(name: str, heads: int) -> np.ndarray:
            y = x @ self.w[p + f"{name}_proj.weight"].T
            if f"{name}_proj" in a.biased_projections:
                y = y + self.w[p + f"{name}_proj.bias"]
            return y.reshape(len(x), heads, a.head_dim).transpose(1, 0, 2)

        q, k, v = (
            project("q", a.num_attention_heads),
            project("k", a.num_key_value_heads),
            project("v", a.num_key_value_heads),
        )
        if a.qk_norm:
            q, k = self._norm(q, p + "q_norm.weight"), self._norm(k, p + "k_norm.weight")
        local = a.local_rope(layer)
        return self._rope(q, positions, local), self._rope(k, positions, local), v

    def finish_layer(self, layer: int, hidden: np.ndarray, attn: np.ndarray) -> np.ndarray:
        """Residual, MLP and residual after the attention output attn [Hq, T, D]."""
        p = f"model.layers.{layer}."
        out = attn.transpose(1, 0, 2).reshape(len(hidden), -1) @ self.w[p + "self_attn.o_proj.weight"].T
        if "o_proj" in self.args.biased_projections:
            out = out + self.w[p + "self_attn.o_proj.bias"]
        sandwich = self.args.sandwich_norms  # Gemma 3 normalises both outputs before the residual
        hidden = hidden + (self._norm(out, p + "post_attention_layernorm.weight") if sandwich else out)
        x = self._norm(
            hidden, p + ("pre_feedforward_layernorm" if sandwich else "post_attention_layernorm") + ".weight"
        )
        gate, up = x @ self.w[p + "mlp.gate_proj.weight"].T, x @ self.w[p + "mlp.up_proj.weight"].T
        if self.args.mlp_activation == "gelu_tanh":
            act = 0.5 * gate * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (gate + 0.044715 * gate**3)))
        else:
            act = gate / (1.0 + np.exp(-gate))
        out = (act * up) @ self.w[p + "mlp.down_proj.weight"].T
        return hidden + (self._norm(out, p + "post_feedforward_layernorm.weight") if sandwich else out)

    def embed(self, ids: list[int]) -> np.ndarray:
        """hidden [T, hidden]: the embedding rows (times sqrt(hidden) for Gemma 3)."""
        hidden = self.w["model.embed_tokens.weight"][np.asarray(ids)]
        return hidden if self.args.embedding_scale is None else hidden * self.args.embedding_scale

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Dense attention [Hq, T, D] of q [Hq, T, D] over k/v [Hkv, T, D] of the same tokens at
        `positions` [T] (ascending): causal, inside the layer's window when it has one."""
        distance = positions[:, None] - positions[None, :]
        window = self.args.layer_window(layer)
        valid = (distance >= 0) & (distance < (window if window is not None else np.inf))
        logits = np.einsum("htd,hsd->hts", q, expand_kv_heads(k, q.shape[0])) * self.scale
        return masked_state(logits, valid[None], expand_kv_heads(v, q.shape[0]))[0].o

    def speculator_pass(
        self,
        ids: list[int],
        n_layers: int,
        lookahead: int,
        stop_ids: frozenset[int] = frozenset(),
        window: int = 1,
        h2o_config: H2OConfig | None = None,
        h2o_layer: H2OLayer | None = None,
        prefix: int = 0,
    ) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """The first `n_layers` layers as SpecPrefill's speculator: (queries [n_l, W + N', Hq, D] of
        the prompt's last `window` tokens and the fed look-ahead tokens, prompt keys [n_l, Hkv, P, D],
        fed tokens). With `h2o_config` the prompt's rows of every layer it names are H2O's output over
        the prompt alone (the composition): `h2o_layer(q, k, v, config, scale, window)` -> [Hq, P, D],
        by default the reference walk's (the oracle's: oracle.oracle_h2o_output; a backend's stages:
        the conformance check); the look-ahead rows attend to every key. prefix: the composition from
        the speculator's cached dense KV of the first `prefix` tokens (docs/methods.md, SpecPrefill from
        a reused prefix): those rows stay dense and the rest of the prompt's are H2O walked from them
        (the reference walk from a prefix, `attention_layer(..., prefix=P)`; not with `h2o_layer`)."""
        from . import REFERENCE  # the package's stages (it never imports this module back)

        if prefix and h2o_layer is not None:
            raise ValueError("speculator_pass from a prefix walks the reference H2O layer only (no h2o_layer)")
        layer_h2o = h2o_layer or (lambda q, k, v, c, scale, w: REFERENCE.attention_layer(q, k, v, c, scale, w).output)
        n_prompt, fed = len(ids), []
        sparse = () if h2o_config is None else h2o_config.layer_indices(n_layers)
        while True:
            seq = ids + fed
            hidden, qs, ks = self.embed(seq), [], []
            for layer in range(n_layers):
                positions = np.arange(len(seq))
                q, k, v = self.qkv(layer, hidden, positions)
                out = self.attend(layer, q, k, v, positions)
                if layer in sparse and prefix > 0:
                    p, sliding = slice(0, n_prompt), self.args.layer_window(layer)
                    walk = REFERENCE.attention_layer(
                        q[:, prefix:n_prompt], k[:, p], v[:, p], h2o_config, self.scale, sliding, prefix=prefix
                    )
                    out[:, prefix:n_prompt] = walk.output
                elif layer in sparse:
                    p = slice(0, n_prompt)
                    out[:, p] = layer_h2o(
                        q[:, p], k[:, p], v[:, p], h2o_config, self.scale, self.args.layer_window(layer)
                    )
                qs.append(q)
                ks.append(k)
                hidden = self.finish_layer(layer, hidden, out)
            token = int(self.logits(hidden[-1:])[-1].argmax())
            if len(fed) == lookahead or token in stop_ids:
                break
            fed.append(token)
        queries = np.stack([q[:, n_prompt - window :].transpose(1, 0, 2) for q in qs])
        return queries, np.stack([k[:, :n_prompt] for k in ks]), fed

    def nested_speculator_pass(
        self,
        ids: list[int],
        split: int,
        lookahead: int,
        subset_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
        stop_ids: frozenset[int] = frozenset(),
        window: int = 1,
        rank_window: int = 1,
        h2o_config: H2OConfig | None = None,
    ) -> NestedPass:
        """The nested speculator (core/methods/speculator_depth.py), naively: every step
        recomputes the sequence; layers < `split` over the prompt and the fed tokens, layers from
        `split` on over the subset's rows and the fed tokens (their original positions), where
        subset = subset_of(queries [split, rank_window, Hq, D] of the prompt's last rank_window
        tokens, prompt keys [split, Hkv, P, D]), chosen once from the prompt. With `h2o_config` the
        prompt's rows (layers < split) and the subset's rows (the deeper layers) of every layer it
        names are the reference walk's H2O output over those rows alone, as in speculator_pass.
        Returns speculator_pass's (queries of the first `split` layers, their keys, fed tokens), the
        subset, and the deeper layers' queries [n - split, window + N', Hq, D] (the subset's last
        `window` rows, then the fed tokens') and keys over the subset [n - split, Hkv, S, D]."""
        from . import REFERENCE  # the package's stages (it never imports this module back)

        sparse = () if h2o_config is None else h2o_config.layer_indices(self.args.num_hidden_layers)

        def attend(layer: int, q, k, v, positions: np.ndarray, rows: int) -> np.ndarray:
            out = self.attend(layer, q, k, v, positions)
            if layer in sparse:  # the first `rows` rows walked by H2O over themselves
                p, sliding = slice(0, rows), self.args.layer_window(layer)
                out[:, p] = REFERENCE.attention_layer(q[:, p], k[:, p], v[:, p], h2o_config, self.scale, sliding).output
            return out

        n_prompt, fed, subset = len(ids), [], None
        while True:
            seq = ids + fed
            hidden, qs, ks, positions = self.embed(seq), [], [], np.arange(len(seq))
            for layer in range(split):
                q, k, v = self.qkv(layer, hidden, positions)
                qs.append(q)
                ks.append(k)
                hidden = self.finish_layer(layer, hidden, attend(layer, q, k, v, positions, n_prompt))
            if subset is None:
                ranking = np.stack([q[:, n_prompt - rank_window : n_prompt].transpose(1, 0, 2) for q in qs])
                subset = np.asarray(subset_of(ranking, np.stack([k[:, :n_prompt] for k in ks])), np.int64)
            rows = np.concatenate([subset, np.arange(n_prompt, len(seq))])
            deep, deep_qs, deep_ks = hidden[rows], [], []
            for layer in range(split, self.args.num_hidden_layers):
                q, k, v = self.qkv(layer, deep, rows)
                deep_qs.append(q)
                deep_ks.append(k)
                deep = self.finish_layer(layer, deep, attend(layer, q, k, v, rows, len(subset)))
            token = int(self.logits(deep[-1:])[-1].argmax())
            if len(fed) == lookahead or token in stop_ids:
                break
            fed.append(token)
        queries = np.stack([q[:, n_prompt - window :].transpose(1, 0, 2) for q in qs])
        n_sub = len(subset)
        return NestedPass(
            queries,
            np.stack([k[:, :n_prompt] for k in ks]),
            fed,
            subset,
            np.stack([q[:, n_sub - window :].transpose(1, 0, 2) for q in deep_qs]),
            np.stack([k[:, :n_sub] for k in deep_ks]),
        )

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        return self._norm(hidden, "model.norm.weight") @ head.T

    def forward(self, ids: list[int], positions: list[int] | None = None) -> np.ndarray:
        """Logits [T, vocab] with full causal attention (positions default to 0..T-1, else
        ascending), windowed on sliding layers."""
        pos = np.arange(len(ids)) if positions is None else np.asarray(positions)
        hidden = self.embed(ids)
        for layer in range(self.args.num_hidden_layers):
            q, k, v = self.qkv(layer, hidden, pos)
            hidden = self.finish_layer(layer, hidden, self.attend(layer, q, k, v, pos))
        return self.logits(hidden)

    def _dense_tail(
        self,
        q: np.ndarray,
        keys: np.ndarray,
        values: np.ndarray,
        start: int,
        tail_start: int,
        window: int | None = None,
    ) -> np.ndarray | None:
        """Outputs [Hq, rows, D] of the chunk's queries q (positions start..) at positions >=
        tail_start, causal over every key so far (keys/values [Hkv, start + T, D]); None if none."""
        first = max(start, tail_start)
        if first >= start + q.shape[1]:
            return None
        padded = np.concatenate([np.zeros((q.shape[0], first, q.shape[2])), q[:, first - start :]], axis=1)
        return h2o.causal_attention(padded, keys, values, self.scale, window).o[:, first:]

    def forward_h2o_chunk_major(self, ids: list[int], config: H2OConfig) -> tuple[np.ndarray, list[list[MemorySet]]]:
        """Logits [T, vocab] of H2O prefill computed chunk by chunk through all layers (sliding
        layers inside their windows; layers outside config.layers, never holding a memory set,
        attend causally to everything so far), and the memory sets built per layer ([layer][chunk])."""
        config = config.for_prompt(len(ids))  # a memory_share becomes L and H for this prompt
        n_layers, size = self.args.num_hidden_layers, config.chunk_size
        sparse = set(config.layer_indices(n_layers))
        keys = [np.zeros((self.args.num_key_value_heads, 0, self.args.head_dim)) for _ in range(n_layers)]
        values = [k.copy() for k in keys]
        scores = [np.zeros((self.args.num_key_value_heads, 0)) for _ in range(n_layers)]
        memory: list[MemorySet | None] = [None] * n_layers
        built: list[list[MemorySet]] = [[] for _ in range(n_layers)]
        out = []
        for start in range(0, len(ids), size):
            end = min(start + size, len(ids))
            hidden = self.embed(ids[start:end])
            for layer in range(n_layers):
                window = self.args.layer_window(layer)  # every key set below intersected with it
                q, k, v = self.qkv(layer, hidden, np.arange(start, end))
                keys[layer] = np.concatenate([keys[layer], k], axis=1)
                values[layer] = np.concatenate([values[layer], v], axis=1)
                intra = h2o.intra_attention(q, k, v, size, self.scale, window)
                scores[layer] = np.concatenate(
                    [scores[layer], h2o.reduce_colsum_to_kv_heads(intra.colsum, k.shape[0])], axis=1
                )
                state = intra.state
                if memory[layer] is not None and config.enabled:
                    k_mem, v_mem = h2o.gather_memory(keys[layer], values[layer], memory[layer])
                    inter = h2o.inter_attention(
                        q,
                        k_mem,
                        v_mem,
                        self.scale,
                        None if window is None else KeyWindow(window, start, memory[layer].indices),
                    )
                    scores[layer] = h2o.accumulate_scores(
                        scores[layer], memory[layer], h2o.reduce_colsum_to_kv_heads(inter.colsum, k.shape[0])
                    )
                    state = merge_states(inter.state, state)
                elif start > 0:  # H2O disabled: plain causal attention over everything so far
                    state = h2o.causal_attention(
                        np.concatenate([np.zeros((q.shape[0], start, q.shape[2])), q], 1),
                        keys[layer],
                        values[layer],
                        self.scale,
                        window,
                    )
                    state = type(state)(state.m[:, start:], state.l[:, start:], state.o[:, start:])
                tail = self._dense_tail(q, keys[layer], values[layer], start, len(ids) - config.dense_tail, window)
                if tail is not None and config.enabled:
                    state = type(state)(
                        state.m, state.l, np.concatenate([state.o[:, : state.o.shape[1] - tail.shape[1]], tail], 1)
                    )
                hidden = self.finish_layer(layer, hidden, state.o)
                if end < len(ids) and config.enabled and layer in sparse:  # a dense layer keeps no memory
                    memory[layer] = h2o.build_memory_set(
                        scores[layer], memory[layer], start // size, start, end, config.local, config.heavy
                    )
                    built[layer].append(memory[layer])
            out.append(self.logits(hidden))
        return np.concatenate(out, axis=0), built
