"""Stage checks and whole-prompt invariants for H2O two-phase prefill."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from specfill.core import AttentionState, MemorySet
from specfill.core.reference import REFERENCE, oracle
from specfill.core.reference.h2o import causal_attention, local_window
from specfill.core.stages import KeyWindow
from specfill.core.tolerances import round_to

from .adapter import ConformanceAdapter
from .cases import CHUNK, H2O_CASES, HEAD_DIM, SCALE, H2OCase, case_terms
from .results import Checker


def _lse(state: AttentionState) -> np.ndarray:
    """Log-sum-exp m + log(l): comparable even when two backends pick different m."""
    l = np.asarray(state.l, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(l > 0, np.asarray(state.m, dtype=np.float64) + np.log(l), -np.inf)


def _inputs(case: H2OCase, dtype: str) -> tuple[np.ndarray, ...]:
    return tuple(round_to(x, dtype) for x in case.tensors())


def _state_close(ck: Checker, check: str, case: str, got: AttentionState, want: AttentionState) -> None:
    ck.close(f"{check}.o", case, got.o, want.o)
    ck.close(f"{check}.lse", case, _lse(got), _lse(want))


def _finite(ck: Checker, check: str, case: str, outputs: dict[str, np.ndarray]) -> None:
    """The check `check`.finite: no NaN or Inf in any of the adapter's `outputs` (two or more: name -> array)."""
    names = list(outputs)
    where = ", ".join(names[:-1]) + " or " + names[-1]
    ck.exact(f"{check}.finite", case, all(bool(np.isfinite(x).all()) for x in outputs.values()), f"NaN/Inf in {where}")


def check_intra_attention(ad: ConformanceAdapter, ck: Checker) -> None:
    for case in H2O_CASES:
        q, k, v = _inputs(case, ck.dtype)
        got = ad.intra_attention(q, k, v, CHUNK, SCALE, case.window, *case.term_args)
        want = REFERENCE.intra_attention(q, k, v, CHUNK, SCALE, case.window, *case.term_args)
        _state_close(ck, "h2o.intra_attention", case.name, got.state, want.state)
        ck.close("h2o.intra_attention.colsum", case.name, got.colsum, want.colsum)


def check_reduce_colsum(ad: ConformanceAdapter, ck: Checker) -> None:
    rng = np.random.default_rng(1)
    for group in (1, 2, 3, 4, 8):
        colsum = round_to(rng.uniform(0, 3, size=(2 * group, 19)), ck.dtype)
        ck.close(
            "h2o.reduce_colsum_to_kv_heads",
            f"gqa-group={group}",
            ad.reduce_colsum_to_kv_heads(colsum, 2),
            REFERENCE.reduce_colsum_to_kv_heads(colsum, 2),
        )


def _random_memory(rng: np.random.Generator, n_kv: int, before: int, size: int, chunk: int) -> MemorySet:
    rows = [np.sort(rng.choice(before, size=size, replace=False)) for _ in range(n_kv)]
    return MemorySet(np.stack(rows).astype(np.int64), chunk)


def check_accumulate_scores(ad: ConformanceAdapter, ck: Checker) -> None:
    rng = np.random.default_rng(2)
    scores = round_to(rng.uniform(0, 5, size=(3, 40)), ck.dtype)
    memory = _random_memory(rng, 3, 32, 5, 3)
    delta = round_to(rng.uniform(0, 2, size=(3, 5)), ck.dtype)
    ck.close(
        "h2o.accumulate_scores",
        "random",
        ad.accumulate_scores(scores, memory, delta),
        REFERENCE.accumulate_scores(scores, memory, delta),
    )


def check_build_memory_set(ad: ConformanceAdapter, ck: Checker) -> None:
    """Memory sets from given scores must match exactly: distinct scores and exact ties."""
    rng = np.random.default_rng(3)
    n_kv, n = 3, 5 * CHUNK
    for local, heavy in ((2, 3), (0, 4), (4, 0), (6, 1), (0, 7)):
        for chunk_index in (0, 3):
            start, end = chunk_index * CHUNK, (chunk_index + 1) * CHUNK
            previous = _random_memory(rng, n_kv, start, local + heavy, chunk_index - 1) if chunk_index else None
            for kind in ("distinct", "ties"):
                if kind == "distinct":
                    scores = np.stack([rng.permutation(n) for _ in range(n_kv)]).astype(np.float64) / n
                else:
                    scores = rng.integers(0, 3, size=(n_kv, n)).astype(np.float64)
                scores = round_to(scores, ck.dtype)
                got = ad.build_memory_set(scores, previous, chunk_index, start, end, local, heavy)
                want = REFERENCE.build_memory_set(scores, previous, chunk_index, start, end, local, heavy)
                case = f"L={local},H={heavy},chunk={chunk_index},{kind}"
                ck.exact(
                    "h2o.build_memory_set",
                    case,
                    np.array_equal(got.indices, want.indices),
                    f"got {np.asarray(got.indices).tolist()} want {want.indices.tolist()}",
                )


def check_gather_memory(ad: ConformanceAdapter, ck: Checker) -> None:
    rng = np.random.default_rng(4)
    k, v = (round_to(rng.normal(size=(3, 30, HEAD_DIM)), ck.dtype) for _ in range(2))
    memory = _random_memory(rng, 3, 30, 6, 2)
    got_k, got_v = ad.gather_memory(k, v, memory)
    want_k, want_v = REFERENCE.gather_memory(k, v, memory)
    ck.exact(
        "h2o.gather_memory",
        "random",
        np.array_equal(got_k, want_k) and np.array_equal(got_v, want_v),
        "gathered rows differ",
    )


def _inter_inputs(
    rng: np.random.Generator, group: int, size: int, logit_max: float | None, dtype: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Phase 2's q [2 * group, S, D] and k_mem / v_mem [2, size, D] in `dtype`, q scaled so the
    largest logit is +-logit_max where one is given (and there is a slot)."""
    q = rng.normal(size=(2 * group, CHUNK, HEAD_DIM))
    k_mem, v_mem = rng.normal(size=(2, 2, size, HEAD_DIM))
    if logit_max and size:
        logits = np.einsum("htd,hmd->htm", q, np.repeat(k_mem, group, axis=0)) * SCALE
        q *= logit_max / np.abs(logits).max()
    q, k_mem, v_mem = (round_to(x, dtype) for x in (q, k_mem, v_mem))
    return q, k_mem, v_mem


def _compare_inter(ad: ConformanceAdapter, ck: Checker, case: str, q, k_mem, v_mem, window=None, terms=None) -> None:
    """The adapter's phase 2 against the reference's: the state, the column sums, and all of them
    finite (the column sums' finiteness checked with terms, whose sinks join their denominators)."""
    got = ad.inter_attention(q, k_mem, v_mem, SCALE, window, terms)
    want = REFERENCE.inter_attention(q, k_mem, v_mem, SCALE, window, terms)
    _state_close(ck, "h2o.inter_attention", case, got.state, want.state)
    ck.close("h2o.inter_attention.colsum", case, got.colsum, want.colsum)
    outputs = {"o": got.state.o, "l": got.state.l}
    _finite(ck, "h2o.inter_attention", case, outputs if terms is None else {**outputs, "the column sums": got.colsum})


def check_inter_attention(ad: ConformanceAdapter, ck: Checker) -> None:
    rng = np.random.default_rng(5)
    for group, memory_size, logit_max in (
        (1, 5, None),
        (2, 5, None),
        (3, 7, None),
        (4, 1, None),
        (8, 5, None),
        (2, 5, 100.0),
        (2, 0, None),
    ):
        q, k_mem, v_mem = _inter_inputs(rng, group, memory_size, logit_max, ck.dtype)
        case = f"gqa-group={group},M={memory_size}" + (",logits=+-100" if logit_max else "")
        _compare_inter(ad, ck, case, q, k_mem, v_mem)
    _check_windowed_inter_attention(ad, ck, rng)
    _check_inter_attention_terms(ad, ck, rng)


def _check_inter_attention_terms(ad: ConformanceAdapter, ck: Checker, rng: np.random.Generator) -> None:
    """Phase 2 with a layer's terms: the soft-capped logits and the sink in the column sums'
    denominators (the state stays sink-free: the walk folds the sink in once), logits and sinks
    up to +-100, and a window under which some rows see no slot (their weights stay 0)."""
    start = 3 * CHUNK
    for group, size, logit_max, sink_scale, softcap, window_size in (
        (2, 5, None, 2.0, None, None),
        (3, 7, None, None, 1.5, None),
        (2, 5, 100.0, 60.0, None, None),
        (2, 5, 100.0, None, 5.0, None),
        (2, 6, None, 2.0, 3.0, 6),
        (1, 1, None, 2.0, None, None),
    ):
        q, k_mem, v_mem = _inter_inputs(rng, group, size, logit_max, ck.dtype)
        terms = case_terms(2 * group, sink_scale, softcap, group * 7 + size)
        window = (
            None
            if window_size is None
            else KeyWindow(window_size, start, _random_memory(rng, 2, start, size, 2).indices)
        )
        case = (
            f"gqa-group={group},M={size}"
            + (f",logits=+-{logit_max:g}" if logit_max else "")
            + (f",sinks~{sink_scale:g}" if sink_scale else "")
            + (f",softcap={softcap:g}" if softcap else "")
            + (f",window={window_size}" if window_size else "")
        )
        _compare_inter(ad, ck, case, q, k_mem, v_mem, window, terms)


def _check_windowed_inter_attention(ad: ConformanceAdapter, ck: Checker, rng: np.random.Generator) -> None:
    """A sliding layer's phase 2 (memory slots at given positions) and dense-tail prefix (keys at
    consecutive positions): rows whose window holds no slot must come back empty, not NaN."""
    start = 3 * CHUNK
    for group, size, positions in ((2, 6, True), (1, CHUNK + 3, True), (3, 2, True), (2, 5, False)):
        q = round_to(rng.normal(size=(2 * group, CHUNK, HEAD_DIM)), ck.dtype)
        if positions:
            memory = _random_memory(rng, 2, start, 7, 2).indices
            window, n_slots = KeyWindow(size, start, memory), memory.shape[1]
        else:
            window, n_slots = KeyWindow(size, start, None, start - 9), 9
        k_mem, v_mem = (round_to(x, ck.dtype) for x in rng.normal(size=(2, 2, n_slots, HEAD_DIM)))
        case = f"gqa-group={group},window={size}," + ("memory" if positions else "prefix")
        _compare_inter(ad, ck, case, q, k_mem, v_mem, window)


def check_merge_states(ad: ConformanceAdapter, ck: Checker) -> None:
    rng = np.random.default_rng(6)
    hq, t = 4, CHUNK

    def state(shift: float) -> AttentionState:
        m = rng.normal(size=(hq, t)) * 30 + shift
        l = rng.uniform(1, 5, size=(hq, t))
        o = rng.normal(size=(hq, t, HEAD_DIM))
        return AttentionState(*(round_to(x, ck.dtype) for x in (m, l, o)))

    empty = AttentionState(np.full((hq, t), -np.inf), np.zeros((hq, t)), np.zeros((hq, t, HEAD_DIM)))
    pairs = {
        "random": (state(0), state(0)),
        "far-apart-max": (state(-80), state(80)),
        "inter-empty": (empty, state(0)),
        "both-empty (fully masked rows)": (empty, empty),
    }
    for name, (a, b) in pairs.items():
        got = ad.merge_states(a, b)
        want = REFERENCE.merge_states(a, b)
        _state_close(ck, "h2o.merge_states", name, got, want)
        _finite(ck, "h2o.merge_states", name, {"o": got.o, "l": got.l})


def check_add_sinks(ad: ConformanceAdapter, ck: Checker) -> None:
    """A sink folded into a query's final state: random states, far-apart maxima, sinks far above
    and below every logit (+-100), and empty rows (a query over no key: finite, o = 0)."""
    rng = np.random.default_rng(8)
    hq, t = 4, CHUNK
    empty = AttentionState(np.full((hq, t), -np.inf), np.zeros((hq, t)), np.zeros((hq, t, HEAD_DIM)))

    def state(shift: float) -> AttentionState:
        m = rng.normal(size=(hq, t)) * 30 + shift
        return AttentionState(
            *(round_to(x, ck.dtype) for x in (m, rng.uniform(1, 5, size=(hq, t)), rng.normal(size=(hq, t, HEAD_DIM))))
        )

    cases = {
        "random": (state(0), rng.normal(size=hq) * 3),
        "sink=+100": (state(0), np.full(hq, 100.0)),
        "sink=-100": (state(0), np.full(hq, -100.0)),
        "m=+-80": (state(80), np.array([-80.0, 0.0, 80.0, 5.0])),
        "empty rows": (empty, rng.normal(size=hq) * 3),
    }
    for name, (base, sinks) in cases.items():
        sinks = round_to(sinks, ck.dtype)
        got = ad.add_sinks(base, sinks)
        want = REFERENCE.add_sinks(base, sinks)
        _state_close(ck, "h2o.add_sinks", name, got, want)
        _finite(ck, "h2o.add_sinks", name, {"m": got.m, "o": got.o, "l": got.l})


def _jaccard(a: np.ndarray, b: np.ndarray) -> float:
    sa, sb = set(np.asarray(a).tolist()), set(np.asarray(b).tolist())
    return len(sa & sb) / max(1, len(sa | sb))


def check_attention_layer(ad: ConformanceAdapter, ck: Checker) -> None:
    """Whole-prompt invariants of one layer."""
    for case in H2O_CASES:
        q, k, v = _inputs(case, ck.dtype)
        config = case.config
        got = ad.attention_layer(q, k, v, config, SCALE, case.window, *case.term_args)
        want = REFERENCE.attention_layer(q, k, v, config, SCALE, case.window, *case.term_args)
        got_sets = [np.asarray(m.indices) for m in got.memory_sets]
        ck.exact("h2o.layer.finite", case.name, bool(np.isfinite(got.output).all()), "NaN/Inf in output")
        _check_memory_structure(ck, case, got_sets)
        # exact whatever sets the backend chose: output and scores are those its K(i) define
        terms = case.terms
        replay_out, replay_scores = oracle.replay_h2o_layer(
            q,
            k,
            v,
            CHUNK,
            got_sets,
            SCALE,
            config.dense_tail,
            case.window,
            None if terms is None else terms.sinks,
            None if terms is None else terms.softcap,
        )
        ck.close("h2o.layer.output_vs_key_sets", case.name, got.output, replay_out)
        ck.close("h2o.layer.scores_vs_key_sets", case.name, got.scores, replay_scores)
        pairs = [(g, w) for gs, ws in zip(got_sets, want.memory_sets) for g, w in zip(gs, ws.indices)]
        agreement = float(np.mean([_jaccard(g, w) for g, w in pairs])) if pairs else 1.0
        differing = [
            (c, h)
            for c, (gs, ws) in enumerate(zip(got_sets, want.memory_sets))
            for h in range(gs.shape[0])
            if not np.array_equal(gs[h], ws.indices[h])
        ]
        ck.at_least(
            "h2o.layer.memory_agreement",
            case.name,
            agreement,
            ck.tol.memory_jaccard,
            f"(chunk, kv head) differing: {differing[:8]}",
        )
        if not differing:
            ck.close("h2o.layer.output", case.name, got.output, want.output)
        if case.n_tokens <= CHUNK:
            ck.close(
                "h2o.layer.single_chunk_is_causal",
                case.name,
                got.output,
                causal_attention(q, k, v, SCALE, case.window, terms).o,
            )
    _check_batch_independence(ad, ck)


def _check_memory_structure(ck: Checker, case: H2OCase, sets: list[np.ndarray], check: str = "h2o.layer") -> None:
    """Count, size, order, local window and provenance (M_(c-1) U C_c) of a layer's memory sets; from
    a reused prefix (case.prefix P) the chunks start at P and M_(-1) is the whole prefix."""
    config = case.config.for_prompt(case.n_tokens)  # memory_share: the L and H this prompt runs with
    p = case.prefix
    n_chunks = math.ceil((case.n_tokens - p) / CHUNK)
    ck.exact(
        f"{check}.memory_count",
        case.name,
        len(sets) == max(0, n_chunks - 1),
        f"{len(sets)} memory sets for {n_chunks} chunks (none after the final chunk)",
    )
    previous = [np.arange(p)] * case.n_kv_heads if p else None
    for c, rows in enumerate(sets):
        start, end = p + c * CHUNK, p + (c + 1) * CHUNK
        local = set(local_window(start, end, config.local).tolist())
        problems = []
        for g, row in enumerate(rows):
            row_list = row.tolist()
            if len(row_list) != config.memory_size:
                problems.append(f"head {g}: size {len(row_list)} != L+H={config.memory_size}")
            if row_list != sorted(set(row_list)):
                problems.append(f"head {g}: not sorted/unique")
            if not local <= set(row_list):
                problems.append(f"head {g}: misses local window {sorted(local)}")
            allowed = set(range(start, end)) | (set(previous[g].tolist()) if previous is not None else set())
            if not set(row_list) <= allowed:
                problems.append(f"head {g}: {sorted(set(row_list) - allowed)} outside M_(c-1) U C_c")
        ck.exact(f"{check}.memory_structure", f"{case.name},chunk={c}", not problems, "; ".join(problems[:4]))
        previous = rows


def _check_batch_independence(ad: ConformanceAdapter, ck: Checker) -> None:
    """Logical batches (B) only schedule work: outputs and memory sets do not depend on B."""
    for case in (c for c in H2O_CASES if c.batch_size < 4 * CHUNK):
        q, k, v = _inputs(case, ck.dtype)
        small = ad.attention_layer(q, k, v, case.config, SCALE, case.window, *case.term_args)
        whole = replace(case.config, batch_size=8 * CHUNK)
        big = ad.attention_layer(q, k, v, whole, SCALE, case.window, *case.term_args)
        same_sets = len(small.memory_sets) == len(big.memory_sets) and all(
            np.array_equal(a.indices, b.indices) for a, b in zip(small.memory_sets, big.memory_sets)
        )
        ck.exact("h2o.layer.batch_independent_memory", case.name, same_sets, "memory sets depend on B")
        ck.close("h2o.layer.batch_independent_output", case.name, small.output, big.output)


H2O_CHECKS = {
    "h2o.intra_attention": check_intra_attention,
    "h2o.reduce_colsum_to_kv_heads": check_reduce_colsum,
    "h2o.accumulate_scores": check_accumulate_scores,
    "h2o.build_memory_set": check_build_memory_set,
    "h2o.gather_memory": check_gather_memory,
    "h2o.inter_attention": check_inter_attention,
    "h2o.merge_states": check_merge_states,
    "h2o.add_sinks": check_add_sinks,
    "h2o.layer": check_attention_layer,
}
