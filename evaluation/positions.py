"""Which prompt positions a sparse prefill kept: the rows of the position-map plots. Its own module:
the quality run, the RULER run and the protocol all draw them."""

from __future__ import annotations

import numpy as np

from specfill.core.runtime import GenerationInfo


def position_map(info: GenerationInfo, prompt_tokens: int) -> list[float] | None:
    """Per prompt position: 1/0 kept (SpecPrefill), or the fraction of (layer, KV head) whose
    last memory set holds it (H2O); None for full prefill."""
    if info.kept_positions is not None:
        row = np.zeros(prompt_tokens)
        row[np.asarray(info.kept_positions, dtype=np.int64)] = 1.0
        return row.tolist()
    if info.memory_sets:
        row = np.zeros(prompt_tokens)
        last = [np.asarray(sets[-1]) for sets in info.memory_sets if sets]
        for indices in last:
            for head_row in indices:
                row[head_row] += 1.0
        return (row / max(1, sum(len(x) for x in last))).tolist()
    return None
