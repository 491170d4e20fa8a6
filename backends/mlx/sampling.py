"""The MLX backend's own sampler: greedy, or temperature / top-p on the device (no host copy per
token). Settings beyond those go through core/sampling.py's host sampler instead."""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from specfill.core.runtime import SamplingConfig

Sampler = Callable[[mx.array], mx.array]  # float32 logits [vocab] -> token [1]


def make_sampler(sampling: SamplingConfig) -> Sampler:
    """Greedy at temperature 0, else mlx-lm's temperature / top-p sampler (on log-probabilities)."""
    if sampling.seed is not None:
        mx.random.seed(sampling.seed)
    if sampling.temperature == 0.0:
        return lambda logits: mx.argmax(logits[None], axis=-1)
    # Imported here: mlx_lm's package import pulls in transformers (seconds), greedy needs none.
    from mlx_lm.sample_utils import make_sampler as mlx_lm_sampler

    sampler = mlx_lm_sampler(temp=sampling.temperature, top_p=sampling.top_p)

    def choose(logits: mx.array) -> mx.array:
        logits = logits[None].astype(mx.float32)
        return sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))

    return choose
