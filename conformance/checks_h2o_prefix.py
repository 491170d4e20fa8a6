"""H2O from a reused prefix (docs/methods.md, issue 46): the walk over the new part only, on its own
chunk grid from P, its first memory set the whole prefix; held to the oracle's key sets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from specfill.core.reference import REFERENCE, oracle
from specfill.core.reference.h2o import causal_attention

from .adapter import ConformanceAdapter
from .cases import CHUNK, H2O_PREFIX_CASES, SCALE
from .checks_h2o import _check_memory_structure, _inputs, _jaccard
from .results import Checker


def check_prefix_layer(ad: ConformanceAdapter, ck: Checker) -> None:
    """H2O from a reused prefix (docs/methods.md): the walk over the new part only, its first memory
    set the whole prefix. Held to the oracle's explicit key sets twice: replaying the backend's own
    memory sets (exact whatever sets float ties chose), and building them itself (the sets must
    agree as the layer's do with the reference: identical in float64)."""
    for case in H2O_PREFIX_CASES:
        q, k, v = _inputs(case, ck.dtype)
        p, config, terms = case.prefix, case.config, case.terms
        sinks, softcap = (None, None) if terms is None else (terms.sinks, terms.softcap)
        got = ad.attention_layer(q[:, p:], k, v, config, SCALE, case.window, *case.term_args, prefix=p)
        want = REFERENCE.attention_layer(q[:, p:], k, v, config, SCALE, case.window, *case.term_args, prefix=p)
        got_sets = [np.asarray(m.indices) for m in got.memory_sets]
        ck.exact("h2o.prefix_layer.finite", case.name, bool(np.isfinite(got.output).all()), "NaN/Inf in output")
        ck.exact(
            "h2o.prefix_layer.shape",
            case.name,
            tuple(got.output.shape[:2]) == (case.n_heads, case.n_tokens - p) and got.scores.shape[1] == case.n_tokens,
            f"output {tuple(got.output.shape)}, scores {tuple(got.scores.shape)} for {case.n_tokens - p} new of "
            f"{case.n_tokens} tokens",
        )
        resolved = config.for_prompt(case.n_tokens)
        full = not resolved.enabled or case.n_tokens - p <= CHUNK
        if full:  # one new chunk, or no memory: full attention over every key, no memory set
            causal = causal_attention(q, k, v, SCALE, case.window, terms).o[:, p:]
            ck.close("h2o.prefix_layer.one_chunk_is_full", case.name, got.output, causal)
            ck.exact("h2o.prefix_layer.memory_count", case.name, not got_sets, f"{len(got_sets)} memory sets")
            continue
        _check_memory_structure(ck, case, got_sets, "h2o.prefix_layer")
        replay_out, replay_scores = oracle.replay_h2o_layer(
            q[:, p:], k, v, CHUNK, got_sets, SCALE, resolved.dense_tail, case.window, sinks, softcap, prefix=p
        )
        ck.close("h2o.prefix_layer.output_vs_key_sets", case.name, got.output, replay_out)
        ck.close("h2o.prefix_layer.scores_vs_key_sets", case.name, got.scores, replay_scores)
        oracle_out, oracle_sets, _ = oracle.oracle_h2o_layer(
            q[:, p:],
            k,
            v,
            CHUNK,
            resolved.local,
            resolved.heavy,
            SCALE,
            resolved.dense_tail,
            case.window,
            sinks,
            softcap,
            prefix=p,
        )
        pairs = [(g, np.asarray(w)) for gs, ws in zip(got_sets, oracle_sets) for g, w in zip(gs, ws)]
        agreement = float(np.mean([_jaccard(g, w) for g, w in pairs])) if pairs else 1.0
        same = len(got_sets) == len(oracle_sets) and all(np.array_equal(g, w) for g, w in pairs)
        ck.at_least("h2o.prefix_layer.memory_vs_oracle", case.name, agreement, ck.tol.memory_jaccard)
        if same:
            ck.close("h2o.prefix_layer.output_vs_oracle", case.name, got.output, oracle_out)
            ck.close("h2o.prefix_layer.output", case.name, got.output, want.output)
        if case.batch_size < 4 * CHUNK:  # logical batches only schedule work
            whole = replace(config, batch_size=8 * CHUNK)
            big = ad.attention_layer(q[:, p:], k, v, whole, SCALE, case.window, *case.term_args, prefix=p)
            ck.close("h2o.prefix_layer.batch_independent_output", case.name, got.output, big.output)


H2O_PREFIX_CHECKS = {"h2o.prefix_layer": check_prefix_layer}
