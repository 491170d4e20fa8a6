"""The cases every backend is checked on: small shapes that reach every edge of the spec."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from specfill.core import H2OConfig, SpecfillWarning, SpecPrefillConfig
from specfill.core.stages import AttentionTerms, query_start

CHUNK = 8  # S for the H2O cases: small, so N in {1, S-1, S, S+1, 2S-1, 3S+17} stays cheap
HEAD_DIM = 16


@dataclass(frozen=True)
class H2OCase:
    name: str
    n_tokens: int
    local: int = 2  # L, H and the heads: a case names only those it changes
    heavy: int = 3
    n_heads: int = 4
    n_kv_heads: int = 2
    batch_size: int = 4 * CHUNK
    logit_max: float | None = None  # rescale q so that max |logit| equals this
    seed: int = 0
    dense_tail: int = 0  # W: the last W queries attend to every earlier key
    window: int | None = None  # a sliding layer's w: query i sees keys j > i - w only
    memory_share: float | None = None  # L + H as a share of the prompt (resolved per prompt)
    sink_scale: float | None = None  # a layer with attention sinks: sinks [Hq] ~ N(0, sink_scale^2)
    softcap: float | None = None  # a layer with a logit soft-cap
    value_dim: int | None = None  # latent attention: values of their own (narrower) head dim
    prefix: int = 0  # P: the first P keys are a reused prefix; the walk runs over the new part only

    @property
    def terms(self) -> AttentionTerms | None:
        """The case's attention terms (sinks as float64 NumPy [Hq]), None for a plain layer."""
        return case_terms(self.n_heads, self.sink_scale, self.softcap, self.seed)

    @property
    def term_args(self) -> tuple:
        """The stages' trailing terms argument: nothing for a plain layer (today's calls)."""
        return () if self.terms is None else (self.terms,)

    @property
    def config(self) -> H2OConfig:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SpecfillWarning)  # the clamped case is on purpose
            return H2OConfig(
                CHUNK,
                self.batch_size,
                self.local,
                self.heavy,
                dense_tail=self.dense_tail,
                memory_share=self.memory_share,
            )

    def tensors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q [Hq, N, D], k [Hkv, N, D], v [Hkv, N, Dv] in float64 (Dv = D but for latent attention)."""
        rng = np.random.default_rng(self.seed)
        q = rng.normal(size=(self.n_heads, self.n_tokens, HEAD_DIM))
        k = rng.normal(size=(self.n_kv_heads, self.n_tokens, HEAD_DIM))
        v = rng.normal(size=(self.n_kv_heads, self.n_tokens, self.value_dim or HEAD_DIM))
        if self.logit_max is not None:
            group = self.n_heads // self.n_kv_heads
            logits = np.einsum("hnd,hmd->hnm", q, np.repeat(k, group, axis=0)) * SCALE
            q = q * (self.logit_max / np.abs(logits).max())
        return q, k, v


SCALE = 1.0 / np.sqrt(HEAD_DIM)


def case_terms(n_heads: int, sink_scale: float | None, softcap: float | None, seed: int) -> AttentionTerms | None:
    """Seeded attention terms of a case: sinks [Hq] ~ N(0, sink_scale^2) (float64), the soft-cap."""
    if sink_scale is None and softcap is None:
        return None
    sinks = None if sink_scale is None else np.random.default_rng(1000 + seed).normal(size=n_heads) * sink_scale
    return AttentionTerms(sinks, softcap)


H2O_CASES: list[H2OCase] = [
    *[H2OCase(f"N={n}", n, seed=n) for n in (1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 1, 3 * CHUNK + 17)],
    *[H2OCase(f"gqa-group={g}", 3 * CHUNK + 5, n_heads=2 * g, seed=10 + g) for g in (1, 2, 3, 4, 8)],
    H2OCase("L=0", 3 * CHUNK + 3, local=0, heavy=4, seed=21),
    H2OCase("H=0", 3 * CHUNK + 3, local=4, heavy=0, seed=22),
    H2OCase("L+H>=S-clamped", 3 * CHUNK + 3, local=6, heavy=6, seed=23),
    H2OCase("logits=+-100", 3 * CHUNK + 17, logit_max=100.0, seed=24),
    H2OCase("batch=S", 4 * CHUNK + 3, batch_size=CHUNK, seed=25),
    H2OCase("batch=2S", 4 * CHUNK + 3, batch_size=2 * CHUNK, seed=25),
    # the dense tail: W = 0 is every case above; inside the last chunk, spanning chunks (and, with
    # B = S, logical batches), the whole prompt (W >= N), and a prompt of one chunk
    H2OCase("tail=3 (in last chunk)", 3 * CHUNK + 5, dense_tail=3, seed=26),
    H2OCase("tail=S+6 (spans chunks)", 3 * CHUNK + 3, dense_tail=CHUNK + 6, seed=27),
    H2OCase("tail=2S+1,batch=S", 4 * CHUNK + 3, batch_size=CHUNK, dense_tail=2 * CHUNK + 1, seed=28),
    H2OCase("tail>=N", 2 * CHUNK + 3, n_heads=6, dense_tail=10 * CHUNK, seed=29),
    H2OCase("tail=2,N<S", CHUNK - 3, dense_tail=2, seed=30),
    # a sliding layer: a window inside a chunk (w < S), one spanning chunks (so memory slots fall
    # in and out of it), one with a dense tail over logical batches of S, one of a single key (w = 1)
    H2OCase("window=5 (<S)", 3 * CHUNK + 5, window=5, seed=31),
    H2OCase("window=S+5 (spans chunks)", 4 * CHUNK + 3, heavy=4, window=CHUNK + 5, seed=32),
    H2OCase(
        "window=S+2,tail=S+6,batch=S",
        4 * CHUNK + 3,
        n_heads=6,
        batch_size=CHUNK,
        dense_tail=CHUNK + 6,
        window=CHUNK + 2,
        seed=33,
    ),
    H2OCase("window=1", 2 * CHUNK + 3, window=1, seed=34),
    # memory as a share of the prompt: 0.1 of 41 tokens -> L + H = 4 in the 2:3 proportion (2, 2);
    # 0.5 of 35 -> clamped to S - 1 = 7
    H2OCase("memory-share=0.1", 5 * CHUNK + 1, memory_share=0.1, seed=35),
    H2OCase("memory-share=0.5 (clamped)", 4 * CHUNK + 3, memory_share=0.5, dense_tail=3, seed=36),
    # attention terms (gpt_oss's sinks, gemma2's logit soft-cap): sinks of either sign and one
    # close to the logits (so the sink holds a real share), sinks and logits at +-100 (no NaN/Inf),
    # a soft-cap that binds (logits +-100 capped to +-5), both with a window and a dense tail
    H2OCase("sinks", 3 * CHUNK + 5, sink_scale=2.0, seed=37),
    H2OCase("sinks,gqa-group=3,batch=S", 4 * CHUNK + 3, n_heads=6, batch_size=CHUNK, sink_scale=1.0, seed=38),
    H2OCase("sinks=+-100,logits=+-100", 3 * CHUNK + 17, logit_max=100.0, sink_scale=60.0, seed=39),
    H2OCase("softcap=5,logits=+-100", 3 * CHUNK + 17, logit_max=100.0, softcap=5.0, seed=40),
    H2OCase("softcap=1.5", 3 * CHUNK + 5, softcap=1.5, seed=41),
    H2OCase(
        "sinks+softcap,window=S+2,tail=S+6",
        4 * CHUNK + 3,
        dense_tail=CHUNK + 6,
        window=CHUNK + 2,
        sink_scale=2.0,
        softcap=3.0,
        seed=42,
    ),
    H2OCase("sinks,window=1", 2 * CHUNK + 3, window=1, sink_scale=2.0, seed=43),
    H2OCase("sinks+softcap,N<S", CHUNK - 2, sink_scale=2.0, softcap=2.0, seed=44),
    # latent attention (deepseek_v3, kimi_k25): values narrower than keys, alone, with GQA, logical
    # batches of S, a window and a dense tail, and with attention terms
    H2OCase("latent,Dv=D/2", 3 * CHUNK + 5, value_dim=HEAD_DIM // 2, seed=45),
    H2OCase(
        "latent,Dv=D/2,gqa-group=3,window=S+2,tail=S+6,batch=S",
        4 * CHUNK + 3,
        n_heads=6,
        batch_size=CHUNK,
        dense_tail=CHUNK + 6,
        window=CHUNK + 2,
        value_dim=HEAD_DIM // 2,
        seed=46,
    ),
    H2OCase("latent,Dv=D/2,sinks+softcap", 3 * CHUNK + 5, sink_scale=2.0, softcap=3.0, value_dim=4, seed=47),
]

# H2O from a reused prefix (docs/methods.md): n_tokens counts the prefix; the new part is walked on
# its own grid from P, its first chunk reading the whole prefix. P off and on the S grid, a new
# part of one chunk (full attention), several logical batches, dense tails reaching into the first
# new chunk, windows shorter and longer than S (hiding part of the prefix), terms, latent values,
# a memory share, L or H zero, large logits
H2O_PREFIX_CASES: list[H2OCase] = [
    H2OCase("prefix=11,new=3S+5", 11 + 3 * CHUNK + 5, seed=60, prefix=11),
    H2OCase("prefix=S,new=2S", 3 * CHUNK, seed=61, prefix=CHUNK),
    H2OCase("prefix=1,new=2S+1", 2 * CHUNK + 2, seed=62, prefix=1),
    H2OCase("prefix=3S+1,new=2S+3", 5 * CHUNK + 4, seed=63, prefix=3 * CHUNK + 1),
    H2OCase("prefix=9,new=S-2 (full)", 9 + CHUNK - 2, seed=64, prefix=9),
    H2OCase("prefix=9,new=S (full)", 9 + CHUNK, seed=65, prefix=9),
    H2OCase("prefix=13,gqa-group=3,batch=S", 13 + 4 * CHUNK + 3, n_heads=6, batch_size=CHUNK, seed=66, prefix=13),
    H2OCase("prefix=13,batch=2S", 13 + 4 * CHUNK + 3, batch_size=2 * CHUNK, seed=66, prefix=13),
    H2OCase("prefix=10,tail=3", 10 + 3 * CHUNK + 5, dense_tail=3, seed=67, prefix=10),
    H2OCase(
        "prefix=10,tail=2S+1,batch=S",
        10 + 3 * CHUNK + 3,
        batch_size=CHUNK,
        dense_tail=2 * CHUNK + 1,
        seed=68,
        prefix=10,
    ),
    H2OCase("prefix=10,tail>=new", 10 + 2 * CHUNK + 3, dense_tail=10 * CHUNK, seed=69, prefix=10),
    H2OCase("prefix=12,window=5", 12 + 3 * CHUNK + 5, window=5, seed=70, prefix=12),
    H2OCase("prefix=20,window=S+5", 20 + 3 * CHUNK + 3, heavy=4, window=CHUNK + 5, seed=71, prefix=20),
    H2OCase("prefix=7,L=0", 7 + 3 * CHUNK + 3, local=0, heavy=4, seed=72, prefix=7),
    H2OCase("prefix=7,H=0", 7 + 3 * CHUNK + 3, local=4, heavy=0, seed=73, prefix=7),
    H2OCase("prefix=7,L+H=0 (full)", 7 + 3 * CHUNK + 3, local=0, heavy=0, seed=74, prefix=7),
    H2OCase("prefix=9,memory-share=0.1", 9 + 4 * CHUNK + 1, memory_share=0.1, seed=75, prefix=9),
    H2OCase("prefix=9,logits=+-100", 9 + 3 * CHUNK + 5, logit_max=100.0, seed=76, prefix=9),
    H2OCase("prefix=9,sinks", 9 + 3 * CHUNK + 5, sink_scale=2.0, seed=77, prefix=9),
    H2OCase("prefix=9,softcap=1.5,window=6", 9 + 3 * CHUNK + 5, softcap=1.5, window=6, seed=78, prefix=9),
    H2OCase("prefix=9,latent,Dv=D/2", 9 + 3 * CHUNK + 5, value_dim=HEAD_DIM // 2, seed=79, prefix=9),
]


@dataclass(frozen=True)
class SpecCase:
    name: str
    prompt_len: int
    config: SpecPrefillConfig
    n_layers: int = 3
    n_queries: int = 4  # last prompt token + 3 look-ahead tokens
    n_heads: int = 4
    n_kv_heads: int = 2
    seed: int = 0
    windows: tuple[int | None, ...] = ()  # per layer: a sliding layer's window (empty: all global)
    n_window: int = 1  # the first n_window queries are the prompt's last tokens' (config.query_window)
    sink_scale: float | None = None  # every layer has attention sinks [Hq] ~ N(0, sink_scale^2)
    softcap: float | None = None  # every layer has a logit soft-cap

    @property
    def query_start(self) -> int | None:
        return query_start(self.prompt_len, self.n_window)

    @property
    def terms(self) -> tuple[AttentionTerms | None, ...]:
        """Each layer's attention terms (its own sinks), () for a case without terms."""
        if self.sink_scale is None and self.softcap is None:
            return ()
        return tuple(
            case_terms(self.n_heads, self.sink_scale, self.softcap, 100 * self.seed + layer)
            for layer in range(self.n_layers)
        )

    def tensors(self) -> tuple[np.ndarray, np.ndarray]:
        """queries [n_l, n_q, Hq, D], keys [n_l, Hkv, P, D] in float64."""
        rng = np.random.default_rng(self.seed)
        queries = rng.normal(size=(self.n_layers, self.n_queries, self.n_heads, HEAD_DIM))
        keys = rng.normal(size=(self.n_layers, self.n_kv_heads, self.prompt_len, HEAD_DIM))
        return queries, keys


SPEC_CASES: list[SpecCase] = [
    SpecCase("keep=one-token", 100, SpecPrefillConfig(keep_tokens=1), seed=1),
    SpecCase("keep=0.1", 257, SpecPrefillConfig(keep_ratio=0.1), seed=2),
    SpecCase("keep=1.0", 100, SpecPrefillConfig(keep_ratio=1.0), seed=3),
    SpecCase("prompt<pool-kernel", 5, SpecPrefillConfig(keep_ratio=0.3), seed=4),
    SpecCase("prompt<select-chunk", 20, SpecPrefillConfig(keep_ratio=0.3), seed=5),
    SpecCase("prompt=1", 1, SpecPrefillConfig(keep_ratio=0.3), seed=6),
    SpecCase("no-lookahead", 150, SpecPrefillConfig(keep_ratio=0.3), n_queries=1, seed=7),
    SpecCase("gqa-group=1", 90, SpecPrefillConfig(keep_ratio=0.3), n_heads=2, n_kv_heads=2, seed=8),
    SpecCase("gqa-group=3", 90, SpecPrefillConfig(keep_ratio=0.3), n_heads=6, n_kv_heads=2, seed=9),
    SpecCase(
        "layers=last-2,mean", 120, SpecPrefillConfig(keep_ratio=0.2, layers="last-2", layer_reduction="mean"), seed=10
    ),
    SpecCase("token-level", 64, SpecPrefillConfig(keep_ratio=0.25, select_chunk=1, pool_kernel=1), seed=11),
    # sliding speculator layers: a window shorter than the look-ahead (the last queries see no
    # prompt key), and one that reaches back past a selection chunk
    SpecCase("windows=(2,-,20)", 90, SpecPrefillConfig(keep_ratio=0.3), windows=(2, None, 20), seed=12),
    SpecCase(
        "windows=(40,40,-),last-2",
        120,
        SpecPrefillConfig(keep_ratio=0.2, layers="last-2"),
        windows=(40, 40, None),
        seed=13,
    ),
    # issue 24's options: max over the look-ahead queries, the importance-mass rule (between its
    # floor and ceiling), neighbour chunks around every kept one, and all three at once
    # an observation window (query_window): the prompt's last W queries score causally, alone,
    # with look-ahead queries after them, and under sliding layers
    SpecCase(
        "query-window=8", 130, SpecPrefillConfig(keep_ratio=0.2, query_window=8), n_queries=11, n_window=8, seed=20
    ),
    SpecCase(
        "query-window=5,no-lookahead",
        60,
        SpecPrefillConfig(keep_ratio=0.3, query_window=5),
        n_queries=5,
        n_window=5,
        seed=21,
    ),
    SpecCase(
        "query-window=6,windows=(3,-,20)",
        90,
        SpecPrefillConfig(keep_ratio=0.3, query_window=6),
        n_queries=9,
        n_window=6,
        windows=(3, None, 20),
        seed=22,
    ),
    SpecCase("lookahead=max", 150, SpecPrefillConfig(keep_ratio=0.2, lookahead_reduction="max"), seed=14),
    SpecCase(
        "mass=0.5", 200, SpecPrefillConfig(keep_mass=0.5, mass_floor=0.1, mass_ceiling=0.6, select_chunk=8), seed=15
    ),
    SpecCase("neighbours=1", 200, SpecPrefillConfig(keep_ratio=0.1, neighbours=1, select_chunk=8), seed=16),
    SpecCase("neighbours=0.5", 200, SpecPrefillConfig(keep_ratio=0.1, neighbours=0.5, select_chunk=8), seed=16),
    SpecCase(
        "mass=0.3,max,neighbours=2",
        257,
        SpecPrefillConfig(
            keep_mass=0.3, mass_floor=0.05, mass_ceiling=0.2, lookahead_reduction="max", neighbours=2, select_chunk=4
        ),
        seed=17,
    ),
    # issue 34's options: a token floor above the ratio's budget, always-kept first and last
    # tokens, scoring layers as a share (the last half)
    SpecCase(
        "floor+edges,last-0.5",
        200,
        SpecPrefillConfig(
            keep_ratio=0.05,
            token_floor=48,
            keep_first=5,
            keep_last=9,
            layers="last-0.5",
            layer_reduction="mean",
            select_chunk=8,
        ),
        seed=18,
    ),
    # attention terms: per-layer sinks (some large enough to take most of a row's mass), a
    # soft-cap, and both with sliding layers whose last queries see no prompt key
    SpecCase("sinks", 150, SpecPrefillConfig(keep_ratio=0.2), sink_scale=3.0, seed=19),
    SpecCase("softcap=1.5", 150, SpecPrefillConfig(keep_ratio=0.2), softcap=1.5, seed=20),
    SpecCase(
        "sinks+softcap,windows=(2,-,20)",
        90,
        SpecPrefillConfig(keep_ratio=0.3),
        windows=(2, None, 20),
        sink_scale=2.0,
        softcap=2.0,
        seed=21,
    ),
]
