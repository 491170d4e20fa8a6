"""Stage checks and whole-prompt invariants for speculative prefill."""

from __future__ import annotations

import numpy as np

from specfill.core import H2OConfig, SpecPrefillConfig
from specfill.core.io.random_model import load_random_model, random_prompt_ids
from specfill.core.reference import REFERENCE, specprefill
from specfill.core.reference.model import ReferenceModel
from specfill.core.tolerances import round_to

from .adapter import ConformanceAdapter
from .cases import SCALE, SPEC_CASES, SpecCase
from .results import Checker


def _probs(case: SpecCase, dtype: str) -> np.ndarray:
    queries, keys = (round_to(x, dtype) for x in case.tensors())
    return round_to(
        specprefill.score_tokens(
            queries, keys, case.config, SCALE, REFERENCE, case.windows, case.terms, case.n_window
        ).probs,
        dtype,
    )


def check_attention_scores(ad: ConformanceAdapter, ck: Checker) -> None:
    """Every layer at once, or layer by layer with each one's sliding window and terms (an
    observation window's queries see the keys up to their own positions)."""
    for case in SPEC_CASES:
        queries, keys = (round_to(x, ck.dtype) for x in case.tensors())
        per_layer = bool(case.windows or case.terms)
        for layer in range(case.n_layers) if per_layer else [slice(None)]:
            window = case.windows[layer] if case.windows else None
            terms = case.terms[layer] if case.terms else None
            one = slice(layer, layer + 1) if per_layer else layer
            name = case.name + (f",layer={layer}" if per_layer else "")
            got = ad.attention_scores(queries[one], keys[one], SCALE, window, terms, case.query_start)
            ck.close(
                "specprefill.attention_scores",
                name,
                got,
                REFERENCE.attention_scores(queries[one], keys[one], SCALE, window, terms, case.query_start),
            )
            if terms is not None:
                ck.exact("specprefill.attention_scores.finite", name, bool(np.isfinite(got).all()), "NaN/Inf in probs")


def check_smooth_scores(ad: ConformanceAdapter, ck: Checker) -> None:
    for case in SPEC_CASES:
        probs = _probs(case, ck.dtype)
        for kernel in (case.config.pool_kernel, 3):
            ck.close(
                "specprefill.smooth_scores",
                f"{case.name},kernel={kernel}",
                ad.smooth_scores(probs, kernel),
                REFERENCE.smooth_scores(probs, kernel),
            )


def check_reduce_scores(ad: ConformanceAdapter, ck: Checker) -> None:
    for case in SPEC_CASES:
        probs = _probs(case, ck.dtype)
        for heads, layers, queries in (
            ("max", "max", "mean"),
            ("max", "mean", "mean"),
            ("mean", "max", "mean"),
            ("max", "max", "max"),
        ):
            ck.close(
                "specprefill.reduce_scores",
                f"{case.name},heads={heads},layers={layers},lookahead={queries}",
                ad.reduce_scores(probs, heads, layers, queries),
                REFERENCE.reduce_scores(probs, heads, layers, queries),
            )


def _selection_cases(dtype: str) -> list[tuple[str, np.ndarray, SpecPrefillConfig]]:
    rng = np.random.default_rng(7)
    out = []
    for case in SPEC_CASES:
        importance = round_to(rng.permutation(case.prompt_len) / max(1, case.prompt_len), dtype)
        out.append((f"{case.name},distinct", importance, case.config))
    out.append(("all-equal (ties to earlier chunks)", np.ones(100), SpecPrefillConfig(keep_ratio=0.3)))
    out.append(("last token cold", np.r_[np.ones(99), 0.0], SpecPrefillConfig(keep_ratio=0.5, select_chunk=10)))
    out.append(
        (
            "float-noise ceil (10 chunks x 0.3)",
            round_to(rng.uniform(size=320), dtype),
            SpecPrefillConfig(keep_ratio=0.3),
        )
    )
    return out


def check_select_tokens(ad: ConformanceAdapter, ck: Checker) -> None:
    for name, importance, config in _selection_cases(ck.dtype):
        got = ad.select_tokens(importance, config)
        want = REFERENCE.select_tokens(importance, config)
        ck.exact(
            "specprefill.select_tokens.kept",
            name,
            np.array_equal(got.kept, want.kept),
            f"got {np.asarray(got.kept).tolist()[:20]} want {want.kept.tolist()[:20]}",
        )
        ck.exact(
            "specprefill.select_tokens.position_ids",
            name,
            np.array_equal(got.position_ids, want.position_ids),
            "position ids are not the kept tokens' original positions",
        )
        ck.exact(
            "specprefill.select_tokens.decode_start",
            name,
            got.decode_start == want.decode_start,
            f"decode starts at {got.decode_start}, not at the prompt length {want.decode_start}",
        )


def check_selection_end_to_end(ad: ConformanceAdapter, ck: Checker) -> None:
    """Scores and selection through the backend's stages: invariants plus agreement."""
    for case in SPEC_CASES:
        queries, keys = (round_to(x, ck.dtype) for x in case.tensors())
        n = case.prompt_len
        _, got = specprefill.speculative_selection(
            queries, keys, case.config, SCALE, ad, case.windows, case.terms, case.n_window
        )
        _, want = specprefill.speculative_selection(
            queries, keys, case.config, SCALE, REFERENCE, case.windows, case.terms, case.n_window
        )
        kept = np.asarray(got.kept).tolist()
        bound = specprefill.keep_count_upper_bound(n, case.config)
        problems = []
        if kept != sorted(set(kept)):
            problems.append("kept positions not sorted/unique")
        if kept and (kept[0] < 0 or kept[-1] >= n):
            problems.append("kept position outside the prompt")
        if n - 1 not in kept:
            problems.append("last token not kept")
        if not 1 <= len(kept) <= bound:
            problems.append(f"{len(kept)} kept, bound {bound}")
        if case.config.keep_ratio == 1.0 and kept != list(range(n)):
            problems.append("keep 1.0 must keep every token")
        if np.asarray(got.position_ids).tolist() != kept:
            problems.append("position ids differ from original positions")
        if got.decode_start != n:
            problems.append(f"decode starts at {got.decode_start}, not {n}")
        ck.exact("specprefill.selection.invariants", case.name, not problems, "; ".join(problems))
        jaccard = len(set(kept) & set(want.kept.tolist())) / max(1, len(set(kept) | set(want.kept.tolist())))
        ck.at_least(
            "specprefill.selection.agreement",
            case.name,
            jaccard,
            ck.tol.memory_jaccard,
            f"differing positions: {sorted(set(kept) ^ set(want.kept.tolist()))[:16]}",
        )


def check_reused_selection(ad: ConformanceAdapter, ck: Checker) -> None:
    """SpecPrefill from a reused prefix of R tokens (docs/methods.md): the backend's scores over every
    prompt key, selected over the new part [R, P) only: kept positions >= R, original, the last token
    kept, decoding at P, and (the same selection code on both sides) equal to the reference's in
    float64 / float32, agreeing as memory sets must in 16-bit dtypes."""
    for case in SPEC_CASES:
        queries, keys = (round_to(x, ck.dtype) for x in case.tensors())
        n = case.prompt_len
        for reused in sorted({n // 2, n - 1} - {0}):
            name = f"{case.name},reused={reused}"
            _, got = specprefill.speculative_selection(
                queries, keys, case.config, SCALE, ad, case.windows, case.terms, case.n_window, reused
            )
            _, want = specprefill.speculative_selection(
                queries, keys, case.config, SCALE, REFERENCE, case.windows, case.terms, case.n_window, reused
            )
            kept, wanted = np.asarray(got.kept).tolist(), want.kept.tolist()
            problems = []
            if not kept or kept[0] < reused or kept != sorted(set(kept)) or kept[-1] != n - 1:
                problems.append(f"kept {kept[:8]}..: not sorted new positions ending at the last token")
            if np.asarray(got.position_ids).tolist() != kept or got.decode_start != n:
                problems.append("positions not the kept tokens' original ones, or decoding not at P")
            ck.exact("specprefill.reuse.invariants", name, not problems, "; ".join(problems))
            if ck.dtype in ("float64", "float32"):
                ck.exact(
                    "specprefill.reuse.kept", name, kept == wanted, f"differing: {sorted(set(kept) ^ set(wanted))}"
                )
            else:
                jaccard = len(set(kept) & set(wanted)) / max(1, len(set(kept) | set(wanted)))
                ck.at_least("specprefill.reuse.agreement", name, jaccard, ck.tol.memory_jaccard, f"got {kept[:16]}")


# SpecPrefill over an H2O speculator on a tiny random model: chunks of 16 with a memory of 8 over
# 96 tokens, so every later chunk attends to a sparse key set; q / k projections scaled by 25 so
# the random model's attention is peaked (N(0, 0.02) weights give near-uniform rows, whose selection
# is decided by rounding noise)
COMPOSED = SpecPrefillConfig(
    keep_ratio=0.25,
    lookahead=2,
    select_chunk=4,
    pool_kernel=3,
    query_window=2,
    speculator_prefill=H2OConfig(chunk_size=16, batch_size=32, local=4, heavy=4, dense_tail=8, layers="all"),
)


def _composed_model() -> tuple[ReferenceModel, list[int]]:
    args, weights = load_random_model("random:tiny-llama", seed=3)
    for name in weights:
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            weights[name] = weights[name] * 25.0
    return ReferenceModel(args, weights), random_prompt_ids(args.vocab_size, 96, seed=4)


def check_composed_selection(ad: ConformanceAdapter, ck: Checker) -> None:
    """SpecPrefill whose speculator prefills with H2O: the speculator's H2O layers through the
    backend's attention_layer (inputs rounded to its dtype; the rest of the model in NumPy), then
    its scoring and selection; kept positions against the reference's run of the same model. In
    float64 / float32 they must be equal, in 16-bit dtypes agree as memory sets must."""
    ref, ids = _composed_model()
    h2o = COMPOSED.speculator_prefill

    def layer(q, k, v, config, scale, window):
        q, k, v = (round_to(x, ck.dtype) for x in (q, k, v))
        return np.asarray(ad.attention_layer(q, k, v, config, scale, window).output, dtype=np.float64)

    got_q, got_k, _ = ref.speculator_pass(ids, 2, COMPOSED.lookahead, window=2, h2o_config=h2o, h2o_layer=layer)
    want_q, want_k, _ = ref.speculator_pass(ids, 2, COMPOSED.lookahead, window=2, h2o_config=h2o)
    got_q, got_k = round_to(got_q, ck.dtype), round_to(got_k, ck.dtype)
    _, got = specprefill.speculative_selection(got_q, got_k, COMPOSED, ref.scale, ad, n_window=2)
    _, want = specprefill.speculative_selection(want_q, want_k, COMPOSED, ref.scale, REFERENCE, n_window=2)
    kept, wanted = np.asarray(got.kept).tolist(), want.kept.tolist()
    name = "tiny-llama,S=16,M=8,N=96"
    if ck.dtype in ("float64", "float32"):
        ck.exact("specprefill.composed.kept", name, kept == wanted, f"differing: {sorted(set(kept) ^ set(wanted))}")
        return
    jaccard = len(set(kept) & set(wanted)) / max(1, len(set(kept) | set(wanted)))
    ck.at_least("specprefill.composed.agreement", name, jaccard, ck.tol.memory_jaccard, f"got {kept[:16]}")


SPECPREFILL_CHECKS = {
    "specprefill.attention_scores": check_attention_scores,
    "specprefill.smooth_scores": check_smooth_scores,
    "specprefill.reduce_scores": check_reduce_scores,
    "specprefill.select_tokens": check_select_tokens,
    "specprefill.selection": check_selection_end_to_end,
    "specprefill.composed": check_composed_selection,
    "specprefill.reuse": check_reused_selection,
}
