"""SpecPrefill's token selection in production: which prompt tokens the main model prefills, from
the importance [P] the scoring left (core/methods/specprefill.py), on the host in float64.

Whole selection chunks are kept: the top ones by mean importance (ties to the earlier chunk),
ceil(n_chunks * keep) of them or as many as the mass rule asks (text units, select_units "text":
the best units until they hold config.token_budget tokens, the one that reaches it included),
then their neighbours (whole chunks or units, or a fraction of a chunk's nearest tokens), the
first keep_first and last keep_last tokens, the protected spans and the last token; kept tokens
keep their original positions and decoding resumes at P. The NumPy reference states the same rule
independently (core/reference/specprefill.select_tokens) and the conformance suite holds this
one to it (every backend's adapter selects with this module).
"""

from __future__ import annotations

import math

import numpy as np

from ..config import SpecPrefillConfig
from ..errors import ConfigError
from ..stages import Selection


def chunk_means(importance: np.ndarray, chunk: int) -> np.ndarray:
    """Mean importance of each contiguous selection chunk (the last may be shorter), in float64:
    the ranking of near-equal chunks must not depend on the backend's compute dtype."""
    n = importance.shape[0]
    n_chunks = -(-n // chunk)
    padded = np.zeros(n_chunks * chunk, np.float64)
    padded[:n] = importance
    counts = np.full(n_chunks, float(chunk))
    counts[-1] = n - (n_chunks - 1) * chunk
    return padded.reshape(n_chunks, chunk).sum(axis=1) / counts


def mass_chunk_count(scores: np.ndarray, counts: np.ndarray, order: np.ndarray, config: SpecPrefillConfig) -> int:
    """The importance-mass rule: the fewest chunks, taken in `order` (best first), whose summed
    importance (chunk mean x chunk length, float64) reaches keep_mass of the whole prompt's,
    clamped to the config's (floor, ceiling) chunk range. A prompt with no importance at all
    (every score 0) keeps the floor."""
    low, high = config.chunk_range(len(scores))
    mass = (scores * counts)[order]
    total = float(mass.sum())
    if total <= 0.0:
        return low
    reached = int(np.searchsorted(np.cumsum(mass), config.keep_mass * total * (1.0 - 1e-12))) + 1
    return max(low, min(high, reached))


def with_neighbours(chosen: np.ndarray, n_units: int, neighbours: int) -> np.ndarray:
    """Unit indices `chosen` plus the `neighbours` units on each side of each, inside the prompt."""
    if neighbours == 0:
        return chosen
    spread = (chosen[:, None] + np.arange(-neighbours, neighbours + 1)[None, :]).ravel()
    return np.unique(spread[(spread >= 0) & (spread < n_units)])


def around_chunks(chosen: np.ndarray, n_tokens: int, config: SpecPrefillConfig) -> list[np.ndarray]:
    """The tokens of chunks `chosen`, each with the nearest ceil(neighbours x select_chunk) tokens on
    each side, inside the prompt: whole neighbour chunks for a whole number, part of one for a fraction."""
    size = config.select_chunk
    reach = math.ceil(config.neighbours * size - 1e-9)  # the guard: float noise must not add a token
    return [np.arange(max(0, c * size - reach), min(n_tokens, (c + 1) * size + reach)) for c in chosen]


def select_tokens(importance: np.ndarray, config: SpecPrefillConfig) -> Selection:
    """The kept tokens of a prompt of P = len(importance) tokens (the module doc's rule)."""
    n_tokens = int(importance.shape[0])
    if n_tokens < 1:
        raise ConfigError("speculative prefill needs a prompt of at least one token")
    bounds = unit_bounds(n_tokens, config)
    if config.select_units == "chunks":
        scores = chunk_means(importance, config.select_chunk)
    else:
        scores = unit_means(np.asarray(importance, np.float64), bounds)
    ranked = np.lexsort((np.arange(len(scores)), -scores))
    if config.select_units == "text":  # best units until they hold the token budget
        held = np.cumsum(np.diff(bounds)[ranked])
        n_keep = int(np.searchsorted(held, config.token_budget(n_tokens))) + 1
    elif config.keep_mass is None:
        n_keep = config.n_kept_chunks(len(scores))
    else:
        n_keep = mass_chunk_count(scores, np.diff(bounds).astype(np.float64), ranked, config)
    if config.select_units == "chunks":
        kept = around_chunks(ranked[:n_keep], n_tokens, config)
    else:  # whole neighbour units (config_checks: text units take no fraction)
        kept = [
            np.arange(bounds[u], bounds[u + 1])
            for u in with_neighbours(ranked[:n_keep], len(scores), config.neighbours)
        ]
    kept.append(np.arange(min(config.keep_first, n_tokens)))
    kept.append(np.arange(max(0, n_tokens - config.keep_last), n_tokens))
    kept.extend(np.arange(min(start, n_tokens), min(end, n_tokens)) for start, end in config.protected)
    if config.force_keep_last:
        kept.append(np.array([n_tokens - 1]))
    positions = np.unique(np.concatenate(kept)).astype(np.int64)
    return Selection(kept=positions, position_ids=positions.copy(), decode_start=n_tokens, chunk_scores=scores)


def unit_means(importance: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Each text unit's mean importance, float64: its sum (NumPy's pairwise sum, as chunk_means's
    rows and the spec's) over its length, so equal units tie exactly on every path."""
    sums = np.array([importance[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])], np.float64)
    return sums / np.diff(bounds)


def unit_bounds(n_tokens: int, config: SpecPrefillConfig) -> np.ndarray:
    """[n_units + 1] int64, ascending: where each selection unit of an n_tokens prompt starts, then
    n_tokens: every select_chunk tokens, or the text units' starts (select_units "text")."""
    if config.select_units == "chunks":
        return np.append(np.arange(0, n_tokens, config.select_chunk), n_tokens).astype(np.int64)
    if not config.unit_starts:
        raise ConfigError(
            "select_units text needs the prompt's unit_starts (the front end fills them from the prompt's "
            "tokens: core/text_units.py)",
            "unit_starts",
        )
    starts = np.asarray(config.unit_starts, np.int64)
    return np.append(starts[starts < n_tokens], n_tokens).astype(np.int64)


def select_new_tokens(importance: np.ndarray, reused: int, config: SpecPrefillConfig) -> Selection:
    """SpecPrefill from a reused prefix of `reused` tokens (docs/methods.md): importance [P] of every
    prompt token, selected over the new part [reused, P) only, as a prompt of its own (its chunk grid
    starts at `reused`: config.for_new_part); kept positions are original ones and decoding resumes
    at P. reused 0 is select_tokens."""
    n_tokens = int(importance.shape[0])
    if not 0 <= reused < n_tokens:
        raise ConfigError(f"a reused prefix of {reused} tokens must leave new tokens of the {n_tokens}-token prompt")
    new = select_tokens(importance[reused:], config.for_new_part(reused) if reused else config)
    kept = np.asarray(new.kept, dtype=np.int64) + reused
    return Selection(kept=kept, position_ids=kept.copy(), decode_start=n_tokens, chunk_scores=new.chunk_scores)
